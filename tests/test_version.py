"""The netlink version handshake (uapi GPUSLICE_GENL_VERSION): gpuctl reads the family's
version before any request and refuses another one with one line naming both; every
request it sends carries its own, which the module checks (kmod/netlink.c)."""

from __future__ import annotations

import errno
import os
import re

import pytest
from click.testing import CliRunner

from gpuslice import netlink as N
from gpuslice.cli import main

REPO = os.path.join(os.path.dirname(__file__), "..")


class FakeFamily:
    def __init__(self, version: int) -> None:
        self.version = version

    def get_attr(self, name: str) -> int | None:
        return self.version if name == "CTRL_ATTR_VERSION" else None


class FakeSock:
    """What GpusliceNetlink uses of pyroute2's GenericNetlinkSocket to connect."""

    def __init__(self, version: int | None, present: bool = True) -> None:
        self.version, self.present, self.closed, self.requests = version, present, False, []

    def bind(self, family: str, _cls: object) -> None:
        assert family == N.FAMILY
        if not self.present:
            raise OSError(errno.ENOENT, "no such family")

    def discovery(self, family: str) -> FakeFamily:
        return FakeFamily(self.version)  # type: ignore[arg-type]

    def close(self) -> None:
        self.closed = True

    def nlm_request(self, msg, msg_type, msg_flags):  # noqa: ANN001
        self.requests.append(msg)
        return []

    prid = 0x20


def test_check_version() -> None:
    N.check_version(N.VERSION)
    for other in (None, 0, N.VERSION - 1, N.VERSION + 1):
        with pytest.raises(N.VersionMismatch) as e:
            N.check_version(other)
        msg = str(e.value)
        assert "\n" not in msg and f"version {other}" in msg and f"version {N.VERSION}" in msg
        assert e.value.errno == errno.EPROTO


def test_connect_checks_before_any_request() -> None:
    sock = FakeSock(N.VERSION + 1)
    with pytest.raises(N.VersionMismatch):
        N.GpusliceNetlink(sock)
    assert sock.closed and sock.requests == []
    good = FakeSock(N.VERSION)
    nl = N.GpusliceNetlink(good)
    assert nl.module_version == N.VERSION
    nl.instances()
    assert good.requests[0]["version"] == N.VERSION  # what the module checks


def test_missing_family_is_not_a_mismatch() -> None:
    with pytest.raises(N.NetlinkError) as e:
        N.GpusliceNetlink(FakeSock(N.VERSION, present=False))
    assert not isinstance(e.value, N.VersionMismatch) and "is gpuslice.ko loaded" in str(e.value)


@pytest.mark.parametrize("mode", ["auto", "yes"])
def test_cli_refuses_a_mismatch_in_one_line(tmp_path, monkeypatch, mode: str) -> None:
    """Even --kernel auto (which goes on without a module) stops at a mismatch."""
    real = N.GpusliceNetlink
    monkeypatch.setattr(N, "GpusliceNetlink", lambda: real(FakeSock(1)))
    monkeypatch.setattr(N, "module_loaded", lambda *a: True)  # auto asks the module only where it is loaded
    res = CliRunner().invoke(main, ["--state", str(tmp_path / "s.json"), "--kernel", mode, "instance", "create",
                                    "web", "--memory", "1GiB"])
    assert res.exit_code == 1
    err = res.stderr.strip()
    assert "\n" not in err and err == (f"gpuctl: gpuslice.ko speaks netlink ABI version 1, this gpuctl speaks "
                                       f"version {N.VERSION}: load the module built from the same gpuslice release")
    assert not (tmp_path / "s.json").exists()


def test_module_checks_the_request_version() -> None:
    """kmod/netlink.c refuses a request of another version (run in the guest suite
    against the loaded module; here: the check is there, on every doit and dump)."""
    src = open(os.path.join(REPO, "kmod", "netlink.c")).read()
    assert re.search(r"hdr->version != GPUSLICE_GENL_VERSION\)\s*\{[^}]*return -EPROTO;", src, re.S)
    assert src.count("gs_nl_admin(skb, info)") == 5  # NEW, DEL, SET, GET, HANDOVER
    assert "return gs_nl_check(cb->skb, cb->nlh, cb->extack);" in src

"""`gpuctl doctor`: each check's ok and failing branch against temporary files and fakes,
and the command through click's CliRunner (table, --json, exit status, one-line error)."""

from __future__ import annotations

import errno
import http.server
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from gpuslice import nvrm_versions

from gpuslice.ops import cdi
from gpuslice.ops import doctor as D
from gpuslice.ops import exporter as E
from gpuslice import netlink as N
from gpuslice import version as V
from gpuslice.cli import main

REPO = os.path.join(os.path.dirname(__file__), "..")
OPEN_580 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Thu Oct  9 19:50:03 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n")
LEGACY_535 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
              "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def write(path, text: str) -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def denied(_path: str) -> str:
    raise PermissionError(errno.EACCES, "Permission denied")


# ---- 1. driver -----------------------------------------------------------------------

def test_the_supported_versions_are_the_modules() -> None:
    """One list, two languages: gpuslice.nvrm_versions and kmod/core/nvrm_tables.c are
    generated from abi/ together (tests/test_nvrm_tables.py checks they are current)."""
    src = open(os.path.join(REPO, "kmod", "core", "nvrm_tables.c")).read()
    assert sorted(re.findall(r'"(\d+\.\d+(?:\.\d+)?)"', src)) == sorted(nvrm_versions.supported())
    assert "580.159.04" in nvrm_versions.supported()  # the H100's driver


@pytest.mark.parametrize("text, version", [(OPEN_580, "580.159.04"), (LEGACY_535, "535.104.05"),
                                           ("580.142\n", "580.142"), ("garbage\n", None)])
def test_parse_driver_version(text: str, version: str | None) -> None:
    assert D.parse_driver_version(text) == version


def test_driver_tested_is_ok(tmp_path) -> None:
    c = D.check_driver(write(tmp_path / "version", OPEN_580), str(tmp_path / "none"))
    assert (c.status, c.fix) == (D.OK, "") and "580.159.04" in c.message
    assert "branch 580, ABI table: yes" in c.message


@pytest.mark.parametrize("version, branch", [("535.104.05", "535"), ("550.163.01", "550"),
                                             ("570.211.01", "570"), ("575.64.05", "575"), ("580.142", "580")])
def test_driver_of_each_supported_branch_is_ok(tmp_path, version: str, branch: str) -> None:
    c = D.check_driver(write(tmp_path / "v", version + "\n"), "/none")
    assert c.status == D.OK and f"branch {branch}, ABI table: yes" in c.message


def test_driver_from_sys_module_when_proc_is_absent(tmp_path) -> None:
    c = D.check_driver(str(tmp_path / "none"), write(tmp_path / "sysver", "580.142\n"))
    assert c.status == D.OK and "580.142" in c.message


@pytest.mark.parametrize("version, why", [("580.999.01", "branch 580 is supported, this release has no ABI table"),
                                          ("590.44.01", "branch 590 is not supported"),
                                          ("525.147.05", "branch 525 is not supported")])
def test_driver_without_a_table_fails_naming_the_supported(tmp_path, version: str, why: str) -> None:
    c = D.check_driver(write(tmp_path / "version", version + "\n"), str(tmp_path / "none"))
    assert c.status == D.FAIL
    assert version in c.message and why in c.message
    assert "535.43.02..535.288.01" in c.message and "580.65.06..580.159.04" in c.message
    assert "passthrough_only=1" in c.fix and "\n" not in c.fix


def test_driver_absent_is_a_skip_not_a_crash(tmp_path) -> None:
    c = D.check_driver(str(tmp_path / "a"), str(tmp_path / "b"))
    assert c.status == D.SKIP and "no NVIDIA driver" in c.message


def test_driver_unreadable_or_unparsable_warns(tmp_path) -> None:
    assert D.check_driver("/x", "/y", read=denied).status == D.WARN
    assert D.check_driver(write(tmp_path / "v", "what\n"), "/y").status == D.WARN


# ---- 2. module and netlink version ---------------------------------------------------

class FakeSock:
    """What GpusliceNetlink uses of pyroute2's GenericNetlinkSocket to connect."""

    def __init__(self, version: int | None, present: bool = True) -> None:
        self.version, self.present, self.closed = version, present, False

    def bind(self, family: str, _cls: object) -> None:
        if not self.present:
            raise OSError(errno.ENOENT, "no such family")

    def discovery(self, family: str) -> Any:
        return SimpleNamespace(get_attr=lambda name: self.version if name == "CTRL_ATTR_VERSION" else None)

    def close(self) -> None:
        self.closed = True


def sys_module(tmp_path, require: str = "Y", passthrough: str = "N") -> str:
    d = tmp_path / "sys" / "module" / "gpuslice"
    write(d / "parameters" / "require_device_cgroup", require + "\n")
    write(d / "parameters" / "passthrough_only", passthrough + "\n")
    return str(d)


def test_module_not_loaded_fails(tmp_path) -> None:
    called = []
    c = D.check_module(str(tmp_path / "none"), connect=lambda: called.append(1))
    assert c.status == D.FAIL and "not loaded" in c.message and "modprobe gpuslice" in c.fix
    assert called == []  # no netlink without the module


def test_module_same_version_is_ok(tmp_path) -> None:
    sock = FakeSock(N.VERSION)
    c = D.check_module(sys_module(tmp_path), connect=lambda: N.GpusliceNetlink(sock))
    assert c.status == D.OK and f"netlink version {N.VERSION}" in c.message
    assert sock.closed


def test_module_version_mismatch_names_both(tmp_path) -> None:
    """The handshake of netlink.py, reused: one line with both versions."""
    c = D.check_module(sys_module(tmp_path), connect=lambda: N.GpusliceNetlink(FakeSock(N.VERSION + 1)))
    assert c.status == D.FAIL
    assert f"version {N.VERSION + 1}" in c.message and f"version {N.VERSION}" in c.message
    assert "\n" not in c.message and "same checkout" in c.fix


def test_module_without_its_family_fails(tmp_path) -> None:
    c = D.check_module(sys_module(tmp_path), connect=lambda: N.GpusliceNetlink(FakeSock(N.VERSION, present=False)))
    assert c.status == D.FAIL and "does not answer" in c.message and "dmesg" in c.fix


def test_module_in_passthrough_warns(tmp_path) -> None:
    c = D.check_module(sys_module(tmp_path, passthrough="Y"), connect=lambda: N.GpusliceNetlink(FakeSock(N.VERSION)))
    assert c.status == D.WARN and "passthrough_only" in c.message


# ---- 3. daemon -----------------------------------------------------------------------

def status_file(tmp_path, pid: int, age_s: float) -> str:
    """As Scheduler.write_status writes it (the keys doctor reads: pid, time)."""
    return write(tmp_path / "status.json", json.dumps({"pid": pid, "time": time.time() - age_s, "switches": 3}))


def test_pid_alive() -> None:
    assert D.pid_alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not D.pid_alive(p.pid)


def test_daemon_fresh_status_file_is_ok_without_systemd(tmp_path) -> None:
    c = D.check_daemon(status_file(tmp_path, os.getpid(), 0.5), unit=lambda u: None)
    assert c.status == D.OK and f"pid {os.getpid()}" in c.message and "no systemd" in c.message


def test_daemon_unit_active_with_a_fresh_file_is_ok(tmp_path) -> None:
    seen = []
    c = D.check_daemon(status_file(tmp_path, os.getpid(), 1), unit=lambda u: seen.append(u) or "active")
    assert c.status == D.OK and seen == ["gpuslice-daemon.service"]


def test_daemon_not_running_fails_with_the_unit(tmp_path) -> None:
    c = D.check_daemon(str(tmp_path / "none.json"), unit=lambda u: "inactive")
    assert c.status == D.FAIL and "not running" in c.message
    assert "systemctl enable --now gpuslice-daemon" in c.fix


def test_daemon_gone_leaves_a_stale_file(tmp_path) -> None:
    c = D.check_daemon(status_file(tmp_path, 4242, 100), unit=lambda u: "failed", alive=lambda p: False)
    assert c.status == D.FAIL and "pid 4242, which is gone" in c.message
    assert c.fix.startswith("journalctl -u gpuslice-daemon")


def test_daemon_active_but_stuck_fails(tmp_path) -> None:
    c = D.check_daemon(status_file(tmp_path, os.getpid(), 60), unit=lambda u: "active")
    assert c.status == D.FAIL and "60 s old" in c.message and "restart" in c.fix


def test_daemon_active_status_unreadable_is_ok(tmp_path) -> None:
    c = D.check_daemon(str(tmp_path / "s.json"), unit=lambda u: "active", read=denied)
    assert c.status == D.OK and "unreadable" in c.message
    assert D.check_daemon(str(tmp_path / "s.json"), unit=lambda u: "inactive", read=denied).status == D.FAIL


def test_daemon_active_without_a_file_yet_warns(tmp_path) -> None:
    assert D.check_daemon(str(tmp_path / "none.json"), unit=lambda u: "active").status == D.WARN


def test_unit_state_reads_systemctl() -> None:
    calls = []

    def run(argv):  # noqa: ANN001
        calls.append(list(argv))
        return 3, "inactive\n"

    assert D.unit_state("x.service", run) == "inactive"
    assert calls == [["systemctl", "is-active", "x.service"]]
    assert D.unit_state("x.service", lambda argv: None) is None


# ---- 4. real nodes -------------------------------------------------------------------

def fake_dev(tmp_path, names: list[str]) -> str:
    d = tmp_path / "dev"
    d.mkdir()
    for n in names:
        (d / n).write_text("")
    return str(d)


def chr_stat(mode: int, major: int = 195, minor: int = 0) -> Any:
    return SimpleNamespace(st_mode=stat.S_IFCHR | mode, st_uid=0, st_gid=0, st_rdev=os.makedev(major, minor))


def test_real_nodes_order_and_scope(tmp_path) -> None:
    dev = fake_dev(tmp_path, ["nvidia10", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia0", "nvidia-modeset", "null"])
    assert [os.path.basename(p) for p in D.real_nodes(dev)] == ["nvidiactl", "nvidia0", "nvidia1", "nvidia10",
                                                                "nvidia-uvm"]


def test_real_nodes_restricted_is_ok(tmp_path) -> None:
    dev = fake_dev(tmp_path, ["nvidiactl", "nvidia0", "nvidia-uvm"])
    c = D.check_real_nodes(dev, stat_fn=lambda p: chr_stat(0o660, 511 if "uvm" in p else 195))
    assert c.status == D.OK and "nvidiactl 0660 root:root" in c.message and "nvidia-uvm 0660" in c.message


def test_real_nodes_world_accessible_warns_with_a_fix(tmp_path) -> None:
    dev = fake_dev(tmp_path, ["nvidiactl", "nvidia0", "nvidia-uvm"])
    c = D.check_real_nodes(dev, stat_fn=lambda p: chr_stat(0o666 if "uvm" not in p else 0o660,
                                                           511 if "uvm" in p else 195))
    assert c.status == D.WARN
    assert "nvidiactl 0666" in c.message and "nvidia0 0666" in c.message and "nvidia-uvm" not in c.message
    assert "fd-translation" in c.message and "NVreg_DeviceFileMode=0660" in c.fix and "chmod o-rw" in c.fix


def test_real_nodes_that_are_not_the_drivers_fail(tmp_path) -> None:
    dev = fake_dev(tmp_path, ["nvidiactl", "nvidia0"])
    c = D.check_real_nodes(dev)  # plain files
    assert c.status == D.FAIL and "not a character device" in c.message
    c = D.check_real_nodes(dev, stat_fn=lambda p: chr_stat(0o660, major=10))
    assert c.status == D.FAIL and "not major 195" in c.message


def test_no_real_nodes_is_a_skip(tmp_path) -> None:
    assert D.check_real_nodes(fake_dev(tmp_path, ["null"])).status == D.SKIP


# ---- 5. require_device_cgroup --------------------------------------------------------

def test_device_cgroup_required_is_ok(tmp_path) -> None:
    c = D.check_device_cgroup(sys_module(tmp_path, require="Y"))
    assert c.status == D.OK and "major 195" in c.message


def test_device_cgroup_not_required_fails_and_says_how(tmp_path) -> None:
    c = D.check_device_cgroup(sys_module(tmp_path, require="N"))
    assert c.status == D.FAIL and "require_device_cgroup=N" in c.message
    assert "require_device_cgroup=1" in c.fix and "tee" in c.fix and "--privileged" in c.fix


def test_device_cgroup_without_module_is_a_skip(tmp_path) -> None:
    assert D.check_device_cgroup(str(tmp_path / "none")).status == D.SKIP


# ---- 6. vm.mmap_min_addr -------------------------------------------------------------

@pytest.mark.parametrize("value, status", [("65536", D.OK), ("131072", D.OK), ("65535", D.FAIL), ("4096", D.FAIL),
                                           ("0", D.FAIL), ("x", D.WARN)])
def test_mmap_min_addr(tmp_path, value: str, status: str) -> None:
    c = D.check_mmap_min_addr(write(tmp_path / "mmap_min_addr", value + "\n"))
    assert c.status == status
    if status == D.FAIL:
        assert f"= {value} < 65536" in c.message and "sysctl -w vm.mmap_min_addr=65536" in c.fix


# ---- 7. CDI spec ---------------------------------------------------------------------

FILES = ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04", "/usr/bin/nvidia-smi"]


def spec_of(*names: str, files: list[str] = FILES) -> dict[str, Any]:
    return cdi.build_spec([cdi.Instance(n, (0,)) for n in names], files)


def test_cdi_current_is_ok(tmp_path) -> None:
    path = str(tmp_path / "gpuslice.yaml")
    cdi.write_spec(path, cdi.render(spec_of("web", "batch")))
    c = D.check_cdi(path, lambda: spec_of("web", "batch"))
    assert c.status == D.OK and "batch, web" in c.message and "2 driver files" in c.message


def test_cdi_missing_fails_with_generate(tmp_path) -> None:
    path = str(tmp_path / "gpuslice.yaml")
    c = D.check_cdi(path, lambda: spec_of("web"))
    assert c.status == D.FAIL and "missing" in c.message and f"gpuctl cdi generate --output {path}" in c.fix
    assert D.check_cdi(path, lambda: spec_of()).status == D.OK  # no instance: no spec is right


def test_cdi_stale_names_the_difference(tmp_path) -> None:
    path = str(tmp_path / "gpuslice.yaml")
    cdi.write_spec(path, cdi.render(spec_of("web", "old")))
    c = D.check_cdi(path, lambda: spec_of("web", "new", files=FILES[:1]))
    assert c.status == D.FAIL
    assert "devices missing: new" in c.message and "devices of no instance: old" in c.message
    assert "1 gone" in c.message
    c = D.check_cdi(path, lambda: spec_of())
    assert c.status == D.FAIL and "no instances" in c.message and "removes it" in c.fix


def test_cdi_same_content_otherwise_written_is_ok(tmp_path) -> None:
    path = write(tmp_path / "gpuslice.yaml", json.dumps(spec_of("web")))  # JSON is YAML
    assert D.check_cdi(path, lambda: spec_of("web")).status == D.OK
    write(tmp_path / "gpuslice.yaml", "- not a spec\n")
    assert D.check_cdi(path, lambda: spec_of("web")).status == D.FAIL


def test_cdi_that_cannot_be_generated_warns(tmp_path) -> None:
    def boom() -> dict[str, Any]:
        raise OSError(errno.EPERM, "Operation not permitted")

    c = D.check_cdi(str(tmp_path / "x.yaml"), boom)
    assert c.status == D.WARN and "Operation not permitted" in c.message


# ---- 8. exporter ---------------------------------------------------------------------

@pytest.fixture()
def exporter_server() -> Iterator[str]:
    """The real exporter's server on a free loopback port, with fake sources."""
    src = E.Sources(instances=lambda: [], status=lambda: None, guard=lambda: None, gpus=lambda: [])
    srv = E.make_server("127.0.0.1:0", E.registry_for(src))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_exporter_reachable_is_ok(exporter_server: str) -> None:
    c = D.check_exporter(exporter_server)
    assert c.status == D.OK and "module_up 1" in c.message and "daemon_up 0" in c.message


def test_exporter_unreachable_names_the_unit() -> None:
    c = D.check_exporter(f"127.0.0.1:{free_port()}", timeout=1.0)
    assert c.status == D.FAIL and "nothing answers" in c.message
    assert "systemctl enable --now gpuslice-exporter" in c.fix


def test_exporter_port_held_by_something_else_fails() -> None:
    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"node_cpu_seconds_total 1\n" if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        c = D.check_exporter(f"127.0.0.1:{srv.server_address[1]}")
        assert c.status == D.FAIL and "no gpuslice_ metrics" in c.message
        c = D.check_exporter("127.0.0.1:1", get=lambda url, t: (404, ""))
        assert c.status == D.FAIL and "HTTP 404" in c.message
    finally:
        srv.shutdown()
        srv.server_close()


def test_exporter_address() -> None:
    assert D.metrics_url("0.0.0.0:9410") == "http://127.0.0.1:9410/metrics"
    assert D.metrics_url("[::]:9401") == "http://[::1]:9401/metrics"
    show = ("{ path=/usr/local/bin/gpuctl ; argv[]=/usr/local/bin/gpuctl exporter --listen 127.0.0.1:9500 ; "
            "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
    assert D.exporter_listen_of(show, "d") == "127.0.0.1:9500"
    assert D.exporter_listen_of("/usr/local/bin/gpuctl exporter --listen=[::1]:1", "d") == "[::1]:1"
    assert D.exporter_listen_of("/usr/local/bin/gpuctl exporter", "d") == "d"
    assert D.exporter_listen_of(None, "d") == "d"
    assert D.check_exporter("nonsense").status == D.FAIL


# ---- all of them, and the command ----------------------------------------------------

def good_root(tmp_path, mmap_min_addr: str = "65536") -> str:
    root = tmp_path / "root"
    write(root / "proc" / "driver" / "nvidia" / "version", OPEN_580)
    write(root / "proc" / "sys" / "vm" / "mmap_min_addr", mmap_min_addr + "\n")
    write(Path(sys_module(root)) / "version", f"{V.RELEASE} {V.build()}\n")  # from gpuctl's checkout
    (root / "dev").mkdir()
    return str(root)


def test_run_all_order_and_a_crashing_check(tmp_path) -> None:
    def crash(url: str, t: float) -> tuple[int, str]:
        raise AssertionError("a bug")

    def bad_connect() -> Any:
        raise RuntimeError("bug in connect")

    checks = D.run_all(str(tmp_path / "s.json"), str(tmp_path / "c.yaml"), lambda: spec_of(),
                       exporter_listen="127.0.0.1:1", root=good_root(tmp_path), connect=bad_connect,
                       unit=lambda u: None, get=crash)
    assert [c.name for c in checks] == ["driver", "module", "build", "instances", "daemon", "real-nodes",
                                        "device-cgroup", "mmap-min-addr", "cdi", "exporter"]
    by = {c.name: c for c in checks}
    assert by["driver"].status == D.OK and by["device-cgroup"].status == D.OK
    assert by["module"].status == D.FAIL and "the check itself failed: RuntimeError" in by["module"].message
    assert by["exporter"].status == D.FAIL  # "nothing answers", whatever get raised
    assert D.failed(checks) == ["module", "daemon", "exporter"]


@pytest.fixture()
def doctor(tmp_path, monkeypatch):
    """`gpuctl doctor` on a fake root: a tested driver, the module (fake netlink of our
    version), the daemon's unit active with a fresh status file, no instances."""
    monkeypatch.setattr(D, "ROOT", good_root(tmp_path))
    monkeypatch.setattr(D, "connect_netlink", lambda: N.GpusliceNetlink(FakeSock(N.VERSION)))
    monkeypatch.setattr(D, "unit_state", lambda unit: "active")
    state = str(tmp_path / "state.json")
    status = status_file(tmp_path, os.getpid(), 0.2)
    spec = str(tmp_path / "cdi" / "gpuslice.yaml")

    def _run(*args: str):
        return CliRunner().invoke(main, ["--state", state, "--kernel", "no", "--cdi-spec", spec, *args])

    def _run_plain(*args: str):
        return CliRunner().invoke(main, ["--state", state, "--kernel", "no", *args], env={"GPUSLICE_CDI_SPEC": None})

    def _doctor(*args: str):
        return _run("doctor", "--status-file", status, *args)

    _doctor.run = _run  # type: ignore[attr-defined]
    _doctor.run_plain = _run_plain  # type: ignore[attr-defined]
    _doctor.spec = spec  # type: ignore[attr-defined]
    return _doctor


def test_cli_all_good(doctor, exporter_server: str) -> None:
    res = doctor("--exporter", exporter_server)
    assert res.exit_code == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "STATUS", "DETAIL"]
    got = {ln.split()[0]: ln.split()[1] for ln in lines[1:]}
    assert got == {"driver": "ok", "module": "ok", "build": "ok", "instances": "skip", "daemon": "ok",
                   "real-nodes": "skip", "device-cgroup": "ok", "mmap-min-addr": "ok", "cdi": "ok", "exporter": "ok"}
    assert "fix:" not in res.stdout and res.stderr == ""


def test_cli_exporter_address_from_the_unit(doctor, exporter_server: str, monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(D, "unit_exec_start", lambda unit: asked.append(unit) or
                        f"{{ path=/usr/local/bin/gpuctl ; argv[]=/usr/local/bin/gpuctl exporter --listen "
                        f"{exporter_server} ; ignore_errors=no }}")
    res = doctor("--json")
    assert res.exit_code == 0, res.stdout + res.stderr
    by = {c["name"]: c for c in json.loads(res.stdout)}
    assert by["exporter"]["status"] == "ok" and exporter_server in by["exporter"]["message"]
    assert asked == ["gpuslice-exporter.service"]


def test_cli_a_failure_exits_non_zero_with_its_fix(doctor, exporter_server: str, tmp_path) -> None:
    write(os.path.join(D.ROOT, "proc", "sys", "vm", "mmap_min_addr"), "4096\n")
    res = doctor("--exporter", exporter_server)
    assert res.exit_code == 1
    assert res.stderr == "gpuctl: 1 of 10 checks failed: mmap-min-addr\n"
    lines = res.stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("mmap-min-addr"))
    assert lines[i].split()[1] == "fail"
    assert lines[i + 1].split()[0] == "fix:" and "sysctl -w vm.mmap_min_addr=65536" in lines[i + 1]


def test_cli_json_and_the_cdi_spec_of_cdi_generate(doctor, exporter_server: str, monkeypatch) -> None:
    # driver files as on a GPU host (a spec without them is a warning: no libcuda in containers)
    monkeypatch.setattr(cdi, "scan_host", lambda *a, **k: list(FILES))
    monkeypatch.setattr(cdi, "driver_files", lambda listing: list(listing))
    """The CDI check compares with what `gpuctl cdi generate` writes."""
    def cdi_check() -> tuple[int, dict[str, str]]:
        res = doctor("--exporter", exporter_server, "--json")
        by = {c["name"]: c for c in json.loads(res.stdout)}
        assert set(by["cdi"]) == {"name", "status", "message", "fix"}
        return res.exit_code, by["cdi"]

    # made without --cdi-spec: no spec
    assert doctor.run_plain("instance", "create", "web", "--memory", "1GiB").exit_code == 0
    code, c = cdi_check()
    assert code == 1 and c["status"] == "fail" and "missing (instances: web)" in c["message"]
    assert c["fix"].startswith(f"sudo gpuctl cdi generate --output {doctor.spec}")
    res = doctor("--exporter", exporter_server)
    assert res.exit_code == 1 and res.stderr == "gpuctl: 1 of 10 checks failed: cdi\n"
    assert doctor.run("cdi", "generate", "--output", doctor.spec).exit_code == 0
    code, c = cdi_check()
    assert code == 0 and c["status"] == "ok" and "1 device(s) (web)" in c["message"]
    # another made without --cdi-spec leaves the spec behind; with it, the spec follows
    assert doctor.run_plain("instance", "create", "batch", "--memory", "1GiB").exit_code == 0
    code, c = cdi_check()
    assert code == 1 and "devices missing: batch" in c["message"]
    assert doctor.run("instance", "create", "db", "--memory", "1GiB").exit_code == 0
    code, c = cdi_check()
    assert code == 0 and "3 device(s) (batch, db, web)" in c["message"]


def test_cli_bad_exporter_address_is_one_line(doctor) -> None:
    res = doctor("--exporter", "nowhere")
    assert res.exit_code == 2 and res.stdout == ""
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("gpuctl: ") and "--exporter" in err


# ---- gpuctl and the module from one checkout: release, netlink ABI, build ---------------------

def test_build_same_checkout_is_ok(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(V, "build", lambda: "0123456789ab")
    d = sys_module(tmp_path)
    write(Path(d) / "version", f"{V.RELEASE} 0123456789ab\n")
    c = D.check_build(d)
    assert c.status == D.OK and f"gpuctl {V.RELEASE} (netlink ABI {N.VERSION}, build 0123456789ab)" in c.message


def test_build_from_another_checkout_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(V, "build", lambda: "0123456789ab")
    d = sys_module(tmp_path)
    write(Path(d) / "version", f"{V.RELEASE} fedcba987654-dirty\n")
    c = D.check_build(d)
    assert c.status == D.WARN and "built from different checkouts" in c.message
    assert "build 0123456789ab" in c.message and "build fedcba987654-dirty" in c.message and "same checkout" in c.fix


def test_build_of_another_release_fails(tmp_path) -> None:
    d = sys_module(tmp_path)
    write(Path(d) / "version", "9.9.9 0123456789ab\n")
    c = D.check_build(d)
    assert c.status == D.FAIL and "different releases" in c.message and "gpuslice.ko 9.9.9" in c.message


def test_build_of_a_module_without_a_version_warns(tmp_path) -> None:
    c = D.check_build(sys_module(tmp_path))
    assert c.status == D.WARN and "states no version" in c.message
    assert D.check_build(str(tmp_path / "none")).status == D.SKIP


def test_build_unknown_is_not_compared(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(V, "build", lambda: "unknown")
    d = sys_module(tmp_path)
    write(Path(d) / "version", f"{V.RELEASE} 0123456789ab\n")
    assert D.check_build(d).status == D.OK
    write(Path(d) / "version", f"{V.RELEASE}\n")  # a module built without gpuslice_build.h
    assert V.parse_module_version(f"{V.RELEASE}\n") == (V.RELEASE, "unknown")

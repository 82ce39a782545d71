"""gpuctl closes its netlink socket, and pyroute2's event loop with it, when a command
ends: a socket left to the interpreter's exit is collected in any order, and the loop's
finalizer, run after its own sockets were closed, printed ``Exception ignored in:
<function BaseEventLoop.__del__ ...> ... ValueError: Invalid file descriptor: -1``
after `instance create` in the demo.

The commands run in a subprocess against a real generic netlink socket, bound to the
kernel's own ``nlctrl`` family in place of gpuslice's (the module is not loaded on the
host), under ``python -X dev``, which reports an event loop or socket never closed as a
ResourceWarning whatever the order of collection."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

HARNESS = textwrap.dedent("""
    import sys
    from gpuslice import netlink as N

    N.FAMILY = "nlctrl"  # always there: the socket, its binding and its event loop are real
    N.check_version = lambda version, ours=N.VERSION: None
    N.module_loaded = lambda *a: True
    from gpuslice.cli import main

    main(sys.argv[1:])
""")


def _netlink_available() -> bool:
    try:
        from pyroute2.netlink.generic import GenericNetlinkSocket

        s = GenericNetlinkSocket()
        s.close()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _netlink_available(), reason="no generic netlink socket here")
@pytest.mark.parametrize("args", [["instance", "list"],
                                  ["instance", "create", "web", "--gpu", "0", "--memory", "1Gi"],
                                  ["instance", "show", "nope"]],
                         ids=lambda a: " ".join(a[:2]))
def test_a_command_leaves_no_event_loop_to_the_exit(tmp_path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "pyctl"), "GPUSLICE_CDI_SPEC": ""}
    res = subprocess.run([sys.executable, "-X", "dev", "-c", HARNESS, "--state", str(tmp_path / "state.json"),
                          "--kernel", "yes", *args], capture_output=True, text=True, env=env, timeout=60)
    assert "Exception ignored" not in res.stderr, res.stderr
    assert "unclosed" not in res.stderr, res.stderr  # the event loop, its transport, the socket
    assert "Traceback" not in res.stderr, res.stderr


def test_close_twice_is_harmless() -> None:
    from gpuslice import netlink as N

    class Sock:
        closes = 0

        def bind(self, *_a: object) -> None:
            pass

        def discovery(self, _f: str) -> object:
            class F:
                def get_attr(self, _n: str) -> int:
                    return N.VERSION
            return F()

        def close(self) -> None:
            Sock.closes += 1

    nl = N.GpusliceNetlink(Sock())
    nl.close()
    nl.close()
    assert Sock.closes == 1

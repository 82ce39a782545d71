"""The reaper per instance (kmod/reaper.c): a close() waits for its own instance's
teardown only. The stand-in's release_hold_minor holds the driver's release of one real
file (as RM's release of a file with many clients takes long), so instance A's teardown
is slow for as long as the test wants; instance B's close() must complete meanwhile,
with B's memory freed and accounted. And a real file of one instance held by another's
(REGISTER_FD naming another instance's nvidiactl) is reaped once that one lets go."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from gpuslice import abi

import nvstub
from gsinst import Instance, needs_modules, node, session, wait_for

pytestmark = needs_modules

MIB = 1 << 20
HOLD = "/sys/module/nvstub/parameters/release_hold_minor"
HELD = "/sys/module/nvstub/parameters/release_held"


def _held() -> int:
    with open(HELD) as f:
        return int(f.read())


def _hold(minor: int) -> None:
    with open(HOLD, "w") as f:
        f.write(f"{minor}\n")


@pytest.fixture
def hold():
    if not os.path.exists(HOLD):
        pytest.skip("stand-in without release_hold_minor")
    yield _hold
    _hold(-1)
    assert wait_for(lambda: _held() == 0, timeout=150)


def test_close_does_not_wait_for_another_instances_slow_teardown(nl, hold):
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        sa = session(a)
        sb = session(b)
        a_closed = threading.Event()
        closer = None
        try:
            assert sa.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
            assert sb.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
            assert a.get()["mem_used"] == b.get()["mem_used"] == 2 * MIB

            # A's teardown: the release of its real nvidia0 file is held in the driver
            hold(sa.gpu)

            def close_a() -> None:
                os.close(sa.dev_fd)
                a_closed.set()

            closer = threading.Thread(target=close_a)
            closer.start()
            assert wait_for(lambda: _held() == 1, timeout=60), "A's release never reached the driver"
            assert not a_closed.is_set()

            # B's close() (nvidia0, then nvidiactl: every client freed) completes meanwhile
            sb.close()
            assert _held() == 1 and not a_closed.is_set(), "B's close waited for A's teardown"
            assert b.get()["mem_used"] == 0
            assert a.get()["mem_used"] == 2 * MIB
        finally:
            hold(-1)
            if closer is not None:
                closer.join()
            else:
                os.close(sa.dev_fd)
        assert a_closed.is_set()
        os.close(sa.ctl)
        assert a.get()["mem_used"] == 0


def test_file_held_by_another_instances_file_is_reaped_when_let_go(nl):
    """A's nvidia0 holds B's nvidiactl (REGISTER_FD across instances): B's file is
    reaped, its client freed, once A's file is gone, and B can then be deleted."""
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        sb = session(b)
        a_gpu = nvstub.open_node(node(a.name, "nvidia0"))
        try:
            assert sb.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
            assert nvstub.register_fd(a_gpu, sb.ctl) == 0
        finally:
            sb.close()
        # the real nvidiactl of B lives on in A's real nvidia0: its client too
        assert b.get()["mem_used"] == 2 * MIB
        with pytest.raises(OSError) as e:
            nl.instance_del(b.name)
        assert e.value.errno == errno.EBUSY
        os.close(a_gpu)
        assert wait_for(lambda: b.get()["mem_used"] == 0, timeout=60)
        nl.instance_del(b.name)
        assert not os.path.exists(b.path("nvidiactl"))

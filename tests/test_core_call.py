"""The call protocol both glues share (kmod/core/call.c gs_call_run()), driven through
tests/core/shim.c t_run with a glue of the test's: which of the glue's ops run, in which
order, and that gs_pre() and gs_post() run once each for a passed call and gs_post() never
for a call the core answered (each takes the instance lock once: docs/core.md)."""

from __future__ import annotations

import errno
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "core"))
import coreshim as cs  # noqa: E402
from coreshim import GiB, MiB, abi  # noqa: E402
from test_core import ALLOC, CONTROL, DEV, env, so  # noqa: E402,F401  (fixtures)

UNLISTED_CMD = 0x2080FFFF  # a control on no row of filter.c


def client(core, rm) -> int:
    arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
    assert core.run(ALLOC, arg, rm.alloc).log == "DAC"
    h = struct.unpack_from("<I", arg, 8)[0]
    assert core.run(ALLOC, cs.alloc_arg(h, h, DEV, abi.NV01_DEVICE_0), rm.alloc).ret == 0
    return h


def mem_arg(h: int, handle: int, size: int):
    p = cs.mem_params(size)
    return cs.alloc_arg(h, DEV, handle, abi.NV01_MEMORY_LOCAL_USER, cs.addr(p)), p


class Counts:
    """What one call did to the instance: lock holds (gs_pre and gs_post take it once
    each) and ioctls counted (gs_pre alone counts). Each read of the lock's figures is
    a hold the next read counts."""

    def __init__(self, core):
        self.core = core
        self.ioctls = core.stats()["ioctls"]
        self.acquired = core.lock_stats()["acquired"]

    def delta(self) -> tuple[int, int]:
        acquired = self.core.lock_stats()["acquired"] - self.acquired - 1
        return acquired, self.core.stats()["ioctls"] - self.ioctls


def test_passed_call_runs_each_step_once_in_order(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 64 * MiB)
    n = Counts(core)
    r = core.run(ALLOC, arg, rm.alloc, nested=0)
    assert (r.ret, r.log, r.status) == (0, "DANC", abi.NV_OK)
    assert n.delta() == (2, 1)  # pre and post, once each
    assert core.stats()["used"] == 64 * MiB


def test_reply_is_answered_without_the_driver_or_post(env):
    core, rm = env
    h = client(core, rm)
    arg = cs.control_arg(h, h, UNLISTED_CMD)
    n = Counts(core)
    r = core.run(CONTROL, arg, rm.control, nested=0)
    assert (r.ret, r.log) == (0, "RNC")  # answered, the nested block and the block back
    assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_UNLISTED)
    assert cs.status_of(CONTROL, arg) == abi.NV_ERR_NOT_SUPPORTED
    assert r.copy_ret_seen == 0
    assert n.delta() == (1, 1)  # gs_pre only: no gs_post after a refusal


def test_quota_refusal_holds_nothing_and_runs_no_post(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 2 * GiB)
    n = Counts(core)
    r = core.run(ALLOC, arg, rm.alloc)
    assert (r.ret, r.log, r.status, r.refusal) == (0, "RC", abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    assert n.delta() == (1, 1)
    # nothing reserved stays behind: the whole limit is still there
    arg, p = mem_arg(h, 0x101, 1 * GiB)
    assert core.run(ALLOC, arg, rm.alloc).log == "DAC"
    assert core.stats()["used"] == 1 * GiB


def test_fail_returns_the_errno_and_copies_nothing(env):
    core, rm = env
    arg = bytearray(abi.REGISTER_FD.size)
    n = Counts(core)
    r = core.run(abi.IOCTL_REGISTER_FD, arg, rm.alloc, nested=0)
    assert (r.ret, r.log, r.err) == (-errno.EPERM, "R", errno.EPERM)
    assert n.delta() == (1, 1)


def test_driver_failure_drops_the_reservation_once(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 1 * GiB)
    n = Counts(core)
    r = core.run(ALLOC, arg, None, ret=-errno.EINVAL)
    # the glue hears the driver's return and decides what goes back
    assert (r.ret, r.log, r.after_ret, r.copy_ret_seen) == (-errno.EINVAL, "DAC", -errno.EINVAL, -errno.EINVAL)
    assert n.delta() == (2, 1)
    assert core.stats()["used"] == 0
    arg, p = mem_arg(h, 0x101, 1 * GiB)
    assert core.run(ALLOC, arg, rm.alloc).ret == 0
    assert core.stats()["used"] == 1 * GiB


def test_unread_reply_is_efault_and_post_still_runs(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 256 * MiB)
    n = Counts(core)
    r = core.run(ALLOC, arg, rm.alloc, nested=0, unread=True, lost=True)
    assert (r.ret, r.log) == (-errno.EFAULT, "D")  # nothing of the reply goes back
    assert n.delta() == (2, 1)
    assert core.stats()["used"] == 256 * MiB  # a lost reply counts as success


def test_unread_failure_releases(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 256 * MiB)
    r = core.run(ALLOC, arg, None, ret=-errno.EIO, unread=True)
    assert (r.ret, r.log) == (-errno.EFAULT, "D")
    assert core.stats()["used"] == 0


def test_nested_reply_the_caller_cannot_take_is_invalid_address(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 64 * MiB)
    r = core.run(ALLOC, arg, rm.alloc, nested=-errno.EFAULT)
    assert (r.ret, r.log) == (0, "DANC")
    assert cs.status_of(ALLOC, arg) == abi.NV_ERR_INVALID_ADDRESS
    assert r.status == abi.NV_OK  # what the core heard from RM: the memory is charged
    assert core.stats()["used"] == 64 * MiB
    # an error RM answered stays RM's
    arg, p = mem_arg(h, 0x101, 64 * MiB)
    rm.fail_next = abi.NV_ERR_NO_MEMORY
    r = core.run(ALLOC, arg, rm.alloc, nested=-errno.EFAULT)
    assert cs.status_of(ALLOC, arg) == abi.NV_ERR_NO_MEMORY


def test_copy_out_failure_is_efault(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 64 * MiB)
    r = core.run(ALLOC, arg, rm.alloc, copy_ret=-errno.EFAULT)
    assert (r.ret, r.log) == (-errno.EFAULT, "DAC")
    assert core.stats()["used"] == 64 * MiB  # RM made it: it stays charged
    arg = cs.control_arg(h, h, UNLISTED_CMD)
    r = core.run(CONTROL, arg, rm.control, copy_ret=-errno.EFAULT)
    assert (r.ret, r.log) == (-errno.EFAULT, "RC")


def test_positive_return_is_the_drivers_success(env):
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 64 * MiB)
    r = core.run(ALLOC, arg, lambda a: (rm.alloc(a), 3)[1])
    assert (r.ret, r.log, r.after_ret) == (3, "DAC", 3)
    assert core.stats()["used"] == 64 * MiB


def test_no_instance_passes_everything_undecided(env):
    core, rm = env
    n = Counts(core)
    arg = bytearray(abi.REGISTER_FD.size)
    r = core.run(abi.IOCTL_REGISTER_FD, arg, None, ret=0, decide=False, nested=0)
    assert (r.ret, r.log) == (0, "DANC")
    assert n.delta() == (0, 0)


def test_done_runs_once_before_anything_goes_back(env):
    """gs_call_ops.done: once per call, right after gs_post() or gs_pre()'s own answer,
    before after, the nested reply and the block go back (the kernel module leaves the
    instance's gate there: the copies to the caller run outside it, kmod/gate.h)."""
    core, rm = env
    h = client(core, rm)
    arg, p = mem_arg(h, 0x100, 64 * MiB)
    r = core.run(ALLOC, arg, rm.alloc, nested=0)
    assert (r.log, r.done, r.done_at) == ("DANC", 1, 1)
    r = core.run(CONTROL, cs.control_arg(h, h, UNLISTED_CMD), rm.control, nested=0)
    assert (r.log, r.done, r.done_at) == ("RNC", 1, 0)
    r = core.run(abi.IOCTL_REGISTER_FD, bytearray(abi.REGISTER_FD.size), rm.alloc, nested=0)
    assert (r.log, r.done, r.done_at) == ("R", 1, 0)
    arg, p = mem_arg(h, 0x101, 64 * MiB)
    r = core.run(ALLOC, arg, rm.alloc, nested=0, unread=True, lost=True)
    assert (r.ret, r.log, r.done, r.done_at) == (-errno.EFAULT, "D", 1, 1)
    r = core.run(abi.IOCTL_REGISTER_FD, bytearray(abi.REGISTER_FD.size), None, ret=0, decide=False, nested=0)
    assert (r.log, r.done, r.done_at) == ("DANC", 1, 1)

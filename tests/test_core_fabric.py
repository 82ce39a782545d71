"""NV_MEMORY_FABRIC in the decision core (kmod/core/core.c gs_pre_fabric): CUDA maps every
cuMemCreate allocation into the fabric address space on GPUs whose NVLink fabric is up,
and fails the allocation when that is refused (JAX, NCCL). The fabric object allocates no
video memory but keeps its hVidMem alive (580 mem_mgr/mem_fabric.c), so it holds that
memory's charge; a flexible object, whose memory comes through controls the core does not
decode, is answered NV_ERR_NOT_SUPPORTED."""

from __future__ import annotations

import ctypes
import struct

import pytest

from test_core import ALLOC, DEV, DUP, FREE, Proc, cs, env, so  # noqa: F401  (fixtures)
from coreshim import GiB, MiB, abi

PAGE_2M = 2 * MiB


def fabric_params(h_vid: int, size: int, flags: int = 0, page: int = PAGE_2M):
    b = ctypes.create_string_buffer(abi.NV00F8_ALLOC_PARAMS_SIZE)
    # alignment, allocSize, pageSize, allocFlags, pad, map.offset, map.hVidMem, map.flags
    struct.pack_into("<QQQIIQII", b, 0, page, size, page, flags, 0, 0, h_vid, 0)
    return b


def fabric(p: Proc, h_vid: int, size: int, flags: int = 0, driver=None):
    params = fabric_params(h_vid, size, flags)
    h = p.next = p.next + 1
    arg = cs.alloc_arg(p.client, DEV, h, abi.NV_MEMORY_FABRIC, cs.addr(params))
    r = p.core.call(ALLOC, arg, driver or p.rm.alloc, file_id=p.file_id, pid=p.pid)
    return r, h


def test_fabric_of_own_memory_passes_and_charges_nothing_more(env):
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(512 * MiB)
    r, _ = fabric(p, vid, 512 * MiB)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_PASS, 0, cs.GS_REFUSE_NONE)
    assert core.stats()["used"] == 512 * MiB
    assert core.stats()["refused_filter"] == 0


def test_freeing_the_memory_under_a_fabric_object_keeps_its_charge(env):
    """The attack: map memory into the fabric, free the memory, allocate again. RM keeps
    the first allocation alive through the fabric object, so its charge must stay."""
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(768 * MiB)
    _, fab = fabric(p, vid, 768 * MiB)
    assert p.free(vid).verdict == cs.GS_PASS
    assert core.stats()["used"] == 768 * MiB
    r, _ = p.mem(512 * MiB)
    assert r.refusal == cs.GS_REFUSE_QUOTA
    p.free(fab)
    assert core.stats()["used"] == 0
    assert p.mem(512 * MiB)[0].verdict == cs.GS_PASS


def test_a_fabric_object_freed_first_leaves_the_memory_charged(env):
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(256 * MiB)
    _, fab = fabric(p, vid, 256 * MiB)
    p.free(fab)
    assert core.stats()["used"] == 256 * MiB
    p.free(vid)
    assert core.stats()["used"] == 0


def test_a_failed_fabric_allocation_keeps_its_reference_until_the_client_goes(env):
    """A failure status may be a sibling thread's rewrite of RM's success (the reply page is
    writable once the driver copies out), and RM's per-process count does not see what a
    fabric object holds: the client keeps the reference. An ioctl that failed (the driver
    did not run the call) takes none."""
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(256 * MiB)

    def refuse(arg: bytearray) -> int:
        struct.pack_into("<I", arg, 40, abi.NV_ERR_INVALID_ARGUMENT)
        return 0

    r, _ = fabric(p, vid, 256 * MiB, driver=refuse)
    assert r.status == abi.NV_ERR_INVALID_ARGUMENT
    p.free(vid)
    assert core.stats()["used"] == 256 * MiB
    core.file_closed(p.file_id)
    assert core.stats()["used"] == 0
    q = Proc(core, rm, file_id=2, pid=101)
    _, vid = q.mem(256 * MiB)
    fabric(q, vid, 256 * MiB, driver=lambda arg: -5)
    q.free(vid)
    assert core.stats()["used"] == 0


def forge_status(rm, status: int):
    """RM makes the object, then a sibling thread rewrites the reply's status."""
    def drv(arg: bytearray) -> int:
        rm.alloc(arg)
        struct.pack_into("<I", arg, 40, status)
        return 0
    return drv


def test_a_success_rewritten_to_a_failure_uncharges_nothing(env):
    """The attack: map, have the reply say it failed, free the memory, allocate again."""
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(768 * MiB)
    r, _ = fabric(p, vid, 768 * MiB, driver=forge_status(rm, abi.NV_ERR_INVALID_ARGUMENT))
    assert r.verdict == cs.GS_PASS
    p.free(vid)
    assert core.stats()["used"] == 768 * MiB
    assert p.mem(512 * MiB)[0].refusal == cs.GS_REFUSE_QUOTA


def rm_chosen(p: Proc, vid: int, size: int):
    params = fabric_params(vid, size)
    return cs.alloc_arg(p.client, DEV, 0, abi.NV_MEMORY_FABRIC, cs.addr(params)), params


def test_an_rm_chosen_handle_rewritten_uncharges_nothing(env):
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(768 * MiB)
    arg, _params = rm_chosen(p, vid, 768 * MiB)

    def drv(a: bytearray) -> int:
        rm.alloc(a)
        struct.pack_into("<I", a, 8, p.client)  # the new handle rewritten to a registered one
        return 0

    assert core.call(ALLOC, arg, drv, file_id=p.file_id, pid=p.pid).verdict == cs.GS_PASS
    p.free(vid)
    assert core.stats()["used"] == 768 * MiB


def test_a_lost_reply_with_an_rm_chosen_handle_uncharges_nothing(env):
    """The glue could not read the reply back (a sibling unmapped it mid-call): the object
    may exist under a handle nobody knows; the client keeps the reference."""
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(768 * MiB)
    arg, _params = rm_chosen(p, vid, 768 * MiB)
    out = (ctypes.c_int32 * 4)()
    buf = (ctypes.c_char * len(arg)).from_buffer(arg)
    c = core.lib.t_pre(core.inst, cs.GS_FILE_CTL, 0, ALLOC, buf, len(arg), p.file_id, p.pid, out)
    assert out[0] == cs.GS_PASS
    core.lib.t_set_reply_lost(c)
    core.lib.t_post(core.inst, c, 0)
    del buf
    p.free(vid)
    assert core.stats()["used"] == 768 * MiB
    core.file_closed(p.file_id)
    assert core.stats()["used"] == 0


@pytest.mark.parametrize("klass", [abi.NV_MEMORY_FABRIC, abi.NV50_MEMORY_VIRTUAL])
def test_a_success_forged_over_a_live_handle_forgets_nothing(env, klass):
    """RM answers INSERT_DUPLICATE_NAME for a live handle, which a sibling could rewrite to
    NV_OK: the core answers it before RM runs, and the registered object and its charge stay."""
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(256 * MiB)
    _, m2 = p.mem(512 * MiB)
    params = fabric_params(vid, 256 * MiB)
    arg = cs.alloc_arg(p.client, DEV, m2, klass, cs.addr(params) if klass == abi.NV_MEMORY_FABRIC else 0)
    r = core.call(ALLOC, arg, lambda a: struct.pack_into("<I", a, 40, 0) or 0, file_id=p.file_id, pid=p.pid)
    # refused before RM runs, as RM refuses it: no reply to forge
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME)
    assert core.stats()["used"] == 768 * MiB
    p.free(m2)
    assert core.stats()["used"] == 256 * MiB


def test_a_duplicate_of_a_fabric_object_keeps_the_charge_until_both_go(env):
    core, rm = env
    a = Proc(core, rm)
    b = Proc(core, rm, file_id=2, pid=101)
    _, vid = a.mem(512 * MiB)
    _, fab = fabric(a, vid, 512 * MiB)
    arg = cs.dup_arg(b.client, DEV, 0x7777, a.client, fab)
    assert core.call(DUP, arg, rm.ok(24), file_id=2, pid=101).verdict == cs.GS_PASS
    core.file_closed(a.file_id)
    assert core.stats()["used"] == 512 * MiB
    core.file_closed(b.file_id)
    assert core.stats()["used"] == 0


def test_the_client_going_frees_fabric_and_memory(env):
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(256 * MiB)
    fabric(p, vid, 256 * MiB)
    p.free(vid)
    core.file_closed(p.file_id)
    assert core.stats()["used"] == 0 and core.stats()["objects"] == 0


def test_flexible_fabric_objects_answered_not_supported_and_not_passed(env):
    core, rm = env
    p = Proc(core, rm)
    passed = []
    r, _ = fabric(p, 0, GiB, flags=abi.NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA,
                  driver=lambda arg: passed.append(arg) or 0)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CLASS)
    assert not passed


def test_fabric_without_readable_parameters_is_refused(env):
    core, rm = env
    p = Proc(core, rm)
    arg = cs.alloc_arg(p.client, DEV, 0x4444, abi.NV_MEMORY_FABRIC, 0)
    r = core.call(ALLOC, arg, rm.alloc)
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INVALID_POINTER)


def test_fabric_of_another_clients_memory_takes_no_charge_of_it(env):
    """RM looks hVidMem up in the calling client only; a handle of another client of the
    instance names nothing there, and the core takes no reference of that client's memory."""
    core, rm = env
    a = Proc(core, rm)
    b = Proc(core, rm, file_id=2, pid=101)
    _, vid = a.mem(256 * MiB)
    fabric(b, vid, 256 * MiB)  # RM (the mock) makes it; the real one answers INVALID_OBJECT
    a.free(vid)
    assert core.stats()["used"] == 0


@pytest.mark.parametrize("cmd", [abi.NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL])
def test_imex_channel_subscription_refused_as_rm_refuses_a_non_channel_fd(env, cmd):
    core, rm = env
    p = Proc(core, rm)
    r, _ = p.control(p.client, cmd, ctypes.create_string_buffer(16), 16)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INSUFFICIENT_PERMISSIONS,
                                                cs.GS_REFUSE_FOREIGN)


def test_a_free_of_the_memory_racing_the_fabric_allocation_uncharges_nothing(env):
    """hVidMem freed while the fabric allocation naming it is with RM: RM may have taken
    its reference already, so the charge the core referenced in gs_pre() stays."""
    core, rm = env
    p = Proc(core, rm)
    _, vid = p.mem(256 * MiB)
    inner = {}

    def during(arg: bytearray) -> int:
        inner["r"] = p.free(vid)
        return rm.alloc(arg)

    _, fab = fabric(p, vid, 256 * MiB, driver=during)
    assert inner["r"].verdict == cs.GS_PASS
    assert core.stats()["used"] == 256 * MiB
    p.free(fab)
    assert core.stats()["used"] == 0

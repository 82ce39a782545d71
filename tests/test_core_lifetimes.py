"""RM's lifetimes in the core's registry (kmod/core/registry.c): dependants RM invalidates with
what they depend on, handles RM refuses to reuse, frees racing creations under an ancestor,
parents registered after their children, and the caps on what a tenant could exhaust for
everyone (TSGs, OS events). Each test failed on the core before these rules."""

from __future__ import annotations

import ctypes
import struct

from test_core import ALLOC, DEV, FREE, Proc, cs, env, so  # noqa: F401  (fixtures)
from coreshim import GiB, MiB, abi

VAS, TSG, CTX, CH = 0x5A5, 0x700, 0x7C0, 0x701


def tsg_params(vas: int = 0, engine: int = 1):
    b = ctypes.create_string_buffer(64)
    struct.pack_into("<II", b, 8, vas, engine)
    return b


def chan_params(ctx: int = 0, vas: int = 0, userd: int = 0):
    b = ctypes.create_string_buffer(abi.NV_CHANNEL_ALLOC_PARAMS_SIZE if hasattr(abi, "NV_CHANNEL_ALLOC_PARAMS_SIZE")
                                    else 368)
    struct.pack_into("<III", b, 24, ctx, vas, userd)
    return b


def ctxshare_params(vas: int):
    b = ctypes.create_string_buffer(12)
    struct.pack_into("<I", b, 0, vas)
    return b


def gated(core) -> list[int]:
    return sorted(o["handle"] for o in core.objects() if o["kind"] == cs.OBJ_CHANNEL and o["gateable"])


def chan_events(core) -> list[tuple[int, int]]:
    return [(e["type"], e["handle"]) for e in core.events()
            if e["type"] in (cs.EV_CHANNEL_NEW, cs.EV_CHANNEL_DEL, cs.EV_TSG_DEL)]


def scheduled_tsg(p: Proc, vas: int = VAS):
    """A VA space, a TSG on it, a subcontext on it and a channel in the TSG, scheduled."""
    keep = [tsg_params(vas), ctxshare_params(vas), chan_params(ctx=CTX)]
    assert p.alloc(DEV, abi.FERMI_VASPACE_A, vas)[0].status == 0
    assert p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, TSG, keep[0])[0].status == 0
    assert p.alloc(TSG, abi.FERMI_CONTEXT_SHARE_A, CTX, keep[1])[0].status == 0
    assert p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, CH, keep[2])[0].status == 0
    p.control(TSG, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    return keep


def test_a_freed_va_space_takes_its_tsg_and_channel_out_of_the_scheduler(env):
    """RM invalidates the TSG (hVASpace) and its channel when the VA space goes
    (rs_server.c clientUpdatePendingFreeList over depRefMap): the controller is told they are
    gone, and no disable is sent for a channel RM no longer has (it would fail the batch)."""
    core, rm = env
    p = Proc(core, rm)
    keep = scheduled_tsg(p)
    assert gated(core) == [CH]
    core.events()
    assert p.free(VAS).status == 0
    ev = chan_events(core)
    assert (cs.EV_CHANNEL_DEL, CH) in ev and (cs.EV_TSG_DEL, TSG) in ev
    assert gated(core) == []
    # RM keeps the invalidated handles until the caller frees them: so does the core
    assert {TSG, CH, CTX} <= {o["handle"] for o in core.objects()}
    del keep


def test_a_handle_rm_keeps_is_not_made_again(env):
    """Under the invalidated TSG's handle RM answers NV_ERR_INSERT_DUPLICATE_NAME
    (rs_client.c clientAllocResource): so does the core, before RM, for memory, a TSG or a
    dup; 8 GiB under a 1 GiB limit through the stale handle was the escape."""
    core, rm = env
    p = Proc(core, rm)
    keep = scheduled_tsg(p)
    assert p.free(VAS).status == 0
    mp = cs.mem_params(512 * MiB)
    r, _, _ = p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, TSG, mp)
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME)
    r, _, _ = p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, CH, tsg_params())
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME)
    _, h = p.mem(64 * MiB)
    arg = cs.dup_arg(p.client, DEV, TSG, p.client, h)
    r = core.call(abi.IOCTL_RM_DUP_OBJECT, arg, rm.ok(24), file_id=p.file_id, pid=p.pid)
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME)
    assert core.stats()["used"] == 64 * MiB
    # freed by the caller, the handle can be used again
    assert p.free(CH, parent=TSG).status == 0 and p.free(TSG).status == 0
    assert p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, TSG, mp)[0].status == 0
    assert core.stats()["used"] == 576 * MiB
    del keep


def test_a_freed_subcontext_takes_its_channel_out_of_the_scheduler(env):
    core, rm = env
    p = Proc(core, rm)
    keep = scheduled_tsg(p)
    core.events()
    assert p.free(CTX, parent=TSG).status == 0
    assert (cs.EV_CHANNEL_DEL, CH) in chan_events(core) and gated(core) == []
    # the TSG itself did not depend on the subcontext: still there, and its new channels gated
    keep2 = chan_params()
    assert p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, 0x702, keep2)[0].status == 0
    assert gated(core) == [0x702]
    del keep


def test_a_channel_made_before_its_tsg_is_registered_is_gated(env):
    """RM made the TSG, and a sibling thread a channel in it, before the TSG's reply reached the
    core: the channel (a stray) is adopted when the TSG registers, and gated with it."""
    core, rm = env
    p = Proc(core, rm)
    tp = tsg_params()
    seen = {}

    def tsg_then_channel(arg: bytearray) -> int:
        rm.alloc(arg)
        cp = chan_params()
        seen["ch"] = p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, CH, cp)[0]
        return 0

    arg = cs.alloc_arg(p.client, DEV, TSG, abi.KEPLER_CHANNEL_GROUP_A, cs.addr(tp))
    assert core.call(ALLOC, arg, tsg_then_channel, file_id=p.file_id, pid=p.pid).status == 0
    assert seen["ch"].status == 0
    p.control(TSG, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    assert gated(core) == [CH]
    assert p.free(TSG).status == 0
    assert gated(core) == [] and CH not in {o["handle"] for o in core.objects()}


def test_a_free_of_the_va_space_racing_a_channel_that_depends_on_it_waits(env):
    """A channel naming the VA space is with RM, and a sibling frees the VA space: RM could make
    the channel and invalidate it before the core registers it, which would then keep it
    gated for good. The free is answered NV_ERR_STATE_IN_USE."""
    core, rm = env
    p = Proc(core, rm)
    assert p.alloc(DEV, abi.FERMI_VASPACE_A, VAS)[0].status == 0
    assert p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, TSG, tsg_params())[0].status == 0
    ctx = ctxshare_params(VAS)
    assert p.alloc(TSG, abi.FERMI_CONTEXT_SHARE_A, CTX, ctx)[0].status == 0
    seen = {}

    def during(arg: bytearray) -> int:
        seen["free"] = p.free(CTX, parent=TSG)
        return rm.alloc(arg)

    cp = chan_params(ctx=CTX)
    arg = cs.alloc_arg(p.client, TSG, CH, abi.HOPPER_CHANNEL_GPFIFO_A, cs.addr(cp))
    assert core.call(ALLOC, arg, during, file_id=p.file_id, pid=p.pid).status == 0
    assert (seen["free"].verdict, seen["free"].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)


def test_tsgs_are_capped_per_instance(env):
    """TSG ids are a pool per runlist for the whole GPU: a tenant gets 256 (core_int.h)."""
    core, rm = env
    p = Proc(core, rm)
    made = 0
    for i in range(300):
        r, _, _ = p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x10000 + i, tsg_params())
        if r.verdict != cs.GS_PASS:
            assert (r.status, r.refusal) == (abi.NV_ERR_INSUFFICIENT_RESOURCES, cs.GS_REFUSE_LIMIT)
            break
        made += 1
    assert made == 256
    assert p.free(0x10000).status == 0
    assert p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x20000, tsg_params())[0].verdict == cs.GS_PASS


def os_event(p: Proc, fd: int, req=abi.IOCTL_ALLOC_OS_EVENT, status: int = 0, file_id=None):
    arg = bytearray(abi.ALLOC_OS_EVENT.pack(p.client, DEV, fd, 0))

    def drv(a: bytearray) -> int:
        struct.pack_into("<I", a, 12, status)
        return 0
    return p.core.call(req, arg, drv, file_id=file_id or p.file_id, pid=p.pid)


def test_os_events_are_capped_per_instance_and_forged_failures_do_not_uncount(env):
    """NV_ESC_ALLOC_OS_EVENT appends to one list for the host, scanned with interrupts off
    (osapi.c allocate_os_event): 1024 per instance. A reply rewritten to a failure still
    counts; FREE_OS_EVENT, the client's free and the file's release give them back."""
    core, rm = env
    p = Proc(core, rm)
    for fd in range(1024):
        assert os_event(p, fd, status=abi.NV_ERR_INVALID_ARGUMENT if fd % 2 else 0).verdict == cs.GS_PASS
    r = os_event(p, 5000)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INSUFFICIENT_RESOURCES, cs.GS_REFUSE_LIMIT)
    assert os_event(p, 7).verdict == cs.GS_PASS  # a key RM has already: nothing new
    assert os_event(p, 7, req=abi.IOCTL_RM_FREE_OS_EVENT).verdict == cs.GS_PASS
    assert os_event(p, 5000).verdict == cs.GS_PASS
    assert os_event(p, 5001).verdict == cs.GS_REPLY
    core.file_closed(p.file_id)
    q = Proc(core, rm, file_id=2, pid=101)
    for fd in range(1024):
        assert os_event(q, fd).verdict == cs.GS_PASS
    assert q.free(q.client, parent=0).status == 0
    r = Proc(core, rm, file_id=3, pid=102)
    assert os_event(r, 1).verdict == cs.GS_PASS


def test_a_files_teardown_frees_every_client_once(env, so):
    """Closing a file frees each of its clients' trees once, by the instance's list of
    clients (tests/bench_core_teardown.py prints how the time grows with the clients)."""
    core, rm = env
    a = Proc(core, rm, file_id=9)
    others = [Proc(core, rm, file_id=9, pid=100 + i) for i in range(50)]
    b = Proc(core, rm, file_id=10, pid=300)
    a.mem(64 * MiB)
    b.mem(32 * MiB)
    core.file_closed(9)
    assert {o["client"] for o in core.objects()} == {b.client}
    assert core.stats()["used"] == 32 * MiB
    assert core.pids() == [300]
    del others


def test_535s_memory_mapper_placeholder_holds_no_memory(tmp_path):
    """535's NV_MEMORY_MAPPER_ALLOCATION_PARAMS is one placeholder byte (cl00fe.h): RM holds
    no semaphore surface, and the byte must not be read as the low byte of a handle whose
    memory the mapper would then keep charged after its free."""
    lib_so = cs.build(tmp_path)
    core = cs.Core(lib_so, 1 * GiB)
    try:
        core.lib.gs_abi_select.argtypes = [ctypes.c_char_p]
        assert core.lib.gs_abi_select(b"535.288.01") == 0
        rm = cs.MockRM()
        p = Proc(core, rm)
        mp = cs.mem_params(64 * MiB)
        assert p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, 0x5, mp)[0].status == 0
        placeholder = ctypes.create_string_buffer(b"\x05", 1)
        assert p.alloc(DEV, abi.NV_MEMORY_MAPPER, 0x6, placeholder)[0].status == 0
        assert p.free(0x5).status == 0
        assert core.stats()["used"] == 0
    finally:
        core.close()


def test_a_channel_stays_gated_when_its_userd_memory_goes(env):
    """From 570 on RM invalidates a channel whose OS-descriptor USERD memory is freed
    (kernel_channel_gv100.c:246-254), but RM does not fix where that memory is, so the core
    cannot tell a forged record under its handle from RM's: it does not follow that edge and
    keeps the channel gated (the scheduler drops a channel RM answers as gone)."""
    core, rm = env
    p = Proc(core, rm)
    a = bytearray(56)  # NVOS02 with its fd: OS-descriptor memory at 0x900
    struct.pack_into("<IIIII", a, 0, p.client, DEV, 0x900, abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, 0)
    struct.pack_into("<Q", a, 32, 0xFFFF)
    assert core.call(abi.IOCTL_RM_ALLOC_MEMORY, a, rm.ok(40), file_id=p.file_id, pid=p.pid).status == 0
    assert p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, TSG, tsg_params())[0].status == 0
    cp = chan_params(userd=0x900)
    assert p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, CH, cp)[0].status == 0
    p.control(TSG, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    assert p.free(0x900).status == 0
    assert gated(core) == [CH]


def forged(status: int = 0):
    def drv(a: bytearray) -> int:
        struct.pack_into("<I", a, 40, status)
        return 0
    return drv


def test_a_forged_record_elsewhere_cannot_take_a_live_tsg_out_of_the_scheduler(env):
    """RM makes VA space V under device D (its reply rewritten to a failure: the core does not
    register it), then refuses V under another parent A (its reply rewritten to a success: the
    core registers V under A). A TSG on V, under D, depends in RM on the real V. Freeing A frees
    nothing of RM's TSG: the core must not drop it either. It follows a dependency only to a VA
    space of the dependant's own device (core.c gs_dep_placed())."""
    core, rm = env
    p = Proc(core, rm)
    d2 = 0x5C0000D2
    assert p.alloc(p.client, abi.NV01_DEVICE_0, d2)[0].status == 0
    arg = cs.alloc_arg(p.client, DEV, VAS, abi.FERMI_VASPACE_A)
    core.call(ALLOC, arg, forged(abi.NV_ERR_INVALID_ARGUMENT), file_id=p.file_id, pid=p.pid)
    arg = cs.alloc_arg(p.client, d2, VAS, abi.FERMI_VASPACE_A)
    assert core.call(ALLOC, arg, forged(0), file_id=p.file_id, pid=p.pid).status == 0
    keep = [tsg_params(VAS), chan_params()]
    assert p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, TSG, keep[0])[0].status == 0
    assert p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, CH, keep[1])[0].status == 0
    p.control(TSG, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    assert gated(core) == [CH]
    assert p.free(d2, parent=p.client).status == 0
    assert gated(core) == [CH]


def test_one_handle_made_twice_at_once_waits(env):
    """Two creations of one handle in flight: RM makes one and refuses the other, whose reply a
    sibling could rewrite to a success, under another parent than RM's object. The later is
    answered NV_ERR_STATE_IN_USE."""
    core, rm = env
    p = Proc(core, rm)
    seen = {}

    def during(a: bytearray) -> int:
        seen["r"] = p.alloc(DEV, abi.FERMI_VASPACE_A, VAS)[0]
        return rm.alloc(a)

    arg = cs.alloc_arg(p.client, DEV, VAS, abi.FERMI_VASPACE_A)
    assert core.call(ALLOC, arg, during, file_id=p.file_id, pid=p.pid).status == 0
    assert (seen["r"].verdict, seen["r"].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)



def test_an_object_cannot_be_its_own_parent_nor_adopt_its_ancestor(env):
    """RM looks a parent up before it makes an object: handle == parent is answered
    NV_ERR_INVALID_OBJECT_PARENT before RM. And a stray whose awaited parent turns out to be
    below it (forged replies) is not adopted: no cycle leaves records unreachable from their
    client, which are all freed with it."""
    core, rm = env
    p = Proc(core, rm)
    r, _, _ = p.alloc(0x7C1, abi.NV50_MEMORY_VIRTUAL, 0x7C1)
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INVALID_OBJECT_PARENT)
    assert p.alloc(0x7C3, abi.NV50_MEMORY_VIRTUAL, 0x7C2)[0].verdict == cs.GS_PASS  # a stray of 0x7C3
    assert p.alloc(0x7C2, abi.NV50_MEMORY_VIRTUAL, 0x7C3)[0].verdict == cs.GS_PASS  # 0x7C3 under 0x7C2
    core.file_closed(p.file_id)
    assert core.stats()["objects"] == 0


def test_objects_waiting_for_their_parent_are_capped(env):
    """Objects whose parent has not registered wait to be adopted, and every registration
    looks through them: 256 wait (core_int.h GS_MAX_STRAYS); past that an object is freed
    with its client only, never stalling the instance's registrations."""
    core, rm = env
    p = Proc(core, rm)
    parent = 0x7A000
    for i in range(300):
        assert p.alloc(parent, abi.NV50_MEMORY_VIRTUAL,
                       0x7B000 + i)[0].verdict == cs.GS_PASS
    # the parent's reply comes: the first 256 are adopted and go with it
    assert p.alloc(DEV, abi.NV50_MEMORY_VIRTUAL, parent)[0].status == 0
    assert p.free(parent).status == 0
    left = {o["handle"] for o in core.objects()} & {0x7B000 + i for i in range(300)}
    assert len(left) == 44
    core.file_closed(p.file_id)
    assert core.stats()["objects"] == 0


def test_os_event_calls_on_one_key_or_its_client_do_not_meet(env):
    """An OS event's free and a new allocation of its key, or its client's free, in flight
    together: RM may run them in the other order and keep an entry the core forgot (osapi.c
    allocate_os_event does not check the client). The later is answered NV_ERR_STATE_IN_USE."""
    core, rm = env
    p = Proc(core, rm)
    assert os_event(p, 0).verdict == cs.GS_PASS
    seen = {}

    def alloc_meanwhile(a: bytearray) -> int:
        seen["alloc"] = os_event(p, 0)
        struct.pack_into("<I", a, 12, 0)
        return 0

    arg = bytearray(abi.ALLOC_OS_EVENT.pack(p.client, DEV, 0, 0))
    core.call(abi.IOCTL_RM_FREE_OS_EVENT, arg, alloc_meanwhile, file_id=p.file_id, pid=p.pid)
    assert (seen["alloc"].verdict, seen["alloc"].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)

    def client_free_meanwhile(a: bytearray) -> int:
        seen["free"] = p.free(p.client, parent=0)
        struct.pack_into("<I", a, 12, 0)
        return 0

    arg = bytearray(abi.ALLOC_OS_EVENT.pack(p.client, DEV, 5, 0))
    core.call(abi.IOCTL_ALLOC_OS_EVENT, arg, client_free_meanwhile, file_id=p.file_id, pid=p.pid)
    assert (seen["free"].verdict, seen["free"].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)


def memory_made_while_a_sibling_frees(p: Proc, victim: int, parent: int):
    """RM makes 1 MiB of memory under DEV, then a sibling sharing the session (the fuzzer's fork
    child) frees `victim`, an ancestor of it, and that free runs whole before the allocation's
    reply reaches the core. Returns whether the free ran (RM then freed the memory too)."""
    seen = {}

    def freed_meanwhile(arg: bytearray) -> int:
        ret = p.rm.alloc(arg)
        seen["free"] = p.free(victim, parent=parent)
        return ret

    mp = cs.mem_params(1 * MiB)
    arg = cs.alloc_arg(p.client, DEV, 0x5D000101, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp))
    assert p.core.call(ALLOC, arg, freed_meanwhile, file_id=p.file_id, pid=p.pid).status == 0
    return (seen["free"].verdict, seen["free"].status) == (cs.GS_PASS, 0)


def test_a_client_freed_while_memory_under_it_is_with_rm_leaves_no_charge(env):
    """The fuzzer's old 1 MiB mismatch (docs/fuzzing.md): a fork child freed the session's
    client while the parent's 1 MiB allocation under its device was with RM. The core before
    the lifetimes let the free through (its busy check compared only the new handle), forgot
    the client, then registered the memory under the client it had forgotten: 1 MiB charged
    that RM had freed, and still charged after the file's release, since a release frees
    clients and no client owned it. Now the free is answered NV_ERR_STATE_IN_USE (or, had it
    run, nothing would be registered under the gone client)."""
    core, rm = env
    p = Proc(core, rm)
    freed = memory_made_while_a_sibling_frees(p, p.client, 0)
    assert core.stats()["used"] == (0 if freed else 1 * MiB)  # what RM holds
    core.file_closed(p.file_id)
    assert core.stats()["used"] == 0 and core.stats()["objects"] == 0


def test_a_device_freed_while_memory_under_it_is_with_rm_leaves_no_charge(env):
    """The same with the device freed: before the lifetimes the core kept 1 MiB charged for
    memory RM had freed with the device, until the client went."""
    core, rm = env
    p = Proc(core, rm)
    freed = memory_made_while_a_sibling_frees(p, DEV, p.client)
    assert core.stats()["used"] == (0 if freed else 1 * MiB)
    core.file_closed(p.file_id)
    assert core.stats()["used"] == 0

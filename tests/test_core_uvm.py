"""Video memory that nvidia-uvm keeps alive, in the decision core (kmod/core/uvm.c).

UVM_MAP_EXTERNAL_ALLOCATION has UVM duplicate the RM memory object into its own client,
per GPU named (580 kernel-open/nvidia-uvm/uvm_map_external.c), so freeing the tenant's
handle frees nothing while the mapping lives, and RM's per-process count no longer sees
it. The core keeps the memory's charge until UVM is known to have let go: a successful
UVM_FREE of the range or UVM_UNMAP_EXTERNAL on every GPU, read where the caller could not
rewrite it (gs_call.reply_trusted), or the release of the nvidia-uvm file."""

from __future__ import annotations

import ctypes
import struct

import pytest

from test_core import ALLOC, DEV, FREE, Proc, cs, env, so  # noqa: F401  (fixtures)
from coreshim import GiB, MiB, abi

UVM_FILE = 77
GPU0 = bytes(range(16))
GPU1 = bytes(range(16, 32))
BASE = 0x7F0000000000


def map_arg(client: int, memory: int, base: int, length: int, gpus=(GPU0,)) -> bytearray:
    b = bytearray(abi.UVM_PARAMS[abi.UVM_MAP_EXTERNAL_ALLOCATION][0])
    struct.pack_into("<QQQ", b, 0, base, length, 0)
    for i, g in enumerate(gpus):
        b[24 + 36 * i:24 + 36 * i + 16] = g
    struct.pack_into("<QiII", b, 9240, len(gpus), 3, client, memory)
    return b


def range_arg(base: int, length: int) -> bytearray:
    b = bytearray(24)
    struct.pack_into("<QQ", b, 0, base, length)
    return b


def unmap_arg(base: int, length: int, gpu: bytes) -> bytearray:
    b = bytearray(40)
    struct.pack_into("<QQ", b, 0, base, length)
    b[16:32] = gpu
    return b


def rm_status(status_off: int, status: int = 0):
    def drv(arg: bytearray) -> int:
        struct.pack_into("<I", arg, status_off, status)
        return 0
    return drv


def uvm(core, cmd: int, arg: bytearray, status: int = 0, *, trusted=True, ret=0, file_id=UVM_FILE):
    off = abi.UVM_PARAMS[cmd][1]
    return core.call(cmd, arg, rm_status(off, status) if ret == 0 else (lambda a: ret),
                     kind=cs.GS_FILE_UVM, file_id=file_id, trusted=trusted)


def mapped(p: Proc, size: int, base: int = BASE, gpus=(GPU0,)):
    _, h = p.mem(size)
    r = uvm(p.core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, h, base, size, gpus))
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)
    return h


DECIDED = (abi.UVM_REGISTER_CHANNEL, abi.UVM_UNREGISTER_CHANNEL, abi.UVM_MAP_EXTERNAL_ALLOCATION,
           abi.UVM_FREE, abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, abi.UVM_UNMAP_EXTERNAL,
           abi.UVM_ALLOC_SEMAPHORE_POOL)


def test_the_core_decides_what_makes_uvm_hold_or_let_go_by_the_block(so):
    """The blocks the glue copies for the core, and where their status is: as the ABI
    mirror (pyctl/gpuslice/abi.py, checked against nvrm_abi.h by test_nvstub_abi.py)."""
    core = cs.Core(so, GiB)
    try:
        lib = core.lib
        for cmd in DECIDED:
            size, status, _ = abi.UVM_PARAMS[cmd]
            assert (lib.t_uvm_arg_size(cmd), lib.t_uvm_status_off(cmd)) == (size, status), cmd
        for cmd in set(abi.UVM_IOCTLS) - set(DECIDED):
            assert lib.t_uvm_arg_size(cmd) == 0, cmd
    finally:
        core.close()


def test_map_free_repeat_stays_within_the_limit(env):
    """The attack: map the memory into UVM, free the RM handle, allocate again. UVM holds
    each allocation, so each keeps its charge and the limit holds."""
    core, rm = env
    p = Proc(core, rm)
    for i in range(4):
        h = mapped(p, 256 * MiB, BASE + i * GiB)
        assert p.free(h).verdict == cs.GS_PASS
    assert core.stats()["used"] == GiB
    r, _ = p.mem(256 * MiB)
    assert r.refusal == cs.GS_REFUSE_QUOTA


def test_uvm_free_of_the_range_gives_the_charge_back(env):
    core, rm = env
    p = Proc(core, rm)
    for _ in range(8):  # cuMemAlloc / cuMemFree, eight times the limit in all
        h = mapped(p, 512 * MiB)
        assert uvm(core, abi.UVM_FREE, range_arg(BASE, 512 * MiB)).status == 0
        p.free(h)
        assert core.stats()["used"] == 0


def test_the_charge_stays_while_either_holds_the_memory(env):
    core, rm = env
    p = Proc(core, rm)
    h = mapped(p, 256 * MiB)
    uvm(core, abi.UVM_FREE, range_arg(BASE, 256 * MiB))
    assert core.stats()["used"] == 256 * MiB  # the handle still holds it
    p.free(h)
    assert core.stats()["used"] == 0


@pytest.mark.parametrize("how", ["failed", "untrusted", "ioctl-error", "other-range", "partial"])
def test_a_free_that_is_not_known_to_have_freed_keeps_the_charge(env, how):
    """A failure, a reply the caller could have rewritten (its page is writable once the
    driver copies out), a free that never ran, another range, part of the range: UVM may
    still hold the memory, so it stays charged."""
    core, rm = env
    p = Proc(core, rm)
    h = mapped(p, 256 * MiB)
    p.free(h)
    arg = range_arg(BASE, 256 * MiB)
    kw = {}
    if how == "failed":
        kw["status"] = 0x1E  # NV_ERR_INVALID_ADDRESS
    elif how == "untrusted":
        kw["trusted"] = False
    elif how == "ioctl-error":
        kw["ret"] = -11
    elif how == "other-range":
        arg = range_arg(BASE + GiB, 256 * MiB)
    elif how == "partial":
        arg = range_arg(BASE, 128 * MiB)
    uvm(core, abi.UVM_FREE, arg, **kw)
    assert core.stats()["used"] == 256 * MiB
    uvm(core, abi.UVM_FREE, range_arg(BASE, 256 * MiB))
    assert core.stats()["used"] == 0


def test_a_forged_success_is_not_believed(env):
    """The driver's reply says the free failed, a sibling thread rewrites it to NV_OK:
    with the reply where the caller can write, the core does not uncharge."""
    core, rm = env
    p = Proc(core, rm)
    p.free(mapped(p, 256 * MiB))
    uvm(core, abi.UVM_FREE, range_arg(BASE, 256 * MiB), status=0, trusted=False)
    assert core.stats()["used"] == 256 * MiB


def test_unmap_must_cover_every_gpu(env):
    core, rm = env
    p = Proc(core, rm)
    p.free(mapped(p, 256 * MiB, gpus=(GPU0, GPU1)))
    uvm(core, abi.UVM_UNMAP_EXTERNAL, unmap_arg(BASE, 256 * MiB, GPU0))
    assert core.stats()["used"] == 256 * MiB
    uvm(core, abi.UVM_UNMAP_EXTERNAL, unmap_arg(BASE, 256 * MiB, GPU0))  # again: nothing
    assert core.stats()["used"] == 256 * MiB
    uvm(core, abi.UVM_UNMAP_EXTERNAL, unmap_arg(BASE, 128 * MiB, GPU1))  # a piece stays
    assert core.stats()["used"] == 256 * MiB
    uvm(core, abi.UVM_UNMAP_EXTERNAL, unmap_arg(BASE - GiB, 4 * GiB, GPU1))
    assert core.stats()["used"] == 0


def test_the_release_of_the_uvm_file_gives_everything_back(env):
    core, rm = env
    p = Proc(core, rm)
    for i in range(3):
        p.free(mapped(p, 128 * MiB, BASE + i * GiB))
    other = Proc(core, rm, file_id=2, pid=101)
    _, h = other.mem(128 * MiB)
    uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(other.client, h, BASE, 128 * MiB), file_id=78)
    other.free(h)
    assert core.stats()["used"] == 512 * MiB
    core.file_closed(UVM_FILE)
    assert core.stats()["used"] == 128 * MiB  # the other file's mapping stays
    core.file_closed(78)
    assert core.stats()["used"] == 0


def test_a_free_on_another_uvm_file_releases_nothing_of_this_one(env):
    core, rm = env
    p = Proc(core, rm)
    p.free(mapped(p, 256 * MiB))
    uvm(core, abi.UVM_FREE, range_arg(BASE, 256 * MiB), file_id=UVM_FILE + 1)
    assert core.stats()["used"] == 256 * MiB


def test_a_failed_or_refused_map_reply_still_holds_the_charge(env):
    """A map whose reply says it failed may have succeeded (a rewritten reply): the record
    is kept until the range is freed or the file goes."""
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(256 * MiB)
    uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, h, BASE, 256 * MiB), status=0x1E)
    p.free(h)
    assert core.stats()["used"] == 256 * MiB
    core.file_closed(UVM_FILE)
    assert core.stats()["used"] == 0


def test_a_map_the_driver_never_ran_takes_no_reference(env):
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(256 * MiB)
    uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, h, BASE, 256 * MiB), ret=-12)
    p.free(h)
    assert core.stats()["used"] == 0


def test_memory_of_a_client_not_the_instances_is_refused_as_rm_answers(env):
    """RM lets UVM duplicate an object of any client whose share policy allows it
    (RM_SHARE); another instance's client is answered as a client that does not exist."""
    core, rm = env
    r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(0xC1D00999, 0x1234, BASE, 2 * MiB))
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLIENT,
                                                 cs.GS_REFUSE_FOREIGN)
    p = Proc(core, rm)
    r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, 0xBEEF, BASE, 2 * MiB))
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_OBJECT_NOT_FOUND)


def test_a_map_with_no_gpu_or_too_many_is_left_to_uvm(env):
    """UVM refuses gpuAttributesCount 0 or above UVM_MAX_GPUS before duplicating anything
    (the driver reads the count the core checked): nothing to hold."""
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(256 * MiB)
    for n in (0, abi.UVM_MAX_GPUS + 1):
        arg = map_arg(p.client, h, BASE, 256 * MiB)
        struct.pack_into("<Q", arg, 9240, n)
        assert uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, arg).verdict == cs.GS_PASS
    p.free(h)
    assert core.stats()["used"] == 0


def test_memory_not_counted_is_mapped_without_a_record(env):
    core, rm = env
    p = Proc(core, rm)
    _, virt, _ = p.alloc(DEV, abi.NV50_MEMORY_VIRTUAL)
    r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, virt, BASE, 2 * MiB))
    assert r.verdict == cs.GS_PASS
    assert core.stats()["used"] == 0


def test_what_cannot_be_memory_is_refused_as_rm_refuses_it(env):
    """RM duplicates only Memory objects for UVM (mem.c memGetByHandle_IMPL:
    NV_ERR_INVALID_OBJECT_HANDLE otherwise, and for an invalidated object): the core answers
    so for a device, a TSG, a channel or an invalidated record, so that memory RM might have
    put under such a handle without the core is never held by UVM uncounted."""
    core, rm = env
    p = Proc(core, rm)
    tp = ctypes.create_string_buffer(64)
    struct.pack_into("<I", tp, 8, 0x5A5)
    assert p.alloc(DEV, abi.FERMI_VASPACE_A, 0x5A5)[0].status == 0
    assert p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x700, tp)[0].status == 0
    for h in (DEV, 0x700):
        r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, h, BASE, 2 * MiB))
        assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INVALID_OBJECT_HANDLE), hex(h)
    assert p.free(0x5A5).status == 0  # the TSG is invalidated, its handle kept
    r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, 0x700, BASE, 2 * MiB))
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INVALID_OBJECT_HANDLE)


def test_a_handle_freed_and_made_again_during_a_map_waits(env):
    """The map names (client, handle); a creation of that handle while the map is in
    flight could make UVM duplicate other memory than the core referenced."""
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(256 * MiB)
    arg = map_arg(p.client, h, BASE, 256 * MiB)
    seen = {}

    def driver(a: bytearray) -> int:
        assert p.free(h).verdict == cs.GS_PASS  # a free passes: the reference holds the charge
        mp = cs.mem_params(512 * MiB)
        r, _, _ = p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, handle=h, params=mp)
        seen["again"] = (r.verdict, r.status)
        return rm_status(9260)(a)

    core.call(abi.UVM_MAP_EXTERNAL_ALLOCATION, arg, driver, kind=cs.GS_FILE_UVM, file_id=UVM_FILE)
    assert seen["again"] == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)
    assert core.stats()["used"] == 256 * MiB


def test_records_are_bounded(env):
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(2 * MiB)
    arg = map_arg(p.client, h, BASE, 2 * MiB)
    n = 0
    while True:
        r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, bytearray(arg))
        if r.verdict != cs.GS_PASS:
            break
        n += 1
    assert n == 65536
    assert r.status == abi.NV_ERR_INSUFFICIENT_RESOURCES
    core.file_closed(UVM_FILE)
    assert uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, bytearray(arg)).verdict == cs.GS_PASS


CHANNEL = 0x9000


def channel(p: Proc, h: int) -> None:
    r = p.core.call(ALLOC, cs.alloc_arg(p.client, DEV, h, abi.HOPPER_CHANNEL_GPFIFO_A), p.rm.ok(40),
                    file_id=p.file_id)
    assert r.verdict == cs.GS_PASS


def register_channel(p: Proc, h: int, **kw):
    b = bytearray(56)
    b[0:16] = GPU0
    struct.pack_into("<iII", b, 16, 3, p.client, h)
    return uvm(p.core, abi.UVM_REGISTER_CHANNEL, b, **kw)


def unregister_channel(p: Proc, h: int, **kw):
    b = bytearray(28)
    b[0:16] = GPU1  # UVM finds the channel by client and handle alone
    struct.pack_into("<II", b, 16, p.client, h)
    return uvm(p.core, abi.UVM_UNREGISTER_CHANNEL, b, **kw)


def channels_left(p: Proc, start: int) -> int:
    n = 0
    while p.core.call(ALLOC, cs.alloc_arg(p.client, DEV, start + n, abi.HOPPER_CHANNEL_GPFIFO_A),
                      p.rm.ok(40)).verdict == cs.GS_PASS:
        n += 1
    for h in range(start, start + n):
        p.free(h)
    return n


def test_a_channel_uvm_retains_after_its_free_stays_counted(env):
    """The attack: make a channel, register it with UVM (which retains it with its TSG
    and GR context), free it, repeat. RM's framebuffer of a channel is counted nowhere;
    the channel cap is what bounds it, so retained channels count against it."""
    core, rm = env
    p = Proc(core, rm)
    for i in range(1024):
        channel(p, CHANNEL + i)
        assert register_channel(p, CHANNEL + i).verdict == cs.GS_PASS
        p.free(CHANNEL + i)
    assert channels_left(p, 0xA0000) == 0
    core.file_closed(UVM_FILE)  # the VA space goes: UVM lets go of them all
    assert channels_left(p, 0xA0000) == 1024


def test_a_registered_channel_counts_once_while_it_lives(env):
    core, rm = env
    p = Proc(core, rm)
    channel(p, CHANNEL)
    register_channel(p, CHANNEL)
    assert channels_left(p, 0xA0000) == 1023
    assert unregister_channel(p, CHANNEL).status == 0
    p.free(CHANNEL)
    assert channels_left(p, 0xA0000) == 1024


@pytest.mark.parametrize("how", ["failed", "untrusted", "other-handle"])
def test_a_retained_channel_stays_counted_until_uvm_is_known_to_let_go(env, how):
    core, rm = env
    p = Proc(core, rm)
    channel(p, CHANNEL)
    register_channel(p, CHANNEL)
    p.free(CHANNEL)
    if how == "failed":
        unregister_channel(p, CHANNEL, status=0x5A)
    elif how == "untrusted":
        unregister_channel(p, CHANNEL, trusted=False)
    else:
        unregister_channel(p, CHANNEL + 1)
    assert channels_left(p, 0xA0000) == 1023
    unregister_channel(p, CHANNEL)
    assert channels_left(p, 0xA0000) == 1024


def test_a_channel_of_another_client_is_refused_as_rm_answers(env):
    core, rm = env
    p = Proc(core, rm)
    b = bytearray(56)
    struct.pack_into("<iII", b, 16, 3, 0xC1D00999, CHANNEL)
    r = uvm(core, abi.UVM_REGISTER_CHANNEL, b)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLIENT,
                                                 cs.GS_REFUSE_FOREIGN)


def region(core, cmd: int, base: int, length: int, **kw):
    size = abi.UVM_PARAMS[cmd][0]
    b = bytearray(size)
    struct.pack_into("<QQ", b, 0, base, length)
    if cmd == abi.UVM_ALLOC_SEMAPHORE_POOL:
        struct.pack_into("<Q", b, size - 16, 1)  # gpuAttributesCount
    return uvm(core, cmd, b, **kw)


@pytest.mark.parametrize("cmd", [abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, abi.UVM_ALLOC_SEMAPHORE_POOL])
def test_ranges_backed_by_page_tables_alone_are_capped(env, cmd):
    """UVM backs a dynamic-parallelism region or a semaphore pool with page tables pinned in
    video memory (measured on the H100: 4 KiB per 4 KiB region, 2 million of them held
    7.8 GiB). CUDA makes one or two per context; the instance gets 1024 at a time."""
    core, rm = env
    n = 0
    while region(core, cmd, BASE + n * 2 * MiB, 4096).verdict == cs.GS_PASS:
        n += 1
    assert n == 1024
    r = region(core, cmd, BASE + n * 2 * MiB, 4096)
    assert (r.status, r.refusal) == (abi.NV_ERR_INSUFFICIENT_RESOURCES, cs.GS_REFUSE_LIMIT)
    uvm(core, abi.UVM_FREE, range_arg(BASE, 4096), status=0x1E)  # refused: nothing back
    assert region(core, cmd, BASE + n * 2 * MiB, 4096).verdict == cs.GS_REPLY
    uvm(core, abi.UVM_FREE, range_arg(BASE, 4096))
    assert region(core, cmd, BASE + n * 2 * MiB, 4096).verdict == cs.GS_PASS
    core.file_closed(UVM_FILE)
    assert region(core, cmd, BASE, 4096).verdict == cs.GS_PASS


def test_a_region_the_driver_never_ran_is_not_counted(env):
    core, rm = env
    for i in range(2000):
        region(core, abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, BASE + i * 2 * MiB, 4096, ret=-11)
    assert region(core, abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, BASE, 4096).verdict == cs.GS_PASS


def test_remapping_one_allocation_is_charged_for_its_page_tables(env):
    """UVM allocates page tables pinned in video memory, counted by no one: 4 KiB per 2 MiB
    with 4 KiB pages, which a base 4 KiB off a 2 MiB boundary forces (measured on the H100:
    1024 maps of one 1 GiB allocation held 2056 MiB). The first mapping of an allocation is
    free; each further one is charged its page tables' upper bound, so remapping cannot
    multiply the limit."""
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(256 * MiB)
    arg = lambda i: map_arg(p.client, h, BASE + i * GiB + 4096, 256 * MiB)  # noqa: E731
    assert uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, arg(0)).verdict == cs.GS_PASS
    assert core.stats()["used"] == 256 * MiB
    per_map = (128 + 1 + 1) * 4096  # 129 spans of 2 MiB touched, 1 of 1 GiB
    n = 1
    while True:
        r = uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, arg(n))
        if r.verdict != cs.GS_PASS:
            break
        n += 1
    assert (r.status, r.refusal) == (abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    assert core.stats()["used"] == 256 * MiB + (n - 1) * per_map <= GiB
    assert GiB - core.stats()["used"] < per_map
    for i in range(n):
        uvm(core, abi.UVM_FREE, range_arg(BASE + i * GiB, GiB))
    assert core.stats()["used"] == 256 * MiB
    p.free(h)
    assert core.stats()["used"] == 0


def test_a_region_s_page_tables_are_charged_until_it_goes(env):
    core, rm = env
    assert region(core, abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, BASE, 64 * MiB).verdict == cs.GS_PASS
    assert core.stats()["used"] == (32 + 1) * 4096
    r = region(core, abi.UVM_ALLOC_SEMAPHORE_POOL, BASE + GiB, 600 * GiB)
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_NO_MEMORY)
    uvm(core, abi.UVM_FREE, range_arg(BASE, 64 * MiB))
    assert core.stats()["used"] == 0


@pytest.mark.parametrize("base,length", [(BASE + 1, 4096), (BASE, 4095), (0, 4096), (BASE | 0xFF << 56, 0xFFFFFF),
                                         ((1 << 64) - 4096, 4096)])
@pytest.mark.parametrize("cmd", [abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, abi.UVM_ALLOC_SEMAPHORE_POOL])
def test_a_range_uvm_refuses_is_not_charged(env, cmd, base, length):
    """UVM refuses a range that is not 4 KiB-aligned, starts at 0 or wraps
    (uvm_api_range_invalid_aligned()); charged for its page tables, it held the charge until
    the UVM file's release. The guest fuzzer once showed 36 KiB charged that nothing held:
    a block read from a GET_PIDS reply (base pid<<24 | 0xFF<<56, length 0xFFFFFF) charged
    9 page tables (docs/fuzzing.md)."""
    core, rm = env
    region(core, cmd, base & (1 << 64) - 1, length, status=abi.NV_ERR_INVALID_ADDRESS)
    assert core.stats()["used"] == 0

"""Graphics and video in the decision core (kmod/core/legacy.c, engines.c, filter.c): the heap
escape OpenGL and Vulkan allocate through (NV_ESC_RM_VID_HEAP_CONTROL, counted like the class
RM turns it into), the other legacy escapes they use, the video engine objects, channel binds
and the ZBC table. Layouts: NVOS32_PARAMETERS (nvos.h, 184 bytes) as kmod/core/nvrm_abi.h
names its offsets."""

from __future__ import annotations

import ctypes
import struct

import pytest

from test_core import ALLOC, CONTROL, DEV, FREE, PERM, SUB, Proc, cs, env, so  # noqa: F401  (fixtures)
from coreshim import GiB, MiB, abi

VIDHEAP = abi.iowr(abi.NV_ESC_RM_VID_HEAP_CONTROL, 184)
IDLE = abi.iowr(abi.NV_ESC_RM_IDLE_CHANNELS, 56)
MAP_DMA = abi.iowr(abi.NV_ESC_RM_MAP_MEMORY_DMA, 64)
CTX_DMA = abi.iowr(abi.NV_ESC_RM_ALLOC_CONTEXT_DMA2, 56)

F_ALLOC_SIZE, F_FREE, F_INFO, F_TILED, F_RANGE, F_ALIGN, F_HW_ALLOC = 2, 3, 5, 6, 14, 18, 19
HANDLE_PROVIDED, VIRTUAL = 0x4000, 0x80000
VIDMEM, PCI = 0 << 25, 1 << 25
EGM = 1 << 24


def heap(p: Proc, function: int, *, size: int = 0, flags: int = 0, attr: int = VIDMEM, attr2: int = 0,
         handle: int = 0, client: int | None = None, parent: int = DEV) -> bytearray:
    a = bytearray(184)
    struct.pack_into("<IIII", a, 0, client or p.client, parent, function, 0)
    if function == F_FREE:
        struct.pack_into("<III", a, 40, 0, handle, 1)  # owner, hMemory, flags MEMORY_HANDLE_PROVIDED
    elif function == F_RANGE:
        struct.pack_into("<IIIII", a, 40, 0, handle, 0, flags, attr)
        struct.pack_into("<Q", a, 80, size)
        struct.pack_into("<I", a, 136, attr2)
    elif function == F_TILED:
        struct.pack_into("<IIIIII", a, 40, 0, handle, 0, flags, size // 4096, 4096)  # height, pitch
        struct.pack_into("<I", a, 64, attr)
        struct.pack_into("<I", a, 144, attr2)
    else:
        struct.pack_into("<IIIII", a, 40, 0, handle, 0, flags, attr)
        struct.pack_into("<Q", a, 88, size)
        struct.pack_into("<I", a, 144, attr2)
    return a


class HeapRM:
    """RM's side of the heap escape: an allocation gets a handle (RM's own when none was
    provided) and the size rounded to 64 KiB written back."""

    def __init__(self) -> None:
        self.next = 0xCAF00100
        self.calls = 0

    def __call__(self, a: bytearray) -> int:
        self.calls += 1
        function, flags = struct.unpack_from("<I", a, 8)[0], struct.unpack_from("<I", a, 52)[0]
        if function in (F_ALLOC_SIZE, F_RANGE, F_TILED):
            if not flags & HANDLE_PROVIDED:
                struct.pack_into("<I", a, 44, self.next)
                self.next += 1
            off = 80 if function == F_RANGE else 88
            if function == F_TILED:
                size = struct.unpack_from("<I", a, 56)[0] * struct.unpack_from("<I", a, 60)[0]
            else:
                size = struct.unpack_from("<Q", a, off)[0]
            struct.pack_into("<Q", a, off, (size + 0xFFFF) & ~0xFFFF)
        struct.pack_into("<I", a, 20, 0)
        return 0


def test_heap_allocations_count_like_the_class_rm_makes_and_free_returns_them(env):
    core, rm = env
    p = Proc(core, rm)
    drv = HeapRM()
    for i, fn in enumerate((F_ALLOC_SIZE, F_RANGE, F_TILED)):
        r = core.call(VIDHEAP, heap(p, fn, size=256 * MiB, flags=HANDLE_PROVIDED, handle=0x200 + i), drv)
        assert (r.verdict, r.status) == (cs.GS_PASS, 0), fn
    assert core.stats()["used"] == 768 * MiB
    # a virtual range and system memory are not video memory
    assert core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=4 * GiB, flags=VIRTUAL), drv).status == 0
    assert core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=64 * MiB, attr=PCI), drv).status == 0
    assert core.stats()["used"] == 768 * MiB
    # the limit holds, answered as RM answers a full heap, with nothing asked of RM
    calls = drv.calls
    r = core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=512 * MiB), drv)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    assert drv.calls == calls and core.stats()["used"] == 768 * MiB
    # RM_FREE of the handle returns its charge; so does the heap's own FREE
    assert sorted(o["handle"] for o in core.objects() if o.get("size") == 256 * MiB) == [0x200, 0x201, 0x202]
    assert p.free(0x200).status == 0
    assert core.stats()["used"] == 512 * MiB
    r = core.call(VIDHEAP, heap(p, F_FREE, handle=0x201), drv)
    assert (r.verdict, r.status) == (cs.GS_PASS, 0)
    assert core.stats()["used"] == 256 * MiB


def test_a_heap_allocation_under_a_handle_rm_chose_is_registered_under_it(env):
    """OpenGL lets RM choose the handle of one allocation and exports it: the object is
    registered under the handle the reply names (as RM_ALLOC's), and its free returns it."""
    core, rm = env
    p = Proc(core, rm)
    a = heap(p, F_ALLOC_SIZE, size=256 * MiB)
    assert core.call(VIDHEAP, a, HeapRM()).status == 0
    replied = struct.unpack_from("<I", a, 44)[0]
    assert [o["size"] for o in core.objects() if o["handle"] == replied] == [256 * MiB]
    assert p.free(replied).status == 0
    assert core.stats()["used"] == 0


def test_heap_handle_provided_and_rm_failure(env):
    core, rm = env
    p = Proc(core, rm)

    def fail(a: bytearray) -> int:
        struct.pack_into("<I", a, 20, abi.NV_ERR_NO_MEMORY)
        return 0

    assert core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=1 * GiB, flags=HANDLE_PROVIDED, handle=7), fail).status \
        == abi.NV_ERR_NO_MEMORY
    assert core.stats()["used"] == 0  # the reservation went with RM's refusal
    r = core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=1 * GiB, flags=HANDLE_PROVIDED, handle=7), HeapRM())
    assert r.status == 0 and core.stats()["used"] == 1 * GiB
    assert p.free(7).status == 0 and core.stats()["used"] == 0


def test_heap_refuses_other_clients_egm_and_what_it_does_not_count(env):
    core, rm = env
    p = Proc(core, rm)
    drv = HeapRM()
    r = core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=MiB, client=0xC1D0FFFF), drv)
    assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_FOREIGN)
    r = core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=MiB, attr2=EGM), drv)
    assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CLASS)
    r = core.call(VIDHEAP, heap(p, F_HW_ALLOC), drv)
    assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_UNLISTED)
    r = core.call(VIDHEAP, heap(p, 99), drv)  # a function RM has no handler for
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_ARGUMENT, cs.GS_REFUSE_UNLISTED)
    r = core.call(VIDHEAP, heap(p, F_ALIGN), drv)
    assert r.verdict == cs.GS_PASS
    assert drv.calls == 1
    # a short block is malformed
    r = core.call(abi.iowr(abi.NV_ESC_RM_VID_HEAP_CONTROL, 64), bytearray(64), drv)
    assert (r.verdict, r.refusal) == (cs.GS_FAIL, cs.GS_REFUSE_MALFORMED)


def test_heap_info_is_the_instances_not_the_gpus(env):
    core, rm = env
    p = Proc(core, rm)
    p.mem(256 * MiB)
    a = heap(p, F_INFO)
    r = core.call(VIDHEAP, a, HeapRM())
    assert (r.verdict, r.status) == (cs.GS_REPLY, 0)  # RM is not asked: it would tell the GPU's
    total, free = struct.unpack_from("<QQ", a, 24)
    assert (total, free) == (1 * GiB, 768 * MiB)
    assert struct.unpack_from("<Q", a, 56)[0] == 768 * MiB  # the largest free region


def test_idle_channels_names_the_callers_client_and_waits_at_most_100ms(env):
    core, rm = env
    p = Proc(core, rm)
    a = bytearray(56)
    struct.pack_into("<III", a, 0, p.client, DEV, 0x5C000050)
    struct.pack_into("<II", a, 40, 0, 10_000_000)  # flags, timeout (us)
    seen = []

    def drv(b: bytearray) -> int:
        seen.append(struct.unpack_from("<I", b, 44)[0])
        struct.pack_into("<I", b, 48, 0)
        return 0

    assert core.call(IDLE, a, drv).verdict == cs.GS_PASS
    assert seen == [100_000]
    struct.pack_into("<I", a, 0, 0xC1D0FFFF)
    r = core.call(IDLE, a, drv)
    assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_FOREIGN)


@pytest.mark.parametrize("req,size", [(MAP_DMA, 64), (CTX_DMA, 56),
                                      (abi.iowr(abi.NV_ESC_RM_UNMAP_MEMORY_DMA, 48), 48)])
def test_dma_escapes_name_the_callers_client(env, req, size):
    core, rm = env
    p = Proc(core, rm)
    a = bytearray(size)
    struct.pack_into("<I", a, 0, p.client)
    assert core.call(req, a, rm.ok(size - 8)).verdict == cs.GS_PASS
    struct.pack_into("<I", a, 0, 0xC1D0FFFF)
    assert core.call(req, a, rm.ok(size - 8)).refusal == cs.GS_REFUSE_FOREIGN


def video_params(prohibit: int) -> ctypes.Array:
    b = ctypes.create_string_buffer(12)
    struct.pack_into("<III", b, 0, 12, prohibit, 0)
    return b


@pytest.mark.parametrize("klass", [abi.NVB8B0_VIDEO_DECODER, abi.NVB8D1_VIDEO_NVJPG, abi.NVB8FA_VIDEO_OFA])
def test_a_video_engine_object_may_not_shut_others_out(env, klass):
    core, rm = env
    p = Proc(core, rm)
    r, _, _ = p.alloc(0x5C000060, klass, params=video_params(0))
    assert r.verdict == cs.GS_PASS
    r, _, _ = p.alloc(0x5C000060, klass, params=video_params(1))
    assert (r.status, r.refusal) == (PERM, cs.GS_REFUSE_GLOBAL)


def test_zbc_table_writes_are_refused_reads_allowed(env):
    core, rm = env
    p = Proc(core, rm)
    for cmd in (abi.NV9096_CTRL_CMD_SET_ZBC_COLOR_CLEAR, abi.NV9096_CTRL_CMD_SET_ZBC_DEPTH_CLEAR,
                abi.NV9096_CTRL_CMD_SET_ZBC_CLEAR_TABLE, abi.NV9096_CTRL_CMD_SET_ZBC_STENCIL_CLEAR):
        r, _ = p.control(0x5C000070, cmd, ctypes.create_string_buffer(64), 64)
        assert (r.status, r.refusal) == (abi.NV_ERR_INSUFFICIENT_RESOURCES, cs.GS_REFUSE_GLOBAL), hex(cmd)
    r, _ = p.control(0x5C000070, 0x90960107, ctypes.create_string_buffer(64), 64)
    assert r.verdict == cs.GS_PASS


def test_zcull_bind_names_the_callers_client(env):
    core, rm = env
    p = Proc(core, rm)
    b = ctypes.create_string_buffer(24)
    struct.pack_into("<II", b, 0, p.client, 0x5C000050)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_GR_CTXSW_ZCULL_BIND, b, 24)
    assert r.verdict == cs.GS_PASS
    struct.pack_into("<I", b, 0, 0xC1D0FFFF)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_GR_CTXSW_ZCULL_BIND, b, 24)
    assert (r.status, r.refusal) == (PERM, cs.GS_REFUSE_FOREIGN)


def test_fb_get_info_v1_passes(env):
    """OpenGL and Vulkan do not start without it; its list is out of the core's reach, so
    RM's figures pass unchanged (docs/isolation.md)."""
    core, rm = env
    p = Proc(core, rm)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FB_GET_INFO, ctypes.create_string_buffer(16), 16)
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)


ALLOC_MEMORY = abi.iowr(abi.NV_ESC_RM_ALLOC_MEMORY, 56)


def alloc_memory(p: Proc, klass: int, limit: int, handle: int) -> bytearray:
    a = bytearray(56)  # NVOS02 with its fd
    struct.pack_into("<IIIII", a, 0, p.client, DEV, handle, klass, 0)
    struct.pack_into("<Q", a, 32, limit)
    return a


def test_alloc_memory_of_system_memory_is_counted(env):
    """The video libraries pin host memory through RM_ALLOC_MEMORY of NV01_MEMORY_SYSTEM
    (limit + 1 bytes): counted on the instance's pinned-memory counter, capped at its limit."""
    core, rm = env
    p = Proc(core, rm)
    r = core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_SYSTEM, 256 * MiB - 1, 0x300), rm.ok(40))
    assert (r.verdict, r.status) == (cs.GS_PASS, 0)
    assert [o["size"] for o in core.objects() if o["handle"] == 0x300] == [256 * MiB]
    assert core.stats()["used"] == 0  # not video memory
    r = core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_SYSTEM, 1 * GiB - 1, 0x301), rm.ok(40))
    assert (r.status, r.refusal) == (abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    r = core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_SYSTEM, (1 << 64) - 1, 0x302), rm.ok(40))
    assert r.refusal == cs.GS_REFUSE_QUOTA
    assert p.free(0x300).status == 0
    r = core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_SYSTEM, 1 * GiB - 1, 0x301), rm.ok(40))
    assert r.status == 0  # the freed charge came back


def test_the_heap_size_question_gets_the_non_administrators_answer_with_the_instances_heap(env):
    """RM_ALLOC_MEMORY of NV01_MEMORY_LOCAL_USER: for an administrator RM makes an object of the
    whole framebuffer; for anyone else an empty NV01_MEMORY_SYSTEM_DYNAMIC object and the heap
    size (rmapi_deprecated_allocmemory.c). RM is asked the latter, whoever calls, and the heap
    reported is the instance's limit."""
    core, rm = env
    p = Proc(core, rm)
    seen = []

    def drv(a: bytearray) -> int:
        seen.append(struct.unpack_from("<I", a, 12)[0])
        struct.pack_into("<Q", a, 32, 80 * GiB - 1)  # RM's answer: the GPU's heap
        struct.pack_into("<I", a, 40, 0)
        return 0

    a = alloc_memory(p, abi.NV01_MEMORY_LOCAL_USER, 0, 0x303)
    r = core.call(ALLOC_MEMORY, a, drv)
    assert (r.verdict, r.status) == (cs.GS_PASS, 0)
    assert seen == [abi.NV01_MEMORY_SYSTEM_DYNAMIC]
    assert struct.unpack_from("<I", a, 12)[0] == abi.NV01_MEMORY_LOCAL_USER
    assert struct.unpack_from("<Q", a, 32)[0] == 1 * GiB - 1
    assert core.stats()["used"] == 0


def test_a_bound_channel_is_announced_on_its_engine(env):
    """The video libraries allocate a channel without an engine, bind it (NVA06F_CTRL_CMD_BIND)
    and schedule it: the controller hears of it on the bound engine (NVDEC0 = 0x13)."""
    core, rm = env
    p = Proc(core, rm)
    ch = 0x5C000080
    params = ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE)
    r, _, _ = p.alloc(DEV, abi.HOPPER_CHANNEL_GPFIFO_A, ch, params)
    assert r.verdict == cs.GS_PASS
    core.events()
    bind = ctypes.create_string_buffer(4)
    struct.pack_into("<I", bind, 0, 0x13)
    r, _ = p.control(ch, abi.NVA06F_CTRL_CMD_BIND, bind, 4)
    assert r.verdict == cs.GS_PASS
    r, _ = p.control(ch, abi.NVA06F_CTRL_CMD_GPFIFO_SCHEDULE, ctypes.create_string_buffer(4), 4)
    assert r.verdict == cs.GS_PASS
    new = [e for e in core.events() if e["type"] == cs.EV_CHANNEL_NEW and e["handle"] == ch]
    assert len(new) == 1 and new[0]["engine"] == 0x13


def failed(a: bytearray) -> int:
    struct.pack_into("<I", a, 28, abi.NV_ERR_INVALID_ARGUMENT)
    return 0


def engine_of(core, handle: int) -> int:
    return [o["engine"] for o in core.objects() if o["handle"] == handle][0]


def test_a_bind_reply_cannot_take_a_channel_out_of_the_slots(env):
    """The controller leaves channels on the video engines running, and which engine a channel
    has comes from its binds, whose status another thread can rewrite (kmod/shadow.c). So a bind
    to GR or a copy engine counts whatever the status says, and a bind to a video engine only
    on success and only for a channel that has no engine yet: no forged reply gets a GR
    channel ungated."""
    core, rm = env
    p = Proc(core, rm)
    bind = ctypes.create_string_buffer(4)

    def bind_to(ch: int, engine: int, driver=None) -> None:
        struct.pack_into("<I", bind, 0, engine)
        p.control(ch, abi.NVA06F_CTRL_CMD_BIND, bind, 4, driver=driver)

    a, b = 0x5C000090, 0x5C000091
    for ch in (a, b):
        assert p.alloc(DEV, abi.HOPPER_CHANNEL_GPFIFO_A, ch, ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE))[0].verdict == cs.GS_PASS
    # a forged success of a bind to NVDEC RM refused, then the real bind to GR, "failed"
    bind_to(a, 0x13)
    assert engine_of(core, a) == 0x13
    bind_to(a, abi.NV2080_ENGINE_TYPE_GR0, driver=failed)
    assert engine_of(core, a) == abi.NV2080_ENGINE_TYPE_GR0
    # a GR channel bound "successfully" to a decoder stays GR
    bind_to(a, 0x13)
    assert engine_of(core, a) == abi.NV2080_ENGINE_TYPE_GR0
    # a failed bind to a decoder records nothing
    bind_to(b, 0x14, driver=failed)
    assert engine_of(core, b) == 0


def test_an_engine_object_takes_a_channel_back_from_a_forged_video_bind(env):
    """A bind to NVDEC whose success another thread forged (RM refused it), then a compute
    object on the channel: RM binds the channel to GR with its first engine object, so the
    core moves it back to GR (engines.c gs_engine_object_made()), whatever that allocation's
    reply says; an engine object never moves a channel towards video."""
    core, rm = env
    p = Proc(core, rm)
    bind = ctypes.create_string_buffer(4)
    struct.pack_into("<I", bind, 0, 0x13)
    chans = {abi.HOPPER_COMPUTE_A: 0x5C0000A0, abi.HOPPER_DMA_COPY_A: 0x5C0000A1, abi.HOPPER_A: 0x5C0000A2}
    for klass, ch in chans.items():
        assert p.alloc(DEV, abi.HOPPER_CHANNEL_GPFIFO_A, ch,
                       ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE))[0].verdict == cs.GS_PASS
        p.control(ch, abi.NVA06F_CTRL_CMD_BIND, bind, 4)  # the forged success
        assert engine_of(core, ch) == 0x13
        arg = cs.alloc_arg(p.client, ch, ch + 0x100, klass)
        core.call(ALLOC, arg, lambda a: struct.pack_into("<I", a, 40, abi.NV_ERR_INVALID_ARGUMENT) or 0,
                  file_id=p.file_id, pid=p.pid)  # its reply forged to a failure too
        want = abi.NV2080_ENGINE_TYPE_COPY0 if klass == abi.HOPPER_DMA_COPY_A else abi.NV2080_ENGINE_TYPE_GR0
        assert engine_of(core, ch) == want, hex(klass)
    # a decoder object on a GR channel leaves it GR
    ch = chans[abi.HOPPER_COMPUTE_A]
    p.alloc(ch, abi.NVB8B0_VIDEO_DECODER, 0x5C0000B0)
    assert engine_of(core, ch) == abi.NV2080_ENGINE_TYPE_GR0


def test_register_memory_needs_a_handle_the_core_knows_and_is_recorded_whatever_rm_says(env):
    core, rm = env
    p = Proc(core, rm)
    r = core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_LOCAL_PRIVILEGED, 0, 0), rm.ok(40))
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_ARGUMENT, cs.GS_REFUSE_MALFORMED)

    def forged_failure(a: bytearray) -> int:
        struct.pack_into("<I", a, 40, abi.NV_ERR_INVALID_ARGUMENT)  # RM made it; the reply says not
        return 0

    assert core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_LOCAL_PRIVILEGED, 0, 0x320), forged_failure).verdict \
        == cs.GS_PASS
    m = bytearray(56)
    struct.pack_into("<III", m, 0, p.client, DEV, 0x320)
    r = core.call(abi.iowr(abi.NV_ESC_RM_MAP_MEMORY, 56), m, rm.ok(40))
    assert (r.status, r.refusal) == (abi.NV_ERR_PROTECTION_FAULT, cs.GS_REFUSE_GLOBAL)


def test_register_memory_is_allocated_but_never_mapped(env):
    """OpenGL and Vulkan allocate NV01_MEMORY_LOCAL_PRIVILEGED (BAR0's descriptor, any client
    may); mapping it is an administrator's (RM answers the rest NV_ERR_PROTECTION_FAULT): a
    container's root is answered so too, whatever RM would let it do."""
    core, rm = env
    p = Proc(core, rm)
    a = alloc_memory(p, abi.NV01_MEMORY_LOCAL_PRIVILEGED, 0, 0x310)
    assert core.call(ALLOC_MEMORY, a, rm.ok(40)).verdict == cs.GS_PASS
    mapping = abi.iowr(abi.NV_ESC_RM_MAP_MEMORY, 56)

    def map_arg(h: int) -> bytearray:
        m = bytearray(56)  # NVOS33 with its fd
        struct.pack_into("<III", m, 0, p.client, DEV, h)
        return m

    r = core.call(mapping, map_arg(0x310), rm.ok(40))
    assert (r.status, r.refusal) == (abi.NV_ERR_PROTECTION_FAULT, cs.GS_REFUSE_GLOBAL)
    # under another handle too
    assert core.call(abi.IOCTL_RM_DUP_OBJECT, cs.dup_arg(p.client, DEV, 0x311, p.client, 0x310),
                     rm.ok(24)).verdict == cs.GS_PASS
    assert core.call(mapping, map_arg(0x311), rm.ok(40)).refusal == cs.GS_REFUSE_GLOBAL
    _, h = p.mem(2 * MiB)
    assert core.call(mapping, map_arg(h), rm.ok(40)).verdict == cs.GS_PASS


def test_a_tiled_allocation_with_a_negative_pitch_is_past_any_limit(so):
    """RM sizes a tiled allocation height x pitch with pitch an NvS32 widened to 64 bits: a
    negative pitch is a size of about 2^64, not the 2 GiB an unsigned pitch would give."""
    core, rm = cs.Core(so, 8 * GiB), cs.MockRM()
    try:
        p = Proc(core, rm)
        a = heap(p, F_TILED, size=0)
        struct.pack_into("<Ii", a, 56, 1, -(1 << 31))  # height 1, pitch -2^31
        r = core.call(VIDHEAP, a, HeapRM())
        assert (r.status, r.refusal) == (abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    finally:
        core.close()


def semsurf_params(h_sem: int, h_max: int = 0) -> ctypes.Array:
    b = ctypes.create_string_buffer(16)
    struct.pack_into("<IIQ", b, 0, h_sem, h_max, 0)
    return b


def test_a_semaphore_surface_holds_its_memorys_charge(env):
    """RM duplicates a semaphore surface's memory into its own client (sem_surf.c): freeing
    the caller's handle leaves the memory allocated, so the charge stays until the surface goes."""
    core, rm = env
    p = Proc(core, rm)
    _, mem = p.mem(256 * MiB)
    r, surf, _ = p.alloc(DEV, abi.NV_SEMAPHORE_SURFACE, params=semsurf_params(mem))
    assert r.verdict == cs.GS_PASS
    assert p.free(mem).status == 0
    assert core.stats()["used"] == 256 * MiB
    assert p.free(surf).status == 0
    assert core.stats()["used"] == 0
    _, m1 = p.mem(2 * MiB)
    _, m2 = p.mem(2 * MiB)
    r, _, _ = p.alloc(DEV, abi.NV_SEMAPHORE_SURFACE, params=semsurf_params(m1, m2))
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_PARAMETER, cs.GS_REFUSE_CLASS)


def mapper_params(h_surf: int, queue: int) -> ctypes.Array:
    b = ctypes.create_string_buffer(24)
    struct.pack_into("<IIIIQ", b, 0, h_surf, queue, 0, 0, 0)
    return b


def test_memory_mappers_are_bounded_and_hold_their_surface(env):
    """RM sizes a mapper's kernel queue by the caller (maxQueueSize x 56 bytes, mem_mapper.c)
    and duplicates its semaphore surface: at most 64 mappers of 8192 entries an instance, each
    holding the surface's (and so its memory's) charge."""
    core, rm = env
    p = Proc(core, rm)
    _, mem = p.mem(64 * MiB)
    _, surf, _ = p.alloc(DEV, abi.NV_SEMAPHORE_SURFACE, params=semsurf_params(mem))
    r, _, _ = p.alloc(DEV, abi.NV_MEMORY_MAPPER, params=mapper_params(surf, 8193))
    assert (r.status, r.refusal) == (abi.NV_ERR_INSUFFICIENT_RESOURCES, cs.GS_REFUSE_LIMIT)
    r, mapper, _ = p.alloc(DEV, abi.NV_MEMORY_MAPPER, params=mapper_params(surf, 8192))
    assert r.verdict == cs.GS_PASS
    assert p.free(mem).status == 0 and p.free(surf).status == 0
    assert core.stats()["used"] == 64 * MiB  # RM still holds it, through the mapper's surface
    assert p.free(mapper).status == 0
    assert core.stats()["used"] == 0
    for _ in range(64):
        assert p.alloc(DEV, abi.NV_MEMORY_MAPPER, params=mapper_params(0, 16))[0].verdict == cs.GS_PASS
    r, _, _ = p.alloc(DEV, abi.NV_MEMORY_MAPPER, params=mapper_params(0, 16))
    assert r.refusal == cs.GS_REFUSE_LIMIT


@pytest.mark.parametrize("wait,manual,timeout,want", [
    (1, 0, 0, (1, 1, 100_000)),            # RM's own 1 s: capped
    (1, 1, 900_000, (1, 1, 100_000)),
    (1, 1, 50_000, (1, 1, 50_000)),        # under the cap: as asked
    (0, 0, 0, (0, 0, 0)),                  # no wait: as asked
])
def test_a_preempt_waits_at_most_100ms(env, wait, manual, timeout, want):
    core, rm = env
    p = Proc(core, rm)
    b = ctypes.create_string_buffer(8)
    struct.pack_into("<BBxxI", b, 0, wait, manual, timeout)
    seen = []

    def drv(a: bytearray) -> int:
        seen.append(struct.unpack_from("<BBxxI", b, 0))
        struct.pack_into("<I", a, 28, 0)
        return 0

    r, _ = p.control(0x5C000050, 0xA06C0105, b, 8, driver=drv)
    assert r.verdict == cs.GS_PASS and seen == [want]

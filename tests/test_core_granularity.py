"""What RM takes from the framebuffer, charged whatever it reports (kmod/core/quota.c
gs_pma_size(), gs_mem_bound()): PMA allocates video memory in units of the page and at least
64 KiB ("Minimum granularity of PMA is 64K", src/nvidia/src/kernel/mem_mgr/video_mem.c
_vidmemPmaAllocate, 580.95.05:195), so a 4 KiB allocation with the 4KB page attribute reports
4 KiB and takes 64 KiB; a fixed address allocation takes its size rounded up to its alignment
(video_mem.c:239-244); an alignment without a fixed address only places the pages
(phys_mem_allocator.c:752). The mock RMs here report what RM reports: the size rounded to
the page, never the PMA unit."""

from __future__ import annotations

import ctypes
import struct

import pytest

from test_core import DEV, Proc, cs, env, so  # noqa: F401  (fixtures)
from coreshim import GiB, MiB, abi
from test_core_render import F_ALLOC_SIZE, F_RANGE, HANDLE_PROVIDED, VIDHEAP, heap

KiB = 1 << 10
PAGE_4KB = abi.NVOS32_ATTR_PAGE_SIZE_4KB << abi.NVOS32_ATTR_PAGE_SIZE_SHIFT
PAGE_BIG = abi.NVOS32_ATTR_PAGE_SIZE_BIG << abi.NVOS32_ATTR_PAGE_SIZE_SHIFT
PAGE_HUGE = abi.NVOS32_ATTR_PAGE_SIZE_HUGE << abi.NVOS32_ATTR_PAGE_SIZE_SHIFT
HUGE_512MB = abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB << abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT
FIXED = 0x10  # NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE (nvos.h)
HINT = abi.NVOS32_ALLOC_FLAGS_ALIGNMENT_HINT
FORCE = abi.NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE
COMPR_ANY = 2 << 12  # NVOS32_ATTR_COMPR_ANY (13:12)

# NV_MEMORY_ALLOCATION_PARAMS (nvos.h; kmod/core/nvrm_abi.h struct nv_memory_allocation_params)
OFF_FLAGS, OFF_ATTR, OFF_ATTR2, OFF_SIZE, OFF_ALIGNMENT, OFF_OFFSET = 8, 24, 28, 64, 72, 80


def vid_params(size: int, *, attr: int = 0, attr2: int = 0, flags: int = 0, alignment: int = 0,
               offset: int = 0):
    p = cs.mem_params(size)
    struct.pack_into("<III", p, OFF_FLAGS, flags, 0, 0)
    struct.pack_into("<II", p, OFF_ATTR, attr, attr2)
    struct.pack_into("<QQ", p, OFF_ALIGNMENT, alignment, offset)
    return p


class PageRM(cs.MockRM):
    """RM_ALLOC of video memory writes back what RM reports: the size rounded to the GPU page
    (mem_mgr_gm107.c memmgrAllocDetermineAlignment_GM107), never to PMA's 64 KiB unit."""

    def __init__(self) -> None:
        super().__init__()
        self.vid_calls = 0

    def alloc(self, arg: bytearray) -> int:
        klass, p_params = struct.unpack_from("<IQ", arg, 12)
        if klass == abi.NV01_MEMORY_LOCAL_USER:
            self.vid_calls += 1
            attr, attr2 = struct.unpack_from("<II", ctypes.string_at(p_params + OFF_ATTR, 8))
            p = ctypes.c_uint64.from_address(p_params + OFF_SIZE)
            psz = attr >> abi.NVOS32_ATTR_PAGE_SIZE_SHIFT & 3
            page = {abi.NVOS32_ATTR_PAGE_SIZE_4KB: 4 * KiB, abi.NVOS32_ATTR_PAGE_SIZE_BIG: 64 * KiB}.get(
                psz, 2 * MiB if psz or p.value >= 2 * MiB else 64 * KiB)
            if psz == abi.NVOS32_ATTR_PAGE_SIZE_HUGE and attr2 == HUGE_512MB:
                page = 512 * MiB
            p.value = -(-p.value // page) * page
        return super().alloc(arg)


def mem(p: Proc, size: int, **kw):
    r, h, _ = p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, params=vid_params(size, **kw))
    return r, h


def reported(rm_params) -> int:
    return struct.unpack_from("<Q", rm_params, OFF_SIZE)[0]


# ---- the attack: many small allocations in 4 KiB pages ----

def test_4kb_page_allocations_are_charged_64k_each_and_refused_at_the_limit(so):
    """Under a 1 GiB limit, 4 KiB allocations with the 4KB page attribute (RM reports 4 KiB
    each) fill the limit after 1 GiB / 64 KiB of them, as PMA does; the next is refused
    before RM sees it. Charging what RM reports let 16 times that through (the limit's worth
    of reservations, 4 KiB charged for each)."""
    core = cs.Core(so, 1 * GiB)
    rm = PageRM()
    try:
        p = Proc(core, rm)
        n = (1 * GiB) // (64 * KiB)
        handles = []
        for i in range(n):
            r, h = mem(p, 4 * KiB, attr=PAGE_4KB)
            assert (r.verdict, r.status) == (cs.GS_PASS, 0), i
            handles.append(h)
        assert core.stats()["used"] == 1 * GiB
        assert {o["size"] for o in core.objects() if o["kind"] == cs.OBJ_MEMORY} == {64 * KiB}
        calls = rm.vid_calls
        r, _ = mem(p, 4 * KiB, attr=PAGE_4KB)
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
        assert rm.vid_calls == calls  # refused before RM
        # each free returns the 64 KiB
        for h in handles[:16]:
            assert p.free(h).status == 0
        assert core.stats()["used"] == 1 * GiB - 1 * MiB
        r, _ = mem(p, 4 * KiB, attr=PAGE_4KB)
        assert r.status == 0 and core.stats()["used"] == 1 * GiB - 1 * MiB + 64 * KiB
    finally:
        core.close()


@pytest.mark.parametrize("size,attr,charged", [
    (4 * KiB, PAGE_4KB, 64 * KiB),
    (100 * KiB, PAGE_4KB, 128 * KiB),  # RM reports 100 KiB
    (64 * KiB + 1, PAGE_4KB, 128 * KiB),
    (1, PAGE_BIG, 64 * KiB),
    (1, 0, 64 * KiB),  # DEFAULT below 2 MiB: the big page
    (3 * MiB, 0, 4 * MiB),  # DEFAULT from 2 MiB up: 2 MiB pages
    (1, PAGE_HUGE, 2 * MiB),
], ids=["4k-4kb", "100k-4kb", "64k+1-4kb", "1-big", "1-default", "3m-default", "1-huge"])
def test_charge_is_what_pma_takes_per_page_size(env, size, attr, charged):
    core, _ = env
    p = Proc(core, PageRM())
    r, h = mem(p, size, attr=attr)
    assert r.status == 0
    assert core.stats()["used"] == charged
    assert p.free(h).status == 0 and core.stats()["used"] == 0


def test_a_lower_reply_is_charged_what_pma_takes(env):
    """A reply rewritten down to the size asked (another thread of the caller can write it):
    a 3 MiB allocation of the default page size takes 4 MiB, charged whatever the reply says."""
    core, rm = env  # MockRM: the size comes back as asked
    p = Proc(core, rm)
    r, _ = mem(p, 3 * MiB)
    assert r.status == 0 and core.stats()["used"] == 4 * MiB


# ---- alignment and fixed addresses ----

def test_fixed_address_allocation_is_charged_its_padded_size(env):
    """FIXED_ADDRESS_ALLOCATE: PMA takes [offset rounded down, end rounded up] to
    max(alignment, page), the size rounded up to the alignment (video_mem.c:239-244); RM
    reports the size rounded to the page."""
    core, _ = env
    rm = PageRM()
    p = Proc(core, rm)
    params = vid_params(1 * MiB, attr=PAGE_BIG, flags=FIXED | FORCE, alignment=16 * MiB, offset=48 * MiB)
    r, h, _ = p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, params=params)
    assert r.status == 0 and reported(params) == 1 * MiB
    assert core.stats()["used"] == 16 * MiB
    assert p.free(h).status == 0 and core.stats()["used"] == 0
    # the unit is at least PMA's 64 KiB also for a smaller alignment
    r, h = mem(p, 4 * KiB, attr=PAGE_4KB, flags=FIXED | HINT, alignment=8 * KiB)
    assert r.status == 0 and core.stats()["used"] == 64 * KiB
    assert p.free(h).status == 0
    # an alignment that is not a multiple of the page is not kept (mem_mgr_gm107.c:253)
    r, h = mem(p, 4 * KiB, attr=PAGE_BIG, flags=FIXED | HINT, alignment=96 * KiB)
    assert r.status == 0 and core.stats()["used"] == 64 * KiB
    assert p.free(h).status == 0
    # without ALIGNMENT_HINT/FORCE the alignment field is not read (video_mem.c:79-83)
    r, h = mem(p, 4 * KiB, attr=PAGE_BIG, flags=FIXED, alignment=16 * MiB)
    assert r.status == 0 and core.stats()["used"] == 64 * KiB


def test_fixed_address_padding_is_checked_before_rm(env):
    """The reservation is the padded size: a 1 MiB request at a 256 MiB alignment is refused
    with 200 MiB left, without RM seeing it."""
    core, _ = env
    rm = PageRM()
    p = Proc(core, rm)
    for _ in range(824 // 8):
        assert mem(p, 8 * MiB, attr=PAGE_HUGE)[0].status == 0
    assert core.stats()["used"] == 824 * MiB
    calls = rm.vid_calls
    r, _ = mem(p, 1 * MiB, attr=PAGE_BIG, flags=FIXED | FORCE, alignment=256 * MiB)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    assert rm.vid_calls == calls and core.stats()["used"] == 824 * MiB
    r, _ = mem(p, 1 * MiB, attr=PAGE_BIG, flags=FIXED | FORCE, alignment=128 * MiB)
    assert r.status == 0 and core.stats()["used"] == 952 * MiB


def test_alignment_without_a_fixed_address_is_not_padded(env):
    """ALIGNMENT_FORCE alone places the range: PMA takes allocationCount pages whatever the
    alignment (phys_mem_allocator.c pmaAllocatePages), so a 2 MiB-aligned big-page allocation,
    as CUDA makes them, is charged as RM reports it."""
    core, _ = env
    p = Proc(core, PageRM())
    r, _ = mem(p, 2 * MiB, attr=PAGE_BIG, flags=FORCE, alignment=2 * MiB)
    assert r.status == 0 and core.stats()["used"] == 2 * MiB
    r, _ = mem(p, 192 * KiB, attr=PAGE_BIG, flags=HINT, alignment=64 * MiB)
    assert r.status == 0 and core.stats()["used"] == 2 * MiB + 192 * KiB


def test_rm_rounding_above_the_pma_size_is_still_charged(env):
    """4224 KiB of the default page size came back as 6144 KiB in the traces: charged as
    reported (RM's padding up to GS_RM_PAD_MAX above the reservation, as before)."""
    core, _ = env
    rm = cs.MockRM(pad=1920 * KiB)
    p = Proc(core, rm)
    r, _ = mem(p, 4224 * KiB)
    assert r.status == 0 and core.stats()["used"] == 6144 * KiB


def test_huge_page_attribute_bounds(env):
    core, _ = env
    p = Proc(core, PageRM())
    # 512 MiB pages: a 4 KiB request takes 512 MiB
    r, _ = mem(p, 4 * KiB, attr=PAGE_HUGE, attr2=HUGE_512MB)
    assert r.status == 0 and core.stats()["used"] == 512 * MiB
    r, _ = mem(p, 4 * KiB, attr=PAGE_HUGE, attr2=HUGE_512MB)
    assert r.status == 0 and core.stats()["used"] == 1 * GiB
    r, _ = mem(p, 4 * KiB, attr=PAGE_4KB)
    assert r.refusal == cs.GS_REFUSE_QUOTA


def test_overflowing_alignment_is_refused(env):
    core, _ = env
    p = Proc(core, PageRM())
    for alignment in (1 << 63, (1 << 64) - (64 << 10), 3 << 62):
        r, _ = mem(p, 4 * KiB, attr=PAGE_BIG, flags=FIXED | HINT, alignment=alignment)
        assert r.refusal == cs.GS_REFUSE_QUOTA, hex(alignment)
    r, _ = mem(p, (1 << 64) - 4 * KiB, attr=PAGE_4KB)
    assert r.refusal == cs.GS_REFUSE_QUOTA
    assert core.stats()["used"] == 0


# ---- the legacy heap escape (legacy.c): the same rule ----

class HeapPageRM:
    """NV_ESC_RM_VID_HEAP_CONTROL's RM side: a handle, and the size rounded to 4 KiB pages
    (the 4KB attribute) written back."""

    def __init__(self) -> None:
        self.next = 0xCAF00100

    def __call__(self, a: bytearray) -> int:
        function, flags = struct.unpack_from("<I", a, 8)[0], struct.unpack_from("<I", a, 52)[0]
        if not flags & HANDLE_PROVIDED:
            struct.pack_into("<I", a, 44, self.next)
            self.next += 1
        off = 80 if function == F_RANGE else 88
        size = struct.unpack_from("<Q", a, off)[0]
        struct.pack_into("<Q", a, off, -(-size // (4 * KiB)) * 4 * KiB)
        struct.pack_into("<I", a, 20, 0)
        return 0


def test_heap_4kb_pages_and_fixed_address_are_charged_what_pma_takes(env):
    core, rm = env
    p = Proc(core, rm)
    drv = HeapPageRM()
    for i, fn in enumerate((F_ALLOC_SIZE, F_RANGE)):
        a = heap(p, fn, size=4 * KiB, attr=PAGE_4KB, flags=HANDLE_PROVIDED, handle=0x300 + i)
        assert core.call(VIDHEAP, a, drv).status == 0
    assert core.stats()["used"] == 128 * KiB
    # data.AllocSize.alignment at 96, data.AllocSizeRange.alignment at 88 (nvos.h)
    a = heap(p, F_ALLOC_SIZE, size=4 * KiB, attr=PAGE_4KB, flags=HANDLE_PROVIDED | FIXED | FORCE, handle=0x310)
    struct.pack_into("<Q", a, 96, 4 * MiB)
    assert core.call(VIDHEAP, a, drv).status == 0
    assert core.stats()["used"] == 128 * KiB + 4 * MiB
    a = heap(p, F_RANGE, size=4 * KiB, attr=PAGE_4KB, flags=HANDLE_PROVIDED | FIXED | FORCE, handle=0x311)
    struct.pack_into("<Q", a, 88, 8 * MiB)
    assert core.call(VIDHEAP, a, drv).status == 0
    assert core.stats()["used"] == 128 * KiB + 12 * MiB
    for h in (0x300, 0x301, 0x310, 0x311):
        assert p.free(h).status == 0
    assert core.stats()["used"] == 0


def test_heap_4kb_pages_refused_at_the_limit(so):
    core = cs.Core(so, 64 * MiB)
    try:
        p = Proc(core, cs.MockRM())
        drv = HeapPageRM()
        for _ in range(1024):
            assert core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=4 * KiB, attr=PAGE_4KB), drv).status == 0
        assert core.stats()["used"] == 64 * MiB
        r = core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=4 * KiB, attr=PAGE_4KB), drv)
        assert (r.status, r.refusal) == (abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    finally:
        core.close()


# ---- per release ----

def test_535_and_550_reserve_2m_pages_for_compressed_memory(tmp_path):
    """On 535 and 550 compressed memory goes in 2 MiB pages when the static BAR1 is on
    (535.288.01 video_mem.c:175, 550.163.01 video_mem.c:559): the reservation allows for it
    (RM then reports the 2 MiB rounding); from 570 on the page is the attribute's."""
    lib_so = cs.build(tmp_path)
    for version, room in (("535.288.01", False), ("550.163.01", False), ("570.211.01", True),
                          ("580.95.05", True)):
        core = cs.Core(lib_so, 3 * MiB)
        try:
            core.lib.gs_abi_select.argtypes = [ctypes.c_char_p]
            assert core.lib.gs_abi_select(version.encode()) == 0
            p = Proc(core, PageRM())
            assert mem(p, 2 * MiB, attr=PAGE_HUGE)[0].status == 0
            r, _ = mem(p, 64 * KiB, attr=PAGE_BIG | COMPR_ANY)
            assert (r.status == 0) is room, version
            # without compression, the big page on every release
            r, _ = mem(p, 64 * KiB, attr=PAGE_BIG)
            assert r.status == 0, version
        finally:
            core.close()

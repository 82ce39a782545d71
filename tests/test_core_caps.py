"""An instance's capability set (kmod/core/core.h GS_CAP_*, NVIDIA_DRIVER_CAPABILITIES' names):
a class or control whose filter row is for none of the instance's capabilities is refused as RM
refuses one it does not have (a class NV_ERR_INVALID_CLASS, a control NV_ERR_NOT_SUPPORTED),
counted as a filter refusal; the default set is all four, which changes nothing."""

from __future__ import annotations

import ctypes
import errno
import struct

import pytest

from test_core import DEV, DUP, SUB, Proc, cs, env, so  # noqa: F401  (fixtures)
from test_core_render import (ALLOC_MEMORY, CTX_DMA, F_ALLOC_SIZE, IDLE, MAP_DMA, PCI, VIDHEAP, VIRTUAL,
                              HeapRM, alloc_memory, heap, video_params)
from test_core_uvm import range_arg, uvm
from coreshim import abi

CHAN = 0x5C000060
NV0080_GR_GET_CAPS = 0x00801102  # a graphics-only control row (filter.c)
NV2080_GR_GET_CAPS_V2 = 0x20801227  # a compute row


def graphics(p: Proc):
    return p.alloc(CHAN, abi.HOPPER_A)[0]


def video(p: Proc):
    return p.alloc(CHAN, abi.NVB8B0_VIDEO_DECODER, params=video_params(0))[0]


def compute(p: Proc):
    return p.alloc(CHAN, abi.HOPPER_COMPUTE_A)[0]


def test_all_capabilities_by_default(env):
    core, rm = env
    p = Proc(core, rm)
    for r in (graphics(p), video(p), compute(p)):
        assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)
    r, _ = p.control(DEV, NV0080_GR_GET_CAPS, ctypes.create_string_buffer(16), 16)
    assert r.verdict == cs.GS_PASS


@pytest.mark.parametrize("caps, refused", [
    (cs.CAP_COMPUTE | cs.CAP_UTILITY, {"graphics", "video"}),
    (cs.CAP_COMPUTE | cs.CAP_UTILITY | cs.CAP_VIDEO, {"graphics"}),
    (cs.CAP_COMPUTE | cs.CAP_UTILITY | cs.CAP_GRAPHICS, {"video"}),
    (cs.CAPS_ALL, set()),
])
def test_a_class_for_none_of_the_instances_capabilities_is_one_rm_does_not_have(env, caps, refused):
    core, rm = env
    core.set_caps(caps)
    p = Proc(core, rm)
    before = core.stats()["refused_filter"]
    for name, call in (("graphics", graphics), ("video", video), ("compute", compute)):
        r = call(p)
        if name in refused:
            assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS), name
        else:
            assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE), name
    assert core.stats()["refused_filter"] - before == len(refused)


def test_a_control_for_none_of_them_is_one_rm_does_not_have(env):
    core, rm = env
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    p = Proc(core, rm)
    r, _ = p.control(DEV, NV0080_GR_GET_CAPS, ctypes.create_string_buffer(16), 16)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CAPS)
    r, _ = p.control(SUB, NV2080_GR_GET_CAPS_V2, ctypes.create_string_buffer(32), 32)
    assert r.verdict == cs.GS_PASS


def test_without_compute_cuda_gets_no_compute_class(env):
    """utility alone (nvidia-smi): the client, device and subdevice rows are utility's too, the
    compute engine class is not."""
    core, rm = env
    core.set_caps(cs.CAP_UTILITY)
    p = Proc(core, rm)
    r = compute(p)
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS)
    r, _ = p.control(SUB, NV2080_GR_GET_CAPS_V2, ctypes.create_string_buffer(32), 32)
    assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CAPS)


# ---- what reaches a class or an escape other than RM_ALLOC / RM_CONTROL (the review's bypasses) ----

UNMAP_DMA = abi.iowr(abi.NV_ESC_RM_UNMAP_MEMORY_DMA, 48)


def never(_a: bytearray) -> int:
    raise AssertionError("a refused call reached the driver")


@pytest.mark.parametrize("klass", [abi.NV01_MEMORY_LOCAL_USER, abi.NV01_MEMORY_SYSTEM])
def test_alloc_memory_of_a_class_for_none_of_the_capabilities_is_one_rm_does_not_have(env, klass):
    """RM_ALLOC_MEMORY makes an RmAlloc of its class (rmapi_deprecated_allocmemory.c): the
    class's row gates it as it gates RM_ALLOC, so utility alone (nvidia-smi) gets neither the
    video-memory heap object nor pinned host memory, answered NV_ERR_INVALID_CLASS."""
    core, rm = env
    core.set_caps(cs.CAP_UTILITY)
    p = Proc(core, rm)
    before = core.stats()["refused_filter"]
    r = core.call(ALLOC_MEMORY, alloc_memory(p, klass, 64 * 4096 - 1, 0x300), never)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS)
    assert core.stats()["refused_filter"] == before + 1
    assert not [o for o in core.objects() if o["handle"] == 0x300]
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    r = core.call(ALLOC_MEMORY, alloc_memory(p, klass, 64 * 4096 - 1, 0x300), rm.ok(40))
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)


@pytest.mark.parametrize("attr,flags", [(0, 0), (PCI, 0), (0, VIRTUAL)], ids=["vidmem", "sysmem", "virtual"])
def test_a_heap_allocation_is_gated_by_the_class_rm_makes_of_it(env, attr, flags):
    """NV_ESC_RM_VID_HEAP_CONTROL allocates NV01_MEMORY_LOCAL_USER, NV01_MEMORY_SYSTEM or
    NV50_MEMORY_VIRTUAL (_rmVidHeapControlAllocCommon): an instance without those rows'
    capability (compute) is refused as RM_ALLOC of the class is, and nothing is charged."""
    core, rm = env
    core.set_caps(cs.CAP_UTILITY)
    p = Proc(core, rm)
    a = heap(p, F_ALLOC_SIZE, size=8 << 20, attr=attr, flags=flags)
    r = core.call(VIDHEAP, a, never)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS)
    assert core.stats()["used"] == 0 and core.stats()["objects"] == 3  # client, device, subdevice
    core.set_caps(cs.CAPS_ALL)
    r = core.call(VIDHEAP, heap(p, F_ALLOC_SIZE, size=8 << 20, attr=attr, flags=flags), HeapRM())
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)


def _legacy(p: Proc, size: int) -> bytearray:
    a = bytearray(size)
    struct.pack_into("<III", a, 0, p.client, DEV, 0x5C000050)
    return a


LEGACY = [("idle_channels", IDLE, 56, cs.CAP_GRAPHICS),
          ("alloc_context_dma2", CTX_DMA, 56, cs.CAP_GRAPHICS),
          ("map_memory_dma", MAP_DMA, 64, cs.CAP_GRAPHICS | cs.CAP_VIDEO),
          ("unmap_memory_dma", UNMAP_DMA, 48, cs.CAP_GRAPHICS | cs.CAP_VIDEO)]


@pytest.mark.parametrize("name,req,size,caps", LEGACY, ids=[row[0] for row in LEGACY])
def test_the_graphics_and_video_escapes_need_their_capability(env, name, req, size, caps):
    """nvproxy gives NV_ESC_RM_IDLE_CHANNELS and ALLOC_CONTEXT_DMA2 to graphics and
    MAP/UNMAP_MEMORY_DMA to graphics and video (version.go frontendIoctl): a compute,utility
    instance is refused them with EINVAL, as nv.c refuses an escape RM does not have; each of
    its capabilities lets it through."""
    core, rm = env
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    p = Proc(core, rm)
    before = core.stats()["refused_filter"]
    r = core.call(req, _legacy(p, size), never)
    assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, errno.EINVAL, cs.GS_REFUSE_CAPS), name
    assert core.stats()["refused_filter"] == before + 1
    for cap in (cs.CAP_GRAPHICS, cs.CAP_VIDEO):
        core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY | cap)
        r = core.call(req, _legacy(p, size), rm.ok(size - 8))
        if caps & cap:
            assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE), (name, cap)
        else:
            assert (r.err, r.refusal) == (errno.EINVAL, cs.GS_REFUSE_CAPS), (name, cap)


def test_uvm_needs_compute_or_utility(env):
    """nvidia-uvm's ioctls are nvproxy's compUtil (version.go uvmIoctl): an instance with
    neither (graphics and video only) is refused them with EINVAL, as uvm_ioctl() answers an
    ioctl it does not have, before the UVM decoding runs."""
    core, rm = env
    core.set_caps(cs.CAP_GRAPHICS | cs.CAP_VIDEO)
    before = core.stats()["refused_filter"]
    for cmd, arg in ((abi.UVM_INITIALIZE, bytearray(abi.UVM_PARAMS[abi.UVM_INITIALIZE][0])),
                     (abi.UVM_FREE, range_arg(0x7F0000000000, 1 << 20))):
        r = core.call(cmd, arg, never, kind=cs.GS_FILE_UVM, file_id=77)
        assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, errno.EINVAL, cs.GS_REFUSE_CAPS), cmd
    assert core.stats()["refused_filter"] == before + 2
    for caps in (cs.CAP_COMPUTE, cs.CAP_UTILITY):
        core.set_caps(caps)
        r = uvm(core, abi.UVM_INITIALIZE, bytearray(abi.UVM_PARAMS[abi.UVM_INITIALIZE][0]))
        assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE), caps


def test_the_rm_escapes_need_compute_or_utility(env):
    """The RM escapes are nvproxy's compUtil (RM_ALLOC_MEMORY compUtil and graphics): an instance
    with graphics or video alone makes no client and allocates no memory through them."""
    core, rm = env
    p = Proc(core, rm)
    core.set_caps(cs.CAP_VIDEO)
    arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
    r = core.call(abi.IOCTL_RM_ALLOC, arg, never)
    assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, errno.EINVAL, cs.GS_REFUSE_CAPS)
    r = core.call(ALLOC_MEMORY, alloc_memory(p, abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, 4095, 0x301), never)
    assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, errno.EINVAL, cs.GS_REFUSE_CAPS)


def test_a_dup_of_an_object_of_a_class_the_instance_no_longer_has_is_refused(env):
    """INSTANCE_SET CAPS narrows the set after graphics, video and memory objects were made: a
    duplicate of one is an object of its class (serverCopyResource), refused as RM_ALLOC of the
    class is (NV_ERR_INVALID_CLASS), and takes no reference on the source's charge; a
    duplicate of an object of a class still in the set passes."""
    core, rm = env
    p = Proc(core, rm)
    r, h_gr, _ = p.alloc(CHAN, abi.HOPPER_A)
    assert r.verdict == cs.GS_PASS
    r, h_vid, _ = p.alloc(CHAN, abi.NVB8B0_VIDEO_DECODER, params=video_params(0))
    assert r.verdict == cs.GS_PASS
    r, h_cmp, _ = p.alloc(CHAN, abi.HOPPER_COMPUTE_A)
    assert r.verdict == cs.GS_PASS
    r, h_mem = p.mem(64 << 20)
    assert r.verdict == cs.GS_PASS
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    before = core.stats()["refused_filter"]
    for i, h in enumerate((h_gr, h_vid)):
        r = core.call(DUP, cs.dup_arg(p.client, CHAN, 0x900 + i, p.client, h), never)
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLASS,
                                                    cs.GS_REFUSE_CAPS), hex(h)
    assert core.stats()["refused_filter"] == before + 2
    r = core.call(DUP, cs.dup_arg(p.client, CHAN, 0x910, p.client, h_cmp), rm.ok(24))
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)
    core.set_caps(cs.CAP_UTILITY)
    r = core.call(DUP, cs.dup_arg(p.client, DEV, 0x911, p.client, h_mem), never)
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS)
    assert p.free(h_mem).status == 0
    assert core.stats()["used"] == 0  # the refused dup held no reference on the charge


def test_a_dup_of_a_source_the_core_cannot_class_is_refused_once_the_set_is_narrowed(env):
    """A source of the instance's own client that the core never registered (or registered as a
    duplicate of such a one, class 0) has no class to gate: with all capabilities it passes as
    before; with fewer it is answered as RM answers a handle it does not know
    (NV_ERR_INVALID_OBJECT_HANDLE), counted as a capability refusal, and RM never sees it."""
    core, rm = env
    p = Proc(core, rm)
    r = core.call(DUP, cs.dup_arg(p.client, DEV, 0x901, p.client, 0x5C00ABCD), rm.ok(24))
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)
    assert {(o["handle"], o["klass"]) for o in core.objects()} >= {(0x901, 0)}
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    before = core.stats()["refused_filter"]
    for i, src in enumerate((0x5C00ABCE, 0x901)):
        r = core.call(DUP, cs.dup_arg(p.client, DEV, 0x910 + i, p.client, src), never)
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_OBJECT_HANDLE,
                                                    cs.GS_REFUSE_CAPS), hex(src)
    assert core.stats()["refused_filter"] == before + 2
    assert not {0x910, 0x911} & {o["handle"] for o in core.objects()}
    # a source of a class it knows is still gated by its row, and one in the set passes
    r, h = p.mem(1 << 20)
    assert r.verdict == cs.GS_PASS
    r = core.call(DUP, cs.dup_arg(p.client, DEV, 0x920, p.client, h), rm.ok(24))
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)


def test_uvm_pageable_mem_access_on_gpu_needs_video(env):
    """UVM_PAGEABLE_MEM_ACCESS_ON_GPU (uvm_ioctl.h UVM_IOCTL_BASE(70)) is nvproxy's CapVideo
    (version.go uvmIoctl): passed with video, refused EINVAL (as a capability) without it, not
    EPERM as an ioctl on no row."""
    core, rm = env
    arg = bytearray(24)  # gpu_uuid IN @0, pageableMemAccess OUT @16, rmStatus OUT @20
    r = core.call(70, arg, lambda a: 0, kind=cs.GS_FILE_UVM, file_id=77)
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    r = core.call(70, bytearray(24), never, kind=cs.GS_FILE_UVM, file_id=77)
    assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, errno.EINVAL, cs.GS_REFUSE_CAPS)
    core.set_caps(cs.CAP_VIDEO)
    r = core.call(70, bytearray(24), lambda a: 0, kind=cs.GS_FILE_UVM, file_id=77)
    assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)

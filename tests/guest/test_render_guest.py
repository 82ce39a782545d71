"""Graphics and video through an instance (kmod/core/legacy.c, engines.c, core.c, filter.c's
graphics/video rows), against the stand-in's model of the 580 driver (tests/standin/
nvstub_legacy.c, nvstub_rm.c, nvstub_ctrl.c).

Each test fails on the core before the graphics/video change (bb65ccc and its two
follow-ups): the vid-heap escape was refused with EPERM (no legacy escape was on the
list), RM_ALLOC_MEMORY of NV01_MEMORY_LOCAL_USER and NV01_MEMORY_LOCAL_PRIVILEGED was
refused by class, and NVB8B0_VIDEO_DECODER, GF100_ZBC_CLEAR and AMPERE_CHANNEL_GPFIFO_A
were on no row of the class list (and NVA06F_CTRL_CMD_BIND on none of the controls')."""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from gpuslice import abi

import nvstub
from gsinst import Instance, needs_modules, real_session, session

MIB = 1 << 20
NV2080_ENGINE_TYPE_NVDEC0 = 0x13

pytestmark = needs_modules


def test_vid_heap_allocations_count_to_the_limit_and_come_back(nl):
    """(a) ALLOC_SIZE, ALLOC_SIZE_RANGE and ALLOC_TILED_PITCH_HEIGHT up to the limit, RM's
    handle or the caller's; one more is NV_ERR_NO_MEMORY; RM_FREE and the heap's FREE return
    the charge. (b) INFO answers the instance's heap."""
    limit = 16 * MIB
    with Instance(nl, limit) as inst:
        s = session(inst)
        try:
            got = []
            for fn in (nvstub.NVOS32_FUNCTION_ALLOC_SIZE, nvstub.NVOS32_FUNCTION_ALLOC_SIZE_RANGE,
                       nvstub.NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT):
                st, h, size = nvstub.vid_heap_alloc(s.ctl, s.client, s.device, 4 * MIB, function=fn)
                assert (st, size) == (abi.NV_OK, 4 * MIB), hex(fn)
                assert h >> 20 == 0xCAF, hex(h)  # the handle RM made (resserv's unique range)
                got.append(h)
            h4 = s.handle()
            st, h, _ = nvstub.vid_heap_alloc(s.ctl, s.client, s.device, 4 * MIB, h_memory=h4)
            assert (st, h) == (abi.NV_OK, h4)
            assert inst.get()["mem_used"] == limit
            st, total, free, largest = nvstub.vid_heap_info(s.ctl, s.client, s.device)
            assert (st, total, free, largest) == (abi.NV_OK, limit, 0, 0)

            st, _, _ = nvstub.vid_heap_alloc(s.ctl, s.client, s.device, 2 * MIB)
            assert st == abi.NV_ERR_NO_MEMORY
            d = inst.get()
            assert d["mem_used"] == limit and d["nr_refused_quota"] >= 1

            assert s.free(got[0]) == abi.NV_OK                                   # RM_FREE
            assert inst.get()["mem_used"] == limit - 4 * MIB
            assert nvstub.vid_heap_free(s.ctl, s.client, s.device, h4) == abi.NV_OK  # heap FREE
            assert inst.get()["mem_used"] == limit - 8 * MIB
            st, total, free, _ = nvstub.vid_heap_info(s.ctl, s.client, s.device)
            assert (st, total, free) == (abi.NV_OK, limit, 8 * MIB)
            st, _, _ = nvstub.vid_heap_alloc(s.ctl, s.client, s.device, 8 * MIB)
            assert st == abi.NV_OK
        finally:
            s.close()
        assert inst.get()["mem_used"] == 0


def test_heap_size_question_answers_the_instance_heap(nl):
    """(c) RM_ALLOC_MEMORY of NV01_MEMORY_LOCAL_USER: the instance's limit - 1, whoever asks
    (the stand-in, like RM, gives root the whole framebuffer on the real node)."""
    limit = 24 * MIB
    with Instance(nl, limit) as inst:
        s = session(inst)
        try:
            st, lim = nvstub.alloc_memory(s.dev_fd, s.client, s.device, s.handle(), abi.NV01_MEMORY_LOCAL_USER)
            assert (st, lim) == (abi.NV_OK, limit - 1)
            assert inst.get()["mem_used"] == 0
        finally:
            s.close()
    r = real_session()
    try:
        st, lim = nvstub.alloc_memory(r.dev_fd, r.client, r.device, r.handle(), abi.NV01_MEMORY_LOCAL_USER)
        assert (st, lim) == (abi.NV_OK, nvstub.pool()["total"] - 1)  # root's answer: the whole FB
    finally:
        r.close()


def test_register_memory_allocates_but_never_maps(nl):
    """(d) NV01_MEMORY_LOCAL_PRIVILEGED through RM_ALLOC_MEMORY; its mapping is refused with
    NV_ERR_PROTECTION_FAULT even for root, whom the driver itself lets map it."""
    assert os.geteuid() == 0  # the guest runs the suite as root: RM's administrator
    with Instance(nl, 16 * MIB) as inst:
        s = session(inst)
        fd = nvstub.open_node(inst.path("nvidia0"))
        try:
            h = s.handle()
            st, lim = nvstub.alloc_memory(s.dev_fd, s.client, s.device, h, abi.NV01_MEMORY_LOCAL_PRIVILEGED,
                                          flags=nvstub.NVOS02_FLAGS_ALLOC_NONE)
            assert (st, lim) == (abi.NV_OK, 0xFFFFFFFF)
            assert nvstub.map_memory(s.ctl, s.client, s.device, h, 4096, fd) == abi.NV_ERR_PROTECTION_FAULT
        finally:
            os.close(fd)
            s.close()
    r = real_session()
    fd = nvstub.open_node(nvstub.gpu_path(0))
    try:
        h = r.handle()
        st, _ = nvstub.alloc_memory(r.dev_fd, r.client, r.device, h, abi.NV01_MEMORY_LOCAL_PRIVILEGED,
                                    flags=nvstub.NVOS02_FLAGS_ALLOC_NONE)
        assert st == abi.NV_OK
        assert nvstub.map_memory(r.ctl, r.client, r.device, h, 4096, fd) == abi.NV_OK
    finally:
        os.close(fd)
        r.close()


def _decoder(s, h_channel: int, prohibit: int) -> int:
    p = ctypes.create_string_buffer(struct.pack("<III", 12, prohibit, 0), 12)
    return nvstub.rm_alloc(s.ctl, s.client, h_channel, s.handle(), abi.NVB8B0_VIDEO_DECODER, p)[0]


def test_video_decoder_may_not_shut_others_out(nl):
    """(e) NVB8B0_VIDEO_DECODER with prohibitMultipleInstances=1 is refused; shared, allowed."""
    with Instance(nl, 16 * MIB) as inst:
        s = session(inst)
        try:
            _, ch = s.tsg_channel(schedule_it=False)
            assert _decoder(s, ch, 1) == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert _decoder(s, ch, 0) == abi.NV_OK
        finally:
            s.close()
    r = real_session()
    try:
        _, ch = r.tsg_channel(schedule_it=False)
        assert _decoder(r, ch, 1) == abi.NV_OK  # the driver grants it
    finally:
        r.close()


def _zbc_depth(s, h_zbc: int) -> int:
    p = ctypes.create_string_buffer(struct.pack("<IIB3x", 0x3F800000, 1, 0), 12)  # 1.0f, FP32
    return nvstub.rm_control(s.ctl, s.client, h_zbc, abi.NV9096_CTRL_CMD_SET_ZBC_DEPTH_CLEAR, p)


def test_zbc_table_write_is_refused(nl):
    """(f) GF100_ZBC_CLEAR allocates; its SET controls (the GPU-wide table) are refused with
    the table-full answer, NV_ERR_INSUFFICIENT_RESOURCES; the driver takes them."""
    with Instance(nl, 16 * MIB) as inst:
        s = session(inst)
        try:
            hz = s.handle()
            assert nvstub.rm_alloc(s.ctl, s.client, s.subdevice, hz, abi.GF100_ZBC_CLEAR)[0] == abi.NV_OK
            assert _zbc_depth(s, hz) == abi.NV_ERR_INSUFFICIENT_RESOURCES
        finally:
            s.close()
    r = real_session()
    try:
        hz = r.handle()
        assert nvstub.rm_alloc(r.ctl, r.client, r.subdevice, hz, abi.GF100_ZBC_CLEAR)[0] == abi.NV_OK
        assert _zbc_depth(r, hz) == abi.NV_OK
    finally:
        r.close()


def test_channel_bound_to_nvdec_shows_its_engine(nl):
    """(g) A channel allocated under the device (as the video libraries do), bound to NVDEC0
    (NVA06F_CTRL_CMD_BIND) and scheduled (NVA06F_CTRL_CMD_GPFIFO_SCHEDULE): the instance's
    object dump shows it with that engine, as the stand-in's engine does."""
    with Instance(nl, 16 * MIB) as inst:
        s = session(inst)
        try:
            ch = s.handle()
            cp = ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE)
            assert nvstub.rm_alloc(s.ctl, s.client, s.device, ch, abi.AMPERE_CHANNEL_GPFIFO_A, cp)[0] == abi.NV_OK
            bp = ctypes.create_string_buffer(struct.pack("<I", NV2080_ENGINE_TYPE_NVDEC0), 4)
            assert nvstub.rm_control(s.ctl, s.client, ch, abi.NVA06F_CTRL_CMD_BIND, bp) == abi.NV_OK
            sp = ctypes.create_string_buffer(struct.pack("<BBB", 1, 0, 0), 3)
            assert nvstub.rm_control(s.ctl, s.client, ch, abi.NVA06F_CTRL_CMD_GPFIFO_SCHEDULE, sp) == abi.NV_OK
            objs = [o for o in nl.objects(inst.name) if o["handle"] == ch]
            assert len(objs) == 1 and objs[0]["obj_kind"] == 2, objs  # a channel
            assert objs[0].get("engine") == NV2080_ENGINE_TYPE_NVDEC0, objs
            eng = [c for c in nvstub.read_engine() if c.client == s.client and c.channel == ch]
            assert [c.engine for c in eng] == [NV2080_ENGINE_TYPE_NVDEC0]
        finally:
            s.close()


def _engine(s, h_channel: int, klass: int) -> int:
    if klass == abi.NVB8B0_VIDEO_DECODER:
        return _decoder(s, h_channel, 0)
    p = ctypes.create_string_buffer(16)  # NV_GR_ALLOCATION_PARAMETERS
    return nvstub.rm_alloc(s.ctl, s.client, h_channel, s.handle(), klass, p)[0]


def test_the_capability_set_gates_graphics_video_and_compute(nl):
    """An instance's CAPS (NVIDIA_DRIVER_CAPABILITIES' names): one created with compute and
    utility only is refused the 3D class (HOPPER_A) and NVDEC's as RM refuses a class it does
    not have (NV_ERR_INVALID_CLASS), its CUDA objects still made; INSTANCE_SET of all lets
    them through. One without compute gets no TSG. An instance created without CAPS has all
    (the dump says 0xf)."""
    with Instance(nl, 16 * MIB) as inst:
        assert inst.get()["caps"] == 0xF
    with Instance(nl, 16 * MIB, caps=0x3) as inst:
        assert inst.get()["caps"] == 0x3
        s = session(inst)
        try:
            _, ch = s.tsg_channel(schedule_it=False)  # TSG, channel and compute object: compute's
            before = inst.get()["nr_refused_filter"]
            for klass in (abi.HOPPER_A, abi.NVB8B0_VIDEO_DECODER):
                assert _engine(s, ch, klass) == abi.NV_ERR_INVALID_CLASS, hex(klass)
            assert inst.get()["nr_refused_filter"] == before + 2
            nl.instance_set(inst.name, caps=0xF)
            assert inst.get()["caps"] == 0xF
            for klass in (abi.HOPPER_A, abi.NVB8B0_VIDEO_DECODER):
                assert _engine(s, ch, klass) == abi.NV_OK, hex(klass)
        finally:
            s.close()
    with Instance(nl, 16 * MIB, caps=0x6) as inst:  # utility and graphics
        s = session(inst)  # the client, device and subdevice are utility's too
        try:
            st, _ = nvstub.rm_alloc(s.ctl, s.client, s.device, s.handle(), abi.KEPLER_CHANNEL_GROUP_A)
            assert st == abi.NV_ERR_INVALID_CLASS
        finally:
            s.close()


def test_the_capability_set_gates_the_heap_and_the_graphics_escapes(nl):
    """Past RM_ALLOC and RM_CONTROL: a utility-only instance (nvidia-smi's) gets no memory
    through NV_ESC_RM_VID_HEAP_CONTROL (the class RM makes of it is compute's: refused as RM
    refuses a class it does not have, NV_ERR_INVALID_CLASS); a compute,utility one is refused
    NV_ESC_RM_IDLE_CHANNELS, which nvproxy gives to graphics alone, with EINVAL as the driver
    fails an escape it does not have; with graphics added it passes the core again."""
    with Instance(nl, 16 * MIB, caps=0x2) as inst:  # utility
        s = session(inst)
        try:
            before = inst.get()["nr_refused_filter"]
            st, _, _ = nvstub.vid_heap_alloc(s.ctl, s.client, s.device, 4 * MIB)
            assert st == abi.NV_ERR_INVALID_CLASS
            assert inst.get()["nr_refused_filter"] == before + 1
        finally:
            s.close()
    with Instance(nl, 16 * MIB, caps=0x3) as inst:  # compute, utility
        s = session(inst)
        try:
            idle = abi.iowr(abi.NV_ESC_RM_IDLE_CHANNELS, 56)
            a = bytearray(56)
            struct.pack_into("<II", a, 0, s.client, s.device)
            assert nvstub.ioctl(s.ctl, idle, a) == -errno.EINVAL
            nl.instance_set(inst.name, caps=0x7)
            a = bytearray(56)
            struct.pack_into("<II", a, 0, s.client, s.device)
            assert nvstub.ioctl(s.ctl, idle, a) == 0
            assert struct.unpack_from("<I", a, 48)[0] == abi.NV_OK  # NVOS30 status
        finally:
            s.close()

"""Unit tests of the decision core (kmod/core) against a mock RM, through tests/core/shim.c."""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "core"))
import coreshim as cs  # noqa: E402
from coreshim import GiB, MiB, abi  # noqa: E402

ALLOC = abi.IOCTL_RM_ALLOC
CONTROL = abi.IOCTL_RM_CONTROL
FREE = abi.IOCTL_RM_FREE
DUP = abi.IOCTL_RM_DUP_OBJECT
PERM = abi.NV_ERR_INSUFFICIENT_PERMISSIONS
DEV, SUB = 0x5C000001, 0x5C000002


@pytest.fixture(scope="module")
def so(tmp_path_factory):
    return cs.build(tmp_path_factory.mktemp("core"))


class Proc:
    """A process of an instance: one client with a device and a subdevice."""

    def __init__(self, core, rm, file_id=1, pid=100, ns_pid=0):
        self.core, self.rm, self.file_id, self.pid, self.ns_pid = core, rm, file_id, pid, ns_pid
        arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
        assert core.call(ALLOC, arg, rm.alloc, file_id=file_id, pid=pid, ns_pid=ns_pid).verdict == cs.GS_PASS
        self.client = struct.unpack_from("<I", arg, 8)[0]
        self.next = 0x100
        self.alloc(self.client, abi.NV01_DEVICE_0, DEV)
        self.alloc(DEV, abi.NV20_SUBDEVICE_0, SUB)

    def alloc(self, parent, klass, handle=None, params=None, client=None):
        if handle is None:
            handle = self.next = self.next + 1
        arg = cs.alloc_arg(client or self.client, parent, handle, klass, cs.addr(params) if params else 0)
        r = self.core.call(ALLOC, arg, self.rm.alloc, file_id=self.file_id, pid=self.pid, ns_pid=self.ns_pid)
        return r, handle, arg

    def mem(self, size, parent=DEV):
        p = cs.mem_params(size)
        r, h, arg = self.alloc(parent, abi.NV01_MEMORY_LOCAL_USER, params=p)
        return r, h

    def free(self, handle, parent=DEV):
        arg = cs.free_arg(self.client, parent, handle)
        return self.core.call(FREE, arg, self.rm.ok(12), file_id=self.file_id, pid=self.pid)

    def control(self, obj, cmd, params=None, size=0, client=None, driver=None):
        arg = cs.control_arg(client or self.client, obj, cmd, cs.addr(params) if params else 0, size)
        r = self.core.call(CONTROL, arg, driver or self.rm.control, file_id=self.file_id, pid=self.pid,
                           ns_pid=self.ns_pid)
        return r, arg


def rm_takes(size: int) -> int:
    """What RM takes for video memory of the default page size, and reports back (MockRM does
    not round): 2 MiB pages from 2 MiB up, 64 KiB ones below (kmod/core/quota.c gs_pma_size())."""
    unit = 2 * MiB if size >= 2 * MiB else 64 << 10
    return -(-size // unit) * unit


@pytest.fixture
def env(so):
    core = cs.Core(so, 1 * GiB)
    rm = cs.MockRM()
    yield core, rm
    core.close()


# ---- quota ----

def test_alloc_up_to_the_limit_then_refused_like_rm(env):
    core, rm = env
    p = Proc(core, rm)
    for _ in range(4):
        r, _ = p.mem(256 * MiB)
        assert r.verdict == cs.GS_PASS and r.status == 0
    assert core.stats()["used"] == 1 * GiB
    r, _ = p.mem(1)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    assert core.stats()["refused_quota"] == 1
    assert core.stats()["used"] == 1 * GiB
    ev = [e for e in core.events() if e["type"] == cs.EV_ALLOC_REFUSED]
    assert len(ev) == 1 and ev[0]["size"] == 1 and ev[0]["client"] == p.client


def test_size_larger_than_limit_and_overflow(env):
    core, rm = env
    p = Proc(core, rm)
    for size in (2 * GiB, (1 << 64) - 1, (1 << 63)):
        r, _ = p.mem(size)
        assert r.refusal == cs.GS_REFUSE_QUOTA
    assert core.stats()["used"] == 0


def test_rm_padding_is_charged(env):
    core, _ = env
    rm = cs.MockRM(pad=2 * MiB)
    p = Proc(core, rm)
    p.mem(4 * MiB)
    assert core.stats()["used"] == 6 * MiB


def test_rm_failure_releases_reservation(env):
    core, rm = env
    p = Proc(core, rm)
    rm.fail_next = abi.NV_ERR_NO_MEMORY
    r, _ = p.mem(1 * GiB)
    assert r.verdict == cs.GS_PASS and r.status == abi.NV_ERR_NO_MEMORY
    assert core.stats()["used"] == 0
    r, _ = p.mem(1 * GiB)  # the reservation is gone: the full limit is available again
    assert r.status == 0


def test_ioctl_error_releases_reservation(env):
    core, rm = env
    p = Proc(core, rm)
    pr = cs.mem_params(1 * GiB)
    arg = cs.alloc_arg(p.client, DEV, 0x999, abi.NV01_MEMORY_LOCAL_USER, cs.addr(pr))
    r = core.call(ALLOC, arg, lambda a: -14)
    assert r.verdict == cs.GS_PASS
    r, _ = p.mem(1 * GiB)
    assert r.status == 0 and core.stats()["used"] == 1 * GiB


def test_free_returns_bytes_and_peak_stays(env):
    core, rm = env
    p = Proc(core, rm)
    _, h1 = p.mem(100 * MiB)
    _, h2 = p.mem(200 * MiB)
    p.free(h1)
    assert core.stats()["used"] == 200 * MiB
    p.free(h2)
    st = core.stats()
    assert st["used"] == 0 and st["peak"] == 300 * MiB


def test_failed_free_keeps_bytes(env):
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(64 * MiB)
    arg = cs.free_arg(p.client, DEV, h)

    def fails(a):
        struct.pack_into("<I", a, 12, abi.NV_ERR_OBJECT_NOT_FOUND)
        return 0
    core.call(FREE, arg, fails)
    assert core.stats()["used"] == 64 * MiB


def test_free_of_ancestor_and_client_and_file(env):
    core, rm = env
    a = Proc(core, rm, file_id=1, pid=10)
    b = Proc(core, rm, file_id=2, pid=20)
    a.mem(10 * MiB)
    r, vas = a.alloc(DEV, abi.FERMI_VASPACE_A)[:2]
    a.mem(20 * MiB, parent=SUB)
    b.mem(40 * MiB)
    assert core.stats()["used"] == 70 * MiB
    a.free(SUB)  # the subdevice and the memory under it
    assert core.stats()["used"] == 50 * MiB
    a.free(DEV, parent=a.client)  # the device and everything under it
    assert core.stats()["used"] == 40 * MiB
    assert core.pids() == [10, 20]
    a.free(a.client, parent=a.client)
    assert core.pids() == [20]
    core.file_closed(2)
    assert core.stats()["used"] == 0 and core.stats()["objects"] == 0
    assert core.pids() == []


def test_dup_keeps_memory_until_last_handle(env):
    core, rm = env
    p = Proc(core, rm)
    _, h = p.mem(512 * MiB)
    arg = cs.dup_arg(p.client, DEV, 0x777, p.client, h)
    r = core.call(DUP, arg, rm.ok(24))
    assert r.verdict == cs.GS_PASS
    assert core.stats()["used"] == 512 * MiB  # a dup allocates nothing
    p.free(h)
    assert core.stats()["used"] == 512 * MiB  # RM still holds it through the dup
    r, _ = p.mem(600 * MiB)
    assert r.refusal == cs.GS_REFUSE_QUOTA  # dup + free does not launder the quota
    p.free(0x777)
    assert core.stats()["used"] == 0


def test_concurrent_reservations_do_not_pass_the_limit(env):
    """Two allocations in flight: the second is judged against the first's reservation."""
    core, rm = env
    p = Proc(core, rm)
    inner = {}

    def driver_first(arg):
        # while RM works on the first 768 MiB, a second caller asks for 512 MiB
        r, _ = p.mem(512 * MiB)
        inner["r"] = r
        return rm.alloc(arg)

    pr = cs.mem_params(768 * MiB)
    arg = cs.alloc_arg(p.client, DEV, 0x900, abi.NV01_MEMORY_LOCAL_USER, cs.addr(pr))
    assert core.call(ALLOC, arg, driver_first).verdict == cs.GS_PASS
    assert inner["r"].refusal == cs.GS_REFUSE_QUOTA
    assert core.stats()["used"] == 768 * MiB


def test_lowering_limit_below_used_refuses_but_frees_nothing(env):
    core, rm = env
    p = Proc(core, rm)
    p.mem(512 * MiB)
    core.set_limit(256 * MiB)
    assert p.mem(1)[0].refusal == cs.GS_REFUSE_QUOTA
    assert core.stats()["used"] == 512 * MiB


@pytest.mark.parametrize("klass,status", [
    (abi.NV01_MEMORY_LOCAL_PRIVILEGED, PERM), (abi.NV01_MEMORY_LOCAL_PHYSICAL, PERM),
    (abi.NV01_MEMORY_LIST_FBMEM, PERM),
    # RM's answer on a GPU without multicast, so that CUDA and NCCL fall back
    (abi.NV_MEMORY_MULTICAST_FABRIC, abi.NV_ERR_NOT_SUPPORTED)])
def test_uncounted_video_memory_classes_refused(env, klass, status):
    core, rm = env
    p = Proc(core, rm)
    r, h, arg = p.alloc(DEV, klass, params=cs.mem_params(MiB))
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, status, cs.GS_REFUSE_CLASS)
    assert struct.unpack_from("<I", arg, 40)[0] == status
    ev = [e for e in core.events() if e["type"] == cs.EV_FILTER_REFUSED]
    assert [(e["klass"], e["client"], e["parent"], e["handle"]) for e in ev] == [(klass, p.client, DEV, h)]


# ---- per-GPU limits (issue 15) ----

DEV1, SUB1 = 0x5C000011, 0x5C000012


def two_gpus(core, rm) -> "Proc":
    """A process with devices on GPU 0 (DEV, SUB) and GPU 1 (DEV1, SUB1), one client."""
    p = Proc(core, rm)
    dp = ctypes.create_string_buffer(56)
    struct.pack_into("<I", dp, 0, 1)  # NV0080_ALLOC_PARAMETERS.deviceId
    assert p.alloc(p.client, abi.NV01_DEVICE_0, DEV1, params=dp)[0].verdict == cs.GS_PASS
    assert p.alloc(DEV1, abi.NV20_SUBDEVICE_0, SUB1)[0].verdict == cs.GS_PASS
    return p


def test_each_gpu_is_limited_apart(env):
    """1 GiB for every GPU, 256 MiB for GPU 1: each GPU refuses at its own limit, the
    other's room is not taken, and a free gives room back on its GPU only."""
    core, rm = env
    core.set_gpu_limits({1: 256 * MiB})
    p = two_gpus(core, rm)
    r, h1 = p.mem(256 * MiB, parent=DEV1)
    assert r.status == 0
    r, _ = p.mem(64 * MiB, parent=SUB1)  # a subdevice's memory is on its device's GPU
    assert r.refusal == cs.GS_REFUSE_QUOTA and r.status == abi.NV_ERR_NO_MEMORY
    for _ in range(4):
        assert p.mem(256 * MiB)[0].status == 0
    assert p.mem(1)[0].refusal == cs.GS_REFUSE_QUOTA
    g = core.gpu_mem()
    assert (g[0]["limit"], g[0]["used"]) == (GiB, GiB)
    assert (g[1]["limit"], g[1]["used"]) == (256 * MiB, 256 * MiB)
    assert g[2]["limit"] == GiB and g[2]["used"] == 0
    assert core.stats()["used"] == GiB + 256 * MiB
    ev = [e for e in core.events() if e["type"] == cs.EV_ALLOC_REFUSED]
    assert [e["gpu"] for e in ev] == [1, 0]
    assert p.free(h1, parent=DEV1).status == 0
    assert p.mem(1)[0].refusal == cs.GS_REFUSE_QUOTA  # GPU 0 stays full
    assert p.mem(256 * MiB, parent=DEV1)[0].status == 0
    g = core.gpu_mem()
    assert g[1]["used"] == 256 * MiB and g[1]["peak"] == 256 * MiB and core.stats()["peak"] == GiB + 256 * MiB
    # limits changed live: GPU 1 back to the instance's
    core.set_gpu_limits(None)
    assert core.gpu_mem()[1]["limit"] == GiB
    assert p.mem(512 * MiB, parent=DEV1)[0].status == 0


def test_per_gpu_charges_go_with_dups_orphans_and_the_client(env):
    """A dup shares its memory's charge on that GPU; memory RM allocated without a
    handle we can free by stays charged to its GPU until its client goes; closing the
    file gives every GPU's charge back."""
    core, rm = env
    core.set_gpu_limits({1: 512 * MiB})
    p = two_gpus(core, rm)
    r, h = p.mem(256 * MiB, parent=DEV1)
    arg = cs.dup_arg(p.client, DEV1, 0x7777, p.client, h)
    assert core.call(DUP, arg, rm.ok(24)).status == 0
    assert core.gpu_mem()[1]["used"] == 256 * MiB
    assert p.free(h, parent=DEV1).status == 0
    assert core.gpu_mem()[1]["used"] == 256 * MiB  # the dup holds it
    mp = cs.mem_params(128 * MiB)
    r, _, _ = p.alloc(DEV1, abi.NV01_MEMORY_LOCAL_USER, handle=0, params=mp)  # RM picks no handle here
    assert r.status == 0
    assert core.gpu_mem()[1]["used"] == 384 * MiB
    assert p.mem(256 * MiB, parent=DEV1)[0].refusal == cs.GS_REFUSE_QUOTA
    assert p.mem(256 * MiB)[0].status == 0
    core.file_closed(p.file_id)
    assert [g["used"] for g in core.gpu_mem()[:2]] == [0, 0] and core.stats()["used"] == 0


def test_memory_under_a_device_we_do_not_know_is_refused(env):
    """Video memory under a parent with no device we registered above it would be
    charged to no GPU's limit: refused as RM refuses an allocation over the limit,
    whichever node the call comes through. And no device, TSG or channel gets an
    RM-chosen handle (the reply naming it can be rewritten before we read it, which
    would leave the object unregistered: its memory on no GPU, its channels ungated)."""
    core, rm = env
    p = Proc(core, rm)
    assert p.mem(GiB)[0].status == 0
    dp = ctypes.create_string_buffer(56)
    for parent, klass, prm in ((p.client, abi.NV01_DEVICE_0, dp), (DEV, abi.KEPLER_CHANNEL_GROUP_A, None),
                               (DEV, abi.HOPPER_CHANNEL_GPFIFO_A, None)):
        r, _, _ = p.alloc(parent, klass, handle=0, params=prm)
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_ARGUMENT, cs.GS_REFUSE_MALFORMED)
    mp = cs.mem_params(GiB)
    for minor, kind in ((255, cs.GS_FILE_CTL), (0, cs.GS_FILE_GPU)):
        arg = cs.alloc_arg(p.client, 0xBADD0E5, 0x7001 + minor, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp))
        r = core.call(ALLOC, arg, rm.alloc, kind=kind, minor=minor)
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NO_MEMORY, cs.GS_REFUSE_QUOTA)
    assert core.stats()["used"] == GiB


def _status_driver(status: int):
    """RM answering ``status`` for an RM_ALLOC (NVOS64 status at 40), creating nothing."""
    def drv(arg: bytearray) -> int:
        struct.pack_into("<I", arg, 40, status)
        return 0
    return drv


def test_a_failed_alloc_under_a_live_handle_uncharges_nothing(env):
    """RM never makes an object under a live handle. An RM_ALLOC naming a registered
    memory handle whose parameters RM cannot read answers NV_ERR_INVALID_ADDRESS, which
    the core takes as "made, reply lost": it must not replace (and uncharge) the live
    object; else each such call would free a limit's worth of accounting."""
    core, rm = env
    p = Proc(core, rm)
    r, h = p.mem(GiB)
    assert r.status == 0
    for klass, params in ((abi.KEPLER_CHANNEL_GROUP_A, ctypes.create_string_buffer(64)),
                          (abi.NV01_MEMORY_LOCAL_USER, cs.mem_params(4096))):
        arg = cs.alloc_arg(p.client, DEV, h, klass, cs.addr(params))
        core.call(ALLOC, arg, _status_driver(abi.NV_ERR_INVALID_ADDRESS))
        assert core.stats()["used"] >= GiB, klass
    assert p.mem(MiB)[0].refusal == cs.GS_REFUSE_QUOTA


def test_a_device_is_on_the_gpu_rm_was_asked_for(env):
    """The device's GPU is the deviceId RM read, decided before the call: a rewrite of
    the parameters after RM's reply (the block is the caller's again then) changes
    nothing; a device of a GPU that is not the instance's is refused before RM."""
    core, rm = env
    core.set_gpus(0b01)
    p = Proc(core, rm)
    dp = ctypes.create_string_buffer(56)
    struct.pack_into("<I", dp, 0, 0)

    def rewrite_after(arg: bytearray) -> int:
        struct.pack_into("<I", dp, 0, 1)  # another thread, once RM has read deviceId 0
        return rm.alloc(arg)

    arg = cs.alloc_arg(p.client, p.client, 0xD2, abi.NV01_DEVICE_0, cs.addr(dp))
    assert core.call(ALLOC, arg, rewrite_after).status == 0
    assert {o["handle"]: o["gpu"] for o in core.objects()}[0xD2] == 0
    struct.pack_into("<I", dp, 0, 1)
    for status in (0, abi.NV_ERR_INVALID_ADDRESS):  # refused whatever RM would answer
        arg = cs.alloc_arg(p.client, p.client, 0xD3, abi.NV01_DEVICE_0, cs.addr(dp))
        r = core.call(ALLOC, arg, _status_driver(status))
        assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_FOREIGN)
    assert 0xD3 not in {o["handle"] for o in core.objects()}
    assert core.gpu_mem()[1]["limit"] == 0  # and nothing could be charged there


def test_a_device_cannot_be_freed_and_remade_under_memory_in_flight(env):
    """Memory checked against GPU 0 under device D, while another thread frees D to make it
    again on GPU 1 before RM runs: the free of an ancestor of a creation in flight is answered
    NV_ERR_STATE_IN_USE (registry.c gs_busy_conflict()), so the charge stays on GPU 0, which
    was checked, and no memory is left charged under a device RM freed."""
    core, rm = env
    core.set_gpu_limits({1: 256 * MiB})
    p = two_gpus(core, rm)
    assert p.mem(256 * MiB, parent=DEV1)[0].status == 0  # GPU 1 full
    dev = 0x5C0000D7
    assert p.alloc(p.client, abi.NV01_DEVICE_0, dev)[0].status == 0  # no params: GPU 0
    seen = []

    def remade(arg: bytearray) -> int:
        seen.append(p.free(dev, parent=p.client))
        return rm.alloc(arg)

    mp = cs.mem_params(512 * MiB)
    arg = cs.alloc_arg(p.client, dev, 0x7A11, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp))
    assert core.call(ALLOC, arg, remade).status == 0
    assert (seen[0].verdict, seen[0].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)
    g = core.gpu_mem()
    assert g[1]["used"] == 256 * MiB and g[0]["used"] == 512 * MiB
    # once the allocation is done, the device frees with its memory
    assert p.free(dev, parent=p.client).status == 0
    assert core.gpu_mem()[0]["used"] == 0


def test_fb_info_is_the_subdevices_gpu(env):
    core, rm = env
    core.set_gpu_limits({1: 256 * MiB})
    p = two_gpus(core, rm)
    p.mem(100 * MiB, parent=DEV1)
    got = {}
    for sub in (SUB, SUB1):
        fp = ctypes.create_string_buffer(abi.FB_GET_INFO_V2_SIZE)
        struct.pack_into("<IIIII", fp, 0, 2, 0x9, 0, 0x16, 0)
        assert p.control(sub, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, fp, abi.FB_GET_INFO_V2_SIZE)[0].verdict == cs.GS_PASS
        got[sub] = struct.unpack_from("<IIII", fp, 4)
    assert got[SUB] == (0x9, GiB >> 10, 0x16, GiB >> 10)
    assert got[SUB1] == (0x9, 256 * 1024, 0x16, 156 * 1024)


# ---- virtualized FB info ----

def test_fb_info_rewrite(env):
    core, rm = env
    p = Proc(core, rm)
    p.mem(100 * MiB)
    fp = ctypes.create_string_buffer(abi.FB_GET_INFO_V2_SIZE)
    idx = [0x16, 0x9, 0x8, 0x7, 0x20, 0x12, 0x10, 0x5]
    struct.pack_into("<I", fp, 0, len(idx))
    for i, x in enumerate(idx):
        struct.pack_into("<II", fp, 4 + 8 * i, x, 0)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, fp, abi.FB_GET_INFO_V2_SIZE)
    assert r.verdict == cs.GS_PASS
    got = dict(struct.unpack_from("<II", fp, 4 + 8 * i) for i in range(len(idx)))
    kib = GiB >> 10
    assert got[0x9] == got[0x8] == got[0x7] == got[0x20] == kib
    assert got[0x16] == got[0x12] == kib - (100 * MiB >> 10)
    assert got[0x10] == rm.fb_kib and got[0x5] == rm.fb_kib  # untouched


def test_fb_info_free_capped_by_physical_free(env):
    core, _ = env
    rm = cs.MockRM(fb_free_kib=1000)
    p = Proc(core, rm)
    fp = ctypes.create_string_buffer(abi.FB_GET_INFO_V2_SIZE)
    struct.pack_into("<III", fp, 0, 1, 0x16, 0)
    p.control(SUB, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, fp, abi.FB_GET_INFO_V2_SIZE)
    assert struct.unpack_from("<I", fp, 8)[0] == 1000


# ---- virtualized process lists (GPU_GET_PIDS, GPU_GET_PID_INFO) ----

GET_PIDS, GET_PID_INFO = 0x2080018D, 0x2080018E
PIDS_SIZE = 12 + 4 * 950
PID_INFO_SIZE = 8 + 72 * 200
NO_PARTITION = 0xFFFFFFFF


def rm_reply(params, fill, status=0):
    """A driver that writes a crafted reply into the parameter block, then status."""
    def drv(arg):
        fill(params)
        struct.pack_into("<I", arg, 28, status)
        return 0
    return drv


def pids_reply(pids):
    def fill(b):
        struct.pack_into("<I", b, 8, len(pids))
        for i, pid in enumerate(pids):
            struct.pack_into("<I", b, 12 + 4 * i, pid)
    return fill


def pid_info_entry(b, i, pid, index=0, result=0, mem=(0,) * 6, ci=NO_PARTITION, gi=NO_PARTITION):
    struct.pack_into("<III4x6QII", b, 8 + 72 * i, pid, index, result, *mem, ci, gi)


def pid_info_at(b, i):
    v = struct.unpack_from("<III4x6QII", b, 8 + 72 * i)
    return {"pid": v[0], "index": v[1], "result": v[2], "mem": v[3:9], "ci": v[9], "gi": v[10]}


def test_get_pids_lists_only_this_instance(env):
    core, rm = env
    a = Proc(core, rm, file_id=1, pid=10)
    Proc(core, rm, file_id=2, pid=20)
    b = ctypes.create_string_buffer(PIDS_SIZE)
    struct.pack_into("<II", b, 0, 0, abi.NV20_SUBDEVICE_0)
    r, _ = a.control(SUB, GET_PIDS, b, PIDS_SIZE, driver=rm_reply(b, pids_reply([555, 10, 777, 20, 888])))
    assert (r.verdict, r.status) == (cs.GS_PASS, 0)
    count = struct.unpack_from("<I", b, 8)[0]
    assert count == 2
    assert list(struct.unpack_from("<5I", b, 12)) == [10, 20, 0, 0, 0]  # no stale foreign pid behind
    assert struct.unpack_from("<II", b, 0) == (0, abi.NV20_SUBDEVICE_0)  # the request is left alone


def test_get_pids_caller_own_pid_kept_and_failures_untouched(env):
    core, rm = env
    a = Proc(core, rm, file_id=1, pid=10)
    b = ctypes.create_string_buffer(PIDS_SIZE)
    a.control(SUB, GET_PIDS, b, PIDS_SIZE, driver=rm_reply(b, pids_reply([10])))
    assert struct.unpack_from("<II", b, 8) == (1, 10)
    # RM failed: its reply is not touched
    b = ctypes.create_string_buffer(PIDS_SIZE)
    r, _ = a.control(SUB, GET_PIDS, b, PIDS_SIZE,
                     driver=rm_reply(b, pids_reply([555]), status=abi.NV_ERR_INVALID_ARGUMENT))
    assert r.status == abi.NV_ERR_INVALID_ARGUMENT and struct.unpack_from("<II", b, 8) == (1, 555)
    # a short block: only the pids that fit are looked at, nothing is written past it
    b = ctypes.create_string_buffer(PIDS_SIZE)
    r, _ = a.control(SUB, GET_PIDS, b, 16, driver=rm_reply(b, pids_reply([555, 666])))
    assert r.verdict == cs.GS_PASS
    assert struct.unpack_from("<III", b, 8) == (0, 0, 666)


def test_get_pid_info_foreign_pid_answered_like_an_unknown_pid(env):
    core, rm = env
    a = Proc(core, rm, file_id=1, pid=10)
    Proc(core, rm, file_id=2, pid=20)
    b = ctypes.create_string_buffer(PID_INFO_SIZE)

    def fill(b):
        struct.pack_into("<I", b, 0, 5)
        pid_info_entry(b, 0, 10, mem=(GiB, 0, 0, 0, 0, 0))        # the caller (PyTorch's OOM path)
        pid_info_entry(b, 1, 20, mem=(2 * GiB, 1, 0, 0, 0, 0))    # another process of the instance
        pid_info_entry(b, 2, 555, mem=(3 * GiB, 5, 6, 0, 0, 0), ci=1, gi=2)  # another container's
        pid_info_entry(b, 3, 555, index=7, result=abi.NV_ERR_INVALID_ARGUMENT)  # bad index: RM's
        pid_info_entry(b, 4, 0, result=abi.NV_ERR_INVALID_ARGUMENT)
    r, _ = a.control(SUB, GET_PID_INFO, b, PID_INFO_SIZE, driver=rm_reply(b, fill))
    assert (r.verdict, r.status) == (cs.GS_PASS, 0)
    e = [pid_info_at(b, i) for i in range(5)]
    assert e[0]["mem"][0] == GiB and e[0]["result"] == 0
    assert e[1]["mem"][:2] == (2 * GiB, 1)
    assert e[2] == {"pid": 555, "index": 0, "result": 0, "mem": (0,) * 6, "ci": NO_PARTITION,
                    "gi": NO_PARTITION}
    assert e[3]["result"] == abi.NV_ERR_INVALID_ARGUMENT and e[3]["index"] == 7
    assert e[4]["result"] == abi.NV_ERR_INVALID_ARGUMENT
    assert struct.unpack_from("<I", b, 0)[0] == 5


def test_process_lists_compare_namespace_pids(env):
    """In a pid namespace RM names processes by their pid there: the core compares the pid
    the caller has in its namespace (gs_call.ns_pid), not the host pid."""
    core, rm = env
    a = Proc(core, rm, file_id=1, pid=5000, ns_pid=7)
    b = ctypes.create_string_buffer(PIDS_SIZE)
    a.control(SUB, GET_PIDS, b, PIDS_SIZE, driver=rm_reply(b, pids_reply([7, 5000, 8])))
    assert struct.unpack_from("<III", b, 8) == (1, 7, 0)
    b = ctypes.create_string_buffer(PID_INFO_SIZE)

    def fill(b):
        struct.pack_into("<I", b, 0, 2)
        pid_info_entry(b, 0, 7, mem=(GiB, 0, 0, 0, 0, 0))
        pid_info_entry(b, 1, 5000, mem=(GiB, 0, 0, 0, 0, 0))
    a.control(SUB, GET_PID_INFO, b, PID_INFO_SIZE, driver=rm_reply(b, fill))
    assert pid_info_at(b, 0)["mem"][0] == GiB and pid_info_at(b, 1)["mem"][0] == 0


def _chan_events(core):
    return [(e["type"], e["handle"]) for e in core.events()
            if e["type"] in (cs.EV_CHANNEL_NEW, cs.EV_CHANNEL_DEL)]


def test_channels_are_announced_once_scheduled(env):
    """A channel is announced (CHANNEL_NEW, and gateable in object dumps) when RM has
    scheduled it, not when it is made: before its TSG's GPFIFO_SCHEDULE RM refuses to
    disable it (NV_ERR_INVALID_CHANNEL on the H100). A schedule RM refused announces
    nothing; a channel made in a TSG scheduled already is announced at once; only an
    announced channel's deletion is."""
    core, rm = env
    p = Proc(core, rm)
    tsg_params = ctypes.create_string_buffer(64)
    struct.pack_into("<I", tsg_params, 12, 1)
    p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x700, tsg_params)
    p.alloc(0x700, abi.HOPPER_CHANNEL_GPFIFO_A, 0x701)
    p.alloc(0x700, abi.HOPPER_CHANNEL_GPFIFO_A, 0x702)
    p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x710, tsg_params)
    p.alloc(0x710, abi.HOPPER_CHANNEL_GPFIFO_A, 0x711)
    gateable = lambda: sorted(o["handle"] for o in core.objects() if o["kind"] == cs.OBJ_CHANNEL and o["gateable"])
    assert _chan_events(core) == [] and gateable() == []

    def refused(arg):
        struct.pack_into("<I", arg, 28, abi.NV_ERR_INVALID_STATE)
        return 0
    p.control(0x700, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, driver=refused)
    assert _chan_events(core) == [] and gateable() == []
    p.control(0x700, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    new = [(cs.EV_CHANNEL_NEW, 0x701), (cs.EV_CHANNEL_NEW, 0x702)]
    assert sorted(_chan_events(core)) == new
    p.control(0x700, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)  # again: nothing new
    p.alloc(0x700, abi.HOPPER_CHANNEL_GPFIFO_A, 0x703)  # into a scheduled TSG
    assert _chan_events(core) == [(cs.EV_CHANNEL_NEW, 0x703)]
    assert gateable() == [0x701, 0x702, 0x703]
    p.free(0x711, parent=0x710)  # never announced: no deletion either
    p.free(0x701, parent=0x700)
    assert _chan_events(core) == [(cs.EV_CHANNEL_DEL, 0x701)]


def test_objects_take_the_gpu_of_their_device(env):
    """RM objects made on nvidiactl (minor 255) are on the GPU their device names
    (NV0080_ALLOC_PARAMETERS.deviceId); without a device above them they keep 255."""
    core, rm = env
    arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
    core.call(ALLOC, arg, rm.alloc, minor=255)
    client = struct.unpack_from("<I", arg, 8)[0]
    dev_params = ctypes.create_string_buffer(56)
    struct.pack_into("<I", dev_params, 0, 1)
    tsg_params = ctypes.create_string_buffer(64)
    struct.pack_into("<I", tsg_params, 12, 1)
    for parent, h, klass, prm in ((client, 0xD1, abi.NV01_DEVICE_0, dev_params),
                                  (client, 0xD0, abi.NV01_DEVICE_0, None),  # no params: device 0
                                  (0xD1, 0xE1, abi.NV20_SUBDEVICE_0, None),
                                  (0xD1, 0xF1, abi.KEPLER_CHANNEL_GROUP_A, tsg_params),
                                  (0xF1, 0xF2, abi.HOPPER_CHANNEL_GPFIFO_A, None),
                                  (0xD0, 0xF3, abi.KEPLER_CHANNEL_GROUP_A, tsg_params),
                                  (client, 0xC1, 0xCB33, None)):
        a = cs.alloc_arg(client, parent, h, klass, cs.addr(prm) if prm else 0)
        assert core.call(ALLOC, a, rm.alloc, minor=255).verdict == cs.GS_PASS
    gpu = {o["handle"]: o["gpu"] for o in core.objects()}
    assert gpu == {client: 255, 0xD1: 1, 0xD0: 0, 0xE1: 1, 0xF1: 1, 0xF2: 1, 0xF3: 0, 0xC1: 255}
    sched = cs.control_arg(client, 0xF1, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    core.call(CONTROL, sched, rm.control, minor=255)  # the channel is announced once scheduled
    ev = [e for e in core.events() if e["type"] in (cs.EV_TSG_NEW, cs.EV_CHANNEL_NEW)]
    assert [(e["handle"], e["gpu"]) for e in ev] == [(0xF1, 1), (0xF3, 0), (0xF2, 1)]
    # memory, counted or refused, is on its device's GPU too
    small, big = cs.mem_params(MiB), cs.mem_params(2 * GiB)
    a = cs.alloc_arg(client, 0xD1, 0x99, abi.NV01_MEMORY_LOCAL_USER, cs.addr(small))
    core.call(ALLOC, a, rm.alloc, minor=255)
    assert {o["handle"]: o["gpu"] for o in core.objects()}[0x99] == 1
    a = cs.alloc_arg(client, 0xD1, 0x9A, abi.NV01_MEMORY_LOCAL_USER, cs.addr(big))
    assert core.call(ALLOC, a, rm.alloc, minor=255).refusal == cs.GS_REFUSE_QUOTA
    assert [e["gpu"] for e in core.events() if e["type"] == cs.EV_ALLOC_REFUSED] == [1]


# ---- filter ----

def disable_params(pairs):
    b = ctypes.create_string_buffer(abi.DISABLE_CHANNELS_SIZE)
    abi.DISABLE_CHANNELS_HEAD.pack_into(b, 0, 1, len(pairs), 0, 0, 0)
    for i, (c, h) in enumerate(pairs):
        struct.pack_into("<I", b, abi.DISABLE_CHANNELS_HEAD.size + 4 * i, c)
        struct.pack_into("<I", b, abi.DISABLE_CHANNELS_HEAD.size + 256 + 4 * i, h)
    return b


def test_disable_channels_foreign_and_own(env):
    core, rm = env
    p = Proc(core, rm)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                     disable_params([(0xC1D0FFFF, 0x5C000010)]), abi.DISABLE_CHANNELS_SIZE)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_FOREIGN)
    r, arg = p.control(SUB, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                       disable_params([(p.client, 0x5C000010)]), abi.DISABLE_CHANNELS_SIZE)
    assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_GLOBAL)
    assert struct.unpack_from("<I", arg, 28)[0] == PERM
    assert core.stats()["refused_filter"] == 2
    ev = [e for e in core.events() if e["type"] == cs.EV_FILTER_REFUSED]
    assert [e["cmd"] for e in ev] == [abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS] * 2
    assert all(e["status"] == PERM for e in ev)
    assert all(e["client"] == p.client and e["handle"] == SUB for e in ev)


def test_disable_channels_unreadable_or_short(env, so):
    core, rm = env
    p = Proc(core, rm)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, None, abi.DISABLE_CHANNELS_SIZE)
    assert r.verdict == cs.GS_REPLY and r.status == abi.NV_ERR_INVALID_POINTER
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, disable_params([]), 8)
    assert r.verdict == cs.GS_REPLY and r.refusal == cs.GS_REFUSE_MALFORMED


def test_control_on_foreign_client(env):
    core, rm = env
    a = Proc(core, rm)
    r, _ = a.control(SUB, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, client=0xC1D0ABCD)
    assert (r.status, r.refusal) == (PERM, cs.GS_REFUSE_FOREIGN)


@pytest.mark.parametrize("cmd", [
    abi.NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES, abi.NV2080_CTRL_CMD_GPU_SET_ECC_CONFIGURATION,
    abi.NV2080_CTRL_CMD_GPU_SET_PARTITIONS, abi.NV0080_CTRL_CMD_GPU_MODIFY_SW_STATE_PERSISTENCE,
    abi.NV2080_CTRL_CMD_PERF_SET_POWERSTATE, abi.NV2080_CTRL_CMD_GPU_SET_POWER,
    abi.NV0000_CTRL_CMD_GPU_MODIFY_DRAIN_STATE, abi.NV0080_CTRL_CMD_BIF_RESET,
    abi.NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET,
])
def test_global_controls_refused(env, cmd):
    core, rm = env
    p = Proc(core, rm)
    r, _ = p.control(SUB, cmd)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_GLOBAL)


def test_a_container_cannot_raise_its_tsgs_interleave_level(env):
    """SET_INTERLEAVE_LEVEL is the operator's (the library's GPUSLICE_INTERLEAVE, issued
    past the core): HIGH would put a container's TSGs between every other one in the
    runlist, so from a container it is refused, not passed to RM."""
    core, rm = env
    p = Proc(core, rm)
    passed = []
    level = ctypes.c_uint32(2)  # NVA06C_CTRL_INTERLEAVE_LEVEL_HIGH
    tsg = p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A)[1]
    r, _ = p.control(tsg, abi.NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, level, 4,
                     driver=lambda arg: passed.append(arg) or rm.control(arg))
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_GLOBAL)
    assert not passed


@pytest.mark.parametrize("cmd", [abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD,
                                 abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD])
def test_export_import_naming_no_file_of_the_instance_refused(env, cmd):
    """The glue found no nvidiactl of the caller's instance at the fd (fd_file_id 0):
    tests/test_core_export.py has the rest."""
    core, rm = env
    p = Proc(core, rm)
    params = ctypes.create_string_buffer(24)
    struct.pack_into("<I", params, 0 if cmd == abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD else 4,
                     abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM)
    size = 24 if cmd == abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD else 20
    r, _ = p.control(p.client, cmd, params, size)
    assert r.refusal == cs.GS_REFUSE_FOREIGN and r.status == PERM


def test_unlisted_control_denied_listed_allowed(env):
    core, rm = env
    p = Proc(core, rm)
    r, _ = p.control(SUB, 0x20801327)  # FB_GET_CALIBRATION_LOCK_FAILED: on no row
    # answered as RM answers a control the object does not have (rs_resource.c resControlLookup_IMPL)
    assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_UNLISTED)
    r, _ = p.control(SUB, 0x20800110)  # GPU_GET_NAME_STRING: traced
    assert r.verdict == cs.GS_PASS
    r, _ = p.control(0x5C000050, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, ctypes.create_string_buffer(8), 8)
    # CUDA sets its own TSGs' timeslice: answered NV_OK, not passed (the operator's, issue 11)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, 0, cs.GS_REFUSE_NONE)


def test_dup_and_share_across_clients(env):
    core, rm = env
    a = Proc(core, rm)
    _, h = a.mem(MiB)
    r = core.call(DUP, cs.dup_arg(a.client, DEV, 0x778, 0xC1D0DEAD, h), rm.ok(24))
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_FOREIGN)
    r = core.call(DUP, cs.dup_arg(0xC1D0DEAD, DEV, 0x778, a.client, h), rm.ok(24))
    assert r.refusal == cs.GS_REFUSE_FOREIGN
    # a share policy on its own object passes (cudaIpcGetMemHandle); on another's, refused
    share = bytearray(abi.NVOS57.pack(a.client, h, 0, 0, abi.RS_SHARE_TYPE_ALL, 0, 0))
    assert core.call(abi.IOCTL_RM_SHARE, share, rm.ok(20)).verdict == cs.GS_PASS
    share = bytearray(abi.NVOS57.pack(0xC1D0DEAD, h, 0, 0, abi.RS_SHARE_TYPE_ALL, 0, 0))
    r = core.call(abi.IOCTL_RM_SHARE, share, rm.ok(20))
    assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_FOREIGN)
    assert struct.unpack_from("<I", share, 20)[0] == PERM


def test_alloc_and_free_under_foreign_client(env):
    core, rm = env
    Proc(core, rm)
    r = core.call(ALLOC, cs.alloc_arg(0xC1D0DEAD, DEV, 0x55, abi.NV01_DEVICE_0), rm.alloc)
    assert r.refusal == cs.GS_REFUSE_FOREIGN
    r = core.call(FREE, cs.free_arg(0xC1D0DEAD, 0xC1D0DEAD, 0xC1D0DEAD), rm.ok(12))
    assert r.refusal == cs.GS_REFUSE_FOREIGN


@pytest.mark.parametrize("klass,why,status", [
    # a class on no row: RM's answer for a class it does not have (alloc_free.c)
    (abi.NV20_SUBDEVICE_DIAG, cs.GS_REFUSE_UNLISTED, abi.NV_ERR_INVALID_CLASS),
    (0xC637, cs.GS_REFUSE_UNLISTED, abi.NV_ERR_INVALID_CLASS),
    (abi.NV01_MEMORY_LOCAL_PRIVILEGED, cs.GS_REFUSE_CLASS, PERM),
    # fabric memory of other processes and nodes: RM's answer to a client without an IMEX channel
    (abi.NV_MEMORY_FABRIC_IMPORT_V2, cs.GS_REFUSE_FOREIGN, PERM),
    (abi.NV_MEMORY_FABRIC_IMPORTED_REF, cs.GS_REFUSE_FOREIGN, PERM),
    (abi.NV_MEMORY_EXPORT, cs.GS_REFUSE_FOREIGN, PERM),
])
def test_classes_refused(env, klass, why, status):
    core, rm = env
    p = Proc(core, rm)
    r, _, _ = p.alloc(SUB, klass)
    assert (r.status, r.refusal) == (status, why)


@pytest.mark.parametrize("nr", [abi.NV_ESC_IOCTL_XFER_CMD, abi.NV_ESC_RM_BIND_CONTEXT_DMA,
                                abi.NV_ESC_RM_EXPORT_OBJECT_TO_FD, abi.NV_ESC_RM_IMPORT_OBJECT_FROM_FD,
                                abi.NV_ESC_RM_GET_EVENT_DATA, abi.NV_ESC_RM_ACCESS_REGISTRY,
                                abi.NV_ESC_SET_NUMA_STATUS, abi.NV_ESC_RM_I2C_ACCESS, 0x77])
def test_escapes_refused(env, nr):
    core, _ = env
    r = core.call(abi.iowr(nr, 64), bytearray(64))
    assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, 1, cs.GS_REFUSE_ESCAPE)  # EPERM


def test_test_escape_only_with_flag(env):
    core, _ = env
    req = abi.iowr(0xF0, 16)
    assert core.call(req, bytearray(16)).verdict == cs.GS_FAIL
    core.set_flags(cs.GS_INST_ALLOW_TEST_ESCAPES)
    assert core.call(req, bytearray(16)).verdict == cs.GS_PASS


def test_uvm_passes(env):
    core, _ = env
    assert core.call(0x30000001, bytearray(), kind=cs.GS_FILE_UVM).verdict == cs.GS_PASS


def test_names(env):
    core, _ = env
    lib = core.lib
    assert lib.t_escape_name(0x2B) == b"RM_ALLOC"
    assert lib.t_class_name(0xC86F) == b"HOPPER_CHANNEL_GPFIFO_A"
    assert lib.t_refusal_name(cs.GS_REFUSE_QUOTA) == b"quota"
    assert lib.t_escape_name(0x77) is None


# ---- malformed input ----

@pytest.mark.parametrize("nr,need", [(abi.NV_ESC_RM_ALLOC, 48), (abi.NV_ESC_RM_CONTROL, 32),
                                     (abi.NV_ESC_RM_FREE, 16), (abi.NV_ESC_RM_DUP_OBJECT, 28),
                                     (abi.NV_ESC_RM_SHARE, 24), (abi.NV_ESC_RM_MAP_MEMORY, 56),
                                     (abi.NV_ESC_RM_ALLOC_MEMORY, 56), (abi.NV_ESC_ALLOC_OS_EVENT, 16)])
def test_short_blocks_fail_with_einval(env, nr, need):
    core, rm = env
    Proc(core, rm)
    for size in (0, 1, need - 1):
        r = core.call(abi.iowr(nr, size), bytearray(size))
        assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, 22, cs.GS_REFUSE_MALFORMED)


def test_unreadable_alloc_params(env, so):
    core, rm = env
    p = Proc(core, rm)
    arg = cs.alloc_arg(p.client, DEV, 0x66, abi.NV01_MEMORY_LOCAL_USER, 0x10)
    r = core.call(ALLOC, arg, rm.alloc)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_POINTER, cs.GS_REFUSE_MALFORMED)
    pr = cs.mem_params(MiB)
    core.lib.t_set_bad(cs.addr(pr), cs.addr(pr) + 128)
    try:
        arg = cs.alloc_arg(p.client, DEV, 0x67, abi.NV01_MEMORY_LOCAL_USER, cs.addr(pr))
        assert core.call(ALLOC, arg, rm.alloc).status == abi.NV_ERR_INVALID_POINTER
    finally:
        core.lib.t_set_bad(0, 0)
    assert core.stats()["used"] == 0


def test_fuzz_random_blocks_never_crash(so):
    """Random requests, sizes and bytes, with pointers that are often unreadable."""
    rnd = random.Random(1234)
    core = cs.Core(so, GiB)
    rm = cs.MockRM()
    p = Proc(core, rm)
    good = cs.mem_params(MiB)
    nrs = [0x27, 0x29, 0x2A, 0x2B, 0x34, 0x35, 0x4E, 0x4F, 0x5E, 0xC8, 0xC9, 0xCE, 0xCF, 0xD3, 0xF0]
    for i in range(20000):
        nr = rnd.choice(nrs) if rnd.random() < 0.9 else rnd.randrange(256)
        size = rnd.choice([0, 1, 4, 16, 24, 28, 32, 48, 56, 64, rnd.randrange(0, 300)])
        arg = bytearray(rnd.getrandbits(8) for _ in range(size))
        if size >= 24 and rnd.random() < 0.5:
            struct.pack_into("<I", arg, 0, p.client)  # own client, to reach deeper paths
        if size >= 24 and rnd.random() < 0.3:
            struct.pack_into("<Q", arg, 16, rnd.choice([0, 8, cs.addr(good)]))
        typ = abi.NV_IOCTL_MAGIC if rnd.random() < 0.95 else rnd.randrange(256)
        req = abi.ioc(3, typ, nr, size)
        r = core.call(req, arg, lambda a: 0, file_id=rnd.choice([1, 2]))
        assert r.verdict in (cs.GS_PASS, cs.GS_REPLY, cs.GS_FAIL)
    core.file_closed(1)
    core.file_closed(2)
    assert core.stats()["used"] == 0
    core.close()


# ---- invariant under random sequences ----

@pytest.mark.parametrize("seed", range(6))
def test_used_equals_sum_of_live_allocations(so, seed):
    rnd = random.Random(seed)
    core = cs.Core(so, 2 * GiB)
    rm = cs.MockRM(pad=rnd.choice([0, 2 * MiB]))
    procs = [Proc(core, rm, file_id=f, pid=1000 + f) for f in (1, 2, 3)]
    live = {}  # (client, handle) -> block id ; blocks: id -> size
    blocks = {}
    for step in range(600):
        p = rnd.choice(procs)
        op = rnd.random()
        mine = [k for k in live if k[0] == p.client]
        if op < 0.5:
            size = rnd.choice([1, 2 * MiB, 64 * MiB, 300 * MiB, rnd.randrange(1, 512 * MiB)])
            used = sum(blocks.values())
            r, h = p.mem(size)
            if r.verdict == cs.GS_PASS:
                bid = (p.client, h)
                live[bid] = bid
                blocks[bid] = max(size + rm.pad, rm_takes(size))
            else:
                assert r.refusal == cs.GS_REFUSE_QUOTA
                # the core reserves what RM may allocate: the size in 2 MiB pages
                assert used + -(-size // (2 * MiB)) * 2 * MiB > 2 * GiB
        elif op < 0.75 and mine:
            k = rnd.choice(mine)
            p.free(k[1])
            bid = live.pop(k)
            if bid not in live.values():
                blocks.pop(bid)
        elif op < 0.85 and mine:
            k = rnd.choice(mine)
            nh = 0x7000 + step
            r = core.call(DUP, cs.dup_arg(p.client, DEV, nh, p.client, k[1]), rm.ok(24))
            assert r.verdict == cs.GS_PASS
            live[(p.client, nh)] = live[k]
        elif op < 0.9:
            core.file_closed(p.file_id)
            for k in [k for k in live if k[0] == p.client]:
                bid = live.pop(k)
                if bid not in live.values():
                    blocks.pop(bid)
            procs.remove(p)
            procs.append(Proc(core, rm, file_id=p.file_id + 10, pid=p.pid))
        assert core.stats()["used"] == sum(blocks.values())
        objs = core.objects()
        mem = {(o["client"], o["handle"]) for o in objs if o["kind"] == cs.OBJ_MEMORY}
        assert mem == set(live)
    for p in procs:
        core.file_closed(p.file_id)
    assert core.stats()["used"] == 0 and core.stats()["objects"] == 0
    core.close()


@pytest.mark.parametrize("seed", range(4))
def test_random_trees_free_exactly_the_subtree(so, seed):
    """Objects under random parents, frees of random nodes (leaves and inner ones): the
    core forgets exactly the subtree RM forgets, and its memory."""
    rnd = random.Random(100 + seed)
    core = cs.Core(so, 1 << 50)
    rm = cs.MockRM()
    p = Proc(core, rm)
    parent = {DEV: p.client, SUB: DEV}  # the model: handle -> parent handle
    size = {}
    nxt = 0x1000
    for step in range(800):
        nodes = list(parent)
        op = rnd.random()
        if op < 0.7:
            nxt += 1
            under = rnd.choice(nodes)
            if op < 0.35:
                r, _, _ = p.alloc(under, abi.FERMI_VASPACE_A, handle=nxt)
            else:
                pr = cs.mem_params(rnd.randrange(1, 64) * MiB)
                r, _, _ = p.alloc(under, abi.NV01_MEMORY_LOCAL_USER, handle=nxt, params=pr)
                size[nxt] = rm_takes(struct.unpack_from("<Q", pr, 64)[0])
            assert r.verdict == cs.GS_PASS
            parent[nxt] = under
        elif len(nodes) > 1:
            victim = rnd.choice(nodes[1:])  # everything but the device (freed last, below)
            p.free(victim, parent=parent[victim])
            gone = {victim}
            changed = True
            while changed:
                changed = False
                for h, up in parent.items():
                    if up in gone and h not in gone:
                        gone.add(h)
                        changed = True
            for h in gone:
                parent.pop(h)
                size.pop(h, None)
        live = {o["handle"] for o in core.objects() if o["handle"] != p.client}
        assert live == set(parent), step
        assert core.stats()["used"] == sum(size.values()), step
    p.free(DEV, parent=p.client)
    assert core.stats()["used"] == 0
    assert {o["handle"] for o in core.objects()} == {p.client}
    core.file_closed(1)
    assert core.stats()["used"] == 0 and core.stats()["objects"] == 0
    core.close()


def test_channel_cap_refuses_like_rm_out_of_resources(env):
    """Channels take framebuffer RM counts nowhere (instance blocks, GR context): their
    number per instance is capped (core_int.h GS_MAX_CHANNELS)."""
    core, rm = env
    p = Proc(core, rm)
    made = 0
    for i in range(1100):
        r = core.call(ALLOC, cs.alloc_arg(p.client, DEV, 0x9000 + i, abi.HOPPER_CHANNEL_GPFIFO_A), rm.ok(40))
        if r.verdict != cs.GS_PASS:
            assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INSUFFICIENT_RESOURCES,
                                                        cs.GS_REFUSE_LIMIT)
            break
        made += 1
    assert made == 1024
    assert core.call(FREE, cs.free_arg(p.client, DEV, 0x9000), rm.ok(12)).verdict == cs.GS_PASS
    r = core.call(ALLOC, cs.alloc_arg(p.client, DEV, 0xA000, abi.HOPPER_CHANNEL_GPFIFO_A), rm.ok(40))
    assert r.verdict == cs.GS_PASS


def test_a_reply_rm_could_not_write_back_still_charges(env):
    """RM allocated, then failed to copy the parameters out (the caller made them
    read-only): status NV_ERR_INVALID_ADDRESS with the object alive (rs_server.c
    serverAllocApiCopyOut). The core charges the reservation under the handle asked."""
    core, rm = env
    p = Proc(core, rm)
    for i in range(3):
        params = cs.mem_params(64 * MiB)
        arg = cs.alloc_arg(p.client, DEV, 0x7100 + i, abi.NV01_MEMORY_LOCAL_USER, cs.addr(params))

        def rm_then_copyout_fails(a: bytearray) -> int:
            struct.pack_into("<I", a, 40, abi.NV_ERR_INVALID_ADDRESS)
            return 0

        r = core.call(ALLOC, arg, rm_then_copyout_fails, file_id=p.file_id, pid=p.pid)
        assert r.verdict == cs.GS_PASS
    assert core.stats()["used"] == 3 * 64 * MiB
    # freeing the handles returns it
    for i in range(3):
        assert p.free(0x7100 + i).verdict == cs.GS_PASS
    assert core.stats()["used"] == 0


def test_a_forged_rm_chosen_handle_cannot_free_another_allocation(env):
    """An allocation that lets RM choose its handle (hObjectNew 0): the reply names the
    handle, and another thread can rewrite it to one already registered. That must not
    replace (and uncharge) the registered allocation."""
    core, rm = env
    p = Proc(core, rm)
    r, h = p.mem(64 * MiB)
    assert r.verdict == cs.GS_PASS and core.stats()["used"] == 64 * MiB
    params = cs.mem_params(64 * MiB)
    arg = cs.alloc_arg(p.client, DEV, 0, abi.NV01_MEMORY_LOCAL_USER, cs.addr(params))

    def rm_then_forged(a: bytearray) -> int:
        struct.pack_into("<I", a, 8, h)  # the reply now names the first allocation
        struct.pack_into("<I", a, 40, 0)
        return 0

    assert core.call(ALLOC, arg, rm_then_forged, file_id=p.file_id, pid=p.pid).verdict == cs.GS_PASS
    assert core.stats()["used"] == 128 * MiB



# ---- the instance lock's hold and wait times (port.h) ----

def test_lock_buckets_are_log2_ns(env):
    core, _ = env
    nb = cs.LOCK_HIST_BUCKETS
    assert [core.lock_bucket(ns) for ns in (0, 1, 2, 3, 4, 1023, 1024, 2047)] == [0, 1, 2, 2, 3, 10, 11, 11]
    assert core.lock_bucket((1 << (nb - 2)) - 1) == nb - 2
    assert core.lock_bucket(1 << (nb - 2)) == nb - 1
    assert core.lock_bucket((1 << 64) - 1) == nb - 1


def test_lock_counts_every_hold_and_its_histograms_sum_to_it(env):
    """pre and post take the lock once each; a read of the stats is counted by the next one."""
    core, rm = env
    p = Proc(core, rm)
    s0 = core.lock_stats()
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, ctypes.create_string_buffer(1028), 1028)
    assert r.verdict == cs.GS_PASS
    r, _ = p.mem(2 * GiB)  # refused: pre only
    assert r.status == abi.NV_ERR_NO_MEMORY
    s1 = core.lock_stats()
    assert s1["acquired"] - s0["acquired"] == 1 + 2 + 1
    for s in (s0, s1):
        assert sum(s["hold_hist"]) == sum(s["wait_hist"]) == s["acquired"]
        assert s["contended"] == 0 and s["wait_ns"] == 0 and s["wait_hist"][0] == s["acquired"]
        assert 0 < s["hold_max_ns"] <= s["hold_ns"]
        top = max(i for i, n in enumerate(s["hold_hist"]) if n)
        assert core.lock_bucket(s["hold_max_ns"]) == top


def test_lock_wait_and_long_hold_are_measured(env):
    """A call that finds the lock held waits for it: counted as contended, its wait and
    the long hold land in their buckets and in the maxima."""
    import threading
    import time

    core, rm = env
    p = Proc(core, rm)
    holder = threading.Thread(target=core.hold_lock, args=(300_000,))
    holder.start()
    while not core.holding():
        time.sleep(0.001)
    r, _ = p.control(SUB, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, ctypes.create_string_buffer(1028), 1028)
    holder.join()
    assert r.verdict == cs.GS_PASS
    s = core.lock_stats()
    assert s["contended"] == 1
    assert s["hold_max_ns"] >= 300_000_000
    assert s["wait_max_ns"] >= 100_000_000  # it waited out most of the 300 ms hold
    assert s["hold_hist"][core.lock_bucket(s["hold_max_ns"])] == 1
    assert s["wait_hist"][core.lock_bucket(s["wait_max_ns"])] == 1
    assert sum(s["hold_hist"]) == sum(s["wait_hist"]) == s["acquired"]


def _old_unkeyed_bucket(client: int, handle: int) -> int:
    """registry.c's hash before issue 11: the same for every instance, computable by anyone."""
    h = (client * 0x9E3779B1) & 0xFFFFFFFF
    h ^= (handle + 0x7F4A7C15 + (h << 6) + (h >> 2)) & 0xFFFFFFFF
    return (h ^ (h >> 16)) & 1023


def test_handles_aimed_at_one_bucket_do_not_chain(env):
    """Issue 11 item 2: the object table's hash was unkeyed, so a container could pick
    handles that all land in one bucket and make every lookup under its instance's lock
    walk them all. Keyed per instance (siphash in the module), 1500 such handles spread."""
    core, rm = env
    p = Proc(core, rm)
    target = _old_unkeyed_bucket(p.client, 0x7000)
    handles = [h for h in range(0x7000, 0x7000 + 1024 * 1600) if _old_unkeyed_bucket(p.client, h) == target][:1500]
    assert len(handles) == 1500
    for h in handles:
        r, _, _ = p.alloc(SUB, 0x90f1, handle=h)  # FERMI_VASPACE_A: registered, not counted
        assert r.verdict == cs.GS_PASS
    st = core.stats()
    print(f"1500 objects aimed at one bucket of the old hash: longest chain {st['max_chain']}")
    assert st["objects"] >= 1500
    assert st["max_chain"] < 32  # ~1.5 per bucket on average; the old hash: 1500

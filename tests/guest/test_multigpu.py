"""Instances and several GPUs (issue 15), on the stand-in with two GPUs: the module and
the stand-in are reloaded with num_gpus=2 for this file and put back as the suite loaded
them after it.

- An instance of GPU 0 has no node of GPU 1, and cannot make a device on it (RM's own
  check, device.c: osIsGpuAccessible) nor pin it (ATTACH_GPUS_TO_FD).
- A 2-GPU instance is limited on each GPU apart (GPU_MEM_LIMIT), and the memory-size
  replies of each GPU's subdevice are that GPU's.
- Within an instance, another process's memory can be duplicated (RM_DUP_OBJECT across
  clients of the instance, after the owner's RM_SHARE as cudaIpcGetMemHandle makes it);
  from another instance it is refused and counted."""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import pytest

from gpuslice import abi
from gpuslice.netlink import MAX_GPUS, GpusliceNetlink, NetlinkError, gpu_mem

import nvstub
from gsinst import Instance, load_as_the_suite, load_both, session, unload_all

MIB = 1 << 20

pytestmark = pytest.mark.skipif(not (nvstub.present() and os.path.exists("/sys/module/gpuslice")),
                                reason="needs nvstub.ko and gpuslice.ko loaded")


@pytest.fixture(scope="module")
def nl():
    unload_all()
    load_both(os.environ.get("NVSTUB_ARGS", "").split() + ["num_gpus=2"],
              os.environ.get("GPUSLICE_ARGS", "").split())
    try:
        with GpusliceNetlink() as sock:
            yield sock
    finally:
        load_as_the_suite()


def limits(**per: int) -> list[int]:
    """GPU_MEM_LIMIT's array: limits(g0=64 * MIB, g1=32 * MIB)."""
    out = [0] * MAX_GPUS
    for k, v in per.items():
        out[int(k[1:])] = v
    return out


def fb(s, indexes: list[int], subdevice: int | None = None) -> dict[int, int]:
    st, info = nvstub.fb_info(s.ctl, s.client, s.subdevice if subdevice is None else subdevice, indexes)
    assert st == abi.NV_OK
    return info


def test_an_instance_of_gpu0_reaches_no_other_gpu(nl) -> None:
    with Instance(nl, 64 * MIB, gpu_mask=0b01) as inst:
        assert os.path.exists(inst.path("nvidia0")) and not os.path.exists(inst.path("nvidia1"))
        s = session(inst)
        try:
            # a device on GPU 1 through the instance's nvidiactl: RM refuses it, since the
            # process has no file of GPU 1 (nv_is_gpu_accessible()); nothing is charged
            dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.pack(1, 0, 0, 0, 0, 0, 0, 0, 0),
                                             abi.DEVICE_ALLOC_PARAMS.size)
            st, _ = nvstub.rm_alloc(s.ctl, s.client, s.client, 0x5C0000D1, abi.NV01_DEVICE_0, dp)
            assert st != abi.NV_OK
            used1 = nvstub.pool_used(1)
            st, _, _ = s.alloc_vidmem(MIB)
            assert st == abi.NV_OK and nvstub.pool_used(1) == used1
            # pinning GPU 1 to a file by id is refused (GPU 0's own id is not)
            ids = nvstub.gpu_ids(s.ctl)
            assert nvstub.attach_gpus(s.ctl, [ids[0], ids[1]]) == -errno.EPERM
            assert nvstub.attach_gpus(s.ctl, [ids[0]]) == 0
        finally:
            s.close()
    with Instance(nl, 64 * MIB, gpu_mask=0b10) as inst:
        assert os.path.exists(inst.path("nvidia1")) and not os.path.exists(inst.path("nvidia0"))
    with pytest.raises(NetlinkError) as e:
        nl.instance_new("nogpu2", 0b100, 64 * MIB)
    assert e.value.errno == errno.ENODEV


def test_a_two_gpu_instance_is_limited_on_each_gpu(nl) -> None:
    with Instance(nl, 64 * MIB, gpu_mask=0b11, gpu_mem_limit=limits(g1=32 * MIB)) as inst:
        s0, s1 = session(inst, 0), session(inst, 1)
        try:
            # GPU 1: 32 MiB, then refused as RM refuses
            st, h1, _ = s1.alloc_vidmem(32 * MIB)
            assert st == abi.NV_OK
            assert s1.alloc_vidmem(2 * MIB)[0] == abi.NV_ERR_NO_MEMORY
            # GPU 0 keeps its own 64 MiB
            assert s0.alloc_vidmem(64 * MIB)[0] == abi.NV_OK
            assert s0.alloc_vidmem(2 * MIB)[0] == abi.NV_ERR_NO_MEMORY
            # one client with a device on each GPU: memory goes to the device's GPU
            dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.pack(1, 0, 0, 0, 0, 0, 0, 0, 0),
                                             abi.DEVICE_ALLOC_PARAMS.size)
            assert nvstub.rm_alloc(s0.ctl, s0.client, s0.client, 0x5C0000D1, abi.NV01_DEVICE_0, dp)[0] == abi.NV_OK
            p = nvstub.mem_params(2 * MIB)
            st, _ = nvstub.rm_alloc(s0.ctl, s0.client, 0x5C0000D1, 0x5C0000E1, abi.NV01_MEMORY_LOCAL_USER, p)
            assert st == abi.NV_ERR_NO_MEMORY  # GPU 1 is full, GPU 0 too
            d = inst.get()
            gm = gpu_mem(d)
            assert set(gm) == {0, 1}
            assert (gm[0]["limit"], gm[0]["used"]) == (64 * MIB, 64 * MIB)
            assert (gm[1]["limit"], gm[1]["used"]) == (32 * MIB, 32 * MIB)
            assert d["mem_used"] == 96 * MIB and d["nr_refused_quota"] == 3
            # each subdevice reports its GPU's size and room
            size, free = abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE, abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE
            assert fb(s1, [size, free]) == {size: 32 * 1024, free: 0}
            assert fb(s0, [size, free]) == {size: 64 * 1024, free: 0}
            # a free gives room back on its GPU only
            assert s1.free(h1) == abi.NV_OK
            assert fb(s1, [free])[free] == 32 * 1024 and fb(s0, [free])[free] == 0
            assert nvstub.rm_alloc(s0.ctl, s0.client, 0x5C0000D1, 0x5C0000E2, abi.NV01_MEMORY_LOCAL_USER,
                                   nvstub.mem_params(2 * MIB))[0] == abi.NV_OK
            assert gpu_mem(inst.get())[1]["used"] == 2 * MIB
            # limits change live; one for a GPU outside the instance is refused
            nl.instance_set(inst.name, gpu_mem_limit=limits(g1=8 * MIB))
            assert gpu_mem(inst.get())[1]["limit"] == 8 * MIB
            assert fb(s1, [size])[size] == 8 * 1024
            with pytest.raises(NetlinkError) as e:
                nl.instance_set(inst.name, gpu_mem_limit=limits(g2=8 * MIB))
            assert e.value.errno == errno.EINVAL
            assert gpu_mem(inst.get())[1]["limit"] == 8 * MIB
        finally:
            s0.close()
            s1.close()
        d = inst.get()
        assert d["mem_used"] == 0 and all(v["used"] == 0 for v in gpu_mem(d).values())


def test_memory_is_shared_within_an_instance_and_not_across(nl) -> None:
    with Instance(nl, 64 * MIB, gpu_mask=0b11) as a, Instance(nl, 64 * MIB, gpu_mask=0b11) as b:
        sa, sa2, sb = session(a, 1), session(a, 1), session(b, 1)
        try:
            st, h, _ = sa.alloc_vidmem(16 * MIB)
            assert st == abi.NV_OK
            # another process of the same instance (another client) duplicates it: one charge
            st, _ = sa2.dup(h, src_client=sa.client)
            assert st == abi.NV_OK
            assert gpu_mem(a.get())[1]["used"] == 16 * MIB
            # another instance cannot: refused, counted, nothing charged to either
            refused = b.get()["nr_refused_filter"]
            st, _ = sb.dup(h, src_client=sa.client)
            assert st == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert b.get()["nr_refused_filter"] == refused + 1
            assert gpu_mem(b.get())[1]["used"] == 0 and gpu_mem(a.get())[1]["used"] == 16 * MIB
        finally:
            for s in (sa, sa2, sb):
                s.close()


def share(s, h: int, share_type: int = abi.RS_SHARE_TYPE_ALL) -> int:
    """RM_SHARE of (s.client, h) with a policy of share_type; RM's status."""
    buf = bytearray(abi.NVOS57.pack(s.client, h, 0, 0, share_type, 0, 0))
    assert nvstub.ioctl(s.ctl, abi.IOCTL_RM_SHARE, buf) == 0
    return abi.NVOS57.unpack(buf)[-1]


def test_a_shared_allocation_reaches_the_instances_other_processes_only(nl) -> None:
    """cudaIpcGetMemHandle's path, through the module: a process shares its memory
    (RM_SHARE, policy ALL); another process of its instance duplicates it (one charge);
    a process of another instance is refused by the module although RM's policy would
    let it; unshared memory stays the owner's process's (RM's default policy)."""
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        r, w = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:  # the exporting process
            code = 1
            try:
                s = session(a)
                st1, h1, _ = s.alloc_vidmem(8 * MIB)
                st2, h2, _ = s.alloc_vidmem(4 * MIB)
                shared = share(s, h1)
                os.write(w, struct.pack("<IIIIII", st1, st2, shared, s.client, h1, h2))
                os.read(r2, 1)
                s.close()
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        os.close(r2)
        sa, sb = session(a), session(b)
        try:
            st1, st2, shared, client, h1, h2 = struct.unpack("<IIIIII", os.read(r, 24))
            assert (st1, st2, shared) == (abi.NV_OK, abi.NV_OK, abi.NV_OK)
            assert sa.dup(h2, src_client=client)[0] == abi.NV_ERR_INSUFFICIENT_PERMISSIONS  # RM: not shared
            assert sa.dup(h1, src_client=client)[0] == abi.NV_OK
            assert gpu_mem(a.get())[0]["used"] == 12 * MIB  # the dup shares the owner's charge
            refused = b.get()["nr_refused_filter"]
            assert sb.dup(h1, src_client=client)[0] == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert b.get()["nr_refused_filter"] == refused + 1  # the module's refusal, counted
            assert gpu_mem(b.get())[0]["used"] == 0
            # nor can another instance set a policy on the object
            buf = bytearray(abi.NVOS57.pack(client, h1, 0, 0, abi.RS_SHARE_TYPE_ALL, 0, 0))
            assert nvstub.ioctl(sb.ctl, abi.IOCTL_RM_SHARE, buf) == 0
            assert abi.NVOS57.unpack(buf)[-1] == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert b.get()["nr_refused_filter"] == refused + 2
        finally:
            os.write(w2, b"x")
            os.close(w2)
            os.close(r)
            _, status = os.waitpid(pid, 0)
            sa.close()
            sb.close()
        assert os.waitstatus_to_exitcode(status) == 0

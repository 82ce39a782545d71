"""Guest tests of the stand-in's nvidia-uvm external mappings (tests/standin/nvstub_uvm.c),
against the bare stand-in (no gpuslice): UVM's RM duplicate of mapped memory keeps it in
the pool (/proc/nvstub/pool "used") after the caller frees its RM handle, until UVM lets it
go: UVM_FREE of the range, UVM_UNMAP_EXTERNAL of every piece, a later map over it on the
same GPU, or the release of the nvidia-uvm file. And the statuses of the real driver's
checks, each citing open-gpu-kernel-modules 580:
  kernel-open/nvidia-uvm/uvm_map_external.c  uvm_create_external_range,
      uvm_map_external_allocation[_on_gpu], uvm_unmap_external[_in_range], uvm_ext_gpu_map_split
  kernel-open/nvidia-uvm/uvm_va_range.c      uvm_free
  kernel-open/nvidia-uvm/uvm_va_space.c      uvm_va_space_register_gpu[_va_space]
  src/nvidia/src/kernel/rmapi/nv_gpu_ops.c   dupMemory (RM's side of the duplicate)
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvstub  # noqa: E402
from gpuslice import abi  # noqa: E402
from test_standin_model import worker  # noqa: E402

pytestmark = [pytest.mark.guest,
              pytest.mark.skipif(not nvstub.present(), reason="nvstub.ko is not loaded")]

KIB = 1 << 10
MIB = 1 << 20
# nvstatuscodes.h values gpuslice.abi may not have
NV_ERR_GPU_UUID_NOT_FOUND = 0x12
NV_ERR_INVALID_OFFSET = 0x37
NV_ERR_OUT_OF_RANGE = 0x5B
NV_ERR_UVM_ADDRESS_IN_USE = 0x68
NV_ERR_INVALID_FLAGS = getattr(abi, "NV_ERR_INVALID_FLAGS", 0x29)

BASE = 0x7E0000000000  # 512 MiB aligned: the mapping page size comes from the memory
GPU0 = nvstub.standin_uuid(0)
NOT_A_GPU = b"GPU-not-a-gpu-uu"


@pytest.fixture
def sess() -> Iterator[nvstub.Session]:
    s = nvstub.Session()
    yield s
    s.close()


@pytest.fixture
def uvm(sess: nvstub.Session) -> Iterator[nvstub.Uvm]:
    """An initialized nvidia-uvm file with GPU 0 and its GPU VA space registered."""
    u = nvstub.Uvm()
    try:
        u.register(sess)
        yield u
    finally:
        u.close()


def used() -> int:
    return nvstub.pool_used(0)


def vidmem(s: nvstub.Session, size: int = 16 * MIB, **fields: int) -> int:
    st, h, got = s.alloc_vidmem(size, **fields)
    assert st == abi.NV_OK and got == size, hex(st)
    return h


def pid_vidmem(s: nvstub.Session) -> tuple[int, int, int]:
    """GET_PID_INFO of this process on GPU 0: (memPrivate, memSharedOwned, memSharedDuped)."""
    st, [info] = nvstub.get_pid_info(s.ctl, s.client, s.subdevice, [os.getpid()])
    assert st == abi.NV_OK
    return info.private, info.shared_owned, info.shared_duped


def plus(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def mapped(u: nvstub.Uvm, s: nvstub.Session, h: int, base: int = BASE, size: int = 16 * MIB) -> None:
    """An external range [base, base + size) with (s.client, h) mapped on GPU 0."""
    assert u.create_range(base, size) == abi.NV_OK
    assert u.map(base, size, s.client, h, [GPU0]) == abi.NV_OK


# ---- GPU UUIDs -------------------------------------------------------------------------


def test_gid_info_reports_the_uuid_uvm_takes(sess: nvstub.Session) -> None:
    """NV2080_CTRL_CMD_GPU_GET_GID_INFO (gpu.c gpuGetGidInfo_IMPL, gpu_uuid.c
    transformGidToUserFriendlyString), the way CUDA learns the UUID it gives nvidia-uvm."""
    assert ("ctrl", nvstub.NV2080_CTRL_CMD_GPU_GET_GID_INFO) in nvstub.read_implemented()
    assert nvstub.gpu_uuid(sess.ctl, sess.client, sess.subdevice) == (abi.NV_OK, GPU0)
    st, text = nvstub.gpu_uuid(sess.ctl, sess.client, sess.subdevice, flags=0)   # ASCII
    assert st == abi.NV_OK and text == b"GPU-6e767374-7562-0000-0000-000000000000\0"
    assert nvstub.gpu_uuid(sess.ctl, sess.client, sess.subdevice, flags=0x4)[0] == NV_ERR_INVALID_FLAGS  # not SHA1


def test_gpu_registration(sess: nvstub.Session) -> None:
    """uvm_va_space_register_gpu: a GPU of the driver (nvUvmInterfaceRegisterGpu:
    NV_ERR_GPU_UUID_NOT_FOUND), once (NV_ERR_INVALID_DEVICE); register_gpu_va_space: a
    registered GPU, once (NV_ERR_INVALID_DEVICE)."""
    with nvstub.Uvm() as u:
        assert u.register_gpu(sess, NOT_A_GPU) == NV_ERR_GPU_UUID_NOT_FOUND
        assert u.register_gpu_va_space(sess) == abi.NV_ERR_INVALID_DEVICE      # GPU not registered
        assert u.register_gpu(sess) == abi.NV_OK
        assert u.register_gpu(sess) == abi.NV_ERR_INVALID_DEVICE
        # a registered GPU without a GPU VA space: nothing can be mapped on it
        # (uvm_va_space_get_gpu_by_uuid_with_gpu_va_space), but unmapping needs only the GPU
        h = vidmem(sess)
        assert u.create_range(BASE, 16 * MIB) == abi.NV_OK
        assert u.map(BASE, 16 * MIB, sess.client, h, [GPU0]) == abi.NV_ERR_INVALID_DEVICE
        assert u.unmap(BASE, 16 * MIB, GPU0) == abi.NV_OK
        assert u.register_gpu_va_space(sess) == abi.NV_OK
        assert u.register_gpu_va_space(sess) == abi.NV_ERR_INVALID_DEVICE
        assert u.map(BASE, 16 * MIB, sess.client, h, [GPU0]) == abi.NV_OK
    with nvstub.Uvm() as other:   # registrations belong to the VA space (the file)
        assert other.register_gpu(sess) == abi.NV_OK


# ---- what keeps memory in the pool -----------------------------------------------------


def test_map_holds_the_memory_until_uvm_free(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    base, mine = used(), pid_vidmem(sess)
    h = vidmem(sess)
    assert used() == base + 16 * MIB
    assert pid_vidmem(sess) == plus(mine, (16 * MIB, 0, 0))
    mapped(uvm, sess, h)
    # UVM's duplicate is a DupCount like any RM duplicate: the owner's memory is now shared
    assert pid_vidmem(sess) == plus(mine, (0, 16 * MIB, 0))
    assert sess.free(h) == abi.NV_OK
    assert used() == base + 16 * MIB                          # UVM still holds it
    assert pid_vidmem(sess) == mine                           # in no process's count
    # uvm_free: exactly the range, or NV_ERR_INVALID_ADDRESS and nothing happens
    assert uvm.free(BASE, 8 * MIB) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.free(BASE + 2 * MIB, 14 * MIB) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.free(BASE - 2 * MIB, 18 * MIB) == abi.NV_ERR_INVALID_ADDRESS
    assert used() == base + 16 * MIB
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK
    assert used() == base
    # the range went with it
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK              # nothing tracked there any more
    assert uvm.unmap(BASE, 16 * MIB, GPU0) == abi.NV_ERR_INVALID_ADDRESS


def test_the_memory_outlives_its_client_and_file(uvm: nvstub.Uvm) -> None:
    base = used()
    s = nvstub.Session()
    try:
        mapped(uvm, s, vidmem(s))
    finally:
        s.close()                                             # the client and its memory handle go
    assert used() == base + 16 * MIB
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK
    assert used() == base


def test_unmap_external_releases_the_last_piece(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    base = used()
    h = vidmem(sess)
    mapped(uvm, sess, h)
    assert sess.free(h) == abi.NV_OK
    # mapped with 2 MiB pages: a cut must fall on one (uvm_ext_gpu_map_split)
    assert uvm.unmap(BASE + 4 * KIB, 8 * MIB, GPU0) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.unmap(BASE, 8 * MIB, GPU0) == abi.NV_OK        # the first half: the rest holds it
    assert used() == base + 16 * MIB
    assert uvm.unmap(BASE + 10 * MIB, 2 * MIB, GPU0) == abi.NV_OK   # a hole: two pieces left
    assert used() == base + 16 * MIB
    assert uvm.unmap(BASE + 8 * MIB, 2 * MIB, GPU0) == abi.NV_OK
    assert used() == base + 16 * MIB
    assert uvm.unmap(BASE, 16 * MIB, GPU0) == abi.NV_OK       # over the gaps too: the last piece
    assert used() == base
    # the range stays, empty, for another map
    h = vidmem(sess)
    assert uvm.map(BASE, 16 * MIB, sess.client, h, [GPU0]) == abi.NV_OK
    assert sess.free(h) == abi.NV_OK
    assert uvm.unmap(BASE, 16 * MIB, GPU0) == abi.NV_OK
    assert used() == base
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK


def test_4k_page_memory_splits_on_4k(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    base = used()
    h = vidmem(sess, 64 * KIB, attr=abi.NVOS32_ATTR_PAGE_SIZE_4KB << abi.NVOS32_ATTR_PAGE_SIZE_SHIFT)
    mapped(uvm, sess, h, size=64 * KIB)
    assert sess.free(h) == abi.NV_OK
    assert uvm.unmap(BASE + 4 * KIB, 4 * KIB, GPU0) == abi.NV_OK
    assert used() == base + 64 * KIB
    assert uvm.unmap(BASE, 64 * KIB, GPU0) == abi.NV_OK
    assert used() == base


def test_closing_the_uvm_file_releases_everything(sess: nvstub.Session) -> None:
    base = used()
    u = nvstub.Uvm()
    try:
        u.register(sess)
        for i in range(3):
            h = vidmem(sess)
            mapped(u, sess, h, BASE + i * 32 * MIB)
            assert sess.free(h) == abi.NV_OK
        assert uvm_unmap_piece(u) == abi.NV_OK
        assert used() == base + 48 * MIB
        fcntl.ioctl(u.fd, abi.UVM_DEINITIALIZE, 0)            # releases nothing
        assert used() == base + 48 * MIB
    finally:
        u.close()                                             # uvm_va_space_destroy
    assert used() == base


def uvm_unmap_piece(u: nvstub.Uvm) -> int:
    """Leave the first mapping in two pieces (both go with the file)."""
    return u.unmap(BASE + 4 * MIB, 2 * MIB, GPU0)


def test_a_map_over_a_mapping_releases_it(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    """uvm_map_external_allocation_on_gpu unmaps what the GPU had there first, and that
    stays undone when the new map then fails."""
    base = used()
    a = vidmem(sess)
    mapped(uvm, sess, a)
    assert sess.free(a) == abi.NV_OK
    b = vidmem(sess, 32 * MIB)
    assert used() == base + 48 * MIB
    assert uvm.map(BASE, 16 * MIB, sess.client, b, [GPU0]) == abi.NV_OK
    assert used() == base + 32 * MIB                          # a went
    assert sess.free(b) == abi.NV_OK
    assert used() == base + 32 * MIB                          # b is held
    c = vidmem(sess)
    assert uvm.map(BASE, 4 * MIB, sess.client, c, [GPU0]) == abi.NV_OK   # over part of b's mapping
    assert used() == base + 48 * MIB                          # b's other piece holds it
    assert uvm.map(BASE + 4 * MIB, 12 * MIB, sess.client, 0x5C00DEAD, [GPU0]) == abi.NV_ERR_OBJECT_NOT_FOUND
    assert used() == base + 16 * MIB                          # ... which the failed map unmapped
    assert sess.free(c) == abi.NV_OK
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK
    assert used() == base


# ---- whose memory UVM may duplicate ------------------------------------------------------


def test_memory_of_another_process_needs_a_share(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    """dupMemory duplicates with NV04_DUP_HANDLE_FLAGS_REJECT_KERNEL_DUP_PRIVILEGE: the
    default RS_SHARE_TYPE_PID policy, for UVM's kernel client, wants the calling process to
    be the one that made the source client (client_resource.c cliresShareCallback_IMPL),
    else NV_ERR_INSUFFICIENT_PERMISSIONS (rs_access_map.c); RS_SHARE_TYPE_ALL lets anyone."""
    base = used()

    def owner(s: nvstub.Session, talk: Callable[[str], str]) -> None:
        h = vidmem(s)
        assert talk(f"{s.client} {h}") == "share"
        buf = bytearray(abi.NVOS57.pack(s.client, h, 0, 0, abi.RS_SHARE_TYPE_ALL, 0, 0))
        assert nvstub.ioctl(s.ctl, abi.IOCTL_RM_SHARE, buf) == 0 and abi.NVOS57.unpack(buf)[-1] == abi.NV_OK
        assert talk("shared") == "free"
        assert s.free(h) == abi.NV_OK
        talk("freed")

    assert uvm.create_range(BASE, 16 * MIB) == abi.NV_OK
    with worker(owner) as w:
        client, h = (int(x) for x in w.recv().split())
        assert uvm.map(BASE, 16 * MIB, client, h, [GPU0]) == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
        w.send("share")
        assert w.recv() == "shared"
        assert uvm.map(BASE, 16 * MIB, client, h, [GPU0]) == abi.NV_OK
        w.send("free")
        assert w.recv() == "freed"
    assert used() == base + 16 * MIB                          # its process is gone; UVM holds it
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK
    assert used() == base


def test_the_calling_process_may_name_any_of_its_clients(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    """The rule is the process, not the file: a client made through another nvidiactl of
    the same process maps; rmCtrlFd is not looked at (UVM only stores it)."""
    other = nvstub.Session()
    null = os.open("/dev/null", os.O_RDWR)
    try:
        h = vidmem(other)
        assert uvm.create_range(BASE, 16 * MIB) == abi.NV_OK
        for fd in (sess.ctl, null, -1, 100000):
            assert uvm.map(BASE, 16 * MIB, other.client, h, [GPU0], rm_ctrl_fd=fd) == abi.NV_OK
    finally:
        os.close(null)
        other.close()
    assert uvm.free(BASE, 16 * MIB) == abi.NV_OK


# ---- failure statuses --------------------------------------------------------------------


def test_create_external_range_checks(uvm: nvstub.Uvm) -> None:
    for b, n in [(0, 2 * MIB), (BASE + 1, 2 * MIB), (BASE, 2 * MIB + 1), (BASE, 0), (2**64 - 4 * KIB, 8 * KIB)]:
        assert uvm.create_range(b, n) == abi.NV_ERR_INVALID_ADDRESS, (hex(b), n)
    assert uvm.create_range(BASE, 16 * MIB) == abi.NV_OK
    for b, n in [(BASE, 16 * MIB), (BASE + 4 * KIB, 4 * KIB), (BASE - 4 * KIB, 8 * KIB),
                 (BASE + 16 * MIB - 4 * KIB, 8 * KIB), (BASE - MIB, 32 * MIB)]:
        assert uvm.create_range(b, n) == NV_ERR_UVM_ADDRESS_IN_USE, (hex(b), n)
    assert uvm.create_range(BASE + 16 * MIB, 4 * KIB) == abi.NV_OK   # adjacent
    assert uvm.create_range(BASE - 4 * KIB, 4 * KIB) == abi.NV_OK
    for b, n in [(BASE - 4 * KIB, 4 * KIB), (BASE, 16 * MIB), (BASE + 16 * MIB, 4 * KIB)]:
        assert uvm.free(b, n) == abi.NV_OK


def test_map_external_checks(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    base = used()
    h = vidmem(sess)
    n = 16 * MIB
    assert uvm.create_range(BASE, n) == abi.NV_OK
    m = uvm.map
    # uvm_map_external_allocation: the range (4K) first, then the count, then the external range
    assert m(BASE + 1, n, sess.client, h, [GPU0], count=0) == abi.NV_ERR_INVALID_ADDRESS
    assert m(0, n, sess.client, h, [GPU0]) == abi.NV_ERR_INVALID_ADDRESS
    assert m(BASE, n, sess.client, h, [GPU0], count=0) == abi.NV_ERR_INVALID_ARGUMENT
    assert m(BASE, n, sess.client, h, [GPU0], count=257) == abi.NV_ERR_INVALID_ARGUMENT
    assert m(BASE + n, n, sess.client, h, [GPU0]) == abi.NV_ERR_INVALID_ADDRESS        # no range there
    assert m(BASE + 2 * MIB, n, sess.client, h, [GPU0]) == abi.NV_ERR_INVALID_ADDRESS  # past its end
    # per GPU: attributes, then the GPU, then the duplicate (RM's statuses)
    assert m(BASE, n, sess.client, h, [GPU0], attrs=(4, 0, 0, 0, 0)) == abi.NV_ERR_INVALID_ARGUMENT
    assert m(BASE, n, sess.client, h, [GPU0], attrs=(0, 3, 0, 0, 0)) == abi.NV_ERR_INVALID_ARGUMENT
    assert m(BASE, n, sess.client, h, [GPU0], attrs=(0, 0, 0, 1, 0)) == abi.NV_ERR_INVALID_ARGUMENT  # bits w/o format
    assert m(BASE, n, sess.client, h, [GPU0], attrs=(0, 0, 1, 3, 0)) == abi.NV_ERR_INVALID_ARGUMENT  # 24 bits
    assert m(BASE, n, sess.client, h, [GPU0], attrs=(0, 0, 0, 0, 2)) == abi.NV_ERR_INVALID_ARGUMENT
    assert m(BASE, n, sess.client, h, [NOT_A_GPU]) == abi.NV_ERR_INVALID_DEVICE
    assert m(BASE, n, 0xC1D0FFFF, h, [GPU0]) == abi.NV_ERR_INVALID_OBJECT_HANDLE    # _serverFindClient
    assert m(BASE, n, sess.client, 0x5C00DEAD, [GPU0]) == abi.NV_ERR_OBJECT_NOT_FOUND  # clientGetResourceRef
    assert m(BASE, n, sess.client, sess.device, [GPU0]) == abi.NV_ERR_INVALID_OBJECT_HANDLE  # not a Memory
    assert m(BASE, n, sess.client, sess.client, [GPU0]) == abi.NV_ERR_INVALID_OBJECT_HANDLE
    virt = sess.handle()
    assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, virt, abi.NV50_MEMORY_VIRTUAL)[0] == abi.NV_OK
    assert m(BASE, n, sess.client, virt, [GPU0]) == abi.NV_ERR_NOT_SUPPORTED          # not FB/SYSMEM
    # after the duplicate: page size from the lowest bit of the alignments, then the window
    assert m(BASE, n, sess.client, h, [GPU0], offset=2 * KIB) == abi.NV_ERR_INVALID_ADDRESS
    assert m(BASE, n, sess.client, h, [GPU0], offset=4 * KIB) == NV_ERR_INVALID_OFFSET
    assert m(BASE, 2 * MIB, sess.client, h, [GPU0], offset=14 * MIB) == abi.NV_OK
    assert m(BASE, 4 * MIB, sess.client, h, [GPU0], offset=14 * MIB) == NV_ERR_INVALID_OFFSET
    # a GPU after a good one fails: what this call mapped goes again
    assert m(BASE, n, sess.client, h, [GPU0, NOT_A_GPU]) == abi.NV_ERR_INVALID_DEVICE
    assert m(BASE, n, sess.client, h, [GPU0, GPU0, NOT_A_GPU]) == abi.NV_ERR_INVALID_DEVICE
    assert sess.free(h) == abi.NV_OK
    assert used() == base                                     # nothing was left mapped
    # system memory: mapped, nothing of the pool involved
    sysmem = sess.handle()
    p = nvstub.mem_params(n)
    assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, sysmem, abi.NV01_MEMORY_SYSTEM, p)[0] == abi.NV_OK
    assert m(BASE, n, sess.client, sysmem, [GPU0]) == abi.NV_OK
    assert used() == base
    assert uvm.free(BASE, n) == abi.NV_OK
    # beyond what a GH100 addresses (57-bit VA): uvm_gpu_can_address
    far = 1 << 56
    assert uvm.create_range(far, 2 * MIB) == abi.NV_OK
    h = vidmem(sess, 2 * MIB)
    assert m(far, 2 * MIB, sess.client, h, [GPU0]) == NV_ERR_OUT_OF_RANGE
    assert uvm.free(far, 2 * MIB) == abi.NV_OK


def test_unmap_and_free_checks(sess: nvstub.Session, uvm: nvstub.Uvm) -> None:
    n = 16 * MIB
    assert uvm.create_range(BASE, n) == abi.NV_OK
    assert uvm.unmap(0, n, GPU0) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.unmap(BASE, n + 1, GPU0) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.unmap(BASE + 4 * KIB, n, GPU0) == abi.NV_ERR_INVALID_ADDRESS            # past the range
    assert uvm.unmap(BASE - 4 * KIB, 8 * KIB, GPU0) == abi.NV_ERR_INVALID_ADDRESS      # no range at base
    assert uvm.unmap(BASE, n, NOT_A_GPU) == abi.NV_ERR_INVALID_DEVICE
    assert uvm.unmap(BASE, n, GPU0) == abi.NV_OK                                       # nothing mapped
    # uvm_free: the tracked external range must be freed whole; what touches no external
    # range is taken for a kind the stand-in does not track (semaphore pool, ...)
    assert uvm.free(0, n) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.free(BASE, 0) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.free(BASE + n, n) == abi.NV_OK
    assert uvm.free(BASE - 4 * KIB, 8 * KIB) == abi.NV_ERR_INVALID_ADDRESS
    assert uvm.free(BASE, n) == abi.NV_OK
    # commands need UVM_INITIALIZE (uvm.c)
    fd = nvstub.open_node(nvstub.UVM_PATH)
    try:
        buf = ctypes.create_string_buffer(struct.pack("<QQ", BASE, n) + GPU0, 40)
        assert nvstub.uvm_ioctl(fd, nvstub.UVM_UNMAP_EXTERNAL, buf) == 0
        assert struct.unpack_from("<I", buf, 32)[0] == abi.NV_ERR_ILLEGAL_ACTION
    finally:
        os.close(fd)


def semaphore_pool(uvm: nvstub.Uvm, base: int, length: int, count: int, prefill: int) -> int:
    """UVM_ALLOC_SEMAPHORE_POOL of [base, base + length) naming count GPUs (no attributes),
    its rmStatus pre-filled with prefill; returns the rmStatus the call left."""
    size, status_off, _ = nvstub.uvm_params(abi.UVM_ALLOC_SEMAPHORE_POOL)
    count_off = nvstub.ABI_ROW["uvm_semaphore_pool_tail"]  # gpuAttributesCount, rmStatus
    head = bytearray(size)
    struct.pack_into("<QQ", head, 0, base, length)
    struct.pack_into("<Q", head, count_off, count)
    struct.pack_into("<I", head, status_off, prefill)
    return uvm.call(abi.UVM_ALLOC_SEMAPHORE_POOL, bytes(head))


def test_semaphore_pool_status_is_the_drivers() -> None:
    """UVM_ALLOC_SEMAPHORE_POOL reads gpuAttributesCount where the release has it and writes
    its own rmStatus, whatever the caller left there (the tail after the per-GPU array ends in
    4 bytes of padding: a tail placed by rmStatus's offset read the count 4 bytes early and
    left the caller's value as the status)."""
    u = nvstub.Uvm()
    try:
        gpus = nvstub.ABI_ROW["uvm_gpus"]
        junk = 0xDEADBEEF
        # more GPUs than the release's UVM_MAX_GPUS (uvm_api_alloc_semaphore_pool)
        assert semaphore_pool(u, BASE, 2 * MIB, gpus + 1, junk) == abi.NV_ERR_INVALID_ARGUMENT
        assert semaphore_pool(u, BASE, 2 * MIB, 2**40, junk) == abi.NV_ERR_INVALID_ARGUMENT
        # a bad range, then a good pool: statuses of their own, not the pre-filled one
        assert semaphore_pool(u, BASE + 1, 2 * MIB, 1, junk) == abi.NV_ERR_INVALID_ADDRESS
        assert semaphore_pool(u, BASE, 2 * MIB, gpus, junk) == abi.NV_OK
        assert semaphore_pool(u, BASE, 2 * MIB, 0, abi.NV_ERR_INVALID_ARGUMENT) == abi.NV_OK
    finally:
        u.close()


# ---- two GPUs (the stand-in reloaded with num_gpus=2; last, as it reloads modules) -------


@pytest.fixture(scope="module")
def two_gpus() -> Iterator[None]:
    """nvstub.ko reloaded with num_gpus=2 (and gpuslice.ko after it, if it was loaded), then
    both put back as scripts/guest-tests.sh loaded them."""
    import gsinst

    nvstub_args = os.environ.get("NVSTUB_ARGS", "").split()
    gpuslice_args = os.environ.get("GPUSLICE_ARGS", "").split()
    had_gpuslice = gsinst.loaded()

    def load(extra: list[str]) -> None:
        r = gsinst.insmod(gsinst.NVSTUB_KO, *nvstub_args, *extra)
        assert r.returncode == 0, r.stderr
        gsinst.sh("udevadm", "settle")
        if had_gpuslice:
            r = gsinst.insmod(gsinst.GPUSLICE_KO, *gpuslice_args)
            assert r.returncode == 0, r.stderr

    try:
        gsinst.unload_all()
    except AssertionError as e:      # something still holds a module (an earlier test's files)
        if not nvstub.present():
            load([])
        elif had_gpuslice and not gsinst.loaded():
            r = gsinst.insmod(gsinst.GPUSLICE_KO, *gpuslice_args)
            assert r.returncode == 0, r.stderr
        pytest.skip(f"cannot reload the modules: {e}")
    try:
        load(["num_gpus=2"])
        yield
    finally:
        gsinst.unload_all()
        load([])


def test_memory_of_another_gpu(two_gpus: None) -> None:
    """set_ext_gpu_map_location: the memory's GPU must be registered in the VA space, and
    video memory of another GPU needs peer access (UVM_ENABLE_PEER_ACCESS, which the stand-in
    does not implement), system memory does not. Each GPU's mappings are apart."""
    gpu1 = nvstub.standin_uuid(1)
    s0, s1 = nvstub.Session(0), nvstub.Session(1)
    try:
        assert nvstub.gpu_uuid(s1.ctl, s1.client, s1.subdevice) == (abi.NV_OK, gpu1)
        base0, base1 = nvstub.pool_used(0), nvstub.pool_used(1)
        with nvstub.Uvm() as u:
            u.register(s0)
            v1 = vidmem(s1)
            sys1 = s1.handle()
            p = nvstub.mem_params(16 * MIB)
            assert nvstub.rm_alloc(s1.ctl, s1.client, s1.device, sys1, abi.NV01_MEMORY_SYSTEM, p)[0] == abi.NV_OK
            assert u.create_range(BASE, 16 * MIB) == abi.NV_OK
            assert u.map(BASE, 16 * MIB, s1.client, v1, [GPU0]) == abi.NV_ERR_INVALID_DEVICE
            assert u.map(BASE, 16 * MIB, s1.client, sys1, [GPU0]) == abi.NV_ERR_INVALID_DEVICE
            assert u.register_gpu(s1) == abi.NV_OK
            assert u.map(BASE, 16 * MIB, s1.client, v1, [GPU0]) == abi.NV_ERR_INVALID_DEVICE  # no peer access
            assert u.map(BASE, 16 * MIB, s1.client, sys1, [GPU0]) == abi.NV_OK
            assert u.map(BASE, 16 * MIB, s1.client, v1, [gpu1]) == abi.NV_ERR_INVALID_DEVICE  # no GPU VA space
            assert u.register_gpu_va_space(s1) == abi.NV_OK
            assert u.map(BASE, 16 * MIB, s1.client, v1, [gpu1]) == abi.NV_OK
            v0 = vidmem(s0)
            assert u.map(BASE, 16 * MIB, s0.client, v0, [GPU0]) == abi.NV_OK     # replaces sys1 on GPU 0
            assert s0.free(v0) == abi.NV_OK and s1.free(v1) == abi.NV_OK
            assert (nvstub.pool_used(0), nvstub.pool_used(1)) == (base0 + 16 * MIB, base1 + 16 * MIB)
            assert u.unmap(BASE, 16 * MIB, gpu1) == abi.NV_OK
            assert (nvstub.pool_used(0), nvstub.pool_used(1)) == (base0 + 16 * MIB, base1)
            assert u.free(BASE, 16 * MIB) == abi.NV_OK
            assert nvstub.pool_used(0) == base0
            # GPU 1 maps, then GPU 0 refuses the same memory: GPU 1's new mapping goes too
            v1 = vidmem(s1)
            assert u.create_range(BASE, 16 * MIB) == abi.NV_OK
            assert u.map(BASE, 16 * MIB, s1.client, v1, [gpu1, GPU0]) == abi.NV_ERR_INVALID_DEVICE
            assert s1.free(v1) == abi.NV_OK
            assert nvstub.pool_used(1) == base1
    finally:
        s1.close()
        s0.close()

"""Guest tests of the stand-in driver's 580 model (tests/standin/nvstub.ko), against the bare
stand-in: video memory rounding as RM does it on GH100, GET_PIDS / GET_PID_INFO, the
per-client and per-pool accounting in /proc/nvstub, the two reads of RM_ALLOC / RM_CONTROL
(with the test-only race_delay_us window) and nvidia-uvm's mmap.

Each expectation cites the open-gpu-kernel-modules 580 source it comes from.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvstub  # noqa: E402
from gpuslice import abi  # noqa: E402

pytestmark = [pytest.mark.guest,
              pytest.mark.skipif(not nvstub.present(), reason="nvstub.ko is not loaded")]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
DEFAULT, P4K, BIG, HUGE = (abi.NVOS32_ATTR_PAGE_SIZE_DEFAULT, abi.NVOS32_ATTR_PAGE_SIZE_4KB,
                           abi.NVOS32_ATTR_PAGE_SIZE_BIG, abi.NVOS32_ATTR_PAGE_SIZE_HUGE)
H_DEF, H_2M, H_512M, H_256G = (abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_DEFAULT, abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB,
                               abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB, abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_256GB)

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
MAP_FAILED = ctypes.c_void_p(-1).value
PROT_NONE = 0
CLONE_NEWPID = 0x20000000


@pytest.fixture
def sess() -> Iterator[nvstub.Session]:
    s = nvstub.Session()
    yield s
    s.close()


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def page_size_field(attr: int) -> int:
    return (attr >> abi.NVOS32_ATTR_PAGE_SIZE_SHIFT) & 3


def huge_field(attr2: int) -> int:
    return (attr2 >> abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT) & 3


def my_vidmem(s: nvstub.Session) -> int:
    return next(c["vidmem"] for c in nvstub.clients() if c["client"] == s.client)


# ---- 3. video memory rounding (GH100) -------------------------------------------------

# (attr PAGE_SIZE, attr2 PAGE_SIZE_HUGE, requested) -> (reported size, pool bytes, page size written back)
# mem_mgr.c memmgrDeterminePageSize_IMPL / _memmgrPickDefaultGpuPageSize (DEFAULT: 2 MiB pages
# for >= 2 MiB, else the 64 KiB big page); mem_mgr_gm107.c memmgrAllocDetermineAlignment_GM107
# (size rounded to the page size); video_mem.c _vidmemPmaAllocate (PMA takes 64 KiB at least).
ROUNDING = [
    (DEFAULT, H_DEF, 1, 64 * KIB, 64 * KIB, (BIG, H_DEF)),
    (DEFAULT, H_DEF, 100 * KIB, 128 * KIB, 128 * KIB, (BIG, H_DEF)),
    (DEFAULT, H_DEF, 2 * MIB - 1, 2 * MIB, 2 * MIB, (BIG, H_DEF)),
    (DEFAULT, H_DEF, 2 * MIB, 2 * MIB, 2 * MIB, (HUGE, H_2M)),
    (DEFAULT, H_DEF, 0x420000, 0x600000, 0x600000, (HUGE, H_2M)),      # as in the H100 traces
    (P4K, H_DEF, 5000, 8 * KIB, 64 * KIB, (P4K, H_DEF)),               # reported 4 KiB, PMA 64 KiB
    (P4K, H_DEF, 70 * KIB, 72 * KIB, 128 * KIB, (P4K, H_DEF)),
    (BIG, H_DEF, 5000, 64 * KIB, 64 * KIB, (BIG, H_DEF)),
    (BIG, H_DEF, 3 * MIB + 1, 3 * MIB + 64 * KIB, 3 * MIB + 64 * KIB, (BIG, H_DEF)),
    (HUGE, H_DEF, 1, 2 * MIB, 2 * MIB, (HUGE, H_2M)),
    (HUGE, H_2M, 3 * MIB, 4 * MIB, 4 * MIB, (HUGE, H_2M)),
    (HUGE, H_512M, 4 * KIB, 512 * MIB, 512 * MIB, (HUGE, H_512M)),
]


@pytest.mark.parametrize("psz,huge,req,reported,charged,written", ROUNDING)
def test_vidmem_rounding(sess: nvstub.Session, psz: int, huge: int, req: int, reported: int, charged: int,
                         written: tuple[int, int]) -> None:
    if charged > nvstub.pool(0)["total"] - nvstub.pool_used(0):
        pytest.skip("pool too small for this case")
    attr, attr2 = nvstub.page_attrs(psz, huge)
    before = nvstub.pool_used(0)
    p = nvstub.mem_params(req, attr=attr, attr2=attr2)
    h = sess.handle()
    st, _ = nvstub.rm_alloc(sess.ctl, sess.client, sess.device, h, abi.NV01_MEMORY_LOCAL_USER, p)
    assert st == abi.NV_OK
    f = nvstub.mem_fields(p)
    assert f["size"] == reported and f["limit"] == reported - 1        # video_mem.c: size, limit = size - 1
    assert (page_size_field(f["attr"]), huge_field(f["attr2"])) == written
    page = {P4K: 4 * KIB, BIG: 64 * KIB, HUGE: 512 * MIB if written[1] == H_512M else 2 * MIB}[written[0]]
    assert f["alignment"] == page                                       # the page size (no HINT/FORCE)
    assert nvstub.pool_used(0) - before == charged
    assert my_vidmem(sess) == charged
    st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [os.getpid()])
    assert st == abi.NV_OK and info[0].private == reported              # GET_PID_INFO counts Length
    assert sess.free(h) == abi.NV_OK
    assert nvstub.pool_used(0) == before


def test_vidmem_256gb_pages_and_refusals(sess: nvstub.Session) -> None:
    before = nvstub.pool_used(0)
    attr, attr2 = nvstub.page_attrs(HUGE, H_256G)
    # 256 GiB pages: GB10x only; memmgrDeterminePageSize returns 0 -> _vidmemPmaAllocate NV_ERR_INVALID_STATE
    assert sess.alloc_vidmem(2 * MIB, attr=attr, attr2=attr2)[0] == abi.NV_ERR_INVALID_STATE
    # standard_mem.c stdmemValidateParams
    assert sess.alloc_vidmem(2 * MIB, owner=0)[0] == abi.NV_ERR_INVALID_OWNER
    assert sess.alloc_vidmem(2 * MIB, owner=0xFFFFFFFF)[0] == abi.NV_ERR_INVALID_OWNER
    assert sess.alloc_vidmem(2 * MIB, owner=0xDEAF0001)[0] == abi.NV_ERR_INVALID_OWNER
    assert sess.alloc_vidmem(0)[0] == abi.NV_ERR_INVALID_ARGUMENT
    # video_mem.c vidmemConstruct_IMPL: LOCATION must be VIDMEM (26:25), no VIRTUAL flag
    assert sess.alloc_vidmem(2 * MIB, attr=1 << 25)[0] == abi.NV_ERR_INVALID_ARGUMENT
    assert sess.alloc_vidmem(2 * MIB, flags=0x80000)[0] == abi.NV_ERR_INVALID_ARGUMENT
    # mem_mgr_gm107.c: an alignment that is neither a multiple nor a divisor of the page
    # size fails with ALIGNMENT_FORCE and is replaced by the page size with ALIGNMENT_HINT
    force, hint = abi.NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE, abi.NVOS32_ALLOC_FLAGS_ALIGNMENT_HINT
    assert sess.alloc_vidmem(2 * MIB, flags=force, alignment=3 * MIB)[0] == abi.NV_ERR_INVALID_ARGUMENT
    assert nvstub.pool_used(0) == before
    for flags, align, want_align in [(hint, 3 * MIB, 2 * MIB), (force, 4 * MIB, 4 * MIB),
                                     (force, 64 * KIB, 2 * MIB), (0, 8 * MIB, 2 * MIB)]:
        p = nvstub.mem_params(2 * MIB, flags=flags, alignment=align)
        h = sess.handle()
        assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, h, abi.NV01_MEMORY_LOCAL_USER, p)[0] == abi.NV_OK
        f = nvstub.mem_fields(p)
        assert (f["size"], f["alignment"]) == (2 * MIB, want_align), (flags, align)   # size: page size only
        assert sess.free(h) == abi.NV_OK
    # the traced CUDA allocation: attr 0x18000000, ALIGNMENT_FORCE 2 MiB, 0x420000 -> 0x600000
    p = nvstub.mem_params(0x420000, attr=0x18000000, flags=0x1C101, alignment=2 * MIB)
    h = sess.handle()
    assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, h, abi.NV01_MEMORY_LOCAL_USER, p)[0] == abi.NV_OK
    f = nvstub.mem_fields(p)
    assert (f["size"], f["alignment"], page_size_field(f["attr"]), huge_field(f["attr2"])) == \
        (0x600000, 2 * MIB, HUGE, H_2M)
    assert sess.free(h) == abi.NV_OK
    assert nvstub.pool_used(0) == before


def test_vidmem_4k_pages_fill_the_pool_in_64k_granules(sess: nvstub.Session) -> None:
    """The 4KB-page case: 4 KiB reported, 64 KiB taken (video_mem.c: "Minimum granularity of PMA is 64K")."""
    attr, _ = nvstub.page_attrs(P4K)
    before = nvstub.pool_used(0)
    hs = []
    for _ in range(16):
        st, h, size = sess.alloc_vidmem(4 * KIB, attr=attr)
        assert (st, size) == (abi.NV_OK, 4 * KIB)
        hs.append(h)
    assert nvstub.pool_used(0) - before == 16 * 64 * KIB
    st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [os.getpid()])
    assert info[0].private == 16 * 4 * KIB
    # FB_GET_INFO_V2's free heap follows the pool
    assert sess.fb_free_kib() == (nvstub.pool(0)["total"] - nvstub.pool_used(0)) // KIB
    for h in hs:
        assert sess.free(h) == abi.NV_OK
    assert nvstub.pool_used(0) == before


# ---- 4. /proc/nvstub/clients and pool -------------------------------------------------


def test_proc_clients_vidmem_adds_up_to_pool() -> None:
    a, b = nvstub.Session(), nvstub.Session()
    try:
        base = nvstub.pool_used(0)
        assert a.alloc_vidmem(0x420000)[0] == abi.NV_OK
        assert a.alloc_vidmem(1)[0] == abi.NV_OK
        assert b.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
        rows = {c["client"]: c for c in nvstub.clients()}
        assert rows[a.client]["vidmem"] == 0x600000 + 64 * KIB
        assert rows[b.client]["vidmem"] == 2 * MIB
        assert rows[a.client]["pid"] == rows[b.client]["pid"] == os.getpid()
        assert nvstub.pool_used(0) - base == 0x600000 + 64 * KIB + 2 * MIB
        assert sum(c["vidmem"] for c in nvstub.clients()) == nvstub.pool_used(0)
        assert nvstub.pool(0)["total"] == int((nvstub.PARAMS / "fb_mib").read_text()) * MIB
    finally:
        a.close()
        b.close()
    assert nvstub.pool_used(0) == base


# ---- 2. GET_PIDS / GET_PID_INFO -------------------------------------------------------


class Worker:
    """The test's end of a forked process that runs body(session, talk)."""

    def __init__(self, pid: int, rd, wr) -> None:
        self.pid, self._rd, self._wr = pid, rd, wr

    def recv(self) -> str:
        """The child's next message (it then waits in talk() for send())."""
        return self._rd.readline().strip()

    def send(self, msg: str) -> None:
        self._wr.write(msg + "\n")
        self._wr.flush()


@contextmanager
def worker(body: Callable[[nvstub.Session, Callable[[str], str]], None]) -> Iterator[Worker]:
    """A forked process with its own Session running body(session, talk); talk(msg) sends msg
    to the test and returns the test's reply ("" once the test is done with the worker).
    Leaving the context closes the pipes and waits for the child (its files close: its
    clients are freed)."""
    c2p_r, c2p_w = os.pipe()
    p2c_r, p2c_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(c2p_r)
            os.close(p2c_w)
            rd, wr = os.fdopen(p2c_r, "r"), os.fdopen(c2p_w, "w")

            def talk(msg: str) -> str:
                wr.write(msg + "\n")
                wr.flush()
                return rd.readline().strip()
            s = nvstub.Session()
            body(s, talk)
            rd.readline()          # stay until the test lets go
            code = 0
        finally:
            os._exit(code)
    os.close(c2p_w)
    os.close(p2c_r)
    w = Worker(pid, os.fdopen(c2p_r, "r"), os.fdopen(p2c_w, "w"))
    try:
        yield w
    finally:
        w._wr.close()
        w._rd.close()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_get_pids_lists_processes_with_a_subdevice(sess: nvstub.Session) -> None:
    assert ("ctrl", abi.NV2080_CTRL_CMD_GPU_GET_PIDS) in nvstub.read_implemented()

    def plain(s: nvstub.Session, talk: Callable[[str], str]) -> None:
        talk("ready")

    def computing(s: nvstub.Session, talk: Callable[[str], str]) -> None:
        s.tsg_channel(schedule_it=False)  # a channel with a HOPPER_COMPUTE_A object
        talk("ready")

    with worker(plain) as a, worker(computing) as b:
        assert a.recv() == "ready" and b.recv() == "ready"
        st, pids = nvstub.get_pids(sess.ctl, sess.client, sess.subdevice)
        assert st == abi.NV_OK
        assert len(pids) == len(set(pids)) and set(pids) == {os.getpid(), a.pid, b.pid}
        # another class id: ChannelDescendant objects of that class on this GPU (gpuGetProcWithObject)
        st, pids = nvstub.get_pids(sess.ctl, sess.client, sess.subdevice, abi.HOPPER_COMPUTE_A)
        assert (st, pids) == (abi.NV_OK, [b.pid])
        assert nvstub.get_pids(sess.ctl, sess.client, sess.subdevice, abi.MPS_COMPUTE) == (abi.NV_OK, [])
        assert nvstub.get_pids(sess.ctl, sess.client, sess.subdevice, 0, id_type=1) == (abi.NV_OK, [])
        assert nvstub.get_pids(sess.ctl, sess.client, sess.subdevice, id_type=7)[0] == abi.NV_ERR_INVALID_ARGUMENT
    st, pids = nvstub.get_pids(sess.ctl, sess.client, sess.subdevice)
    assert (st, pids) == (abi.NV_OK, [os.getpid()])          # their files closed: clients freed
    # only on a subdevice, and paramsSize must be 3812 (control.c _rmapiRmControl)
    p = ctypes.create_string_buffer(abi.GET_PIDS_SIZE)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.device, abi.NV2080_CTRL_CMD_GPU_GET_PIDS, p) == \
        abi.NV_ERR_NOT_SUPPORTED
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_PIDS,
                             ctypes.create_string_buffer(abi.GET_PIDS_SIZE - 4)) == abi.NV_ERR_INVALID_ARGUMENT


def test_get_pids_needs_a_subdevice(sess: nvstub.Session) -> None:
    """A client with a device but no subdevice is not listed for id NV20_SUBDEVICE_0
    (gpuGetProcWithObject looks for classId(Subdevice))."""
    def only_device(s: nvstub.Session, talk: Callable[[str], str]) -> None:
        assert nvstub.rm_free(s.ctl, s.client, s.device, s.subdevice) == abi.NV_OK
        talk("ready")
    with worker(only_device) as w:
        assert w.recv() == "ready"
        st, pids = nvstub.get_pids(sess.ctl, sess.client, sess.subdevice)
        assert st == abi.NV_OK and w.pid not in pids and os.getpid() in pids


def test_get_pid_info_reports_each_process_bytes(sess: nvstub.Session) -> None:
    assert ("ctrl", abi.NV2080_CTRL_CMD_GPU_GET_PID_INFO) in nvstub.read_implemented()

    def a_body(s: nvstub.Session, talk: Callable[[str], str]) -> None:
        st1, h1, _ = s.alloc_vidmem(0x420000)          # 6 MiB
        st2, h2, _ = s.alloc_vidmem(1)                 # 64 KiB
        assert (st1, st2) == (abi.NV_OK, abi.NV_OK)
        # sysmem and RM-internal objects are not counted (_checkVidmemClassValidity)
        assert nvstub.rm_alloc(s.ctl, s.client, s.device, s.handle(), abi.NV01_MEMORY_SYSTEM,
                               nvstub.mem_params(8 * MIB))[0] == abi.NV_OK
        s.tsg_channel(schedule_it=False)
        talk("allocated")
        assert s.free(h1) == abi.NV_OK
        talk("freed")

    def b_body(s: nvstub.Session, talk: Callable[[str], str]) -> None:
        assert s.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
        talk("allocated")

    with worker(a_body) as a, worker(b_body) as b:
        assert a.recv() == "allocated" and b.recv() == "allocated"
        nobody = 4_000_000  # above pid_max: no process
        st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice,
                                       [a.pid, b.pid, os.getpid(), 0, nobody])
        assert st == abi.NV_OK
        assert [(i.pid, i.result, i.private, i.shared_owned, i.shared_duped) for i in info] == [
            (a.pid, abi.NV_OK, 0x600000 + 64 * KIB, 0, 0),
            (b.pid, abi.NV_OK, 2 * MIB, 0, 0),
            (os.getpid(), abi.NV_OK, 0, 0, 0),
            (0, abi.NV_ERR_INVALID_ARGUMENT, 0, 0, 0),        # gpuFindClientInfoWithPidIterator: pid != 0
            (nobody, abi.NV_OK, 0, 0, 0),
        ]
        assert all(i.protected == (0, 0, 0) for i in info)
        assert all((i.compute_instance_id, i.gpu_instance_id) == (0xFFFFFFFF, 0xFFFFFFFF) for i in info)
        a.send("go")
        assert a.recv() == "freed"
        st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [a.pid])
        assert (st, info[0].private) == (abi.NV_OK, 64 * KIB)
    st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [a.pid, b.pid])
    assert st == abi.NV_OK and [i.private for i in info] == [0, 0]


def test_get_pid_info_argument_checks(sess: nvstub.Session) -> None:
    ctl = abi.NV2080_CTRL_CMD_GPU_GET_PID_INFO
    # subdeviceCtrlCmdGpuGetPidInfo_IMPL: count 0 or > 200 fails the call; params are then
    # not written back (serverControlApiCopyOut skips the copy-out on error)
    for count in (0, abi.NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT + 1):
        p = nvstub.pid_info_params([os.getpid()], count=count)
        struct.pack_into("<I", p, abi.GET_PID_INFO_LIST_OFFSET + 8, 0xABCD)   # result sentinel
        before = p.raw
        assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, ctl, p) == abi.NV_ERR_INVALID_ARGUMENT
        assert p.raw == before
    # an unknown index: that entry's result, data untouched, partition ids invalid
    p = nvstub.pid_info_params([os.getpid(), os.getpid()])
    struct.pack_into("<I", p, abi.GET_PID_INFO_LIST_OFFSET + 4, 5)
    struct.pack_into("<Q", p, abi.GET_PID_INFO_LIST_OFFSET + 16, 0x1234)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, ctl, p) == abi.NV_OK
    bad, good = nvstub.parse_pid_info(p, 2)
    assert (bad.result, bad.private, bad.gpu_instance_id) == (abi.NV_ERR_INVALID_ARGUMENT, 0x1234, 0xFFFFFFFF)
    assert good.result == abi.NV_OK
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, ctl,
                             ctypes.create_string_buffer(abi.GET_PID_INFO_SIZE + 8)) == abi.NV_ERR_INVALID_ARGUMENT
    # 200 entries is the most
    st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [os.getpid()] * 200)
    assert st == abi.NV_OK and len(info) == 200 and all(i.result == abi.NV_OK for i in info)


def test_get_pid_info_shared_and_duped(sess: nvstub.Session) -> None:
    """_gpuCollectMemInfo: DupCount == 1 -> memPrivate, else the owner's -> memSharedOwned, a
    duplicate's -> memSharedDuped; freeing the owner passes ownership on (mem.c memDestructCommon)
    and the pages stay in the pool until the last duplicate goes."""
    other = nvstub.Session()
    try:
        base = nvstub.pool_used(0)
        st, h, _ = sess.alloc_vidmem(4 * MIB)
        assert st == abi.NV_OK
        st, hd = other.dup(h, src_client=sess.client)
        assert st == abi.NV_OK
        assert nvstub.pool_used(0) - base == 4 * MIB
        st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [os.getpid()])
        assert (info[0].private, info[0].shared_owned, info[0].shared_duped) == (0, 4 * MIB, 4 * MIB)
        assert (my_vidmem(sess), my_vidmem(other)) == (4 * MIB, 0)
        assert sess.free(h) == abi.NV_OK
        assert nvstub.pool_used(0) - base == 4 * MIB
        st, info = nvstub.get_pid_info(sess.ctl, sess.client, sess.subdevice, [os.getpid()])
        assert (info[0].private, info[0].shared_owned, info[0].shared_duped) == (4 * MIB, 0, 0)
        assert (my_vidmem(sess), my_vidmem(other)) == (0, 4 * MIB)
        # a duplicate under a subdevice when the source is under a device: memCopyConstruct refuses
        st, h2, _ = sess.alloc_vidmem(2 * MIB)
        assert other.dup(h2, src_client=sess.client, parent=other.subdevice)[0] == abi.NV_ERR_INVALID_OBJECT_PARENT
        assert other.free(hd) == abi.NV_OK
        assert nvstub.pool_used(0) - base == 2 * MIB
        assert sess.free(h2) == abi.NV_OK
    finally:
        other.close()
    assert nvstub.pool_used(0) == base


def test_pids_seen_from_another_pid_namespace(sess: nvstub.Session) -> None:
    """os-interface.c os_find_ns_pid (pid_vnr): pids as the caller's namespace sees them;
    clients it cannot see are left out (GET_PIDS) or not matched (GET_PID_INFO)."""
    assert sess.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(r)
            if libc.unshare(CLONE_NEWPID) != 0:
                os._exit(3)
            inner = os.fork()   # pid 1 of the new namespace
            if inner == 0:
                icode = 1
                try:
                    s = nvstub.Session()
                    assert s.alloc_vidmem(64 * KIB)[0] == abi.NV_OK
                    st, pids = nvstub.get_pids(s.ctl, s.client, s.subdevice)
                    st2, info = nvstub.get_pid_info(s.ctl, s.client, s.subdevice, [1, os.getppid() or 9999])
                    os.write(w, json.dumps({"me": os.getpid(), "st": st, "pids": pids, "st2": st2,
                                            "mine": info[0].private}).encode())
                    s.close()
                    icode = 0
                finally:
                    os._exit(icode)
            _, status = os.waitpid(inner, 0)
            code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 3:
        pytest.skip("unshare(CLONE_NEWPID) not permitted")
    assert code == 0
    got = json.loads(data)
    assert got["me"] == 1 and got["st"] == abi.NV_OK and got["st2"] == abi.NV_OK
    assert got["pids"] == [1]            # the test's own client is not visible from there
    assert got["mine"] == 64 * KIB


# ---- 1. the two reads, and race_delay_us ----------------------------------------------


@contextmanager
def race_delay(us: int) -> Iterator[None]:
    nvstub.set_race_delay_us(us)
    try:
        yield
    finally:
        nvstub.set_race_delay_us(0)


def racing_ioctl(fd: int, req: int, block: ctypes.Array) -> tuple[threading.Thread, list[int], threading.Event]:
    """Start an ioctl whose top-level block is block (passed by address, so both reads go to
    this memory) in a thread; returns (thread, [ret], event set right before the call)."""
    ret: list[int] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        r = libc.ioctl(fd, req, ctypes.addressof(block))   # ctypes drops the GIL during the call
        ret.append(r if r >= 0 else -ctypes.get_errno())
    t = threading.Thread(target=run)
    t.start()
    return t, ret, started


def test_race_delay_parameter() -> None:
    path = nvstub.PARAMS / "race_delay_us"
    assert path.read_text().strip() == "0"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_alloc_reads_nested_params_after_the_window(sess: nvstub.Session) -> None:
    """nv.c nvidia_ioctl copies NVOS64 in at entry and back at exit; alloc_free.c
    serverAllocApiCopyIn reads pAllocParms later, once. A size rewritten between the two
    reads is the size allocated; the top-level block the caller rewrote meanwhile is
    overwritten by the copy-back."""
    base = nvstub.pool_used(0)
    p = nvstub.mem_params(2 * MIB)
    h = sess.handle()
    block = ctypes.create_string_buffer(abi.NVOS64.pack(sess.client, sess.device, h, abi.NV01_MEMORY_LOCAL_USER,
                                                        ctypes.addressof(p), 0, 0, 0, 0), abi.NVOS64.size)
    with race_delay(1_000_000):
        t, ret, started = racing_ioctl(sess.ctl, abi.IOCTL_RM_ALLOC, block)
        started.wait()
        time.sleep(0.3)
        struct.pack_into("<Q", p, abi.MEMORY_ALLOCATION_SIZE_OFFSET, 64 * MIB)   # nested: seen
        struct.pack_into("<I", block, 12, abi.NV01_MEMORY_SYSTEM)                 # top-level: not seen
        t.join()
    assert ret == [0]
    f = abi.NVOS64.unpack(block.raw)
    assert f[3] == abi.NV01_MEMORY_LOCAL_USER and f[8] == abi.NV_OK
    assert nvstub.mem_size(p) == 64 * MIB
    assert nvstub.pool_used(0) - base == 64 * MIB
    assert sess.free(h) == abi.NV_OK
    assert nvstub.pool_used(0) == base


def test_control_reads_nested_params_after_the_window(sess: nvstub.Session) -> None:
    """control.c serverControlApiCopyIn reads the params once, before RM's locks: a pid
    rewritten from 0 (an invalid entry) to ours during the window is answered for ours."""
    assert sess.alloc_vidmem(2 * MIB)[0] == abi.NV_OK
    p = nvstub.pid_info_params([0])
    block = ctypes.create_string_buffer(abi.NVOS54.pack(sess.client, sess.subdevice,
                                                        abi.NV2080_CTRL_CMD_GPU_GET_PID_INFO, 0,
                                                        ctypes.addressof(p), abi.GET_PID_INFO_SIZE, 0),
                                        abi.NVOS54.size)
    with race_delay(1_000_000):
        t, ret, started = racing_ioctl(sess.ctl, abi.IOCTL_RM_CONTROL, block)
        started.wait()
        time.sleep(0.3)
        struct.pack_into("<I", p, abi.GET_PID_INFO_LIST_OFFSET, os.getpid())
        t.join()
    assert ret == [0] and abi.NVOS54.unpack(block.raw)[6] == abi.NV_OK
    info = nvstub.parse_pid_info(p, 1)[0]
    assert (info.pid, info.result, info.private) == (os.getpid(), abi.NV_OK, 2 * MIB)


def test_nested_copy_faults_and_order(sess: nvstub.Session) -> None:
    """An unreadable params pointer: NV_ERR_INVALID_ADDRESS (os_memcpy_from_user), read before
    the client is checked (serverAllocResource copies in first); for controls the client must
    exist and paramsSize must match before the read (control.c _rmapiRmControl)."""
    bad = 0x10
    buf = bytearray(abi.NVOS64.pack(sess.client, sess.device, sess.handle(), abi.NV01_MEMORY_LOCAL_USER, bad,
                                    0, 0, 0, 0))
    assert nvstub.ioctl(sess.ctl, abi.IOCTL_RM_ALLOC, buf) == 0
    assert abi.NVOS64.unpack(buf)[8] == abi.NV_ERR_INVALID_ADDRESS
    buf = bytearray(abi.NVOS64.pack(0xDEAD, sess.device, 0, abi.NV01_MEMORY_LOCAL_USER, bad, 0, 0, 0, 0))
    assert nvstub.ioctl(sess.ctl, abi.IOCTL_RM_ALLOC, buf) == 0
    assert abi.NVOS64.unpack(buf)[8] == abi.NV_ERR_INVALID_ADDRESS
    cmd = abi.NV2080_CTRL_CMD_GPU_GET_PIDS

    def control(h_client: int, ptr: int, size: int) -> int:
        b = bytearray(abi.NVOS54.pack(h_client, sess.subdevice, cmd, 0, ptr, size, 0))
        assert nvstub.ioctl(sess.ctl, abi.IOCTL_RM_CONTROL, b) == 0
        return abi.NVOS54.unpack(b)[6]
    assert control(sess.client, bad, abi.GET_PIDS_SIZE) == abi.NV_ERR_INVALID_ADDRESS
    assert control(0xDEAD, bad, abi.GET_PIDS_SIZE) == abi.NV_ERR_INVALID_CLIENT
    assert control(sess.client, bad, 8) == abi.NV_ERR_INVALID_ARGUMENT
    assert control(sess.client, 0, abi.GET_PIDS_SIZE) == abi.NV_ERR_INVALID_ARGUMENT
    # a client of another file: checked under the lock, after the read
    other = nvstub.Session()
    try:
        assert control(other.client, bad, abi.GET_PIDS_SIZE) == abi.NV_ERR_INVALID_ADDRESS
        p = ctypes.create_string_buffer(abi.GET_PIDS_SIZE)
        assert control(other.client, ctypes.addressof(p), abi.GET_PIDS_SIZE) == abi.NV_ERR_INVALID_CLIENT
    finally:
        other.close()


# ---- 5. nvidia-uvm mmap ---------------------------------------------------------------


def uvm_init(fd: int, flags: int = 0) -> int:
    p = ctypes.create_string_buffer(16)
    struct.pack_into("<Q", p, 0, flags)
    assert nvstub.uvm_ioctl(fd, abi.UVM_INITIALIZE, p) == 0
    return struct.unpack_from("<I", p, 8)[0]


def reserve(length: int) -> int:
    addr = libc.mmap(None, length, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr != MAP_FAILED
    return addr


def uvm_map(fd: int, addr: int, length: int, prot: int = mmap.PROT_READ | mmap.PROT_WRITE,
            flags: int = mmap.MAP_SHARED, offset: int | None = None) -> int:
    """mmap(addr, length, prot, flags | MAP_FIXED, fd, offset or addr); 0 or -errno."""
    MAP_FIXED = 0x10
    got = libc.mmap(addr, length, prot, flags | MAP_FIXED, fd, addr if offset is None else offset)
    if got == MAP_FAILED:
        return -ctypes.get_errno()
    assert got == addr
    return 0


def test_uvm_mmap_checks() -> None:
    """uvm.c uvm_mmap: initialized va_space (-EBADFD), the va_space's mm (-EOPNOTSUPP), offset ==
    address (-EINVAL), MAP_SHARED + PROT_READ|PROT_WRITE (-EINVAL); then a managed range whose
    pages read as zero."""
    length = 4 * mmap.PAGESIZE
    uvm = nvstub.open_node(nvstub.UVM_PATH)
    uvm_mm = nvstub.open_node(nvstub.UVM_PATH)
    addr = reserve(length)
    try:
        assert uvm_map(uvm, addr, length) == -errno.EBADFD                # not initialized
        assert uvm_init(uvm) == abi.NV_OK
        mm = ctypes.create_string_buffer(8)
        struct.pack_into("<i", mm, 0, uvm)
        assert nvstub.uvm_ioctl(uvm_mm, abi.UVM_MM_INITIALIZE, mm) == 0
        assert struct.unpack_from("<I", mm, 4)[0] == abi.NV_OK
        assert uvm_map(uvm_mm, addr, length) == -errno.EBADFD             # UVM_FD_MM: no va_space
        assert uvm_map(uvm, addr, length, offset=addr + mmap.PAGESIZE) == -errno.EINVAL
        assert uvm_map(uvm, addr, length, flags=mmap.MAP_PRIVATE) == -errno.EINVAL
        assert uvm_map(uvm, addr, length, prot=mmap.PROT_READ) == -errno.EINVAL
        assert uvm_map(uvm, addr, length) == 0
        buf = (ctypes.c_char * length).from_address(addr)
        assert buf.raw == bytes(length)
        buf[0:4] = b"uvm!"
        buf[length - 1] = b"z"
        assert buf.raw[0:4] == b"uvm!" and buf.raw[-1:] == b"z"
        # another process (another mm) cannot map this va_space
        r = os.fork()
        if r == 0:
            os._exit(0 if uvm_map(uvm, addr, length) == -errno.EOPNOTSUPP else 1)
        _, status = os.waitpid(r, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        libc.munmap(addr, length)
        os.close(uvm_mm)
        os.close(uvm)


def test_uvm_mmap_multi_process_sharing() -> None:
    """UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE: the va_space has no mm (uvm_va_space_mm_enabled),
    so a forked child may map it too."""
    length = 2 * mmap.PAGESIZE
    uvm = nvstub.open_node(nvstub.UVM_PATH)
    try:
        assert uvm_init(uvm, abi.UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE) == abi.NV_OK
        r = os.fork()
        if r == 0:
            code = 1
            try:
                addr = reserve(length)
                if uvm_map(uvm, addr, length) == 0:
                    code = 0 if (ctypes.c_char * length).from_address(addr).raw == bytes(length) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(r, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(uvm)

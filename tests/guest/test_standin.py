"""Guest tests of the stand-in NVIDIA driver (tests/standin/nvstub.ko).

They run in the QEMU guest with nvstub loaded (scripts/vm.sh -- bash scripts/guest-tests.sh)
and skip when its nodes are absent.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import signal
import stat
import struct
import sys
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

MIB = 1 << 20


@pytest.fixture
def sess() -> Iterator[nvstub.Session]:
    s = nvstub.Session()
    yield s
    s.close()


def in_child(fn: Callable[[], int]) -> int:
    """Run fn in a forked child (own fd table) and return its result (0..255)."""
    pid = os.fork()
    if pid == 0:
        code = 250
        try:
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_nodes_have_the_real_numbers() -> None:
    ctl = os.stat(nvstub.CTL_PATH)
    gpu0 = os.stat(nvstub.gpu_path(0))
    assert stat.S_ISCHR(ctl.st_mode) and stat.S_ISCHR(gpu0.st_mode)
    assert (os.major(ctl.st_rdev), os.minor(ctl.st_rdev)) == (195, 255)
    assert (os.major(gpu0.st_rdev), os.minor(gpu0.st_rdev)) == (195, 0)
    assert stat.S_ISCHR(os.stat(nvstub.UVM_PATH).st_mode)


def test_implemented_list() -> None:
    impl = nvstub.read_implemented()
    for item in [("esc", abi.NV_ESC_RM_ALLOC), ("esc", nvstub.NVSTUB_ESC_SUBMIT),
                 ("class", abi.NV01_MEMORY_LOCAL_USER), ("class", abi.HOPPER_CHANNEL_GPFIFO_A),
                 ("ctrl", abi.NV2080_CTRL_CMD_FB_GET_INFO_V2), ("ctrl", abi.NVA06C_CTRL_CMD_SET_TIMESLICE),
                 ("uvm", abi.UVM_INITIALIZE)]:
        assert item in impl
    assert ("ctrl", 0x20800102) not in impl  # not modelled: answers NOT_SUPPORTED


def test_card_info_and_version() -> None:
    ctl = nvstub.open_node(nvstub.CTL_PATH)
    try:
        buf = bytearray(abi.CARD_INFO.size * abi.NV_MAX_DEVICES)
        assert nvstub.ioctl(ctl, abi.IOCTL_CARD_INFO, buf) == 0
        valid = [abi.CARD_INFO.unpack_from(buf, i * abi.CARD_INFO.size)[0] for i in range(abi.NV_MAX_DEVICES)]
        ngpus = len([p for p in os.listdir("/dev") if p[len("nvidia"):].isdigit() and p.startswith("nvidia")])
        assert sum(valid) == ngpus >= 1
        version = nvstub.standin_version().encode()
        ok = bytearray(abi.RM_API_VERSION.pack(0, 0, version))
        assert nvstub.ioctl(ctl, abi.IOCTL_CHECK_VERSION_STR, ok) == 0
        assert abi.RM_API_VERSION.unpack(ok)[1] == abi.NV_RM_API_VERSION_REPLY_RECOGNIZED
        bad = bytearray(abi.RM_API_VERSION.pack(0, 0, b"525.1"))
        assert nvstub.ioctl(ctl, abi.IOCTL_CHECK_VERSION_STR, bad) == -errno.EINVAL
        assert abi.RM_API_VERSION.unpack(bad)[2].rstrip(b"\0") == version
        # CARD_INFO is a control-device escape
        gpu = nvstub.open_node(nvstub.gpu_path(0))
        assert nvstub.ioctl(gpu, abi.IOCTL_CARD_INFO, buf) == -errno.EINVAL
        os.close(gpu)
    finally:
        os.close(ctl)


def test_register_fd_checks_the_file() -> None:
    ctl = nvstub.open_node(nvstub.CTL_PATH)
    gpu = nvstub.open_node(nvstub.gpu_path(0))
    other = nvstub.open_node(nvstub.gpu_path(0))
    null = os.open("/dev/null", os.O_RDWR)
    try:
        assert nvstub.register_fd(gpu, null) == -errno.EINVAL       # not an nvidia file
        assert nvstub.register_fd(gpu, other) == -errno.EINVAL      # not the control device
        assert nvstub.register_fd(gpu, 9999) == -errno.EINVAL       # not an fd
        assert nvstub.register_fd(gpu, ctl) == 0
        assert nvstub.register_fd(gpu, ctl) == -errno.EINVAL        # only once
    finally:
        for fd in (ctl, gpu, other, null):
            os.close(fd)


def test_device_needs_an_open_gpu_file() -> None:
    def child() -> int:
        os.closerange(3, 4096)  # no nvidia0 file inherited from the test process
        ctl = nvstub.open_node(nvstub.CTL_PATH)
        st, client = nvstub.rm_alloc(ctl, 0, 0, 0, abi.NV01_ROOT_CLIENT)
        assert st == abi.NV_OK
        dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.size)
        st, _ = nvstub.rm_alloc(ctl, client, client, 0x5C000002, abi.NV01_DEVICE_0, dp)
        if st != abi.NV_ERR_INSUFFICIENT_PERMISSIONS:
            return 1
        gpu = nvstub.open_node(nvstub.gpu_path(0))
        st, _ = nvstub.rm_alloc(ctl, client, client, 0x5C000002, abi.NV01_DEVICE_0, dp)
        os.close(gpu)
        return 0 if st == abi.NV_OK else 2
    assert in_child(child) == 0


def test_client_handles_and_ownership(sess: nvstub.Session) -> None:
    assert sess.client & 0xFFF00000 == 0xC1D00000
    other = nvstub.open_node(nvstub.CTL_PATH)
    try:
        tsg, _ = sess.tsg_channel()
        # a client created through another file is not this file's
        assert nvstub.set_timeslice(other, sess.client, tsg, 2000) == abi.NV_ERR_INVALID_CLIENT
        assert nvstub.rm_free(other, sess.client, sess.client, sess.client) == abi.NV_ERR_INVALID_CLIENT
        assert nvstub.set_timeslice(sess.ctl, sess.client, tsg, 2000) == abi.NV_OK
        assert nvstub.get_timeslice(sess.ctl, sess.client, tsg) == (abi.NV_OK, 2000)
        # unknown class, bad parent, duplicate handle, free of a missing handle (compat: NV_OK)
        assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, 0x5C0000F0, 0xBEEF)[0] == abi.NV_ERR_INVALID_CLASS
        assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, 0x5C0000F1,
                               abi.HOPPER_CHANNEL_GPFIFO_A)[0] == abi.NV_ERR_INVALID_OBJECT_PARENT
        assert nvstub.rm_alloc(sess.ctl, sess.client, sess.device, tsg,
                               abi.KEPLER_CHANNEL_GROUP_A)[0] == abi.NV_ERR_INSERT_DUPLICATE_NAME
        assert sess.free(0x5C0000FF) == abi.NV_OK
        assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, 0x20800102,
                                 ctypes.create_string_buffer(564)) == abi.NV_ERR_NOT_SUPPORTED
    finally:
        os.close(other)


def test_video_memory_pool(sess: nvstub.Session) -> None:
    start = sess.fb_free_kib()
    st, info = nvstub.fb_info(sess.ctl, sess.client, sess.subdevice,
                              [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE, abi.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE])
    assert st == abi.NV_OK
    total_kib = info[abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE]
    assert info[abi.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE] == total_kib >= start > 0
    # sizes of 2 MiB or more are rounded up to 2 MiB pages, as in the traces (0x420000 -> 0x600000)
    st, h, size = sess.alloc_vidmem(0x420000)
    assert (st, size) == (abi.NV_OK, 0x600000)
    assert sess.fb_free_kib() == start - 0x600000 // 1024
    handles = [h]
    chunk = 64 * MIB
    while True:
        st, h, size = sess.alloc_vidmem(chunk)
        if st != abi.NV_OK:
            break
        handles.append(h)
        assert len(handles) < 100000
    assert st == abi.NV_ERR_NO_MEMORY
    left = sess.fb_free_kib()
    assert left < chunk // 1024
    # a refused allocation charges nothing
    assert sess.alloc_vidmem(1 << 40)[0] == abi.NV_ERR_NO_MEMORY
    assert sess.fb_free_kib() == left
    for h in handles:
        assert sess.free(h) == abi.NV_OK
    st, _, _ = sess.alloc_vidmem(chunk)
    assert st == abi.NV_OK
    # freeing the client frees everything it holds
    assert nvstub.rm_free(sess.ctl, sess.client, sess.client, sess.client) == abi.NV_OK
    fresh = nvstub.Session()
    try:
        assert fresh.fb_free_kib() == start
    finally:
        fresh.close()


def test_closing_the_file_frees_its_clients() -> None:
    s = nvstub.Session()
    start = s.fb_free_kib()
    assert s.alloc_vidmem(256 * MIB)[0] == abi.NV_OK
    client = s.client
    assert f"client=0x{client:08x}" in (nvstub.PROC / "clients").read_text()
    s.close()
    assert f"client=0x{client:08x}" not in (nvstub.PROC / "clients").read_text()
    s2 = nvstub.Session()
    try:
        assert s2.fb_free_kib() == start
    finally:
        s2.close()


def test_map_memory_and_mmap(sess: nvstub.Session) -> None:
    st, hvid, size = sess.alloc_vidmem(2 * MIB)
    assert st == abi.NV_OK
    map_fd = nvstub.open_node(nvstub.gpu_path(0))
    ctl2 = nvstub.open_node(nvstub.CTL_PATH)
    try:
        def map_on(fd: int, hmem: int, length: int) -> tuple[int, int]:
            buf = bytearray(abi.NVOS33_WITH_FD.pack(sess.client, sess.subdevice, hmem, 0, length, 0, 0, 0, fd))
            assert nvstub.ioctl(sess.ctl, abi.IOCTL_RM_MAP_MEMORY, buf) == 0
            f = abi.NVOS33_WITH_FD.unpack(buf)
            return f[6], f[5]
        assert map_on(ctl2, hvid, size)[0] == abi.NV_ERR_INVALID_ARGUMENT   # vidmem: needs an nvidiaN file
        st, addr = map_on(map_fd, hvid, size)
        assert st == abi.NV_OK and addr != 0
        assert map_on(map_fd, hvid, size)[0] == abi.NV_ERR_STATE_IN_USE     # one context per file
        with pytest.raises(OSError):
            mmap.mmap(map_fd, size // 2)                                     # must map the mapped length
        m = mmap.mmap(map_fd, size)
        m[0:4] = b"abcd"
        assert m[0:4] == b"abcd"
        m.close()
        with pytest.raises(OSError):
            mmap.mmap(ctl2, 4096)                                            # no context on this file
    finally:
        os.close(map_fd)
        os.close(ctl2)


def test_uvm_fd_checks() -> None:
    uvm = nvstub.open_node(nvstub.UVM_PATH)
    uvm2 = nvstub.open_node(nvstub.UVM_PATH)
    null = os.open("/dev/null", os.O_RDWR)
    s = nvstub.Session()
    try:
        size, st_off, fd_off = abi.UVM_PARAMS[abi.UVM_REGISTER_GPU]
        p = ctypes.create_string_buffer(size)
        assert nvstub.uvm_ioctl(uvm, abi.UVM_REGISTER_GPU, p) == 0
        assert struct.unpack_from("<I", p, st_off)[0] == abi.NV_ERR_ILLEGAL_ACTION   # not initialized
        init = ctypes.create_string_buffer(16)
        assert nvstub.uvm_ioctl(uvm, abi.UVM_INITIALIZE, init) == 0
        assert struct.unpack_from("<I", init, 8)[0] == abi.NV_OK
        for fd, want in [(null, abi.NV_ERR_INVALID_ARGUMENT), (s.dev_fd, abi.NV_ERR_INVALID_ARGUMENT),
                         (s.ctl, abi.NV_OK)]:
            p = ctypes.create_string_buffer(size)
            p[0:16] = nvstub.standin_uuid(0)  # a GPU of the driver (else NV_ERR_GPU_UUID_NOT_FOUND first)
            struct.pack_into("<iII", p, fd_off, fd, s.client, 0)
            assert nvstub.uvm_ioctl(uvm, abi.UVM_REGISTER_GPU, p) == 0
            assert struct.unpack_from("<I", p, st_off)[0] == want
        mm = ctypes.create_string_buffer(8)
        struct.pack_into("<i", mm, 0, null)
        assert nvstub.uvm_ioctl(uvm2, abi.UVM_MM_INITIALIZE, mm) == 0
        assert struct.unpack_from("<I", mm, 4)[0] == abi.NV_ERR_INVALID_ARGUMENT
        struct.pack_into("<i", mm, 0, uvm)
        assert nvstub.uvm_ioctl(uvm2, abi.UVM_MM_INITIALIZE, mm) == 0
        assert struct.unpack_from("<I", mm, 4)[0] == abi.NV_OK
    finally:
        s.close()
        for fd in (uvm, uvm2, null):
            os.close(fd)


def test_submit_checks_client_and_channel(sess: nvstub.Session) -> None:
    tsg, ch = sess.tsg_channel(schedule_it=False)
    other = nvstub.open_node(nvstub.CTL_PATH)
    try:
        assert nvstub.submit(other, sess.client, ch, 1000) == abi.NV_ERR_INVALID_CLIENT
        assert nvstub.submit(sess.ctl, sess.client, tsg, 1000) == abi.NV_ERR_INVALID_OBJECT_HANDLE
        assert nvstub.submit(sess.ctl, sess.client, ch, 5_000_000) == abi.NV_OK
        time.sleep(0.2)
        row = next(r for r in nvstub.read_engine() if r.channel == ch and r.client == sess.client)
        assert row.executed_ns == 0 and row.pending_ns == 5_000_000   # not scheduled yet
        assert nvstub.schedule(sess.ctl, sess.client, tsg) == abi.NV_OK
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = next(r for r in nvstub.read_engine() if r.channel == ch and r.client == sess.client)
            if row.pending_ns == 0:
                break
            time.sleep(0.05)
        assert (row.executed_ns, row.pending_ns) == (5_000_000, 0)
    finally:
        os.close(other)


@contextmanager
def busy_workers(timeslices_us: list[int]) -> Iterator[list[tuple[int, int, int]]]:
    """Forked processes, each with its own client and a channel in a TSG of the given
    timeslice, kept busy with more work than the test can consume. Yields
    [(pid, hClient, hChannel)]."""
    procs = []
    for ts in timeslices_us:
        r_info, w_info = os.pipe()
        r_quit, w_quit = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r_info)
                os.close(w_quit)
                s = nvstub.Session()
                _, ch = s.tsg_channel(timeslice_us=ts)
                assert nvstub.submit(s.ctl, s.client, ch, 3600 * 10**9) == abi.NV_OK
                os.write(w_info, struct.pack("<II", s.client, ch))
                os.read(r_quit, 1)
                code = 0
            finally:
                os._exit(code)
        os.close(w_info)
        os.close(r_quit)
        data = os.read(r_info, 8)
        os.close(r_info)
        assert len(data) == 8, "worker failed to start"
        client, ch = struct.unpack("<II", data)
        procs.append((pid, client, ch, w_quit))
    try:
        yield [(pid, c, ch) for pid, c, ch, _ in procs]
    finally:
        # SIGKILL: later workers inherited earlier workers' pipes, so EOF never comes
        for pid, _, _, w in procs:
            os.close(w)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def executed(channels: list[tuple[int, int]]) -> list[int]:
    """executed_ns of each (hClient, hChannel): handles are per client, so both are needed."""
    rows = {(r.client, r.channel): r for r in nvstub.read_engine()}
    return [rows[key].executed_ns for key in channels]


def test_timeslice_ratio_1_to_3() -> None:
    """Acceptance criterion: two always-busy clients at timeslices 1:3 get executed
    time within 5% of 1:3."""
    with busy_workers([1000, 3000]) as workers:
        chans = [(c, ch) for _, c, ch in workers]
        time.sleep(0.5)
        before = executed(chans)
        time.sleep(4.0)
        after = executed(chans)
    a, b = (after[i] - before[i] for i in range(2))
    ratio = a / b
    print(f"\nnvstub engine: executed {a / 1e6:.1f} ms vs {b / 1e6:.1f} ms, ratio {ratio:.4f} (1:3 = 0.3333)")
    assert a > 0 and b > 0
    assert abs(ratio - 1 / 3) <= 0.05 * (1 / 3)


def stall_every_cpu(seconds: float) -> None:
    """Keep every CPU busy at SCHED_FIFO 99 for `seconds`: the engine thread (SCHED_FIFO 50)
    wakes that much late, as a stalled TCG vCPU would make it."""
    pids = []
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            try:
                os.sched_setaffinity(0, {cpu})
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99))
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    pass
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)


def test_a_stalled_engine_keeps_running_a_lone_tsg() -> None:
    """A turn the engine thread saw late by hundreds of its TSG's slices is an overrun the
    TSG owes to others; with nobody else runnable it owes nothing, and it must go on
    running. (The stand-in used to wait out the debt idle, 64 slices per 100 ms, and
    charge that idle time to the next turn as a new, larger debt: a lone offline instance
    stopped for seconds in the second boot's priority test, 1 run in 3.) Functional: it
    executes in each of 15 steps of 0.1 s after the stall (the old debt stopped it for about
    2 s); the share of the wall time it got is printed by tests/guest/bench_activity.py."""
    with busy_workers([250]) as workers:
        chans = [(c, ch) for _, c, ch in workers]
        time.sleep(0.3)
        stall_every_cpu(0.3)
        time.sleep(0.1)
        marks = [executed(chans)[0]]
        for _ in range(15):
            time.sleep(0.1)
            marks.append(executed(chans)[0])
    stopped = [i for i in range(15) if marks[i + 1] == marks[i]]
    print(f"\nlone TSG after a 0.3 s stall: executed {(marks[-1] - marks[0]) / 1e9:.3f} s in 15 steps "
          f"of 0.1 s, stopped in steps {stopped}")
    assert not stopped, f"stopped in steps {stopped} of 15 after the stall"


def test_disable_channels_from_a_third_client(sess: nvstub.Session) -> None:
    with busy_workers([1000, 1000]) as workers:
        (_, ca, cha), (_, cb, chb) = workers
        time.sleep(0.3)
        # the gating client names another process's client and channel
        assert nvstub.disable_channels(sess.ctl, sess.client, sess.subdevice, [(ca, cha)], True) == abi.NV_OK
        assert next(r for r in nvstub.read_engine() if r.channel == cha and r.client == ca).disabled
        time.sleep(0.1)
        a0, b0 = executed([(ca, cha), (cb, chb)])
        time.sleep(1.0)
        a1, b1 = executed([(ca, cha), (cb, chb)])
        assert a1 == a0            # stopped
        assert b1 > b0             # the other keeps running (work-conserving)
        assert nvstub.disable_channels(sess.ctl, sess.client, sess.subdevice, [(ca, cha)], False) == abi.NV_OK
        time.sleep(0.5)
        assert executed([(ca, cha)])[0] > a1
        # unknown client / channel in the list
        assert nvstub.disable_channels(sess.ctl, sess.client, sess.subdevice,
                                       [(0xC1D0FFFF, cha)], True) == abi.NV_ERR_INVALID_CLIENT
        assert nvstub.disable_channels(sess.ctl, sess.client, sess.subdevice,
                                       [(ca, 0x5C0000EE)], True) == abi.NV_ERR_INVALID_CHANNEL


def test_channel_ids_and_engine_ids(sess: nvstub.Session) -> None:
    tsg, ch1 = sess.tsg_channel(schedule_it=False)
    ch2 = sess.handle()
    assert nvstub.rm_alloc(sess.ctl, sess.client, tsg, ch2, abi.HOPPER_CHANNEL_GPFIFO_A)[0] == abi.NV_OK
    handles = (ctypes.c_uint32 * 2)(ch1, ch2)
    ids = (ctypes.c_uint32 * 2)()
    p = ctypes.create_string_buffer(abi.FIFO_GET_CHANNELLIST.pack(2, ctypes.addressof(handles),
                                                                  ctypes.addressof(ids)),
                                    abi.FIFO_GET_CHANNELLIST.size)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.device, abi.NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST,
                             p) == abi.NV_OK
    assert ids[0] != ids[1]
    tok = ctypes.create_string_buffer(4)
    assert nvstub.rm_control(sess.ctl, sess.client, ch2, abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
                             tok) == abi.NV_OK
    assert struct.unpack("<I", tok.raw)[0] == ids[1]
    handles[1] = tsg  # not a channel
    assert nvstub.rm_control(sess.ctl, sess.client, sess.device, abi.NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST,
                             p) == abi.NV_ERR_INVALID_CHANNEL
    # the engine of a channel's compute object
    gr = ch1 + 1  # Session.tsg_channel allocates tsg, channel, compute in handle order
    q = ctypes.create_string_buffer(abi.CLASS_ENGINEID.pack(gr, 0, 0, 0), abi.CLASS_ENGINEID.size)
    assert nvstub.rm_control(sess.ctl, sess.client, ch1, abi.NV906F_CTRL_CMD_GET_CLASS_ENGINEID, q) == abi.NV_OK
    assert abi.CLASS_ENGINEID.unpack(q.raw)[2:] == (abi.HOPPER_COMPUTE_A, abi.NV2080_ENGINE_TYPE_GR0)
    # wrong params size: control.c _rmapiRmControl, before anything else is looked at
    assert nvstub.rm_control(sess.ctl, sess.client, ch1, abi.NV906F_CTRL_CMD_GET_CLASS_ENGINEID,
                             ctypes.create_string_buffer(8)) == abi.NV_ERR_INVALID_ARGUMENT


def test_a_channel_is_proven_only_through_its_clients_file(sess: nvstub.Session) -> None:
    """rm.owns_channel, the user-space daemon's proof that a process passing a file owns
    a channel: true through the file that made the channel's client (a dup of it is the
    same file); false through another file of the driver (client.c rmclientValidate_IMPL,
    strict: NV_ERR_INVALID_CLIENT), for a TSG, for a handle that does not exist."""
    from gpuslice.sched.rm import nvidia_file, owns_channel

    tsg, ch = sess.tsg_channel()
    assert nvidia_file(sess.ctl) and nvidia_file(sess.dev_fd)
    assert owns_channel(sess.ctl, sess.client, ch)
    dup = os.dup(sess.ctl)
    other = nvstub.Session()
    try:
        assert owns_channel(dup, sess.client, ch)
        assert not owns_channel(other.ctl, sess.client, ch)  # another process's file
        assert not owns_channel(other.ctl, other.client, ch)  # its own client, not its channel
        assert not owns_channel(sess.ctl, sess.client, tsg)
        assert not owns_channel(sess.ctl, sess.client, 0x5C0000EE)
        tok = ctypes.create_string_buffer(4)
        assert nvstub.rm_control(other.ctl, sess.client, ch, abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
                                 tok) == abi.NV_ERR_INVALID_CLIENT
    finally:
        os.close(dup)
        other.close()


def test_gpu_ids(sess: nvstub.Session) -> None:
    ids = ctypes.create_string_buffer(128)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.client, abi.NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS,
                             ids) == abi.NV_OK
    gpu_ids = [i for i in struct.unpack("<32I", ids.raw) if i != abi.NV0000_CTRL_GPU_INVALID_ID]
    assert len(gpu_ids) >= 1
    info = ctypes.create_string_buffer(abi.GPU_ID_INFO_V2.pack(gpu_ids[0], 0, 0, 0, 0, 0, 0, 0),
                                       abi.GPU_ID_INFO_V2.size)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.client, abi.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
                             info) == abi.NV_OK
    assert abi.GPU_ID_INFO_V2.unpack(info.raw)[2] == 0  # deviceInstance of the first GPU
    bad = ctypes.create_string_buffer(abi.GPU_ID_INFO_V2.pack(0xBAD, 0, 0, 0, 0, 0, 0, 0), abi.GPU_ID_INFO_V2.size)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.client, abi.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
                             bad) == abi.NV_ERR_INVALID_ARGUMENT
    # client controls go to the client object, not the device
    assert nvstub.rm_control(sess.ctl, sess.client, sess.device, abi.NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS,
                             ids) == abi.NV_ERR_NOT_SUPPORTED


def test_os_events(sess: nvstub.Session) -> None:
    def ev(fd: int, req: int, event_fd: int) -> int:
        buf = bytearray(abi.ALLOC_OS_EVENT.pack(sess.client, sess.subdevice, event_fd, 0))
        assert nvstub.ioctl(fd, req, buf) == 0
        return abi.ALLOC_OS_EVENT.unpack(buf)[3]
    gpu = nvstub.open_node(nvstub.gpu_path(0))
    assert nvstub.register_fd(gpu, sess.ctl) == 0
    assert ev(gpu, abi.IOCTL_ALLOC_OS_EVENT, 77) == abi.NV_OK
    assert ev(gpu, abi.IOCTL_ALLOC_OS_EVENT, 77) == abi.NV_ERR_INSUFFICIENT_RESOURCES
    assert ev(gpu, abi.IOCTL_RM_FREE_OS_EVENT, 77) == abi.NV_OK
    assert ev(gpu, abi.IOCTL_RM_FREE_OS_EVENT, 77) == abi.NV_ERR_INVALID_EVENT
    assert ev(gpu, abi.IOCTL_ALLOC_OS_EVENT, 78) == abi.NV_OK
    os.close(gpu)  # the file's events go with it
    assert ev(sess.dev_fd, abi.IOCTL_ALLOC_OS_EVENT, 78) == abi.NV_OK


def test_name_string_and_ctx_buffer(sess: nvstub.Session) -> None:
    p = ctypes.create_string_buffer(abi.NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS_SIZE)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING,
                             p) == abi.NV_OK
    assert p.raw[4:].split(b"\0")[0].startswith(b"NVIDIA H100")
    struct.pack_into("<I", p, 0, 7)  # no such string type
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING,
                             p) == abi.NV_ERR_INVALID_ARGUMENT
    tsg, ch = sess.tsg_channel(schedule_it=False)
    for h, want in [(ch, abi.NV_OK), (tsg, abi.NV_ERR_INVALID_CHANNEL)]:
        q = ctypes.create_string_buffer(abi.GR_CTX_BUFFER_SIZE.pack(h, 0), abi.GR_CTX_BUFFER_SIZE.size)
        assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE,
                                 q) == want
    assert abi.GR_CTX_BUFFER_SIZE.unpack(q.raw)[1] == 0  # a refused query reports no size


def test_identity_controls(sess: nvstub.Session) -> None:
    """PCI identity, virtualization mode and GR masks agree with what CARD_INFO reports."""
    buf = bytearray(abi.CARD_INFO.size * abi.NV_MAX_DEVICES)
    assert nvstub.ioctl(sess.ctl, abi.IOCTL_CARD_INFO, buf) == 0
    card = abi.CARD_INFO.unpack_from(buf, 0)
    vendor, device = card[5], card[6]
    p = ctypes.create_string_buffer(abi.BUS_PCI_INFO.size)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_BUS_GET_PCI_INFO,
                             p) == abi.NV_OK
    assert abi.BUS_PCI_INFO.unpack(p.raw)[0] == (device << 16) | vendor
    v = ctypes.create_string_buffer(abi.VIRTUALIZATION_MODE.size)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.device, abi.NV0080_CTRL_CMD_GPU_GET_VIRTUALIZATION_MODE,
                             v) == abi.NV_OK
    g = ctypes.create_string_buffer(abi.GR_GET_GPC_MASK.size)
    assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_GR_GET_GPC_MASK,
                             g) == abi.NV_OK
    gpc_mask = abi.GR_GET_GPC_MASK.unpack(g.raw)[2]
    assert gpc_mask != 0
    ngpc = gpc_mask.bit_length()
    for gpc, want in [(0, abi.NV_OK), (ngpc - 1, abi.NV_OK), (ngpc, abi.NV_ERR_INVALID_ARGUMENT)]:
        t = ctypes.create_string_buffer(abi.GR_GET_TPC_MASK.pack(0, 0, gpc, 0), abi.GR_GET_TPC_MASK.size)
        assert nvstub.rm_control(sess.ctl, sess.client, sess.subdevice, abi.NV2080_CTRL_CMD_GR_GET_TPC_MASK,
                                 t) == want
        if want == abi.NV_OK:
            assert abi.GR_GET_TPC_MASK.unpack(t.raw)[3] != 0

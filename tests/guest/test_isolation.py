"""Issue 11 in the guest against the stand-in: a container's values rewritten after the
module's check never reach the driver (kmod/shadow.c), the pages the driver reads them
from cannot be written, replaced or pinned by the container, and handles inside
allocation parameters are checked. Each race test holds the stand-in's window open with
its TEST ONLY parameters (race_delay_entry_us before the top-level copy, race_delay_us
before the nested copy) and checks the outcome in the stand-in itself."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gpuslice import abi

import nvstub
from gsinst import Instance, needs_modules, session

MIB = 1 << 20
PARAMS = "/sys/module/nvstub/parameters/"
SHADOW_BASE = 0x1000
SHADOW_LEN = 15 * 4096

pytestmark = needs_modules

libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


def _set(param: str, value: int) -> None:
    with open(PARAMS + param, "w") as f:
        f.write(f"{value}\n")


@pytest.fixture
def windows():
    if not os.path.exists(PARAMS + "race_delay_entry_us"):
        pytest.skip("the stand-in has no race_delay_entry_us")
    yield _set
    _set("race_delay_entry_us", 0)
    _set("race_delay_us", 0)


def _disabled(client: int, channel: int) -> bool:
    return next(r for r in nvstub.read_engine() if r.client == client and r.channel == channel).disabled


def _rewrite_later(after_s: float, addr: int, data: bytes) -> threading.Thread:
    def run() -> None:
        time.sleep(after_s)
        ctypes.memmove(addr, data, len(data))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_control_rewritten_after_the_check_never_reaches_rm(nl, windows):
    """Item 1: the caller's RM_CONTROL block says FB_GET_INFO_V2 (allowed) when the module
    checks it; a sibling thread then rewrites it into FIFO_DISABLE_CHANNELS naming another
    instance's channel, before the driver copies the block. The driver must see the
    checked block: the victim's channel stays enabled."""
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        victim = session(b)
        attacker = session(a)
        try:
            _, vch = victim.tsg_channel()
            assert not _disabled(victim.client, vch)
            info = ctypes.create_string_buffer(abi.FB_GET_INFO_V2_SIZE)
            evil = nvstub.disable_params([(victim.client, vch)])
            blk = ctypes.create_string_buffer(abi.NVOS54.pack(
                attacker.client, attacker.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, 0,
                ctypes.addressof(info), ctypes.sizeof(info), 0), abi.NVOS54.size)
            rewritten = abi.NVOS54.pack(attacker.client, attacker.subdevice,
                                        abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, 0,
                                        ctypes.addressof(evil), ctypes.sizeof(evil), 0)
            windows("race_delay_entry_us", 300000)
            t = _rewrite_later(0.1, ctypes.addressof(blk), rewritten)
            ret = libc.ioctl(attacker.ctl, abi.IOCTL_RM_CONTROL, ctypes.addressof(blk))
            t.join()
            windows("race_delay_entry_us", 0)
            print("ioctl", ret, "status", hex(abi.NVOS54.unpack(blk.raw)[6]))
            assert not _disabled(victim.client, vch), "the rewritten control reached RM"
            assert a.get()["nr_refused_filter"] == 0
        finally:
            attacker.close()
            victim.close()


def test_a_size_rewritten_after_the_check_never_reaches_rm(nl, windows):
    """The quota race of issue 10, closed: the size is rewritten 24x between the driver's
    two reads, and the parameters made read-only so RM cannot write back. RM must
    allocate what was checked; the stand-in never holds more than the limit."""
    limit = 64 * MIB
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with Instance(nl, limit) as a:
        s = session(a)
        import mmap
        page = mmap.mmap(-1, mmap.PAGESIZE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        try:
            base = nvstub.pool_used()
            windows("race_delay_us", 200000)
            for i in range(4):
                libc.mprotect(addr, mmap.PAGESIZE, 3)
                p = (ctypes.c_char * abi.MEMORY_ALLOCATION_PARAMS_SIZE).from_address(addr)
                ctypes.memmove(addr, nvstub.mem_params(2 * MIB).raw, abi.MEMORY_ALLOCATION_PARAMS_SIZE)

                def flip() -> None:
                    time.sleep(0.05)
                    ctypes.memmove(addr + 64, (48 * MIB).to_bytes(8, "little"), 8)
                    libc.mprotect(addr, mmap.PAGESIZE, 1)

                t = threading.Thread(target=flip)
                t.start()
                try:
                    st, _ = nvstub.rm_alloc(s.ctl, s.client, s.device, s.handle(), abi.NV01_MEMORY_LOCAL_USER, p)
                except nvstub.IoctlError as e:
                    st = -e.errno  # the reply could not be copied to the read-only page
                t.join()
                held = nvstub.pool_used() - base
                print(f"alloc {i}: {st} stand-in holds {held >> 20} MiB, module {a.get()['mem_used'] >> 20} MiB")
                assert held <= limit
                assert held == a.get()["mem_used"]
            assert nvstub.pool_used() - base == 4 * 2 * MIB
        finally:
            libc.mprotect(addr, mmap.PAGESIZE, 3)
            s.close()
            page.close()


PROBE = r'''
import ctypes, mmap, os, sys, time
sys.path[:0] = sys.argv[3].split(":")
import nvstub
from gsinst import InstSession
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
libc.read.restype = ctypes.c_ssize_t
BASE, LEN = 0x1000, 15 * 4096
MAP_FIXED, MAP_ANON, MAP_PRIVATE, MAP_FIXED_NOREPLACE = 0x10, 0x20, 0x02, 0x100000
s = InstSession(sys.argv[1], sys.argv[2])
line = [l for l in open("/proc/self/maps").read().splitlines() if l.startswith("00001000-00010000")]
print("maps", line)
def res(r):
    return (r if r is None or r < 2**63 else r - 2**64), ctypes.get_errno()
print("peek", ctypes.string_at(BASE, 4).hex())
print("mprotect", *res(libc.mprotect(BASE, 4096, 3)))
print("mremap", *res(libc.mremap(BASE, LEN, LEN, 3, 0x7e0000000000)))
r, w = os.pipe()
os.write(w, b"x" * 8)
print("read2", *res(libc.read(r, BASE, 8)))
fd = os.open("/proc/self/mem", os.O_RDWR)
try:
    os.pwrite(fd, b"x", BASE)
    print("procmem", 0)
except OSError as e:
    print("procmem", e.errno)
print("noreplace", *res(libc.mmap(BASE, 4096, 3, MAP_PRIVATE | MAP_ANON | MAP_FIXED_NOREPLACE, -1, 0)))
if sys.argv[4] != "munmap_busy":
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
    print("fixed_unpriv", *res(libc.mmap(BASE, 4096, 3, MAP_PRIVATE | MAP_ANON | MAP_FIXED, -1, 0)))
print("maps_after", [l for l in open("/proc/self/maps").read().splitlines() if l.startswith("00001000-")])
# still works through the instance after all that
print("fbfree", s.fb_free_kib() > 0, flush=True)
if sys.argv[4] == "write":
    ctypes.memmove(BASE + 8, b"x", 1)
elif sys.argv[4] == "munmap_idle":
    print("munmap", *res(libc.munmap(BASE, LEN)))
    print("fbfree_again", s.fb_free_kib() > 0, flush=True)
elif sys.argv[4] == "munmap_busy":
    import threading
    open("/sys/module/nvstub/parameters/race_delay_entry_us", "w").write("500000")
    threading.Thread(target=s.fb_free_kib, daemon=True).start()
    time.sleep(0.2)
    libc.munmap(BASE, LEN)
    time.sleep(2)
print("survived", flush=True)
'''


def _probe(inst: Instance, mode: str) -> tuple[int, dict[str, list[str]]]:
    here = os.path.dirname(os.path.abspath(__file__))
    path = ":".join([here, os.path.join(here, "..", "..", "pyctl")])
    p = subprocess.run([sys.executable, "-c", PROBE, inst.path("nvidiactl"), inst.path("nvidia0"), path, mode],
                       capture_output=True, text=True, timeout=60)
    print(p.stdout, p.stderr[-2000:])
    out = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition(" ")
        out[k] = v.split()
    return p.returncode, out


def test_the_parameter_pages_cannot_be_written_replaced_or_pinned(nl):
    """The pages the driver reads (kmod/shadow.c) after a process's first call: readable,
    but mprotect, mremap, read(2) into them, /proc/self/mem, mapping over them (without
    CAP_SYS_RAWIO: below vm.mmap_min_addr) all fail; a plain write kills the writer with
    SIGBUS; unmapping them while a call is in flight kills the process (idle, they are
    made again at the next call); calls keep working after every refusal."""
    min_addr = int(open("/proc/sys/vm/mmap_min_addr").read())
    print("vm.mmap_min_addr", min_addr)
    with Instance(nl, 64 * MIB) as inst:
        rc, out = _probe(inst, "none")
        assert rc == 0
        assert out["maps"] and "gpuslice-params" in " ".join(out["maps"])
        assert out["mprotect"] == ["-1", "13"]          # EACCES
        assert out["mremap"][0] == "-1"
        assert out["read2"] == ["-1", "14"]             # EFAULT
        assert out["procmem"] != ["0"]
        assert out["noreplace"] == ["-1", "17"]         # EEXIST
        if min_addr >= SHADOW_BASE + SHADOW_LEN:
            assert out["fixed_unpriv"] == ["-1", "1"]   # EPERM
            assert "gpuslice-params" in " ".join(out["maps_after"])
        assert out["fbfree"] == ["True"]
        assert "survived" in out
        rc, out = _probe(inst, "write")
        assert rc == -signal.SIGBUS and "survived" not in out
        rc, out = _probe(inst, "munmap_idle")
        assert rc == 0 and out["munmap"][0] == "0" and out["fbfree_again"] == ["True"]
        try:
            rc, out = _probe(inst, "munmap_busy")
        finally:
            _set("race_delay_entry_us", 0)
        assert rc == -signal.SIGKILL and "survived" not in out
        assert inst.get()["mem_used"] == 0


def test_device_parameters_naming_another_client_are_refused(nl):
    """Item 5: NV0080_ALLOC_PARAMETERS.hClientShare (share that client's VA space) and
    hTargetClient naming a client outside the instance are refused; its own are not."""
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        victim = session(b)
        attacker = session(a)
        try:
            for share, target in ((victim.client, 0), (0, victim.client)):
                dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.pack(0, share, target, 0, 0, 0, 0, 0, 0),
                                                 abi.DEVICE_ALLOC_PARAMS.size)
                st, _ = nvstub.rm_alloc(attacker.ctl, attacker.client, attacker.client, attacker.handle(),
                                        abi.NV01_DEVICE_0, dp)
                assert st != abi.NV_OK, (share, target)
            assert a.get()["nr_refused_filter"] == 2
            # its own client as hClientShare: whatever RM answers, the module passes it
            real = nvstub.Session()
            try:
                for sess in (attacker, real):
                    dp = ctypes.create_string_buffer(
                        abi.DEVICE_ALLOC_PARAMS.pack(0, sess.client, 0, 0, 0, 0, 0, 0, 0),
                        abi.DEVICE_ALLOC_PARAMS.size)
                    sess.st = nvstub.rm_alloc(sess.ctl, sess.client, sess.client, sess.handle(),
                                              abi.NV01_DEVICE_0, dp)[0]
                assert attacker.st == real.st
                assert a.get()["nr_refused_filter"] == 2
            finally:
                real.close()
        finally:
            attacker.close()
            victim.close()


def test_no_timeslice_or_host_wide_setting_from_a_container(nl):
    """Item 6: a container's SET_TIMESLICE is answered NV_OK and not passed (the TSG keeps
    the instance's timeslice); SYS_PARAMS (host-wide NUMA memory block size, first caller
    wins) is answered 0 and not passed; ATTACH_GPUS_TO_FD (opens and pins GPUs by id) is
    refused for a GPU that is not the instance's."""
    with Instance(nl, 64 * MIB, timeslice_us=3000) as inst:
        s = session(inst)
        real = nvstub.Session()
        try:
            tsg, ch = s.tsg_channel()
            assert nvstub.set_timeslice(s.ctl, s.client, tsg, 100000) == abi.NV_OK
            eng = [c for c in nvstub.read_engine() if c.channel == ch and c.client == s.client]
            assert eng[0].timeslice_us == 3000

            def memblock(fd: int) -> int:
                buf = bytearray(abi.NUMA_INFO_SIZE)
                assert nvstub.ioctl(fd, abi.IOCTL_NUMA_INFO, buf) == 0
                return abi.NUMA_INFO_HEAD.unpack_from(buf)[2]

            before = memblock(real.dev_fd)  # a GPU node's escape
            bogus = before + (1 << 20) if before else 4096
            assert nvstub.ioctl(s.ctl, abi.IOCTL_SYS_PARAMS, bytearray(abi.SYS_PARAMS.pack(bogus))) == 0
            assert memblock(real.dev_fd) == before
            # attaching a GPU that is not the instance's (an id no GPU of the instance has)
            assert nvstub.attach_gpus(s.ctl, [0xDEAD00, 0]) == -errno.EPERM
            assert inst.get()["nr_refused_filter"] == 1
            # its own GPU: what CUDA does on a shareable handle's export file
            assert nvstub.attach_gpus(s.ctl, [nvstub.gpu_ids(real.ctl)[0]]) == 0
        finally:
            real.close()
            s.close()


CGROUP_PROBE = r'''
import os, sys
ok = []
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        ok.append(f"{path}:ok")
    except OSError as e:
        ok.append(f"{path}:{e.errno}")
print(" ".join(ok))
'''


def _device_filter_cgroup(deny_major: int) -> str:
    """A cgroup v2 group with a BPF device program that denies one major and allows the
    rest, as runc/crun install for a container (BPF_PROG_TYPE_CGROUP_DEVICE)."""
    import struct as st

    root = "/sys/fs/cgroup"
    with open("/proc/mounts") as f:
        if not any(line.split()[1] == root and line.split()[2] == "cgroup2" for line in f):
            root = "/tmp/gs-cgroup2"
            os.makedirs(root, exist_ok=True)
            if subprocess.run(["mount", "-t", "cgroup2", "none", root]).returncode:
                pytest.skip("no cgroup2")
    cg = os.path.join(root, f"gs-devfilter-{os.getpid()}")
    os.makedirs(cg, exist_ok=True)

    def insn(code: int, dst: int, src: int, off: int, imm: int) -> bytes:
        return st.pack("<BBhi", code, (src << 4) | dst, off, imm)

    prog = b"".join([
        insn(0x61, 2, 1, 4, 0),           # r2 = ctx->major
        insn(0x15, 2, 0, 2, deny_major),  # if r2 == deny_major goto deny
        insn(0xB7, 0, 0, 0, 1),           # r0 = 1 (allow)
        insn(0x95, 0, 0, 0, 0),           # exit
        insn(0xB7, 0, 0, 0, 0),           # deny: r0 = 0
        insn(0x95, 0, 0, 0, 0),           # exit
    ])
    sysc = ctypes.CDLL(None, use_errno=True).syscall
    sysc.restype = ctypes.c_long
    code = ctypes.create_string_buffer(prog)
    lic = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    # union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license
    st.pack_into("<IIQQ", attr, 0, 15, len(prog) // 8, ctypes.addressof(code), ctypes.addressof(lic))
    fd = sysc(321, 5, attr, 128)  # bpf(BPF_PROG_LOAD)
    if fd < 0:
        pytest.skip(f"BPF_PROG_LOAD: errno {ctypes.get_errno()}")
    cfd = os.open(cg, os.O_RDONLY | os.O_DIRECTORY)
    attr = ctypes.create_string_buffer(128)
    st.pack_into("<IIII", attr, 0, cfd, fd, 6, 0)  # target_fd, attach_bpf_fd, BPF_CGROUP_DEVICE, flags
    r = sysc(321, 8, attr, 128)  # bpf(BPF_PROG_ATTACH)
    os.close(cfd)
    os.close(fd)
    if r < 0:
        pytest.skip(f"BPF_PROG_ATTACH: errno {ctypes.get_errno()}")
    return cg


def test_no_instance_node_for_a_process_that_can_open_the_real_one(nl):
    """Item 3: during a call the real files are in the caller's fd table, where another
    thread can reach them through /proc/<pid>/task/<tid>/fd; only the device cgroup stops
    it opening them again. With require_device_cgroup (the module's default; the test bed
    turns it off), a process whose device cgroup would let it open the real node gets no
    instance node; one whose cgroup denies major 195, as a container's does, gets them."""
    param = "/sys/module/gpuslice/parameters/require_device_cgroup"
    if not os.path.exists(param):
        pytest.skip("no require_device_cgroup")
    with Instance(nl, 64 * MIB) as inst:
        cg = _device_filter_cgroup(195)
        paths = [inst.path("nvidiactl"), inst.path("nvidia0"), "/dev/nvidiactl"]
        _set_param = lambda v: open(param, "w").write(v)  # noqa: E731
        try:
            _set_param("Y")
            with pytest.raises(PermissionError):
                os.open(inst.path("nvidiactl"), os.O_RDWR)

            def enter() -> None:
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))

            out = subprocess.run([sys.executable, "-c", CGROUP_PROBE, *paths], preexec_fn=enter,
                                 capture_output=True, text=True, timeout=60)
            print(out.stdout, out.stderr)
            got = dict(x.rsplit(":", 1) for x in out.stdout.split())
            assert got[inst.path("nvidiactl")] == "ok" and got[inst.path("nvidia0")] == "ok"
            assert got["/dev/nvidiactl"] == "1"  # EPERM: the container's device cgroup
        finally:
            _set_param("N")
            try:
                os.rmdir(cg)
            except OSError:
                pass


def test_debugger_and_event_parameters_naming_another_client_are_refused(nl):
    """GT200_DEBUGGER's hAppClient (a debug session on that client's contexts) and
    NV01_EVENT_OS_EVENT's hParentClient (its notifications) naming a client outside the
    instance are refused; the instance's own pass to the driver."""
    import struct as st

    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        victim = session(b)
        attacker = session(a)
        try:
            dbg = ctypes.create_string_buffer(st.pack("<III", 0, victim.client, 0), 12)
            ev = ctypes.create_string_buffer(st.pack("<IIIIQ", victim.client, victim.device, 0, 0, 0), 24)
            assert nvstub.rm_alloc(attacker.ctl, attacker.client, attacker.device, attacker.handle(),
                                   abi.GT200_DEBUGGER, dbg)[0] == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert nvstub.rm_alloc(attacker.ctl, attacker.client, attacker.device, attacker.handle(),
                                   abi.NV01_EVENT_OS_EVENT, ev)[0] == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert a.get()["nr_refused_filter"] == 2
            dbg = ctypes.create_string_buffer(st.pack("<III", 0, attacker.client, 0), 12)
            nvstub.rm_alloc(attacker.ctl, attacker.client, attacker.device, attacker.handle(),
                            abi.GT200_DEBUGGER, dbg)
            assert a.get()["nr_refused_filter"] == 2  # its own client: passed to the driver
        finally:
            attacker.close()
            victim.close()


def test_instance_names_are_ascii(nl):
    """The netlink fuzzer created an instance named b"nlf\\xe9" (the kernel's isalnum()
    takes Latin-1 letters): its /dev/gpuslice directory did not match the name user space
    reads back. Names are ASCII letters, digits, '_', '.', '-'."""
    import rawgenl
    from gpuslice import netlink as gnl

    A = gnl.ATTR_IDS
    name = b"nlf\xe9" + os.urandom(2).hex().encode()
    with rawgenl.Genl("gpuslice") as g:
        err, _ = g.request(gnl.CMD_INSTANCE_NEW, [(A["GPUSLICE_A_NAME"], name + b"\0"),
                                                  (A["GPUSLICE_A_GPU_MASK"], rawgenl.u32(1)),
                                                  (A["GPUSLICE_A_MEM_LIMIT"], rawgenl.u64(MIB))])
    assert err == 22, err  # EINVAL
    names = os.listdir("/dev/gpuslice") if os.path.isdir("/dev/gpuslice") else []
    assert not any(n.encode(errors="surrogateescape").startswith(b"nlf\xe9") for n in names)

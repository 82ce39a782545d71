"""The netlink family under load and attack (guest only): INSTANCE_GET of an instance
with more processes than one message holds, handlers that must not hold the instance list while a container
holds its instance's core lock, open() racing delete, and refusal floods that must
not cost other instances' channel events."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuslice import abi
from gpuslice import netlink as gnl

import nvstub
import rawgenl
from gsinst import Instance, dmesg_tail, needs_modules, node, session, unique

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
A = gnl.ATTR_IDS
PY = os.path.realpath(getattr(sys, "_base_executable", sys.executable))  # stdlib-only children

pytestmark = needs_modules


def gpuctl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from gpuslice.cli import main; main()", "--state", str(state),
                           "--kernel", "yes", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})


def pids_of(msg: rawgenl.Attrs) -> list[int]:
    """The pids of every PIDS nest of one message, in order."""
    return [struct.unpack("<I", p)[0] for t, nest in msg if t == A["GPUSLICE_A_PIDS"]
            for tt, p in rawgenl.parse(nest) if tt == A["GPUSLICE_A_PID"]]


def kernel_bugs(since: str) -> list[str]:
    out = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    out = out[len(since):] if out.startswith(since) else out
    return [ln for ln in out.splitlines()
            if any(k in ln for k in ("BUG:", "Oops", "WARNING:", "general protection", "list_del corruption"))]


# ---- INSTANCE_GET with 600 processes ---------------------------------------------------

# Forks N processes that each open NODE, allocate an RM client on it, report, and become
# `sleep` with the node still open (a Python process each would not fit the guest).
HOLDERS = r"""
import fcntl, json, os, signal, struct, sys
n, ctl, req, klass, fmt = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r, w = os.pipe()
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            fd = os.open(ctl, os.O_RDWR)
            buf = bytearray(struct.pack(fmt, 0, 0, 0, klass, 0, 0, 0, 0, 0))
            fcntl.ioctl(fd, req, buf, True)
            os.write(w, struct.pack("<iI", os.getpid(), struct.unpack(fmt, buf)[8]))
            os.set_inheritable(fd, True)
            os.execv("/bin/sleep", ["sleep", "3600"])
        finally:
            os._exit(1)
    kids.append(pid)
os.close(w)
got, data = {}, b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    data += chunk
for i in range(0, len(data) - 7, 8):
    pid, st = struct.unpack_from("<iI", data, i)
    got[pid] = st
print(json.dumps(got), flush=True)
sys.stdin.read()
for pid in kids:
    os.kill(pid, signal.SIGKILL)
for pid in kids:
    os.waitpid(pid, 0)
"""

N_HOLDERS = 600  # more than one NLMSG_GOODSIZE message held (about 450)


def test_instance_get_lists_more_pids_than_one_message_holds(nl, tmp_path: Path) -> None:
    """The reply used to be one NLMSG_GOODSIZE message: about 450 pids, then EMSGSIZE
    (and a dump ended early, so gpuctl showed no kernel data at all)."""
    state = tmp_path / "state.json"
    name = unique("big")
    r = gpuctl(state, "instance", "create", name, "--memory", "1GiB", "--mode", "660")
    assert r.returncode == 0, r.stderr
    holder = subprocess.Popen([PY, "-I", "-c", HOLDERS, str(N_HOLDERS), node(name, "nvidiactl"),
                               str(abi.IOCTL_RM_ALLOC), str(abi.NV01_ROOT_CLIENT), abi.NVOS64.format],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        got = json.loads(holder.stdout.readline())
        assert len(got) == N_HOLDERS and set(got.values()) == {abi.NV_OK}
        pids = sorted(int(p) for p in got)

        (d,) = nl.instances(name)  # the doit: one reply holding every pid
        assert d["pids"] == pids

        show = gpuctl(state, "instance", "show", name, "--json")  # gpuctl reads the dump
        assert show.returncode == 0, show.stderr
        assert json.loads(show.stdout)["kernel"]["pids"] == pids

        # A dump read with a 4 KiB buffer: the kernel's messages fit it, the pids go on
        # in continuations (NAME, ID, PIDS only), each pid once, in order.
        with rawgenl.Genl("gpuslice", recv_size=4096) as g:
            err, replies = g.request(gnl.CMD_INSTANCE_GET, [], dump=True)
            assert err == 0 and max(g.sizes) <= 4096
            mine = [m for m in replies if rawgenl.get_str(m, A["GPUSLICE_A_NAME"]) == name]
            assert len(mine) >= 2
            assert [p for m in mine for p in pids_of(m)] == pids
            assert all(rawgenl.get_u32(m, A["GPUSLICE_A_WEIGHT"]) is None for m in mine[1:])
            assert len({rawgenl.get_u32(m, A["GPUSLICE_A_ID"]) for m in mine}) == 1
            # NAME filters a dump
            err, replies = g.request(gnl.CMD_INSTANCE_GET, [(A["GPUSLICE_A_NAME"], rawgenl.string(name))],
                                     dump=True)
            assert err == 0 and {rawgenl.get_str(m, A["GPUSLICE_A_NAME"]) for m in replies} == {name}
            assert [p for m in replies for p in pids_of(m)] == pids
            # the doit's single message, with several PIDS-nest-sized chunks if need be
            g.recv_size = 1 << 20
            err, replies = g.request(gnl.CMD_INSTANCE_GET, [(A["GPUSLICE_A_NAME"], rawgenl.string(name))])
            assert err == 0 and len(replies) == 1 and pids_of(replies[0]) == pids
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(300)
    assert nl.instances(name)[0]["pids"] == []
    r = gpuctl(state, "instance", "delete", name)
    assert r.returncode == 0, r.stderr


# ---- instance restore after a reboot with a GPU gone -----------------------------------

def test_restore_makes_the_rest_when_the_module_refuses_one(nl, tmp_path: Path) -> None:
    """The state file names an instance of a GPU this host no longer has (removed or
    renumbered since it was made): `instance restore` names it with the module's refusal
    in words, makes the others, writes the CDI spec with them and exits 0, so that the
    daemon's unit (ExecStartPre) still starts the daemon; `instance create` on that GPU
    is refused in one line."""
    from gpuslice import state as S

    gone = next(g for g in range(1, gnl.MAX_GPUS) if not os.path.exists(f"/dev/nvidia{g}"))
    kept, lost = unique("rkept"), unique("rlost")
    state, spec = tmp_path / "state.json", tmp_path / "gpuslice.yaml"
    with S.locked(str(state)) as st:  # as after a reboot: in the state file, not in the module
        st.instances[kept] = S.Instance(kept, [0], 1 << 30, mode=0o660)
        st.instances[lost] = S.Instance(lost, [gone], 1 << 30, mode=0o660)
    try:
        r = gpuctl(state, "--cdi-spec", str(spec), "instance", "restore")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"created {kept}", f"not restored: {lost}"]
        assert r.stderr == (f"gpuctl: warning: instance {lost} (GPU {gone}) not restored: this host has no GPU "
                            f"{gone} (no /dev/nvidia{gone}); it stays in the state file (`gpuctl instance delete "
                            f"{lost}` forgets it)\n")
        have = {d["name"] for d in nl.instances()}
        assert kept in have and lost not in have
        assert os.path.exists(node(kept, "nvidiactl"))
        assert f"name: {kept}" in spec.read_text() and lost not in spec.read_text()
        assert sorted(S.load(str(state)).instances) == sorted([kept, lost])
        r = gpuctl(state, "instance", "create", unique("rnew"), "--gpu", str(gone), "--memory", "1GiB")
        assert r.returncode == 1 and r.stderr.startswith("gpuctl: cannot create ") and \
            r.stderr.endswith(f" on GPU {gone}: this host has no GPU {gone} (no /dev/nvidia{gone})\n"), r.stderr
    finally:
        for name in (kept, lost):
            gpuctl(state, "--cdi-spec", "", "instance", "delete", name)
    assert kept not in {d["name"] for d in nl.instances()}


# ---- a container holding its instance's core lock --------------------------------------

SYS_USERFAULTFD = 323
UFFD_API = 0xAA
UFFDIO_API = 0xC018AA3F
UFFDIO_REGISTER = 0xC020AA00
UFFDIO_COPY = 0xC028AA03
PAGE = 4096


class StallPage:
    """An anonymous page whose first touch, from user or kernel mode, waits until
    :meth:`release` (userfaultfd, missing mode): a call that reads its parameters from
    it sleeps in copy_from_user, with whatever lock it holds."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        self.fd = libc.syscall(SYS_USERFAULTFD, os.O_CLOEXEC)
        if self.fd < 0:
            pytest.skip(f"userfaultfd: {os.strerror(ctypes.get_errno())}")
        fcntl.ioctl(self.fd, UFFDIO_API, bytearray(struct.pack("<QQQ", UFFD_API, 0, 0)), True)
        self.addr = libc.mmap(None, PAGE, 0x3, 0x22, -1, 0)  # RW, MAP_PRIVATE|MAP_ANONYMOUS
        fcntl.ioctl(self.fd, UFFDIO_REGISTER, bytearray(struct.pack("<QQQQ", self.addr, PAGE, 1, 0)), True)
        self.released = False

    def wait_touched(self, timeout: float) -> bool:
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        os.read(self.fd, 32)  # struct uffd_msg
        return True

    def release(self, content: bytes) -> None:
        if self.released:
            return
        src = ctypes.create_string_buffer(content.ljust(PAGE, b"\0"), PAGE)
        fcntl.ioctl(self.fd, UFFDIO_COPY,
                    bytearray(struct.pack("<QQQQq", self.addr, ctypes.addressof(src), PAGE, 0, 0)), True)
        self.released = True

    def close(self) -> None:
        os.close(self.fd)


# What must go on while instance A's core lock is held: open and close of B's node,
# INSTANCE_GET of B, OBJECT_GET of B, INSTANCE_NEW and DEL of a third instance.
OTHERS = r"""
import errno, json, os, sys, time
b_node, b_name, c_name, n = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
t0 = time.monotonic()
os.close(os.open(b_node, os.O_RDWR))
g = Genl("gpuslice")
err, r = g.request(n["get"], [(n["name"], string(b_name))])
assert err == 0 and get_str(r[0], n["name"]) == b_name, err
err, r = g.request(n["obj"], [(n["name"], string(b_name))], dump=True)
assert err == 0, err
new = [(n["name"], string(c_name)), (n["gpu_mask"], u32(1)), (n["mem_limit"], u64(1 << 20))]
assert g.request(n["new"], new)[0] == 0
assert g.request(n["del"], [(n["name"], string(c_name))])[0] == 0
print("ok %.1f" % (time.monotonic() - t0))
"""


def test_busy_instance_stalls_nobody_else(nl) -> None:
    """A container's call sleeps in copy_from_user (here: RM_ALLOC parameters on a
    userfaultfd page). That copy used to happen under the instance's core lock, and
    INSTANCE_GET waited for it holding gs_instances_lock (and genl_mutex), so every open
    and close of every node on the host, and every netlink request, waited too. Now the
    core reads only the glue's kernel copies (issue 11 item 2): even INSTANCE_GET of the
    stalled instance itself answers, and so does everything else."""
    nums = {"get": gnl.CMD_INSTANCE_GET, "obj": gnl.CMD_OBJECT_GET, "new": gnl.CMD_INSTANCE_NEW,
            "del": gnl.CMD_INSTANCE_DEL, "name": A["GPUSLICE_A_NAME"], "gpu_mask": A["GPUSLICE_A_GPU_MASK"],
            "mem_limit": A["GPUSLICE_A_MEM_LIMIT"]}
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        s = session(a)
        page = StallPage()
        params = bytes(nvstub.mem_params(2 * MIB))
        call = bytearray(abi.NVOS64.pack(s.client, s.device, s.handle(), abi.NV01_MEMORY_LOCAL_USER,
                                         page.addr, 0, 0, 0, 0))
        got: dict[str, object] = {}
        stuck = threading.Thread(target=lambda: got.update(ret=nvstub.ioctl(s.ctl, abi.IOCTL_RM_ALLOC, call)))
        reader = threading.Thread(target=lambda: got.update(
            get=rawgenl.Genl("gpuslice").request(gnl.CMD_INSTANCE_GET,
                                                 [(A["GPUSLICE_A_NAME"], rawgenl.string(a.name))])))
        others = None
        try:
            stuck.start()
            assert page.wait_touched(60), "the RM_ALLOC never read its parameters"
            reader.start()
            reader.join(60)
            assert not reader.is_alive(), "INSTANCE_GET waited for a call stalled in a user copy"
            others = subprocess.Popen([PY, "-I", "-c", rawgenl.source() + "\n" + OTHERS, b.path("nvidiactl"),
                                       b.name, unique("c"), json.dumps(nums)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
            deadline = time.monotonic() + 90
            while others.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            finished = others.poll() is not None
        finally:
            page.release(params)  # whatever happened: the call goes on, and everything behind it
            stuck.join(120)
            reader.join(120)
            s.close()
            page.close()
        out, err = others.communicate(timeout=120) if others is not None else ("", "")
        assert finished, "open/close of another instance's node or netlink waited for a busy instance"
        assert others.returncode == 0 and out.startswith("ok"), err
        assert got["ret"] == 0 and abi.NVOS64.unpack(call)[8] == abi.NV_OK
        err_get, replies = got["get"]  # type: ignore[misc]
        assert err_get == 0 and rawgenl.get_str(replies[0], A["GPUSLICE_A_NAME"]) == a.name


# ---- open() against delete ------------------------------------------------------------

OPENERS = r"""
import errno, os, sys, threading, time
path, nthreads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = time.monotonic() + seconds
ok, bad = [0], []
def loop():
    while time.monotonic() < stop:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV):
                bad.append(e.errno)
            continue
        ok[0] += 1
        os.close(fd)
ts = [threading.Thread(target=loop) for _ in range(nthreads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(ok[0], bad)
"""


def test_open_races_delete_and_recreate(nl) -> None:
    """Threads open() an instance's node in a loop while it is deleted and created again
    under the same name, and read over netlink meanwhile. gs_instance_del used to free
    the nodes after dropping the lock under which open() looks them up."""
    since = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    name = unique("race")
    nl.instance_new(name, 1, 64 * MIB, mode=0o666)
    openers = subprocess.Popen([PY, "-I", "-c", OPENERS, node(name, "nvidiactl"), "4", "25"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    stop = threading.Event()
    read_errs: list[int] = []

    def read_loop() -> None:
        with rawgenl.Genl("gpuslice") as g:
            while not stop.is_set():
                err, _ = g.request(gnl.CMD_INSTANCE_GET, [(A["GPUSLICE_A_NAME"], rawgenl.string(name))])
                if err not in (0, errno.ENOENT):
                    read_errs.append(err)
                err, _ = g.request(gnl.CMD_INSTANCE_GET, [], dump=True)
                if err:
                    read_errs.append(err)

    reader = threading.Thread(target=read_loop)
    reader.start()
    rounds = busy = 0
    try:
        while openers.poll() is None:
            try:
                nl.instance_del(name)
            except OSError as e:
                assert e.errno == errno.EBUSY
                busy += 1
                continue
            nl.instance_new(name, 1, 64 * MIB, mode=0o666)
            rounds += 1
    finally:
        stop.set()
        reader.join(60)
        out, err = openers.communicate(timeout=60)
        try:
            nl.instance_del(name)
        except OSError as e:
            assert e.errno == errno.ENOENT
    opened, bad = out.split(" ", 1)
    assert openers.returncode == 0 and bad.strip() == "[]", (out, err)
    assert int(opened) > 0 and rounds >= 5, (opened, rounds, busy)
    assert not read_errs
    assert not kernel_bugs(since), dmesg_tail()


# ---- refusal floods --------------------------------------------------------------------

# Opens NODE and makes N RM_CONTROL calls naming a client that is not the instance's:
# each is refused by the filter (FILTER_REFUSED event).
FLOOD = r"""
import fcntl, os, struct, sys, time
path, n, req, cmd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_RDWR)
buf = bytearray(struct.pack("<IIIIQII", 0x7E57C11E, 0x7E57C11F, cmd, 0, 0, 0, 0))
print("start", flush=True)
t0 = time.monotonic()
for _ in range(n):
    fcntl.ioctl(fd, req, buf, True)
print("%.2f %x" % (time.monotonic() - t0, struct.unpack_from("<I", buf, 28)[0]), flush=True)
"""
N_FLOOD = 50000
RCVBUF = 8 << 20


def test_refusal_flood_loses_no_channel_event(nl) -> None:
    """One instance loops refused calls while another creates channels; a listener that
    reads only at the end (a slow daemon) must still see every channel event: refusal
    events are limited per instance (100/s, burst 100), TSG/CHANNEL events never."""
    with Instance(nl, 64 * MIB) as a, Instance(nl, 256 * MIB) as b, \
            rawgenl.Genl("gpuslice", rcvbuf=RCVBUF) as listener:
        assert listener.join(gnl.MCGRP_EVENTS) == 0
        sb = session(b)
        flood = subprocess.Popen([PY, "-I", "-c", FLOOD, a.path("nvidiactl"), str(N_FLOOD),
                                  str(abi.IOCTL_RM_CONTROL), str(abi.NV2080_CTRL_CMD_FB_GET_INFO_V2)],
                                 stdout=subprocess.PIPE, text=True, cwd="/")
        channels = []
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "start\n"
            while (flood.poll() is None and len(channels) < 40) or len(channels) < 10:
                channels.append(sb.tsg_channel()[1])
                time.sleep(0.1)
            out = flood.stdout.read()
            channels.append(sb.tsg_channel()[1])  # and one after the flood
            events, overruns = listener.events(2.0)
        finally:
            flood.wait(60)
            sb.close()
        elapsed, status = out.split()
        assert flood.returncode == 0 and int(status, 16) == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
        ev = A["GPUSLICE_A_EVENT"]
        seen = {rawgenl.get_u32(e, A["GPUSLICE_A_HANDLE"]) for e in events
                if rawgenl.get_str(e, A["GPUSLICE_A_NAME"]) == b.name
                and rawgenl.get_u32(e, ev) == gnl.EVENTS["GPUSLICE_EV_CHANNEL_NEW"]}
        missing = [h for h in channels if h not in seen]
        assert not missing and overruns == 0, (f"{len(missing)} of {len(channels)} channel events lost, "
                                               f"{overruns} overruns, flood {elapsed}s")
        refused = [e for e in events if rawgenl.get_str(e, A["GPUSLICE_A_NAME"]) == a.name
                   and rawgenl.get_u32(e, ev) == gnl.EVENTS["GPUSLICE_EV_FILTER_REFUSED"]]
        assert 100 <= len(refused) <= 100 + 100 * (float(elapsed) + 3)
        d = a.get()
        assert d["nr_refused_filter"] == N_FLOOD
        assert d["nr_events_suppressed"] == N_FLOOD - len(refused)
        last = [p for t, p in refused[-1] if t == A["GPUSLICE_A_NR_EVENTS_SUPPRESSED"]]
        assert last and 0 < struct.unpack("<Q", last[0])[0] <= d["nr_events_suppressed"]
        assert b.get()["nr_events_suppressed"] == 0

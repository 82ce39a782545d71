"""gpuslice.ko in the guest, against the nvstub stand-in driver: nodes,
pass-through, fd translation, quota, filter, netlink."""

from __future__ import annotations

import ctypes
import signal
import errno
import os
import stat
import subprocess

import pytest

from gpuslice import abi

import nvstub
import rawgenl
from gsinst import Instance, needs_modules, rdev_major, real_session, session

MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = needs_modules


def test_nodes_created_with_owner_mode_and_our_major(nl):
    with Instance(nl, 64 * MIB, uid=1234, gid=4321, mode=0o640) as inst:
        for leaf in ("nvidiactl", "nvidia0", "nvidia-uvm"):
            st = os.stat(inst.path(leaf))
            assert stat.S_ISCHR(st.st_mode), leaf
            assert os.major(st.st_rdev) != abi.NV_MAJOR_DEVICE_NUMBER, leaf
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 4321, 0o640), leaf
        assert not os.path.exists(inst.path("nvidia1"))
        nl.instance_set(inst.name, uid=99, gid=98, mode=0o660)
        st = os.stat(inst.path("nvidiactl"))
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (99, 98, 0o660)
    assert not os.path.exists(inst.path("nvidiactl"))


def test_session_through_instance_passes_driver_fd_checks(nl):
    """REGISTER_FD (fget + f_op check) and device alloc (fd-table scan) succeed."""
    with Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        try:
            st, h, size = s.alloc_vidmem(2 * MIB)
            assert st == abi.NV_OK and size == 2 * MIB
            assert inst.get()["mem_used"] == 2 * MIB
            assert s.free(h) == abi.NV_OK
            assert inst.get()["mem_used"] == 0
        finally:
            s.close()
        assert inst.get()["nr_ioctls"] > 0


def test_quota_exact_limit_then_one_byte_over(nl):
    limit = 8 * MIB
    with Instance(nl, limit) as inst:
        s = session(inst)
        try:
            st1, h1, _ = s.alloc_vidmem(6 * MIB)
            st2, h2, _ = s.alloc_vidmem(2 * MIB)
            assert (st1, st2) == (abi.NV_OK, abi.NV_OK)
            assert inst.get()["mem_used"] == limit
            st3, _, _ = s.alloc_vidmem(1)
            assert st3 == abi.NV_ERR_NO_MEMORY
            d = inst.get()
            assert d["mem_used"] == limit and d["nr_refused_quota"] == 1
            assert s.free(h2) == abi.NV_OK
            st4, h4, _ = s.alloc_vidmem(2 * MIB)
            assert st4 == abi.NV_OK
            # the same over-limit allocation on the real node is allowed
            r = real_session()
            try:
                assert r.alloc_vidmem(limit + MIB)[0] == abi.NV_OK
            finally:
                r.close()
        finally:
            s.close()
        assert inst.get()["mem_used"] == 0


def test_fb_info_shows_limit_and_room(nl):
    limit = 16 * MIB
    with Instance(nl, limit) as inst:
        s = session(inst)
        try:
            s.alloc_vidmem(4 * MIB)
            idx = [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE, abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE,
                   abi.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE]
            st, info = nvstub.fb_info(s.ctl, s.client, s.subdevice, idx)
            assert st == abi.NV_OK
            assert info[abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE] == limit >> 10
            assert info[abi.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE] == limit >> 10
            assert info[abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE] == (limit - 4 * MIB) >> 10
        finally:
            s.close()


def _alloc_free_worker(ctl_path: str, gpu_path: str, size: int, rounds: int, ready, hold: bool) -> None:
    from gsinst import InstSession

    s = InstSession(ctl_path, gpu_path)
    held = []
    for _ in range(rounds):
        st, h, _ = s.alloc_vidmem(size)
        if st == abi.NV_OK:
            held.append(h)
        if len(held) > 1 or (not hold and held):
            s.free(held.pop(0))
    ready.set()
    if hold:
        while True:  # keep everything allocated until killed
            signal.pause()


def test_32_processes_never_exceed_limit_and_kill9_frees_all(nl):
    import multiprocessing as mp

    size = 2 * MIB
    limit = 16 * size  # 32 processes want up to 2 each: many are refused
    ctx = mp.get_context("fork")
    with Instance(nl, limit) as inst:
        procs, events = [], []
        for _ in range(32):
            ev = ctx.Event()
            p = ctx.Process(target=_alloc_free_worker,
                            args=(inst.path("nvidiactl"), inst.path("nvidia0"), size, 20, ev, True))
            p.start()
            procs.append(p)
            events.append(ev)
        peak_seen = 0
        for ev in events:
            while not ev.wait(0.05):
                d = inst.get()
                peak_seen = max(peak_seen, d["mem_used"])
                assert d["mem_used"] <= limit
        d = inst.get()
        assert d["mem_used"] <= limit and d["mem_peak"] <= limit
        # 32 processes each end up holding one granule if they can: only 16 fit,
        # so some were refused
        assert 0 < d["mem_used"] <= limit
        assert d["nr_refused_quota"] > 0
        assert len(d["pids"]) == 32
        for p in procs:
            os.kill(p.pid, 9)
        for p in procs:
            p.join()
        d = inst.get()
        assert d["mem_used"] == 0
        assert d.get("pids", []) == []
        assert d["mem_peak"] <= limit


def test_destroy_with_open_files_is_ebusy_and_unload_refused(nl):
    with Instance(nl, 64 * MIB) as inst:
        fd = os.open(inst.path("nvidiactl"), os.O_RDWR)
        try:
            with pytest.raises(OSError) as ei:
                nl.instance_del(inst.name)
            assert ei.value.errno == errno.EBUSY
            r = subprocess.run(["rmmod", "gpuslice"], capture_output=True, text=True)
            assert r.returncode != 0 and "in use" in (r.stderr + r.stdout).lower()
            assert os.path.exists("/sys/module/gpuslice")
        finally:
            os.close(fd)
        nl.instance_del(inst.name)
        assert not os.path.exists(inst.path("nvidiactl"))


def test_open_after_destroy_is_enodev_and_name_reusable(nl):
    inst = Instance(nl, 64 * MIB)
    with inst:
        pass
    with pytest.raises(FileNotFoundError):
        os.open(inst.path("nvidiactl"), os.O_RDWR)
    nl.instance_new(inst.name, 1, 64 * MIB)
    nl.instance_del(inst.name)


def test_netlink_commands_and_errors(nl):
    name = "nlcheck"
    nl.instance_new(name, 1, 32 * MIB, weight=7, share=2500, timeslice_us=1500, uid=5, gid=6, mode=0o600)
    try:
        (d,) = nl.instances(name)
        assert (d["name"], d["gpu_mask"], d["mem_limit"], d["weight"], d["share"],
                d["timeslice_us"], d["uid"], d["gid"], d["mode"]) == (
                    name, 1, 32 * MIB, 7, 2500, 1500, 5, 6, 0o600)
        assert d["id"] > 0 and d["mem_used"] == 0
        assert name in [x["name"] for x in nl.instances()]
        nl.instance_set(name, mem_limit=48 * MIB, weight=9, share=5000, timeslice_us=0)
        (d,) = nl.instances(name)
        assert (d["mem_limit"], d["weight"], d["share"], d["timeslice_us"]) == (48 * MIB, 9, 5000, 0)
        assert nl.objects(name) == []
        for bad in ({"weight": 0}, {"weight": 10001}, {"share": 10001}, {"mode": 0o1777},
                    {"mem_limit": 0}, {"gpu_mask": 1}):
            with pytest.raises(OSError) as ei:
                nl.instance_set(name, **bad)
            assert ei.value.errno == errno.EINVAL, bad
        with pytest.raises(OSError) as ei:
            nl.instance_new(name, 1, MIB)
        assert ei.value.errno == errno.EEXIST
    finally:
        nl.instance_del(name)
    for args, err in ((("bad/name", 1, MIB), errno.EINVAL), (("", 1, MIB), errno.EINVAL),
                      (("x" * 40, 1, MIB), errno.EINVAL), (("ok", 0, MIB), errno.EINVAL),
                      (("ok", 1, 0), errno.EINVAL), (("ok", 1 << 20, MIB), errno.ENODEV)):
        with pytest.raises(OSError) as ei:
            nl.instance_new(*args)
        assert ei.value.errno == err, args
    for fn in (lambda: nl.instance_del("nosuch"), lambda: nl.instances("nosuch"),
               lambda: nl.instance_set("nosuch", weight=1)):
        with pytest.raises(OSError) as ei:
            fn()
        assert ei.value.errno == errno.ENOENT


def _raw_genl(family_id: int, cmd: int, attrs: list[tuple[int, bytes]], version: int | None = None) -> int:
    """Sends one generic netlink request built by hand (genetlink header version:
    gpuslice's unless given); returns the kernel's errno (0 = ok)."""
    import socket
    import struct

    from gpuslice import netlink as gnl

    version = gnl.VERSION if version is None else version

    body = b""
    for typ, payload in attrs:
        a = struct.pack("<HH", 4 + len(payload), typ) + payload
        body += a + b"\0" * (-len(a) % 4)
    msg = struct.pack("<BBH", cmd, version, 0) + body
    hdr = struct.pack("<IHHII", 16 + len(msg), family_id, 0x1 | 0x4, 1, 0)  # NLM_F_REQUEST|ACK
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16) as sk:  # NETLINK_GENERIC
        sk.send(hdr + msg)
        data = sk.recv(65536)
    _len, typ, _fl, _seq, _pid = struct.unpack_from("<IHHII", data)
    assert typ == 2  # NLMSG_ERROR
    return -struct.unpack_from("<i", data, 16)[0]


def test_netlink_version_handshake(nl):
    """The module registers GPUSLICE_GENL_VERSION as the family's version (gpuctl read
    it on connect) and refuses a request of any other version with EPROTO, doit and
    dump alike, before it looks at the request."""
    import struct

    import rawgenl

    from gpuslice import netlink as gnl

    assert nl.module_version == gnl.VERSION
    fam = nl.sock.prid
    new = [(1, b"ver0\0"), (3, struct.pack("<I", 1)), (4, struct.pack("<Q", MIB))]
    for other in (0, 1, gnl.VERSION + 1, 255):
        assert _raw_genl(fam, gnl.CMD_INSTANCE_NEW, new, version=other) == errno.EPROTO, other
        assert _raw_genl(fam, gnl.CMD_INSTANCE_GET, [(1, b"nosuch\0")], version=other) == errno.EPROTO, other
    assert not [x for x in nl.instances() if x["name"] == "ver0"]
    with rawgenl.Genl("gpuslice") as g:
        err, _ = g.request_raw(g.family, gnl.CMD_INSTANCE_GET, b"", dump=True, version=gnl.VERSION - 1)
        assert err == errno.EPROTO
        err, _ = g.request_raw(g.family, gnl.CMD_INSTANCE_GET, b"", dump=True)
        assert err == 0


def test_netlink_malformed_attribute_is_einval(nl):
    """Strict policy: wrong attribute length, unknown attribute, missing NUL -> EINVAL."""
    import struct

    from gpuslice import netlink as gnl

    fam = nl.sock.prid
    u32 = lambda v: struct.pack("<I", v)  # noqa: E731
    u64 = lambda v: struct.pack("<Q", v)  # noqa: E731
    ok = [(1, b"mal0\0"), (3, u32(1)), (4, u64(MIB))]  # NAME, GPU_MASK, MEM_LIMIT
    assert _raw_genl(fam, gnl.CMD_INSTANCE_NEW, ok) == 0  # the well-formed request works
    assert nl.instances("mal0")[0]["mem_limit"] == MIB
    assert _raw_genl(fam, gnl.CMD_INSTANCE_DEL, [(1, b"mal0\0")]) == 0
    cases = {
        "u32 sent as u64": [(1, b"mal1\0"), (3, u64(1)), (4, u64(MIB))],
        "u64 sent as u32": [(1, b"mal2\0"), (3, u32(1)), (4, u32(MIB))],
        "unknown attribute": [(1, b"mal3\0"), (3, u32(1)), (4, u64(MIB)), (31, u32(1))],
        "name without NUL": [(1, b"mal4"), (3, u32(1)), (4, u64(MIB))],
        "name too long": [(1, b"m" * 40 + b"\0"), (3, u32(1)), (4, u64(MIB))],
        "missing limit": [(1, b"mal5\0"), (3, u32(1))],
    }
    for what, attrs in cases.items():
        assert _raw_genl(fam, gnl.CMD_INSTANCE_NEW, attrs) == errno.EINVAL, what
    assert not [x for x in nl.instances() if x["name"].startswith("mal")]


# Runs as the unprivileged user: the standard library and rawgenl's source only, so it
# works wherever root cloned the checkout (a 0700 /root/x is unreadable to uid 65534).
UNPRIV = r"""
import errno, json, sys
name, n = sys.argv[1], json.loads(sys.argv[2])
g = Genl("gpuslice")
new = [(n["name"], string("unpriv")), (n["gpu_mask"], u32(1)), (n["mem_limit"], u64(1 << 20))]
got = [g.request(n["new"], new)[0], g.request(n["del"], [(n["name"], string(name))])[0],
       g.request(n["set"], [(n["name"], string(name)), (n["weight"], u32(3))])[0]]
assert got == [errno.EPERM] * 3, got
# reads too: replies and events name host pids and RM handles
reads = {"get": g.request(n["get"], [(n["name"], string(name))]),
         "dump": g.request(n["get"], [], dump=True),
         "objects": g.request(n["obj"], [], dump=True)}
assert {k: v for k, v in reads.items() if v != (errno.EPERM, [])} == {}, reads
assert g.join("events") == errno.EPERM
print("ok")
"""


def _unpriv_run(how: list[str], hide: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` (after rawgenl's source) with the system interpreter under
    ``setpriv how``, in a mount namespace where ``hide`` (the checkout) is an empty
    0700 directory: nothing the child needs may come from there."""
    import sys

    py = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    assert not py.startswith(hide.rstrip("/") + "/"), py
    code = rawgenl.source() + "\n" + script
    sh = 'mount -t tmpfs -o mode=0700 gs-hidden "$0" && exec setpriv "$@"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", sh, hide, *how,
                           "--", py, "-I", "-c", code, *args],
                          capture_output=True, text=True, cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


UNPRIV_HOW = (["--reuid=65534", "--regid=65534", "--clear-groups"],  # nobody: no capability at all
              ["--inh-caps=-all", "--bounding-set=-sys_admin"])       # root without CAP_SYS_ADMIN


def test_netlink_commands_and_events_need_cap_sys_admin(nl):
    """Without CAP_SYS_ADMIN (uid 65534, or root with it dropped from the bounding set)
    every command is refused with EPERM, reads and dumps too, and the events group
    cannot be joined."""
    import json

    from gpuslice import netlink as gnl

    a = gnl.ATTR_IDS
    nums = {"new": gnl.CMD_INSTANCE_NEW, "del": gnl.CMD_INSTANCE_DEL, "set": gnl.CMD_INSTANCE_SET,
            "get": gnl.CMD_INSTANCE_GET, "obj": gnl.CMD_OBJECT_GET, "name": a["GPUSLICE_A_NAME"],
            "gpu_mask": a["GPUSLICE_A_GPU_MASK"], "mem_limit": a["GPUSLICE_A_MEM_LIMIT"],
            "weight": a["GPUSLICE_A_WEIGHT"]}
    with Instance(nl, 16 * MIB) as inst:
        for how in UNPRIV_HOW:
            r = _unpriv_run(how, str(REPO), UNPRIV, inst.name, json.dumps(nums))
            assert r.returncode == 0 and "ok" in r.stdout, (how, r.stderr)
        assert inst.get()["weight"] != 3
        assert [d["name"] for d in nl.instances()].count("unpriv") == 0
        with rawgenl.Genl("gpuslice") as g:  # root may
            assert g.join("events") == 0
            assert g.request(gnl.CMD_INSTANCE_GET, [(a["GPUSLICE_A_NAME"], rawgenl.string(inst.name))])[0] == 0


def test_proc_attach_detach_and_object_events(nl):
    nl.subscribe()
    nl.poll_events(0)
    with Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        try:
            tsg, ch = s.tsg_channel()
            objs = nl.objects(inst.name)
            kinds = sorted((o["obj_kind"], o["handle"]) for o in objs)
            assert (1, tsg) in kinds and (2, ch) in kinds
            assert all(o["pid"] == os.getpid() and o["name"] == inst.name for o in objs)
        finally:
            s.close()
        evs = [e for e in nl.poll_events(1.0) if e.get("name") == inst.name]
        types = [e["event"] for e in evs]
        assert 5 in types and 6 in types  # PROC_ATTACH, PROC_DETACH
        assert 1 in types and 3 in types  # TSG_NEW, CHANNEL_NEW
        assert all(e["pid"] == os.getpid() for e in evs if e["event"] in (5, 6))


def _fb_loop(s, stop, errors) -> None:
    idx = [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE]
    while not stop.is_set():
        st, _ = nvstub.fb_info(s.ctl, s.client, s.subdevice, idx)
        st2, h, _ = s.alloc_vidmem(2 * MIB)
        if st != abi.NV_OK or st2 != abi.NV_OK or s.free(h) != abi.NV_OK:
            errors.append((st, st2))


def _majors_of(fds_dir: str) -> list[int]:
    out = []
    for fd in os.listdir(fds_dir):
        try:
            st = os.stat(f"{fds_dir}/{fd}")
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(os.major(st.st_rdev))
    return out


def _pidfd_getfd(pidfd: int, fd: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd (x86_64)


def test_no_real_fd_reachable_while_hammering(nl):
    """Other threads hammer fd-translated ioctls: the process's fd table never
    shows a real device; pidfd_getfd() on the leader while the leader hammers
    never yields a real device file."""
    import threading

    uvm_major = rdev_major(nvstub.UVM_PATH)
    real_majors = {abi.NV_MAJOR_DEVICE_NUMBER, uvm_major}
    with Instance(nl, 256 * MIB) as inst:
        sessions = [session(inst) for _ in range(3)]
        ours = rdev_major(inst.path("nvidiactl"))
        stop, errors = threading.Event(), []
        try:
            workers = [threading.Thread(target=_fb_loop, args=(s, stop, errors)) for s in sessions[1:]]
            for w in workers:
                w.start()
            seen_ours = 0
            for _ in range(300):  # the leader does no ioctl: /proc/self/fd is the shared table
                majors = _majors_of("/proc/self/fd")
                assert not real_majors & set(majors)
                seen_ours += majors.count(ours)
            stop.set()
            for w in workers:
                w.join()
            assert seen_ours > 0 and not errors

            # now the leader hammers and a sibling steals fds with pidfd_getfd()
            stop.clear()
            pidfd = os.pidfd_open(os.getpid())
            stolen = {"ours": 0, "real": 0}

            def thief() -> None:
                while not stop.is_set():
                    for fd in range(3, 64):
                        got = _pidfd_getfd(pidfd, fd)
                        if got < 0:
                            continue
                        st = os.fstat(got)
                        os.close(got)
                        if not stat.S_ISCHR(st.st_mode):
                            continue
                        if os.major(st.st_rdev) in real_majors:
                            stolen["real"] += 1
                        elif os.major(st.st_rdev) == ours:
                            stolen["ours"] += 1

            t = threading.Thread(target=thief)
            t.start()
            loop_stop = threading.Event()
            timer = threading.Timer(8.0, loop_stop.set)
            timer.start()
            _fb_loop(sessions[0], loop_stop, errors)
            stop.set()
            t.join()
            os.close(pidfd)
            assert stolen["real"] == 0
            assert stolen["ours"] > 0  # the thief did reach the leader's table
            assert not errors
        finally:
            stop.set()
            for s in sessions:
                s.close()


def test_refusals_are_answered_as_the_driver_answers_an_absent_feature(nl):
    """What the module refuses, a container hears as the driver's own answer for that case:
    a class or control the driver lacks gets the stand-in's answer for one it lacks (RM:
    INVALID_CLASS, alloc_free.c; NOT_SUPPORTED, rs_resource.c); fabric memory of other
    processes and IMEX channels get RM's answer to a client without an IMEX channel; a
    multicast object RM's answer on a GPU without multicast."""
    with Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        r = real_session()
        try:
            before = inst.get()["nr_refused_filter"]
            bogus_class, bogus_cmd = 0xBEEF, 0x2080FFF1
            got = [nvstub.rm_alloc(x.ctl, x.client, x.subdevice, x.handle(), bogus_class)[0] for x in (s, r)]
            assert got == [abi.NV_ERR_INVALID_CLASS] * 2
            p = ctypes.create_string_buffer(8)
            got = [nvstub.rm_control(x.ctl, x.client, x.subdevice, bogus_cmd, p) for x in (s, r)]
            assert got[0] == got[1] == abi.NV_ERR_NOT_SUPPORTED
            for klass in (abi.NV_MEMORY_FABRIC_IMPORT_V2, abi.NV_MEMORY_FABRIC_IMPORTED_REF, abi.NV_MEMORY_EXPORT):
                params = ctypes.create_string_buffer(256)
                assert nvstub.rm_alloc(s.ctl, s.client, s.subdevice, s.handle(), klass, params)[0] \
                    == abi.NV_ERR_INSUFFICIENT_PERMISSIONS, hex(klass)
            params = ctypes.create_string_buffer(256)
            assert nvstub.rm_alloc(s.ctl, s.client, s.subdevice, s.handle(), abi.NV_MEMORY_MULTICAST_FABRIC,
                                   params)[0] == abi.NV_ERR_NOT_SUPPORTED
            p = ctypes.create_string_buffer(8)
            assert nvstub.rm_control(s.ctl, s.client, s.client, abi.NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL,
                                     p) == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert inst.get()["nr_refused_filter"] == before + 7
        finally:
            s.close()
            r.close()


def test_filter_refused_through_instance_allowed_on_real_node(nl):
    with Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        r = real_session()
        try:
            tsg, ch = s.tsg_channel()
            rtsg, rch = r.tsg_channel()
            before = inst.get()["nr_refused_filter"]
            # gating belongs to the scheduler: refused even on the instance's own channel
            assert nvstub.disable_channels(s.ctl, s.client, s.subdevice, [(s.client, ch)], True) \
                == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            assert nvstub.disable_channels(r.ctl, r.client, r.subdevice, [(r.client, rch)], True) == abi.NV_OK
            assert nvstub.disable_channels(r.ctl, r.client, r.subdevice, [(r.client, rch)], False) == abi.NV_OK
            # another process's (the real session's) client: foreign
            assert nvstub.disable_channels(s.ctl, s.client, s.subdevice, [(r.client, rch)], True) \
                == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            p = ctypes.create_string_buffer(1028)
            assert nvstub.rm_control(s.ctl, r.client, r.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, p) \
                == abi.NV_ERR_INSUFFICIENT_PERMISSIONS
            # a control that is not on the allowlist: RM's answer for a control the object lacks
            assert nvstub.get_timeslice(s.ctl, s.client, tsg)[0] == abi.NV_ERR_NOT_SUPPORTED
            assert nvstub.get_timeslice(r.ctl, r.client, rtsg)[0] == abi.NV_OK
            assert inst.get()["nr_refused_filter"] >= before + 4
            # the stand-in's test escape: only with allow_test_escapes=1
            allowed = open("/sys/module/gpuslice/parameters/allow_test_escapes").read().strip() == "Y"
            st_real = nvstub.submit(r.ctl, r.client, rch, 1000)
            assert st_real == abi.NV_OK
            try:
                st = nvstub.submit(s.ctl, s.client, ch, 1000)
            except OSError as e:
                st = -e.errno
            assert (st == abi.NV_OK) == allowed
        finally:
            s.close()
            r.close()


def test_timeslice_applied_on_tsg_alloc_and_lazily_on_change(nl):
    with Instance(nl, 64 * MIB, timeslice_us=3000) as inst:
        s = session(inst)
        try:
            tsg, ch = s.tsg_channel()
            eng = [c for c in nvstub.read_engine() if c.channel == ch and c.client == s.client]
            assert eng and eng[0].timeslice_us == 3000
            nl.instance_set(inst.name, timeslice_us=5000)
            # applied at this process's next ioctl on the file that owns the TSG
            assert s.fb_free_kib() > 0
            eng = [c for c in nvstub.read_engine() if c.channel == ch and c.client == s.client]
            assert eng[0].timeslice_us == 5000
        finally:
            s.close()


def test_mmap_through_instance_reaches_real_file(nl):
    import mmap

    with Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        try:
            st, h, size = s.alloc_vidmem(2 * MIB)
            assert st == abi.NV_OK
            buf = bytearray(abi.NVOS33_WITH_FD.pack(s.client, s.device, h, 0, size, 0, 0, 0, s.dev_fd))
            assert nvstub.ioctl(s.ctl, abi.iowr(abi.NV_ESC_RM_MAP_MEMORY, abi.NVOS33_WITH_FD.size), buf) == 0
            assert abi.NVOS33_WITH_FD.unpack(buf)[6] == abi.NV_OK
            m = mmap.mmap(s.dev_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            m[0:4] = b"gpus"
            assert m[0:4] == b"gpus"
            maps = open("/proc/self/maps").read()
            m.close()
            # the vma names the real node, not ours
            assert "/dev/nvidia0" in maps
        finally:
            s.close()


def test_tracepoints_report_ioctls_and_refusals(nl):
    tr = "/sys/kernel/tracing"
    if not os.path.exists(f"{tr}/events"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", tr], check=False)
    ev = f"{tr}/events/gpuslice"
    assert os.path.isdir(f"{ev}/gpuslice_ioctl") and os.path.isdir(f"{ev}/gpuslice_refusal")
    fmt = open(f"{ev}/gpuslice_ioctl/format").read()
    for f in ("inst_id", "inst", "pid", "escape", "what", "status", "refusal", "drv_ns", "total_ns"):
        assert f"field:u32 {f};" in fmt or f"field:u64 {f};" in fmt or f"__data_loc char[] {f};" in fmt, f
    with Instance(nl, 4 * MIB) as inst:
        open(f"{tr}/trace", "w").write("")
        open(f"{ev}/enable", "w").write("1")
        try:
            s = session(inst)
            try:
                assert s.alloc_vidmem(8 * MIB)[0] == abi.NV_ERR_NO_MEMORY
            finally:
                s.close()
        finally:
            open(f"{ev}/enable", "w").write("0")
        text = open(f"{tr}/trace").read()
    lines = [ln for ln in text.splitlines() if inst.name in ln]
    assert any("gpuslice_ioctl:" in ln and "escape=0x2b" in ln for ln in lines)
    ref = [ln for ln in lines if "gpuslice_refusal:" in ln]
    assert ref and f"size={8 * MIB}" in ref[0] and "status=0x51" in ref[0]


REPLAY = r"""
import json, sys
from pathlib import Path
from gpuslice.trace import replay as rp
from gpuslice.trace import records as t
calls = t.read_trace(Path(sys.argv[1]))
rep = rp.replay(calls, rp.read_implemented(), "/dev/", sys.argv[2])
mism = [(r.index, r.name, str(r.expected), str(r.got)) for r in rep.by("mismatch")]
print("RESULT " + json.dumps({"summary": rep.summary(), "mismatch": mism}))
"""


@pytest.mark.parametrize("trace", ("cuda-driver-alloc", "torch-matmul", "nvidia-smi-q"))
def test_trace_replays_through_bind_mounted_instance_nodes(nl, trace):
    """The recorded init sequence, driven through the instance's nodes bind-mounted
    over /dev/nvidia* in a private mount namespace, gets the recorded outcomes."""
    import json
    import sys
    from pathlib import Path

    traces = Path(__file__).resolve().parents[1] / "traces"
    fb = int(open("/sys/module/nvstub/parameters/fb_mib").read()) * MIB
    with Instance(nl, fb) as inst:
        binds = " && ".join(f"mount --bind {inst.path(leaf)} /dev/{leaf}"
                            for leaf in ("nvidiactl", "nvidia0", "nvidia-uvm"))
        script = (f"mount --make-rprivate / && {binds} && "
                  f"test $(stat -c %t /dev/nvidiactl) != c3 && "
                  f"exec {sys.executable} -c '{REPLAY}' {traces}/{trace}.log.gz {trace}")
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        res = json.loads(line[len("RESULT "):])
        print(trace, res["summary"])
        assert res["summary"]["match"] > 0
        mism = [m for m in res["mismatch"] if m[1] not in nvstub.release_differences()]
        assert not mism, mism[:20]
        assert inst.get()["nr_ioctls"] > 0
        assert inst.get()["mem_used"] == 0  # the replayer's files are closed

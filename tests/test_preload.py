"""libgpuslice.so (preload/) on the host, over a mock driver (tests/core/mockrm.c).

LD_PRELOAD="libgpuslice.so libmockrm.so": the mock answers the 'F' ioctls on files
named nvidiactl / nvidia0 like RM and makes fstat() report them as major-195
character devices, so the glue's fd recognition, copies, refusals, close/dup handling,
threads and the controller socket are all exercised without a GPU.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "tests" / "core"
CC = os.environ.get("CC") or shutil.which("cc") or "gcc"
GiB = 1 << 30


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("preload")
    subprocess.run(["make", "-s", "-C", str(REPO / "preload"), f"CC={CC}"], check=True)
    inc = f"-I{REPO / 'kmod' / 'core'}"
    subprocess.run([CC, "-O1", "-g", "-Wall", "-Werror", "-shared", "-fPIC", inc,
                    str(CORE / "mockrm.c"), "-o", str(d / "libmockrm.so"), "-ldl"], check=True)
    subprocess.run([CC, "-O1", "-g", "-Wall", "-Werror", inc, str(CORE / "preload_client.c"),
                    "-o", str(d / "client"), "-lpthread"], check=True)
    dev = d / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    (dev / "nvidia0").touch()
    return d


PROOF_FILE = '{"proof_file":1}'  # what goes with the file of a channel's client, before its CHANNEL_NEW


class Listener:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.lines: list[str] = []
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        conn, _ = self.sock.accept()
        buf = b""
        while True:
            b = conn.recv(65536)
            if not b:
                break
            buf += b
        self.lines = buf.decode().splitlines()


def client_env(built, tmp_path, limit="1GiB", sock=None, extra_env=None):
    """The environment of a program run over the library and the mock driver."""
    env = dict(os.environ)
    env.update({
        "LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
        "GPUSLICE_MEM_LIMIT": limit,
        "GPUSLICE_INSTANCE": "box1",
        "GPUSLICE_STATS": str(tmp_path / "stats"),
        "GPUSLICE_SOCKET": str(sock or tmp_path / "nosock"),
        "MOCKRM_LOG": str(tmp_path / "rmlog"),
    })
    env.update(extra_env or {})
    return env


def run_client(built, tmp_path, limit="1GiB", sock=None, extra_env=None, check=True):
    """The client (tests/core/preload_client.c) over the library and the mock driver:
    (its "key value" output, the library's stats at exit, the calls the driver saw, stderr).
    check=False: the client may fail (its exit status is not asserted), and where the
    library wrote no stats or no call reached the driver they come back empty."""
    env = client_env(built, tmp_path, limit, sock, extra_env)
    p = subprocess.run([str(built / "client"), str(built / "dev")], env=env, capture_output=True,
                       text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        w = line.split()
        for k, v in zip(w[::2], w[1::2]):
            out[k] = int(v, 0)
    stats_file, rmlog_file = tmp_path / "stats", tmp_path / "rmlog"
    stats = json.loads(stats_file.read_text().splitlines()[-1]) if check or stats_file.exists() else {}
    rmlog = rmlog_file.read_text().split("\n") if check or rmlog_file.exists() else []
    return out, stats, rmlog, p.stderr


def test_preload_enforces_and_virtualizes(built, tmp_path):
    out, stats, rmlog, _ = run_client(built, tmp_path)
    kib = GiB >> 10
    assert out["client_status"] == 0
    assert out["fb_total_kib"] == kib and out["fb_free_kib"] == kib
    assert [out[f"alloc256_{i}"] for i in range(4)] == [0, 0, 0, 0]
    assert out["alloc_over"] == 0x51
    assert out["fb_free_kib_after"] == 0 and out["fb_total_kib_after"] == kib
    assert out["fb_free_kib_freed"] == kib
    assert out["disable_foreign"] == 0x1B and out["compute_mode"] == 0x1B
    # refused calls never reached the driver
    assert "2a 2080110b" not in rmlog and "2a 20800130" not in rmlog
    assert sum(1 for x in rmlog if x == "2b 40") == 4 + out["threads_ok"] + 2
    assert "d3 0" not in rmlog


def test_preload_malformed_calls_fail_cleanly(built, tmp_path):
    out, _, _, _ = run_client(built, tmp_path)
    assert (out["bad_arg_ret"], out["errno"]) != (0, 0)
    assert out["bad_params_ret"] == 0 and out["status"] == 0x3D  # NV_ERR_INVALID_POINTER


def test_preload_threads_never_pass_the_limit(built, tmp_path):
    out, stats, _, _ = run_client(built, tmp_path)
    assert out["threads_ok"] > 0 and out["threads_refused"] > 0
    assert out["max_live"] <= GiB
    assert out["fb_free_kib_threads"] == GiB >> 10
    assert stats["peak"] <= GiB
    assert stats["used"] == 0  # the last client's memory went with close()
    assert stats["refused_filter"] == 5
    # every call takes the instance lock (twice when it reaches RM); the threads met there
    assert stats["lock_acquired"] >= stats["ioctls"] and stats["lock_hold_max_ns"] > 0
    assert 0 <= stats["lock_contended"] <= stats["lock_acquired"]


def test_preload_close_and_dup(built, tmp_path):
    out, _, _, _ = run_client(built, tmp_path)
    assert out["fork_child_exit"] == 0  # the child's own instance refused the parent's client
    assert out["fb_free_kib_fork"] == (GiB - 512 * (1 << 20)) >> 10  # the child's close changed nothing
    assert out["fb_free_kib_vfork"] == (GiB - 512 * (1 << 20)) >> 10  # nor a vfork child's (shared memory)
    assert out["fb_free_kib_dup"] == (GiB - 512 * (1 << 20)) >> 10  # dup kept the file open
    assert out["fb_free_kib_reopen"] == GiB >> 10  # closing the last fd returned it
    assert "close_range_errno" not in out
    assert out["fb_free_kib_close_range"] == GiB >> 10  # so did close_range()


def test_preload_reports_to_controller(built, tmp_path):
    sock = tmp_path / "ctl.sock"
    lst = Listener(sock)
    out, _, _, _ = run_client(built, tmp_path, sock=sock)
    lst.t.join(timeout=10)
    ev = [json.loads(x) for x in lst.lines if x != PROOF_FILE]
    assert PROOF_FILE in lst.lines  # before its channel, with the file (not read here)
    assert ev, "no events"
    keys = {"event", "name", "pid", "client", "handle", "parent", "class", "engine", "gpu", "obj_kind"}
    assert all(keys <= e.keys() for e in ev)
    assert all(e["name"] == "box1" for e in ev)
    kinds = [e["event"] for e in ev]
    assert 5 in kinds  # PROC_ATTACH
    assert kinds.count(7) == out["threads_refused"] + 1  # ALLOC_REFUSED
    tsg = [e for e in ev if e["event"] == 1]
    ch = [e for e in ev if e["event"] == 3]
    assert len(tsg) == 1 and tsg[0]["class"] == 0xA06C and tsg[0]["engine"] == 1
    assert len(ch) == 1 and ch[0]["parent"] == tsg[0]["handle"] and ch[0]["engine"] == 1
    assert [e["event"] for e in ev if e["event"] in (2, 4)] == [4, 2]  # channel, then TSG
    refused = [e for e in ev if e["event"] == 8]
    assert {e["cmd"] for e in refused} >= {0x2080110B, 0x20800130}


def test_preload_without_socket_or_limit(built, tmp_path):
    out, stats, _, _ = run_client(built, tmp_path, limit="")
    assert out["alloc_over"] == 0
    assert stats["limit"] == (1 << 64) - 1


def test_size_suffixes(built, tmp_path):
    for text, val in (("4GiB", 4 * GiB), ("4g", 4 * GiB), ("512MiB", 512 << 20), ("123", 123),
                      ("2T", 2 << 40), ("1KB", 1024)):
        _, stats, _, _ = run_client(built, tmp_path, limit=text)
        assert stats["limit"] == val, text


class Server:
    """A controller's socket that records each connection's lines; stop() is a daemon exit."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.sock.settimeout(0.1)
        self.lock = threading.Lock()
        self.conns: list[list[dict]] = []
        self.open: list[socket.socket] = []
        self.stopping = False
        self.t = threading.Thread(target=self.accept, daemon=True)
        self.t.start()

    def accept(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with self.lock:
                self.conns.append([])
                self.open.append(c)
                lines = self.conns[-1]
            threading.Thread(target=self.read, args=(c, lines), daemon=True).start()

    def read(self, c, lines):
        buf = b""
        while True:
            try:
                b = c.recv(65536)
            except OSError:
                return
            if not b:
                return
            buf += b
            *done, buf = buf.split(b"\n")
            now = time.monotonic_ns()
            with self.lock:
                lines.extend({**json.loads(x), "_t": now} for x in done if x.strip() and x != PROOF_FILE.encode())

    def wait(self, cond, what, timeout=30.0):
        """Bounded wait for cond(conns) (the library retries once a second)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                snap = [list(x) for x in self.conns]
            if cond(snap):
                return snap
            time.sleep(0.05)
        raise AssertionError(f"no {what}: {snap}")

    def say(self, line: bytes) -> None:
        """Write a line to every connection (as the controller asks for sampling)."""
        with self.lock:
            for c in self.open:
                c.sendall(line)

    def stop(self):
        self.stopping = True
        self.t.join()
        with self.lock:
            for c in self.open:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
        self.sock.close()
        self.path.unlink()


def channels(lines):
    return [e for e in lines if e["event"] == 3]


def start_serving(built, tmp_path, sock, mode="serve", extra_env=None):
    env = dict(os.environ)
    env.update({
        "LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
        "GPUSLICE_INSTANCE": "box1",
        "GPUSLICE_SOCKET": str(sock),
    })
    env.update(extra_env or {})
    p = subprocess.Popen([str(built / "client"), str(built / "dev"), mode], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().split() == ["ready", "1"]
    return p


def start_userd(built, sock):
    """The client's userd mode (one channel whose USERD it moves through its phases,
    printed as it goes) under the library, reporting to ``sock``."""
    env = {**os.environ, "LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
           "GPUSLICE_INSTANCE": "box1", "GPUSLICE_SOCKET": str(sock)}
    return subprocess.Popen([str(built / "client"), str(built / "dev"), "userd", "0"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def check_snapshot(lines, n_chan=2):
    """A connection starts with the live objects: the TSG, then its channels, on GPU 0."""
    head = lines[: 1 + n_chan]
    assert [e["event"] for e in head] == [1] + [3] * n_chan
    tsg = head[0]
    assert tsg["class"] == 0xA06C and tsg["engine"] == 1
    assert all(e["parent"] == tsg["handle"] and e["class"] == 0xC86F for e in head[1:])
    assert all(e["gpu"] == 0 and e["name"] == "box1" for e in head)  # not 255 (nvidiactl)


def test_preload_late_controller_gets_live_channels_first(built, tmp_path):
    sock = tmp_path / "late.sock"
    p = start_serving(built, tmp_path, sock)  # no controller yet: the channels are made unseen
    try:
        srv = Server(sock)
        snap = srv.wait(lambda c: c and len(channels(c[0])) >= 2, "snapshot")
        check_snapshot(snap[0])
        p.stdin.write("chan\n")
        p.stdin.flush()
        new = int(p.stdout.readline().split()[1], 0)
        snap = srv.wait(lambda c: any(e["handle"] == new for e in channels(c[0])), "new channel")
        assert [e["handle"] for e in channels(snap[0])][-1] == new  # after the snapshot
        assert len(snap) == 1
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()
    snap = srv.wait(lambda c: sum(e["event"] == 4 for e in c[0]) == 3, "channel deletions")
    srv.stop()


def test_preload_sends_each_channel_with_its_clients_file(built, tmp_path):
    """Every CHANNEL_NEW, of the snapshot a late controller gets and of a channel made
    later, goes with the file its client was made through (SCM_RIGHTS), which the
    controller asks RM about (rm.owns_channel; here a double that knows the mock's file
    by its inode). A controller that finds no proof takes no channel."""
    import sys

    sys.path.insert(0, str(REPO / "pyctl"))
    from gpuslice.sched.sources import PreloadSource

    ctl_ino = os.stat(built / "dev" / "nvidiactl").st_ino
    asked: list[tuple[int, int, int]] = []

    def verify(fd: int, client: int, handle: int) -> bool:
        asked.append((os.fstat(fd).st_ino, client, handle))
        return asked[-1][0] == ctl_ino

    def wait(src: PreloadSource, n: int) -> set:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            src.refresh()
            got = src.channels().get("box1", set())
            if len(got) >= n:
                return got
            time.sleep(0.02)
        raise AssertionError(f"{n} channels not registered: {src.channels()} unproven {src.unproven}")

    sock = tmp_path / "proof.sock"
    p = start_serving(built, tmp_path, sock)  # channels made before any controller
    try:
        src = PreloadSource(str(sock), verify=verify)
        try:
            snap = wait(src, 2)
            p.stdin.write("chan\n")
            p.stdin.flush()
            new = int(p.stdout.readline().split()[1], 0)
            got = wait(src, 3)
            assert new in {c.handle for c in got}
            assert {(c.client, c.handle) for c in got} == {(cl, h) for _i, cl, h in asked}
            assert all(ino == ctl_ino for ino, _c, _h in asked) and src.unproven == 0
            assert snap < got
        finally:
            src.close()
        refused = PreloadSource(str(sock), verify=lambda fd, c, h: False)
        try:
            deadline = time.monotonic() + 30
            while refused.unproven < 3 and time.monotonic() < deadline:  # the library reconnects
                refused.refresh()
                time.sleep(0.02)
            assert refused.unproven >= 3 and refused.channels() == {}
        finally:
            refused.close()
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()


@pytest.mark.parametrize("own", ["5", "0"])
def test_preload_samples_as_often_as_the_controller_asks(built, tmp_path, own):
    """The controller's {"sample_us":N} (sent to an online instance of a GPU with offline
    ones) makes the library's sampler look at its channels at least every N us; 0 gives
    back the process's own setting; a malformed line, a value out of range or a line too
    long changes nothing and keeps the connection; the operator's GPUSLICE_SAMPLE_MS=0
    (never read USERD) stays; a new connection starts from the process's own setting."""
    sock = tmp_path / "ctl.sock"
    srv = Server(sock)
    p = start_serving(built, tmp_path, sock, extra_env={"GPUSLICE_DEBUG": "1", "GPUSLICE_SAMPLE_MS": own})
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    reader.start()

    def said(what: str, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(what in ln for ln in list(err)):
                return True
            time.sleep(0.05)
        return False

    def looks() -> list[str]:
        return [ln.split("every ")[1].split()[0] for ln in list(err) if "the sampler looks every" in ln]

    try:
        srv.wait(lambda c: c and len(channels(c[0])) >= 2, "channels")
        for bad in (b'{"sample_us":10}', b'{"sample_us":"300"}', b'{"sample_us":2000000}',
                    b'{"sample_us":-1}', b'{"sample_us":}', b' {"sample_us":300}',
                    b'x' * 100 + b'{"sample_us":300}', b'{"sample_us":99999999999999999999999}',
                    b'{"sample_us":300,"repeat_us":20000}', b'{"sample_us":300,"repeat_us":10}',
                    b'{"sample_us":300,"repeat_us":}', b'{"sample_us":300,"repeat_us":500}x',
                    b'{"sample_us":300,"repeat":500}', b'{"sample_us":300'):
            srv.open[0].sendall(bad + b"\n")
        srv.open[0].sendall(b'{"sample_us":200}\n')
        assert said("(controller: 200, repeat 0)"), err
        if own == "0":  # never: the controller cannot turn the sampler on
            time.sleep(0.3)
            assert looks() == [], err
        else:
            assert said("the sampler looks every 200 us"), err
            srv.open[0].sendall(b'{"sample_us":0}\n')
            assert said("the sampler looks every 5000 us"), err
            assert looks() == ["200", "5000"], err
            srv.open[0].sendall(b'{"sample_us":100}\n')
            assert said("the sampler looks every 100 us"), err
        assert [ln for ln in err if "(controller:" in ln and "controller: 200, repeat 0)" not in ln
                and "controller: 0, repeat 0)" not in ln and "controller: 100, repeat 0)" not in ln] == [], err
        assert len(srv.conns) == 1  # the bad lines did not cost the connection
        if own != "0":
            srv.stop()  # the controller goes: its request with it
            deadline = time.monotonic() + 10
            while looks()[-1] != "5000" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert looks()[-2:] == ["100", "5000"], err
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, err
    if own == "0":
        srv.stop()


def test_preload_takes_controller_lines_split_or_at_the_length_limit(built, tmp_path):
    """A controller line may arrive in pieces (read at the library's next look); a line of
    96 bytes is taken, one of 97 is dropped whole, and the line after it is read again."""
    sock = tmp_path / "split.sock"
    srv = Server(sock)
    p = start_serving(built, tmp_path, sock, extra_env={"GPUSLICE_DEBUG": "1"})
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()

    def said(what: str) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(what in ln for ln in list(err)):
                return True
            time.sleep(0.05)
        return False

    def line(sample_digits: str, repeat: str = "1000") -> bytes:
        return b'{"sample_us":' + sample_digits.encode() + b',"repeat_us":' + repeat.encode() + b"}"

    try:
        srv.wait(lambda c: c and len(channels(c[0])) >= 2, "channels")
        srv.say(b'{"sample_us":15')
        time.sleep(0.3)  # a few looks of the library in between
        srv.say(b'0,"repeat_us":600}\n')
        assert said("(controller: 150, repeat 600)"), err
        exact = line("0" * 62 + "120")
        assert len(exact) == 96
        long = line("0" * 63 + "130")
        assert len(long) == 97
        srv.say(long + b"\n")  # well formed, one byte too long: dropped whole
        srv.say(exact + b"\n")
        assert said("(controller: 120, repeat 1000)"), err
        assert not [ln for ln in err if "(controller:" in ln and "150, repeat 600" not in ln
                    and "120, repeat 1000" not in ln], err
        assert len(srv.conns) == 1
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, err
    srv.stop()


def test_preload_restarted_controller_gets_live_channels_again(built, tmp_path):
    sock = tmp_path / "restart.sock"
    first = Server(sock)
    p = start_serving(built, tmp_path, sock)
    try:
        snap = first.wait(lambda c: c and len(channels(c[0])) >= 2, "channels")
        assert [e["event"] for e in snap[0] if e["event"] in (1, 3)] == [1, 3, 3]
        assert all(e["gpu"] == 0 for e in snap[0] if e["event"] in (1, 3))
        first.stop()  # the daemon goes away and comes back: nothing new happens in the workload
        second = Server(sock)
        snap = second.wait(lambda c: c and len(channels(c[0])) >= 2, "snapshot after restart")
        check_snapshot(snap[0])
        assert len(channels(snap[0])) == 2  # once each
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()
    second.stop()


def test_preload_restarted_controller_hears_a_quiet_process(built, tmp_path):
    """A process that makes no ioctls once its channels exist (CUDA in steady state)
    is announced to a controller (re)started after it: by the library's own thread,
    not by the relay the GPU tests used to need (issue 12, item 2)."""
    sock = tmp_path / "quiet.sock"
    first = Server(sock)
    p = start_serving(built, tmp_path, sock, mode="serve-quiet")
    try:
        first.wait(lambda c: c and len(channels(c[0])) >= 2, "channels")
        first.stop()
        for _ in range(2):  # and again, with no connection in between
            second = Server(sock)
            snap = second.wait(lambda c: c and len(channels(c[0])) >= 2, "snapshot without an ioctl")
            check_snapshot(snap[0])
            assert len(snap) == 1 and len(channels(snap[0])) == 2  # one connection, each channel once
            second.stop()
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()


WORK = 9  # GPUSLICE_EV_CHANNEL_WORK


@pytest.mark.parametrize("others", [0, 300], ids=["alone", "after-300-mappings"])
def test_preload_reports_work_submitted_in_userd(built, tmp_path, others):
    """The library finds a channel's USERD the way CUDA maps it (RM_MAP_MEMORY with an fd,
    then mmap of that fd) and reports CHANNEL_WORK while GPPut moves or GPGet != GPPut,
    rate-limited, nothing while the channel is quiet, and never reads it once unmapped
    (issue 12: an activity signal that does not depend on how the process waits). With
    300 other RM mappings made first (more than the library keeps: it forgets those no
    channel uses) the channel's USERD is still found."""
    sock = tmp_path / "work.sock"
    srv = Server(sock)
    env = dict(os.environ)
    env.update({
        "LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
        "GPUSLICE_INSTANCE": "box1",
        "GPUSLICE_SOCKET": str(sock),
    })
    p = subprocess.run([str(built / "client"), str(built / "dev"), "userd", str(others)], env=env, text=True,
                       capture_output=True, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stderr)  # no fault from reading an unmapped USERD
    out = [ln.split() for ln in p.stdout.splitlines()]
    client, chan = (int(x, 0) for x in out[0][1:3])
    t = {w[1]: int(w[2]) for w in out if w[0] == "phase"}
    snap = srv.wait(lambda c: c and any(e["event"] == 3 for e in c[0]), "the channel")
    srv.stop()
    work = [e for e in snap[0] if e["event"] == WORK]
    assert work and all((e["client"], e["handle"], e["name"]) == (client, chan, "box1") for e in work), work
    at = [e["_t"] for e in work]

    def between(a, b):
        return [x for x in at if t[a] <= x < t[b]]

    assert not [x for x in at if x < t["busy"]], "work reported before anything was submitted"
    busy = between("busy", "idle")
    assert 2 <= len(busy) <= 150, busy  # repeated while it submits, at most every 10 ms
    # quiet again: nothing in the second half of the idle phase (the first half may still
    # carry the last sample of the busy phase on a loaded machine)
    assert not [x for x in at if (t["idle"] + t["pending"]) // 2 <= x < t["pending"]]
    # an entry not fetched for 600 ms counts all along, not only when GPPut moved
    assert len(between("pending", "fetched")) >= 2
    assert not [x for x in at if x >= (t["unmapped"] + t["done"]) // 2]


def test_preload_reconnects_at_once_to_a_controller_restarted_while_it_reports(built, tmp_path):
    """A controller stopped while the library reports a busy channel (CHANNEL_WORK every
    few ms): the library's next send fails (EPIPE), and it connects again at once, not a
    second later as after a send a live controller did not take (its buffer full). So the
    restarted controller has the channel back, and hears its work, while the channel is
    still busy: the busy phase lasts 1 s and the controller is restarted 0.1 s into it
    (before, the library waited GS_RETRY_NS, 1 s, and came back only once it was idle)."""
    sock = tmp_path / "busy.sock"
    first = Server(sock)
    p = start_userd(built, sock)
    try:
        first.wait(lambda c: c and any(e["event"] == 3 for e in c[0]), "the channel")
        t: dict[str, int] = {}
        while "busy" not in t:
            w = p.stdout.readline().split()
            assert w, p.stderr.read()
            if w[0] == "phase":
                t[w[1]] = int(w[2])
        time.sleep(0.1)
        first.wait(lambda c: any(e["event"] == WORK for e in c[0]), "work before the restart")
        first.stop()
        second = Server(sock)
        out, errs = p.communicate(timeout=60)
        assert p.returncode == 0, errs
        t.update({w[1]: int(w[2]) for w in (ln.split() for ln in out.splitlines()) if w and w[0] == "phase"})
        with second.lock:
            lines = list(second.conns[0]) if second.conns else []
        second.stop()
    finally:
        if p.poll() is None:
            p.kill()
    assert [e["event"] for e in lines[:1]] == [1], lines[:3]  # the snapshot first
    assert any(e["event"] == 3 for e in lines)
    busy = [e for e in lines if e["event"] == WORK and e["_t"] < t["idle"]]
    assert busy, f"no work heard by the restarted controller before the channel went idle: {lines[:5]}"


def test_preload_reports_a_busy_channel_as_often_as_the_controller_asks(built, tmp_path):
    """{"sample_us":N,"repeat_us":M}: a channel that keeps work pending is reported every M
    us, not only every GS_WORK_REPEAT_NS (10 ms): the daemon asks for less than its online
    hold, so a busy online channel never looks quiet between two reports. The client keeps
    one entry pending for 600 ms: at 10 ms that is at most 61 reports, so more than 61 is
    the controller's period at work (how many per second: tests/bench_preload.py)."""
    pending, _ = pending_work_reports(built, tmp_path, b'{"sample_us":100,"repeat_us":1000}')
    assert len(pending) > 61, len(pending)  # more than GS_WORK_REPEAT_NS could give


def pending_work_reports(built, tmp_path, asked: bytes | None) -> tuple[list[dict], float]:
    """The CHANNEL_WORK reports of the client's channel while it has an entry pending, and
    for how many seconds, with the controller's request asked (None: the default)."""
    sock = tmp_path / "rep.sock"
    srv = Server(sock)
    p = start_userd(built, sock)
    srv.wait(lambda c: c and any(e["event"] == 3 for e in c[0]), "the channel")
    if asked:
        srv.say(asked + b"\n")
    out, errs = p.communicate(timeout=60)
    assert p.returncode == 0, errs
    t = {w[1]: int(w[2]) for w in (ln.split() for ln in out.splitlines()) if w[0] == "phase"}
    time.sleep(0.3)  # the last lines reach the server's reader
    with srv.lock:
        lines = list(srv.conns[0])
    srv.stop()
    pending = [e for e in lines if e["event"] == WORK and t["pending"] <= e["_t"] < t["fetched"]]
    return pending, (t["fetched"] - t["pending"]) / 1e9


def share(built, tmp_path, exporter: str, importer: str) -> tuple[dict, dict, list[str]]:
    """One process exports 64 MiB into a nvidiactl file and hands the fd to another over a
    unix socket, as NCCL's cuMem transport does (preload/siblings.c); each runs with
    GPUSLICE_INSTANCE as given. Returns the importer's lines, its stats, what RM saw."""
    fifo = built / "dev" / "fifo"
    fifo.mkdir(exist_ok=True)
    if not (fifo / "nvidiactl").exists():
        os.mkfifo(fifo / "nvidiactl")  # pollable, as the driver's file is; a regular file is not
    sock = tmp_path / f"share-{exporter}-{importer}.sock"

    def env(name: str, who: str) -> dict:
        e = dict(os.environ)
        e.update({"LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
                  "GPUSLICE_MEM_LIMIT": "1GiB", "GPUSLICE_INSTANCE": name,
                  "GPUSLICE_EXPORTS": str(tmp_path / "exports"), "GPUSLICE_SOCKET": str(tmp_path / "nosock"),
                  "GPUSLICE_STATS": str(tmp_path / f"stats-{who}"), "MOCKRM_LOG": str(tmp_path / f"rmlog-{who}")})
        return e

    exp = subprocess.Popen([str(built / "client"), str(built / "dev"), "export", str(sock)],
                           env=env(exporter, f"exp-{importer}"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] != "listening 1":
            line = exp.stdout.readline()
            assert line, exp.stderr.read()
            lines.append(line.strip())
        assert "export_status 0" in lines
        imp = subprocess.run([str(built / "client"), str(built / "dev"), "import", str(sock)],
                             env=env(importer, f"imp-{importer}"), capture_output=True, text=True, timeout=60)
        assert imp.returncode == 0, imp.stderr
    finally:
        try:
            rest, err = exp.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            exp.kill()
            rest, err = exp.communicate()
        assert exp.returncode == 0, err
    # sent, closed and its handle freed: the export holds the memory, and its charge;
    # once the importer is gone the file is released, and the charge with it
    assert f"exp_free_kib_sent {(GiB - 64 * (1 << 20)) >> 10}" in rest.splitlines(), rest
    assert f"exp_free_kib_released {GiB >> 10}" in rest.splitlines(), rest
    out = dict((w[0], int(w[1])) for w in (x.split() for x in imp.stdout.splitlines()) if len(w) == 2)
    stats = json.loads((tmp_path / f"stats-imp-{importer}").read_text().splitlines()[-1])
    return out, stats, (tmp_path / f"rmlog-imp-{importer}").read_text().split("\n")


def test_an_export_reaches_the_instances_other_processes_only(built, tmp_path):
    """Within an instance the import (NCCL's cuMem path) and the duplicate from the
    exporter's client (legacy CUDA IPC) reach RM and cost the importer nothing (the
    exporter's core holds the charge); from another instance both are refused before RM.
    Before siblings.c the first were refused as well (one core per process)."""
    out, stats, rmlog = share(built, tmp_path, "box1", "box1")
    assert (out["import_status"], out["import_type"]) == (0, 1)
    assert out["import_again"] == 0x19  # NV_ERR_INSERT_DUPLICATE_NAME: the import registered it
    assert out["dup_status"] == 0 and "34 0" in rmlog  # legacy IPC: from the exporter's client
    assert rmlog.count("2a 3d0c") == 1 and stats["refused_filter"] == 1 and stats["used"] == 0
    out, stats, rmlog = share(built, tmp_path, "box1", "box2")
    assert out["import_status"] == 0x1B  # NV_ERR_INSUFFICIENT_PERMISSIONS
    assert out["dup_status"] == 0x1B
    assert "2a 3d0c" not in rmlog and "34 0" not in rmlog and stats["refused_filter"] == 3
    # nothing left behind by processes that exited
    assert not any((tmp_path / "exports").glob("*/*"))


def test_an_export_keeps_its_charge_when_the_application_closes_the_librarys_epoll(built, tmp_path):
    """The library learns that an exported file was released from its epoll set's
    fdinfo. An application that dup2()s over the library's fds (or closes them) must not
    make a live export look released: its charge stays (the limit keeps counting it)."""
    fifo = built / "dev" / "fifo"
    fifo.mkdir(exist_ok=True)
    if not (fifo / "nvidiactl").exists():
        os.mkfifo(fifo / "nvidiactl")
    env = dict(os.environ)
    env.update({"LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
                "GPUSLICE_MEM_LIMIT": "1GiB", "GPUSLICE_INSTANCE": "box1",
                "GPUSLICE_EXPORTS": str(tmp_path / "exports"), "GPUSLICE_SOCKET": str(tmp_path / "nosock"),
                "MOCKRM_LOG": str(tmp_path / "rmlog")})
    r = subprocess.run([str(built / "client"), str(built / "dev"), "exportlost"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "export_status 0" in lines
    held = f"{(GiB - 64 * (1 << 20)) >> 10}"
    assert f"lost_free_kib_sent {held}" in lines, lines
    assert f"lost_free_kib_after {held}" in lines, lines


@pytest.mark.parametrize("value,bad", [("200", False), ("64k", True), ("10", True), ("2000000", True), ("", False)])
def test_preload_sample_us_takes_plain_microseconds(built, tmp_path, value, bad):
    """GPUSLICE_SAMPLE_US is a number of microseconds, 50 to 1000000: anything else is
    reported on stderr and ignored (the process runs on with the default)."""
    env = {"GPUSLICE_SAMPLE_US": value} if value else {}
    p = start_serving(built, tmp_path, tmp_path / "nosock", extra_env=env)
    p.stdin.close()
    assert p.wait(timeout=60) == 0
    assert ("bad GPUSLICE_SAMPLE_US" in p.stderr.read()) == bad



def test_preload_gives_its_tsgs_the_timeslice_the_controller_asks(built, tmp_path):
    """{"sample_us":0,"repeat_us":0,"timeslice_us":T}: the process's live TSG gets
    SET_TIMESLICE T from the process itself (RM takes it only from the owner), once;
    the same T again changes nothing; one below 100 us is not a line the library takes;
    a TSG made later gets T when it is made."""
    sock = tmp_path / "ts.sock"
    log = tmp_path / "rmlog"
    srv = Server(sock)
    p = start_serving(built, tmp_path, sock, extra_env={"MOCKRM_LOG": str(log)})

    def sets() -> list[str]:
        return [x for x in log.read_text().split("\n") if x.startswith("7473 ")]

    try:
        srv.wait(lambda c: c and len(channels(c[0])) >= 2, "channels")
        assert sets() == []
        srv.say(b'{"sample_us":0,"repeat_us":0,"timeslice_us":8000}\n')
        deadline = time.monotonic() + 30
        while not sets() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sets() == ["7473 1f40"]
        srv.say(b'{"sample_us":0,"repeat_us":0,"timeslice_us":8000}\n')
        srv.say(b'{"sample_us":0,"repeat_us":0,"timeslice_us":99}\n')
        time.sleep(0.5)  # several looks of the library
        assert sets() == ["7473 1f40"]
        lines = log.read_text().split("\n")
        assert lines.index("2b a06c") < lines.index("7473 1f40")
        p.stdin.write("tsg\n")  # a TSG made after the line gets it when it is made
        p.stdin.flush()
        assert p.stdout.readline().split()[0] == "tsg_done"
        assert sets() == ["7473 1f40", "7473 1f40"]
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0, p.stderr.read()
    srv.stop()


@pytest.mark.parametrize("us,level", [(0, ""), (1500, ""), (0, "high"), (250, "low"), (0, "bogus")])
def test_preload_applies_the_operators_timeslice(built, tmp_path, us, level):
    """GPUSLICE_TIMESLICE_US and GPUSLICE_INTERLEAVE reach RM once for each TSG the
    process makes, from that process, after the TSG exists; the application's own request
    (CUDA's 2048 us) never does, and a level the library does not know is not passed."""
    log = tmp_path / "rmlog"
    env = ({"MOCKRM_LOG": str(log)} | ({"GPUSLICE_TIMESLICE_US": str(us)} if us else {})
           | ({"GPUSLICE_INTERLEAVE": level} if level else {}))
    p = start_serving(built, tmp_path, tmp_path / "nosock", extra_env=env)
    p.stdin.close()
    assert p.wait(timeout=60) == 0, p.stderr.read()
    lines = log.read_text().split("\n")
    assert [x for x in lines if x.startswith("7473 ")] == ([f"7473 {us:x}"] if us else [])
    code = {"low": 0, "medium": 1, "high": 2}.get(level)
    assert [x for x in lines if x.startswith("696c ")] == ([f"696c {code:x}"] if code is not None else [])
    for ctl in (f"7473 {us:x}" if us else None, f"696c {code:x}" if code is not None else None):
        if ctl:
            assert lines.index("2b a06c") < lines.index(ctl)


def test_preload_decodes_with_the_drivers_table(built, tmp_path):
    """The library asks the driver its version at the first call and decodes with that
    release's table: beside a 535 driver the limit holds as beside 580."""
    out, stats, _, err = run_client(built, tmp_path, extra_env={"MOCKRM_VERSION": "535.288.01",
                                                                 "GPUSLICE_DEBUG": "1"})
    assert "NVIDIA driver 535.288.01, ABI table of branch 535" in err
    assert [out[f"alloc256_{i}"] for i in range(4)] == [0, 0, 0, 0]
    assert out["alloc_over"] == 0x51
    assert stats["peak"] <= GiB


@pytest.mark.parametrize("version", ["590.44.01", "580.1.1"])
def test_preload_refuses_a_driver_without_a_table(built, tmp_path, version):
    """One line naming the supported releases; no call of the process reaches the driver."""
    from gpuslice import nvrm_versions

    _, _, rmlog, err = run_client(built, tmp_path, extra_env={"MOCKRM_VERSION": version}, check=False)
    lines = [x for x in err.splitlines() if "has no ABI table" in x]
    assert lines == [f"gpuslice: NVIDIA driver {version} has no ABI table "
                     f"(supported: {nvrm_versions.supported_summary()}): its calls are refused"]
    assert "cannot ask the NVIDIA driver its version" not in err  # an answer, not a failure
    assert not [x for x in rmlog if x.startswith(("2b", "2a", "29"))], rmlog[:5]


def test_preload_asks_the_version_on_a_nvidiactl(built, tmp_path):
    """RM answers the version query on nvidiactl only (nv.c NV_CTL_DEVICE_ONLY), and a
    process's first call may be on a GPU node (REGISTER_FD): the library then asks
    through a nvidiactl of its own, beside that node."""
    src = tmp_path / "gpufirst.c"
    src.write_text(r'''
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include "nvrm_abi.h"
int main(int argc, char **argv)
{
    char p[512];
    struct nv_ioctl_register_fd r = { .ctl_fd = -1 };
    int g;

    snprintf(p, sizeof(p), "%s/nvidia0", argv[1]);
    g = open(p, O_RDWR);
    printf("%d\n", ioctl(g, _IOWR(NV_IOCTL_MAGIC, NV_ESC_REGISTER_FD, struct nv_ioctl_register_fd), &r));
    return 0;
}
''')
    subprocess.run([CC, "-Wall", "-Werror", f"-I{REPO / 'kmod' / 'core'}", str(src), "-o", str(tmp_path / "gpufirst")],
                   check=True)
    env = dict(os.environ)
    env.update({"LD_PRELOAD": f"{REPO / 'preload' / 'libgpuslice.so'} {built / 'libmockrm.so'}",
                "GPUSLICE_MEM_LIMIT": "1GiB", "GPUSLICE_INSTANCE": "box1", "GPUSLICE_DEBUG": "1",
                "GPUSLICE_SOCKET": str(tmp_path / "nosock"), "MOCKRM_LOG": str(tmp_path / "rmlog"),
                "MOCKRM_VERSION": "550.163.01"})
    p = subprocess.run([str(tmp_path / "gpufirst"), str(built / "dev")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert "NVIDIA driver 550.163.01, ABI table of branch 550" in p.stderr, p.stderr
    assert "has no ABI table" not in p.stderr
    assert p.stdout.strip() == "0"


def cprog(tmp_path, name, src):
    """A test program (C source src) built against nvrm_abi.h; returns its path."""
    (tmp_path / f"{name}.c").write_text(src)
    exe = tmp_path / name
    subprocess.run([CC, "-Wall", "-Werror", f"-I{REPO / 'kmod' / 'core'}", str(tmp_path / f"{name}.c"),
                    "-o", str(exe), "-ldl", "-lpthread"], check=True)
    return exe


def test_preload_leaves_other_ioctls_alone(built, tmp_path):
    """An ioctl of neither NVIDIA's type nor a number of nvidia-uvm's the library decodes
    goes straight to libc: its fd is never looked at (no fstat). An 'F' ioctl on the same
    fd is looked at, once (the count sees the library's fstat)."""
    exe = cprog(tmp_path, "otherioctl", r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "nvrm_abi.h"
int main(void)
{
    unsigned int *fstats = dlsym(RTLD_DEFAULT, "mockrm_fstats");
    struct nvos00_params f = { 0 };
    unsigned int a, b, c;
    int p[2], n = -1, r1, r2;

    if (!fstats || pipe(p) || write(p[1], "xy", 2) != 2)
        return 2;
    a = *fstats;
    r1 = ioctl(p[0], FIONREAD, &n);
    r2 = ioctl(p[1], FIOCLEX);
    b = *fstats;
    ioctl(p[0], _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_FREE, struct nvos00_params), &f);
    c = *fstats;
    printf("fionread %d n %d fioclex %d fstat_other %u fstat_nv %u\n", r1, n, r2, b - a, c - b);
    return 0;
}
''')
    p = subprocess.run([str(exe)], env=client_env(built, tmp_path), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    w = p.stdout.split()
    out = {k: int(v) for k, v in zip(w[::2], w[1::2])}
    assert out == {"fionread": 0, "n": 2, "fioclex": 0, "fstat_other": 0, "fstat_nv": 1}


def test_preload_asks_the_version_again_after_a_failed_query(built, tmp_path):
    """A version query that gets no answer (no nvidiactl of its own could be opened: EMFILE)
    refuses that call only: the next call asks again and, answered, goes to the driver."""
    exe = cprog(tmp_path, "emfile", r'''
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>
#include "nvrm_abi.h"
int main(int argc, char **argv)
{
    char p[512];
    struct nv_ioctl_register_fd r = { .ctl_fd = -1 };
    struct rlimit rl = { 32, 32 };
    int g, fds[64], n = 0, a, ea, b;

    snprintf(p, sizeof(p), "%s/nvidia0", argv[1]);
    g = open(p, O_RDWR);
    if (g < 0 || setrlimit(RLIMIT_NOFILE, &rl))
        return 2;
    while (n < 64 && (fds[n] = open("/dev/null", O_RDONLY)) >= 0)
        n++;
    errno = 0;
    a = ioctl(g, _IOWR(NV_IOCTL_MAGIC, NV_ESC_REGISTER_FD, struct nv_ioctl_register_fd), &r);
    ea = errno;
    while (n > 0)
        close(fds[--n]);
    b = ioctl(g, _IOWR(NV_IOCTL_MAGIC, NV_ESC_REGISTER_FD, struct nv_ioctl_register_fd), &r);
    printf("first %d errno %d second %d\n", a, ea, b);
    return 0;
}
''')
    env = client_env(built, tmp_path, extra_env={"GPUSLICE_DEBUG": "1", "MOCKRM_VERSION": "550.163.01"})
    p = subprocess.run([str(exe), str(built / "dev")], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["first", "-1", "errno", str(errno.EPERM), "second", "0"], p.stderr
    failed = [x for x in p.stderr.splitlines() if "cannot ask the NVIDIA driver its version" in x]
    assert len(failed) == 1 and "Too many open files" in failed[0], p.stderr
    assert "NVIDIA driver 550.163.01, ABI table of branch 550" in p.stderr
    assert "has no ABI table" not in p.stderr
    rmlog = (tmp_path / "rmlog").read_text().split("\n")
    assert rmlog.count("c9 0") == 1  # NV_ESC_REGISTER_FD: the second call only


def test_preload_child_forked_during_the_version_query_is_not_blocked(built, tmp_path):
    """A fork while another thread asks the driver its version (holding the library's ABI
    lock) leaves the child a lock of its own: its first call asks again and goes on."""
    exe = cprog(tmp_path, "forkquery", r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "nvrm_abi.h"
static int g;
static int first_ret = -2;
static int call(void)
{
    struct nv_ioctl_register_fd r = { .ctl_fd = -1 };

    return ioctl(g, _IOWR(NV_IOCTL_MAGIC, NV_ESC_REGISTER_FD, struct nv_ioctl_register_fd), &r);
}
static void *first(void *x)
{
    first_ret = call();
    return NULL;
}
int main(int argc, char **argv)
{
    char p[512];
    int *in_query = dlsym(RTLD_DEFAULT, "mockrm_in_version_query");
    pthread_t t;
    pid_t pid;
    int status, i;

    snprintf(p, sizeof(p), "%s/nvidia0", argv[1]);
    g = open(p, O_RDWR);
    if (g < 0 || !in_query || pthread_create(&t, NULL, first, NULL))
        return 2;
    for (i = 0; i < 10000 && !*in_query; i++)
        usleep(1000);
    if (!*in_query)
        return 3;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        alarm(20);      /* blocked on the parent's lock: killed */
        _exit(call() == 0 ? 0 : 1);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 4;
    pthread_join(t, NULL);
    printf("thread %d child_exited %d child_status %d child_signal %d\n", first_ret,
           WIFEXITED(status), WIFEXITED(status) ? WEXITSTATUS(status) : -1,
           WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return 0;
}
''')
    env = client_env(built, tmp_path, extra_env={"MOCKRM_VERSION_DELAY_MS": "500"})
    p = subprocess.run([str(exe), str(built / "dev")], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["thread", "0", "child_exited", "1", "child_status", "0",
                                "child_signal", "0"], p.stderr


BAD_CAPS = ("warp", "compute,warp", ",")


@pytest.mark.parametrize("caps,refused", [("", False), ("compute,utility", False), ("all", False),
                                          ("utility,graphics", True)] + [(c, True) for c in BAD_CAPS])
def test_preload_takes_the_capability_set(built, tmp_path, caps, refused):
    """GPUSLICE_CAPS is the instance's capability set, as the module's CAPS: without compute
    the video memory class (a compute row) is refused as RM refuses a class it does not have
    (NV_ERR_INVALID_CLASS) and never reaches the driver. A bad set fails closed, as the module
    refuses one: it is named, and no capability applies (not all, nor the names it did know),
    so no RM call reaches the driver (the escapes are compute's and utility's: EINVAL)."""
    env = {"GPUSLICE_CAPS": caps, "GPUSLICE_DEBUG": "1"} if caps else {}
    out, _, rmlog, err = run_client(built, tmp_path, extra_env=env, check=not refused)
    if caps in BAD_CAPS:
        assert not [line for line in rmlog if line.strip()], rmlog[:3]
        assert "refused caps (box1) escape 0x2b RM_ALLOC" in err
    elif refused:
        assert out["alloc256_0"] == 0x22
        assert "2b 40" not in rmlog
    else:
        assert [out[f"alloc256_{i}"] for i in range(4)] == [0, 0, 0, 0]
    assert ("bad GPUSLICE_CAPS" in err) == (caps in BAD_CAPS)

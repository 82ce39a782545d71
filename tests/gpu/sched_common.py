"""Machinery shared by the scheduler benchmark (bench_sched.py) and tests (test_sched.py):
matmul workloads under libgpuslice.so that the harness can run/pause, `gpuctl daemon`
start/stop/kill, and rates.

The workloads' GPUSLICE_SOCKET is the daemon's own socket. A daemon (re)started under
running workloads learns their channels from the library itself: its reporter thread
reconnects within 0.2 s and resends the live objects (preload/report.c), so no relay
replays them any more (issue 12, item 2); Daemon.start records how long that took.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SO = REPO / "preload" / "libgpuslice.so"
WL = HERE / "wl_sched.py"
sys.path.insert(0, str(REPO / "pyctl"))

FAKE = os.environ.get("GPUSLICE_FAKE_WORKLOAD") == "1"  # local dry run of the harness only


def have_gpu() -> bool:
    import ctypes.util

    return os.path.exists("/dev/nvidiactl") and ctypes.util.find_library("cuda") is not None


def pythonpath() -> str:
    parts = [str(REPO / "pyctl")]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return ":".join(parts)


# ---- workloads -----------------------------------------------------------------------

class Workload:
    def __init__(self, name: str, size: int, workdir: str, sock_path: str, log,
                 extra_env: dict[str, str] | None = None, cmd: list[str] | None = None) -> None:
        self.name, self.size = name, size
        self.ctl = os.path.join(workdir, f"{name}.ctl")
        self.out = os.path.join(workdir, f"{name}.ts")
        with open(self.ctl, "w") as f:
            f.write("pause ")
        if os.path.exists(self.out):
            os.unlink(self.out)
        env = dict(os.environ, PYTHONUNBUFFERED="1", LD_PRELOAD=str(SO), GPUSLICE_INSTANCE=name,
                   GPUSLICE_SOCKET=sock_path)
        env.pop("GPUSLICE_DEBUG", None)
        env.update(extra_env or {})
        # another program with wl_sched.py's protocol (tests/gpu/wl_poll.c): cmd + [ctl, out]
        self.cmd = (cmd[:1] + [cmd[1], self.ctl, self.out] + cmd[2:]) if cmd else \
            [sys.executable, str(WL), str(size), self.ctl, self.out]
        extra = "".join(f"{k}={v} " for k, v in (extra_env or {}).items())
        log(f"$ LD_PRELOAD={SO} GPUSLICE_INSTANCE={name} GPUSLICE_SOCKET={sock_path} {extra}{' '.join(self.cmd)}")
        self.errf = open(os.path.join(workdir, f"{name}.err"), "w")
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.PIPE, stderr=self.errf, text=True)
        self._ts = array("d")
        self._read_off = 0
        self.cfd = os.open(self.ctl, os.O_WRONLY)

    def wait_ready(self, timeout: float = 120) -> None:
        assert self.proc.stdout is not None
        t0 = time.monotonic()
        line = self.proc.stdout.readline()
        if not line.startswith("{") or time.monotonic() - t0 > timeout:
            raise RuntimeError(f"workload {self.name} did not start: {line!r} rc={self.proc.poll()}")

    def set(self, mode: str) -> None:
        os.pwrite(self.cfd, mode.ljust(6)[:6].encode(), 0)

    def stop(self) -> None:
        self.set("exit")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cfd)
        self.errf.close()

    def times(self) -> array:
        """Completion times so far (monotonic seconds), sorted."""
        try:
            with open(self.out, "rb") as f:
                f.seek(self._read_off)
                data = f.read()
        except FileNotFoundError:
            return self._ts
        n = len(data) // 8 * 8
        if n:
            a = array("d")
            a.frombytes(data[:n])
            self._ts.extend(a)
            self._read_off += n
        return self._ts


def channels_of(src, names, timeout: float = 10.0) -> dict:
    """``src.channels()`` once each of ``names`` has reported a channel (or ``timeout`` passed)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        src.refresh()
        ch = src.channels()
        if all(ch.get(n) for n in names):
            return ch
        time.sleep(0.05)
    return src.channels()


def count(ts, t0: float, t1: float) -> int:
    return bisect.bisect_left(ts, t1) - bisect.bisect_left(ts, t0)


def rate(ts, t0: float, t1: float) -> float:
    return count(ts, t0, t1) / (t1 - t0) if t1 > t0 else 0.0


def first_after(ts, t: float) -> float | None:
    i = bisect.bisect_right(ts, t)
    return ts[i] if i < len(ts) else None


# ---- the daemon ----------------------------------------------------------------------

FAKE_DAEMON = r"""
import json, os, signal, socket, sys, time
sock, status = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
if os.path.exists(sock): os.unlink(sock)
s.bind(sock); s.listen(8); s.setblocking(False)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
t0 = time.monotonic(); conns = []
while not stop:
    try: conns.append(s.accept()[0])
    except BlockingIOError: pass
    time.sleep(0.01)
    json.dump({"pid": os.getpid(), "switches": int((time.monotonic() - t0) * 60), "rm_calls": 1,
               "switch_latency_ns": {"p50": 600000, "p99": 900000, "max": 1000000},
               "rm_call_ns": {"disable": {"n": 1, "p50": 500000, "p99": 800000, "max": 900000},
                              "enable": {"n": 1, "p50": 500000, "p99": 800000, "max": 900000}},
               "gpus": {}}, open(status, "w"))
"""


class Daemon:
    """`gpuctl daemon --source preload` with its paths under ``workdir``."""

    def __init__(self, workdir: str, log, probe: str = "cpu") -> None:
        self.dir = workdir
        self.state = os.path.join(workdir, "state.json")
        self.status = os.path.join(workdir, "status.json")
        self.sock = os.path.join(workdir, "daemon.sock")
        self.rejoin_s: list[float] = []  # per start: spawn to every member's channels seen
        self.log = log
        self.probe = probe
        self.proc: subprocess.Popen | None = None
        self.logf = open(os.path.join(workdir, "daemon.log"), "a")
        self.runs = 0
        self.order = "enable-first"  # --switch-order (the daemon's default)
        self.extra: list[str] = os.environ.get("DAEMON_ARGS", "").split()  # more daemon options
        self.mode_args: list[str] = []  # and those of one benchmark mode

    def write_state(self, policy: str, period_ms: int, members: dict[str, dict]) -> None:
        from gpuslice import state as S

        st = S.State()
        st.gpus[0] = S.GpuPolicy(policy, period_ms * 1_000_000)
        for name, kw in members.items():
            st.instances[name] = S.Instance(name, [0], 1 << 30, **kw)
        S.save(st, self.state)

    def cmd(self) -> list[str]:
        if FAKE:
            return [sys.executable, "-c", FAKE_DAEMON, self.sock, self.status]
        return [sys.executable, "-c", "import sys; from gpuslice.cli import main; main()",
                "--state", self.state, "--kernel", "no", "daemon", "--source", "preload",
                "--preload-sock", self.sock, "--preload-dir", os.path.join(os.path.dirname(self.sock), "instances"),
                "--probe", self.probe, "--status-file", self.status,
                "--switch-order", self.order, "-v"] + self.extra + self.mode_args

    def start(self, members: list[str] = (), timeout: float = 15, need_switch: bool = True) -> float:
        """Start, wait until the daemon's status shows channels for every one of
        ``members`` (the workloads reconnect by themselves) and a slot switch. Returns
        the monotonic time it was ready; the delay from spawn goes to ``rejoin_s``."""
        for p in (self.sock, self.status):
            if os.path.exists(p):
                os.unlink(p)
        env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONUNBUFFERED="1")
        env.pop("LD_PRELOAD", None)  # the daemon is not in any instance: its RM client is unfiltered
        self.runs += 1
        c = self.cmd()
        if self.runs <= 1 or getattr(self, "_logged_order", None) != c:
            self._logged_order = c
            self.log("$ PYTHONPATH=" + env["PYTHONPATH"] + " " + " ".join(c[:2]) + " '" + c[2] + "' " + " ".join(c[3:]))
        self.logf.write(f"==== run {self.runs} {time.strftime('%H:%M:%S')}\n")
        self.logf.flush()
        self.proc = subprocess.Popen(c, env=env, stdout=self.logf, stderr=self.logf)
        t0 = time.monotonic()
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"daemon did not start (rc {self.proc.poll()}); see daemon.log")
            time.sleep(0.005)
        while members and not FAKE:
            st = self.read_status() or {}
            insts = st.get("gpus", {}).get("0", {}).get("instances", {})
            if all(insts.get(m, {}).get("channels", 0) > 0 for m in members) and \
                    (st.get("switches", 0) > 0 or not need_switch):
                break
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"daemon did not see channels of {members}: {insts} (rc {self.proc.poll()})")
            time.sleep(0.02)
        ready = time.monotonic()
        if members:
            self.rejoin_s.append(ready - t0)
        return ready

    def read_status(self) -> dict | None:
        try:
            with open(self.status) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def signal(self, sig: int) -> tuple[float, float]:
        """Send ``sig``; returns (monotonic time sent, seconds until the process was gone)."""
        assert self.proc is not None
        t = time.monotonic()
        os.kill(self.proc.pid, sig)
        self.proc.wait()
        return t, time.monotonic() - t

    def stop(self) -> dict | None:
        st = self.read_status()
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        self.proc = None
        return st


def normalised(ws: dict[str, Workload], alone: dict[str, float], t0: float, t1: float) -> dict[str, float]:
    return {n: rate(w.times(), t0, t1) / alone[n] for n, w in ws.items()}


def target_shares(policy: str, members: dict[str, dict], active: set[str]) -> dict[str, float]:
    from gpuslice.policy import Claim, compute_shares

    claims = [Claim(n, kw.get("weight", 1), kw.get("share"), kw.get("ceiling")) for n, kw in sorted(members.items())]
    return compute_shares(policy, claims, active)


def jitter(lo: float, hi: float) -> float:
    return random.uniform(lo, hi)

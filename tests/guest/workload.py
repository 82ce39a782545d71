"""Simulated GPU workloads on the nvstub stand-in, and measuring them (guest only).

Run as a program it is one workload process: it opens the stand-in's nodes, allocates
client/device/subdevice/TSG/channel, enables the TSG (GPFIFO_SCHEDULE) and keeps its
channel's pending work topped up to --depth ms while busy. SIGUSR1 = busy, SIGUSR2 =
idle (stop submitting; the backlog drains). It prints "ready CLIENT CHANNEL" when set up.
The instance it belongs to comes from GPUSLICE_INSTANCE (what nvstub_sched.NvstubSource reads).

Imported, it offers Workload (spawn/control one) and helpers to read the engine,
start the daemon, and measure shares over whole scheduling periods.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUEST = REPO / "tests" / "guest"
sys.path.insert(0, str(GUEST))
sys.path.insert(0, str(REPO / "pyctl"))

ENGINE = "/proc/nvstub/engine"
MS = 1_000_000
FOREVER_NS = 3600 * 1000 * MS


def engine() -> dict[tuple[int, int], dict[str, int]]:
    """(client, channel) -> row of /proc/nvstub/engine."""
    from nvstub_sched import parse_engine

    with open(ENGINE) as f:
        return {(r["client"], r["channel"]): r for r in parse_engine(f.read())}


def _main() -> None:
    import nvstub  # tests/guest/nvstub.py

    depth_ns = int(float(sys.argv[sys.argv.index("--depth") + 1]) * MS) if "--depth" in sys.argv else 30 * MS
    busy = {"on": "--idle" not in sys.argv}
    signal.signal(signal.SIGUSR1, lambda *_: busy.__setitem__("on", True))
    signal.signal(signal.SIGUSR2, lambda *_: busy.__setitem__("on", False))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if "--dev" in sys.argv:  # an instance's nodes (/dev/gpuslice/NAME), through the interposer
        import gsinst

        d = sys.argv[sys.argv.index("--dev") + 1]
        s = gsinst.InstSession(f"{d}/nvidiactl", f"{d}/nvidia0")
    else:
        s = nvstub.Session(0)
    userd = None
    if "--userd" in sys.argv:  # submissions visible in the channel's USERD, as a GPU's are
        _tsg, ch, userd = s.userd_channel()
    else:
        _tsg, ch = s.tsg_channel()
    print(f"ready {s.client} {ch}", flush=True)
    key = (s.client, ch)

    def submit(work_ns: int) -> None:
        if userd is not None:
            userd.put()  # the GPFIFO entry, then the doorbell
        nvstub.submit(s.ctl, s.client, ch, work_ns)

    if "--forever" in sys.argv:
        # one huge submit: never runs dry and costs no CPU (polling starved the guest).
        # Idle = a process that never submits (Workload.start(busy=False)); SIGUSR1 makes it busy.
        while True:
            if busy["on"] and engine()[key]["pending_ns"] < FOREVER_NS // 2:
                submit(FOREVER_NS)
            signal.pause()
    if "--steady" in sys.argv:
        # half the depth submitted every half depth while busy, without reading the engine
        # (cheap: the guest's CPUs stay with the engine and the daemon); what is gated piles up
        while True:
            if busy["on"]:
                submit(depth_ns // 2)
            time.sleep(depth_ns / 2e9)
    while True:
        if busy["on"]:
            pending = engine()[key]["pending_ns"]
            if pending < depth_ns:
                submit(depth_ns - pending)
        time.sleep(depth_ns / 2e9)  # pending drops by at most the wall time elapsed


@dataclass
class Workload:
    name: str
    proc: subprocess.Popen[str]
    client: int
    channel: int

    @classmethod
    def start(cls, name: str, busy: bool = True, depth_ms: float = 30, dev: str | None = None,
              forever: bool = True, userd: bool = False, steady: bool = False) -> "Workload":
        """forever: one huge submit (idle = stop it and start a non-busy one); else keep
        --depth ms topped up by polling (SIGUSR2 idles it; costs CPU); steady: half the depth
        submitted every half depth, no polling. userd: the channel's USERD is mapped and each
        submission moves its GPPut (what the module samples)."""
        env = {**os.environ, "GPUSLICE_INSTANCE": name}
        args = [sys.executable, __file__, "--depth", str(depth_ms)] + ([] if busy else ["--idle"])
        args += ["--forever"] if forever else []
        args += ["--userd"] if userd else []
        args += ["--steady"] if steady else []
        args += ["--dev", dev] if dev else []
        p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None
        line = p.stdout.readline().split()
        if not line or line[0] != "ready":
            p.kill()
            raise RuntimeError(f"workload {name} did not start")
        return cls(name, p, int(line[1]), int(line[2]))

    @property
    def key(self) -> tuple[int, int]:
        return (self.client, self.channel)

    def busy(self, on: bool = True) -> None:
        self.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)

    def executed(self) -> int:
        return engine()[self.key]["executed_ns"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Daemon:
    """`gpuctl daemon` on the stand-in, as its own process: its source and probe are
    nvstub_sched's (tests/guest on its PYTHONPATH) unless ``source`` / ``probe`` say otherwise."""

    def __init__(self, state_path: str, status_path: str, *extra: str, source: str = "nvstub_sched:NvstubSource",
                 probe: str = "nvstub_sched:NvstubProbe", kernel: str = "no") -> None:
        self.status_path = status_path
        try:
            os.unlink(status_path)  # a killed predecessor's report must not count as ours
        except FileNotFoundError:
            pass
        cmd = [sys.executable, "-c", "from gpuslice.cli import main; main()", "--state", state_path, "--kernel", kernel,
               "daemon", "--source", source, "--probe", probe, "--status-file", status_path, *extra]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "pyctl"), str(GUEST)])}
        self.log_path = status_path + ".log"
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, env=env, stderr=self._log, text=True)

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def status(self, timeout: float = 60.0) -> dict:
        """The daemon's latest report (waits for the first)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                with open(self.status_path) as f:
                    d = json.load(f)
                if d.get("pid") == self.proc.pid:
                    return d
                raise ValueError("not ours")
            except (OSError, ValueError):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log_tail()}")
                time.sleep(0.05)
        raise TimeoutError(f"daemon wrote no status; its log: {self.log_tail()}")

    def wait_periods(self, gpu: int = 0, min_periods: int = 3, timeout: float = 90.0) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                d = self.status()
                if d["gpus"][str(gpu)]["periods"] >= min_periods:
                    return d
            except (KeyError, RuntimeError):
                if self.proc.poll() is not None:
                    raise
            time.sleep(0.1)
        raise TimeoutError("daemon did not run periods")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def next_boundary(d: dict, gpu: int = 0, margin_ns: int = 2 * MS) -> tuple[int, int]:
    """(next period start after now + margin, period) from a daemon report."""
    g = d["gpus"][str(gpu)]
    start, period = g["period_start_ns"], g["period_ns"]
    now = time.monotonic_ns() + margin_ns
    k = max(0, -(-(now - start) // period))
    return start + k * period, period


def sleep_until(t_ns: int) -> None:
    dt = t_ns - time.monotonic_ns()
    if dt > 0:
        time.sleep(dt / 1e9)


def measure(daemon: Daemon, loads: list[Workload], periods: int = 10, gpu: int = 0) -> tuple[dict[str, float], float]:
    """Shares of wall time each workload executed over ``periods`` whole periods
    (aligned to the daemon's period starts), and the engine's total utilisation."""
    d = daemon.status()
    b, period = next_boundary(d, gpu)
    sleep_until(b)
    t0 = time.monotonic_ns()
    e0 = engine()
    sleep_until(b + periods * period)
    t1 = time.monotonic_ns()
    e1 = engine()
    wall = t1 - t0
    shares = {w.name: (e1.get(w.key, {}).get("executed_ns", 0) - e0.get(w.key, {}).get("executed_ns", 0)) / wall
              for w in loads}
    return shares, sum(shares.values())


def native_utilisation(loads: list[Workload], seconds: float = 0.5) -> float:
    """Fraction of wall time the stand-in's engine executes for ``loads`` with nobody
    gating them. Under QEMU/TCG it is well below 1 (the engine thread's own overhead), so
    shares are compared as fractions of it: of the time the engine can deliver."""
    e0 = engine()
    t0 = time.monotonic_ns()
    time.sleep(seconds)
    e1 = engine()
    wall = time.monotonic_ns() - t0
    return sum(e1.get(w.key, {}).get("executed_ns", 0) - e0.get(w.key, {}).get("executed_ns", 0)
               for w in loads) / wall


if __name__ == "__main__":
    _main()

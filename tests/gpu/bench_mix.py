"""Shares of a mix of frameworks under every policy, RM calls per switch, and the
daemon's restart, with `gpuctl daemon` on its default paths (as the systemd unit runs
it). Run on the GPU machine by `scripts/gpu-run.sh mix`; results in
docs/h100-scheduler.md.

  python3 tests/gpu/bench_mix.py [--out DIR] [--mix a=cupy,b=torch-block,c=jax]
      [--policies weight:3,2,1/burst:1,1,1/fixed:20,30,40] [--periods 50,20]
      [--seconds 6] [--restarts 4] [--native/--no-native]

Tenants (tests/gpu/wl_mix.py) run under LD_PRELOAD=preload/libgpuslice.so with their own
GPUSLICE_INSTANCE and the library's default socket; the state file is the daemon's
default (/var/lib/gpuslice/state.json). A tenant's share is its step rate in a window
divided by its rate alone (the mean of the alone blocks before and after the phase).

Phases: alone (each tenant, 2 s), native (all, no daemon), each policy and period
(the daemon started, 1 s settle, then the window; its status gives switches and RM
calls, its log the warnings of that run), alone again; then the restarts: with every
tenant running under the first policy, the daemon is stopped (SIGTERM and SIGKILL in
turn) and started again, and the time from the new daemon's spawn until its status
shows every tenant's channels and a slot switch is recorded, with how long the stopped
one took to exit. A daemon that has not seen every tenant within 10 s gets SIGUSR2
(faulthandler: every thread's stack to its log).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sched_common as sc  # noqa: E402

SOCK = "/run/gpuslice/preload.sock"
STATUS = "/run/gpuslice/status.json"
STATE = "/var/lib/gpuslice/state.json"
SETTLE = 1.0
DAEMON_PY = ("import faulthandler, signal; faulthandler.register(signal.SIGUSR2, all_threads=True); "
             "from gpuslice.cli import main; main()")


class DefaultDaemon(sc.Daemon):
    """`gpuctl daemon -v` and nothing else: every path and option its default."""

    def __init__(self, workdir: str, log) -> None:  # type: ignore[no-untyped-def]
        super().__init__(workdir, log)
        self.sock, self.status, self.state = SOCK, STATUS, STATE
        os.makedirs(os.path.dirname(STATE), exist_ok=True)

    def cmd(self) -> list[str]:
        return [sys.executable, "-c", DAEMON_PY, "daemon", "-v"] + self.extra + self.mode_args


def parse_policies(spec: str) -> list[tuple[str, list[float], str]]:
    """weight:3,2,1/fixed:20,30,40@disable-first: a policy, its values by tenant, and
    optionally the daemon's --switch-order."""
    out = []
    for part in filter(None, spec.split("/")):
        part, _, order = part.partition("@")
        kind, _, vals = part.partition(":")
        out.append((kind, [float(v) for v in vals.split(",")] if vals else [], order))
    return out


def members_of(kind: str, vals: list[float], names: list[str]) -> dict[str, dict]:
    if kind == "fixed":
        return {n: {"share": v / 100} for n, v in zip(names, vals)}
    if kind in ("weight", "burst"):
        return {n: {"weight": int(v)} for n, v in zip(names, vals)}
    return {n: {} for n in names}


class Mix:
    def __init__(self, out: Path, mix: list[tuple[str, str]], timeslice_us: int = 0) -> None:
        self.out = out
        self.env = {"GPUSLICE_TIMESLICE_US": str(timeslice_us)} if timeslice_us else {}
        self.work = out / "mix-work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.logf = open(out / "mix.txt", "a")
        self.daemon = DefaultDaemon(str(self.work), self.log)
        self.names = [n for n, _k in mix]
        self.kinds = dict(mix)
        self.ws: dict[str, sc.Workload] = {}
        self.blocks: list[dict] = []
        self.res: dict = {"mix": mix, "alone": [], "phases": [], "restarts": []}
        self.clocks: list[tuple[float, float, float]] = []  # (monotonic, SM MHz, W)
        threading.Thread(target=self._sample_clocks, daemon=True).start()

    def _sample_clocks(self) -> None:
        """The SM clock and power every 200 ms: a GPU that clocks down under sustained
        load makes every tenant slower than it was alone, whoever schedules it."""
        try:
            p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                  "-lms", "200"], stdout=subprocess.PIPE, text=True)
        except OSError:
            return
        assert p.stdout is not None
        for line in p.stdout:
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.clocks.append((time.monotonic(), mhz, watts))

    def clock_in(self, t0: float, t1: float) -> tuple[float, float] | None:
        xs = [(m, w) for t, m, w in self.clocks if t0 <= t <= t1]
        if not xs:
            return None
        return sum(m for m, _w in xs) / len(xs), sum(w for _m, w in xs) / len(xs)

    def log(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def start(self) -> None:
        os.makedirs(os.path.dirname(SOCK), exist_ok=True)
        for n in self.names:
            self.ws[n] = sc.Workload(n, 0, str(self.work), SOCK, self.log, extra_env=self.env,
                                     cmd=[sys.executable, str(Path(__file__).with_name("wl_mix.py")), self.kinds[n]])
        for w in self.ws.values():
            w.wait_ready(timeout=300)
        self.log("tenants ready: " + ", ".join(f"{n}={self.kinds[n]} pid {w.proc.pid}" for n, w in self.ws.items()))

    def run_set(self, running: set[str]) -> None:
        for n, w in self.ws.items():
            w.set("run" if n in running else "pause")

    def pause_all(self) -> None:
        self.run_set(set())
        time.sleep(0.4)

    def alone(self, seconds: float = 2.0) -> None:
        b: dict = {"t": time.monotonic(), "rates": {}, "clocks": {}}
        for n, w in self.ws.items():
            self.run_set({n})
            t0 = time.monotonic()
            time.sleep(seconds)
            t1 = time.monotonic()
            self.pause_all()
            b["rates"][n] = sc.rate(w.times(), t0 + min(SETTLE, seconds / 3), t1)
            b["clocks"][n] = self.clock_in(t0 + min(SETTLE, seconds / 3), t1)
        self.blocks.append(b)
        self.res["alone"].append(b)
        self.log("alone (steps/s): " + "  ".join(f"{n} {r:.1f} ({1e3 / r if r else 0:.2f} ms, SM "
                                                f"{(b['clocks'][n] or (0, 0))[0]:.0f} MHz)"
                                                for n, r in b["rates"].items()))

    def window(self, t0: float, t1: float) -> dict[str, float]:
        return {n: sc.rate(w.times(), t0, t1) for n, w in self.ws.items()}

    def native(self, seconds: float) -> None:
        self.run_set(set(self.names))
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
        self.pause_all()
        self.res["phases"].append({"phase": "native", "t0": t0 + SETTLE, "t1": t1, "rates": self.window(t0 + SETTLE, t1),
                                   "clocks": self.clock_in(t0 + SETTLE, t1)})

    def policy(self, kind: str, vals: list[float], order: str, period: int, seconds: float) -> None:
        members = members_of(kind, vals, self.names)
        self.daemon.mode_args = ["--switch-order", order] if order else []
        self.daemon.write_state(kind, period, members)
        off = os.path.getsize(self.daemon.logf.name) if os.path.exists(self.daemon.logf.name) else 0
        self.run_set(set(self.names))
        try:
            self.daemon.start(members=self.names, timeout=30)
        except RuntimeError as e:
            self.log(f"{kind} {period} ms: {e}")
            self.daemon.stop()
            self.pause_all()
            return
        time.sleep(SETTLE)
        s0 = self.daemon.read_status() or {}
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
        s1 = self.daemon.read_status() or {}
        rates = self.window(t0, t1)
        self.daemon.stop()
        self.pause_all()
        with open(self.daemon.logf.name, errors="replace") as f:
            f.seek(off)
            text = f.read()
        bad = [ln for ln in text.splitlines() if "warning" in ln.lower() or "error" in ln.lower()
               or "failed" in ln.lower() or "INVALID" in ln]
        from gpuslice.policy import Claim, compute_shares

        claims = [Claim(n, kw.get("weight", 1), kw.get("share")) for n, kw in members.items()]
        target = compute_shares(kind, claims, set(self.names))
        sw = (s1.get("switches", 0) or 0) - (s0.get("switches", 0) or 0)
        calls = (s1.get("rm_calls", 0) or 0) - (s0.get("rm_calls", 0) or 0)
        self.daemon.mode_args = []
        self.res["phases"].append({"phase": f"{kind}-{period}" + (f"-{order}" if order else ""), "policy": kind, "vals": vals, "period_ms": period,
                                   "t0": t0, "t1": t1, "rates": rates, "target": target, "switches": sw,
                                   "rm_calls": calls, "log_problems": bad[:50], "log_problem_count": len(bad),
                                   "switch_latency_ns": s1.get("switch_latency_ns"),
                                   "rm_call_ns": s1.get("rm_call_ns"), "clocks": self.clock_in(t0, t1),
                                   "instances": s1.get("gpus", {}).get("0", {}).get("instances")})

    def restarts(self, n: int, kind: str, vals: list[float], _order: str = "") -> None:
        self.daemon.mode_args = []
        self.daemon.write_state(kind, 50, members_of(kind, vals, self.names))
        self.run_set(set(self.names))
        try:
            self.daemon.start(members=self.names, timeout=30)
        except RuntimeError as e:
            self.log(f"restart: first start: {e}")
            self.daemon.stop()
            self.pause_all()
            return
        for i in range(n):
            sig = signal.SIGTERM if i % 2 == 0 else signal.SIGKILL
            time.sleep(2.0)
            proc = self.daemon.proc
            assert proc is not None
            t_sig = time.monotonic()
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=10)
                exit_s: float | None = time.monotonic() - t_sig
            except subprocess.TimeoutExpired:
                exit_s = None
                os.kill(proc.pid, signal.SIGUSR2)
                time.sleep(0.5)
                proc.kill()
                proc.wait()
            t_spawn = time.monotonic()
            rec: dict = {"signal": signal.Signals(sig).name, "exit_s": exit_s}
            try:
                self.daemon.start(members=self.names, timeout=10)
                rec["ready_s"] = time.monotonic() - t_spawn
            except RuntimeError as e:
                rec["ready_s"] = None
                rec["error"] = str(e)
                stuck = self.daemon.proc
                if stuck is not None and stuck.poll() is None:
                    rec["wchan"] = _wchans(stuck.pid)
                    os.kill(stuck.pid, signal.SIGUSR2)
                    time.sleep(0.5)
                    stuck.kill()
                    stuck.wait()
                try:
                    self.daemon.start(members=self.names, timeout=60)
                except RuntimeError as e2:
                    self.log(f"restart {i + 1}: no daemon after 60 s either: {e2}")
                    break
            rec["since_signal_s"] = (rec["ready_s"] + t_spawn - t_sig) if rec.get("ready_s") is not None else None
            self.res["restarts"].append(rec)
            self.log(f"restart {i + 1}: {rec}")
        st = self.daemon.stop()
        self.pause_all()
        self.res["restart_final_status"] = st

    def report(self) -> None:
        def alone_at(t: float) -> dict[str, float]:
            before = [b for b in self.blocks if b["t"] <= t][-1:]
            after = [b for b in self.blocks if b["t"] >= t][:1]
            use = before + after
            return {n: sum(b["rates"][n] for b in use) / len(use) for n in self.names}

        lines = ["", f"mix: {', '.join(f'{n}={k}' for n, k in self.res['mix'])}",
                 "| phase | target % | measured % | worst error (pt) | total % | switches | RM calls/switch | "
                 "log problems | SM MHz |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for ph in self.res["phases"]:
            al = alone_at(ph["t0"])
            got = {n: 100 * ph["rates"][n] / al[n] if al[n] else 0.0 for n in self.names}
            ph["share_pct"] = got
            tgt = ph.get("target")
            err = max(abs(got[n] - 100 * tgt[n]) for n in self.names) if tgt else None
            ph["worst_error_pt"] = err
            per = ph["rm_calls"] / ph["switches"] if ph.get("switches") else None
            lines.append(f"| {ph['phase']} | {' / '.join(f'{100 * tgt[n]:.1f}' for n in self.names) if tgt else ''} | "
                         f"{' / '.join(f'{got[n]:.1f}' for n in self.names)} | {'' if err is None else f'{err:.1f}'} | "
                         f"{sum(got.values()):.1f} | {ph.get('switches', '')} | {'' if per is None else f'{per:.2f}'} | "
                         f"{ph.get('log_problem_count', '')} | {(ph.get('clocks') or (0, 0))[0]:.0f} |")
        if self.res["restarts"]:
            lines += ["", "| restart | stopped daemon exited after (s) | new daemon saw every tenant and switched after (s) |",
                      "| --- | --- | --- |"]
            for r in self.res["restarts"]:
                lines.append(f"| {r['signal']} | {r['exit_s'] if r['exit_s'] is None else round(r['exit_s'], 3)} | "
                             f"{r['ready_s'] if r['ready_s'] is None else round(r['ready_s'], 3)} |")
        for ln in lines:
            self.log(ln)
        (self.out / "mix.json").write_text(json.dumps(self.res, indent=1, default=str))
        if os.path.exists(self.daemon.logf.name):
            shutil.copy(self.daemon.logf.name, self.out / "daemon.log")

    def close(self) -> None:
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()
        for w in self.ws.values():
            w.stop()
        for n, w in self.ws.items():
            err = Path(w.errf.name).read_text(errors="replace")[-2000:]
            if err.strip():
                self.log(f"{n} stderr tail:\n{err}")


def _wchans(pid: int) -> dict[str, str]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out[t] = Path(f"/proc/{pid}/task/{t}/wchan").read_text() + " " + \
                Path(f"/proc/{pid}/task/{t}/stat").read_text().split(")")[1].split()[0]
        except OSError:
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("GPUSLICE_RAW", "/tmp/gpuslice-out"))
    ap.add_argument("--mix", default="a=cupy,b=torch-block,c=jax")
    ap.add_argument("--policies", default="weight:3,2,1/burst:1,1,1/fixed:20,30,40")
    ap.add_argument("--periods", default="50")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--alone-seconds", type=float, default=2.0)
    ap.add_argument("--timeslice-us", type=int, default=0,
                    help="every tenant's TSGs get this hardware timeslice (GPUSLICE_TIMESLICE_US; 0: RM's)")
    ap.add_argument("--native", action=argparse.BooleanOptionalAction, default=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mix = [tuple(p.split("=", 1)) for p in a.mix.split(",")]
    m = Mix(out, mix, a.timeslice_us)  # type: ignore[arg-type]
    pols = parse_policies(a.policies)
    try:
        m.start()
        m.alone(a.alone_seconds)
        if a.native:
            m.native(a.seconds)
        for period in (int(p) for p in a.periods.split(",")):
            for kind, vals, order in pols:
                m.policy(kind, vals, order, period, a.seconds)
            m.alone(a.alone_seconds)
        if a.restarts:
            m.restarts(a.restarts, *pols[0])
    finally:
        m.close()
        m.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())

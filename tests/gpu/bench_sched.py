"""`gpuctl daemon` gating real PyTorch workloads on one GPU: shares, throughput, switch
cost, crash safety. Run on the GPU machine by `scripts/gpu-run.sh sched`; the results
are in docs/h100-scheduler.md.

  python3 tests/gpu/bench_sched.py [--out DIR] [--kills N] [--quick]

Four workloads (tests/gpu/wl_sched.py: a loop of one SIZE^2 fp32 matmul + synchronize,
completion times recorded) run under LD_PRELOAD=preload/libgpuslice.so with their own
GPUSLICE_INSTANCE, reporting their RM objects to the harness's relay, which forwards
them to whichever daemon runs (sched_common.py says why). The harness runs or pauses
each workload; a paused one has its context and channels but submits nothing.

  a 4096, b 4096, c 3072, d 2048 (d is the bursty one: 2 s busy / 2 s idle where noted)

Normalisation: a workload's throughput in a window, divided by its own throughput when
it ran alone (phase "alone", same process, same loop). "achieved share" is that
fraction; "total" is the sum over the workloads (1.0 = one process alone).

Phases, in order:
  alone      each workload alone, 3 s (and again at the end, 2 s, as a drift check)
  native     {a,b}, {a,b,c}, {a,b,c,d} together, no daemon (hardware time-slicing)
  policies   for period 20, 50, 100 ms: fixed a50% b30% c20%; weight a3 b2 c1;
             equal a,b,c,d; burst a1 b1 c1 d3 (d bursty in equal and burst)
  crash      a and b under fixed 60/40, period 50 ms; the daemon is killed N times with
             SIGTERM and N times with SIGKILL (random order, random moment 0.2-1.0 s
             after it started gating) and restarted; per kill, the time from the kill to
             each workload's next completed matmul, and both rates in the second after.

Windows skip the first 0.5 s after any change (phase start, d's toggles).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sched_common as sc  # noqa: E402

SIZES = {"a": 4096, "b": 4096, "c": 3072, "d": 2048}
SETTLE = 0.5
POLICY_SETS = {
    "fixed": ({"a": {"share": 0.5}, "b": {"share": 0.3}, "c": {"share": 0.2}}, False),
    "weight": ({"a": {"weight": 3}, "b": {"weight": 2}, "c": {"weight": 1}}, False),
    "equal": ({"a": {}, "b": {}, "c": {}, "d": {}}, True),
    "burst": ({"a": {"weight": 1}, "b": {"weight": 1}, "c": {"weight": 1}, "d": {"weight": 3}}, True),
}


def f1(x) -> str:
    return "never" if x is None else f"{x:.1f}"


class Bench:
    def __init__(self, out: Path, quick: bool) -> None:
        self.out = out
        self.quick = quick
        self.work = tempfile.mkdtemp(prefix="gs-sched-")
        self.logf = open(out / "sched.txt", "a")
        self.relay = sc.Relay(os.path.join(self.work, "relay.sock"))
        self.daemon = sc.Daemon(self.work, self.relay, self.log)
        self.ws: dict[str, sc.Workload] = {}
        self.res: dict = {"phases": [], "alone": {}, "native": {}, "policies": [], "crash": []}
        self.status_samples: list = []

    def log(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def dur(self, s: float) -> float:
        return s / 2 if self.quick else s

    # --- phases ---
    def run_set(self, running: dict[str, str]) -> None:
        for n, w in self.ws.items():
            w.set(running.get(n, "pause"))

    def start(self) -> None:
        for n, size in SIZES.items():
            self.ws[n] = sc.Workload(n, size, self.work, self.relay.path, self.log)
        for w in self.ws.values():
            w.wait_ready()
        self.log(f"workloads ready: {', '.join(f'{n}={w.proc.pid}' for n, w in self.ws.items())}")

    def alone(self, tag: str, seconds: float) -> None:
        for n, w in self.ws.items():
            self.run_set({n: "run"})
            t0 = time.monotonic()
            time.sleep(seconds)
            t1 = time.monotonic()
            self.run_set({})
            r = sc.rate(w.times(), t0 + 0.3, t1)
            self.res["alone"].setdefault(n, {})[tag] = r
            self.res["phases"].append({"phase": f"alone-{tag}", "who": n, "t0": t0, "t1": t1})
            self.log(f"alone {tag} {n} ({w.size}^2): {r:.1f} matmuls/s")
            time.sleep(0.1)

    def native(self, names: list[str], seconds: float) -> None:
        self.run_set({n: "run" for n in names})
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
        self.run_set({})
        time.sleep(0.1)
        norm = sc.normalised({n: self.ws[n] for n in names}, self.alone_rate, t0 + SETTLE, t1)
        key = "".join(names)
        self.res["native"][key] = {"norm": norm, "total": sum(norm.values()),
                                   "rates": {n: sc.rate(self.ws[n].times(), t0 + SETTLE, t1) for n in names}}
        self.res["phases"].append({"phase": f"native-{key}", "t0": t0, "t1": t1})
        self.log(f"native {key}: " + " ".join(f"{n} {v:.3f}" for n, v in norm.items())
                 + f"  total {sum(norm.values()):.3f}")

    def policy(self, policy: str, period: int, seconds: float) -> None:
        members, bursty = POLICY_SETS[policy]
        self.daemon.write_state(policy, period, members)
        self.run_set({n: "run" for n in members})
        self.daemon.start(members=list(members))
        toggles: list[tuple[float, bool]] = []
        t0 = time.monotonic()
        toggles.append((t0, True))
        samples = []
        nxt = t0 + 2.0
        while time.monotonic() < t0 + seconds:
            now = time.monotonic()
            if bursty and now >= nxt:
                busy = not toggles[-1][1]
                self.ws["d"].set("run" if busy else "pause")
                toggles.append((time.monotonic(), busy))
                nxt += 2.0
            st = self.daemon.read_status()
            if st:
                g = st.get("gpus", {}).get("0", {})
                samples.append({"t": now, "switches": st.get("switches"),
                                "active": sorted(n for n, i in g.get("instances", {}).items() if i.get("active")),
                                "shares": {n: round(i.get("share", 0), 4) for n, i in g.get("instances", {}).items()}})
            time.sleep(0.1)
        t1 = time.monotonic()
        st = self.daemon.stop()
        self.run_set({})
        time.sleep(0.1)
        toggles.append((t1, None))  # type: ignore[arg-type]
        # windows per state of d (all busy when not bursty)
        by_state: dict[bool, list[tuple[float, float]]] = {}
        for (ta, busy), (tb, _b) in zip(toggles, toggles[1:]):
            if tb - ta > SETTLE + 0.2:
                by_state.setdefault(bool(busy) if bursty else True, []).append((ta + SETTLE, tb))
        rows = []
        for d_busy, wins in sorted(by_state.items(), reverse=True):
            running = [n for n in members if n != "d" or d_busy]
            tgt = sc.target_shares(policy, members, set(running))
            span = sum(b - a for a, b in wins)
            ach = {n: sum(sc.count(self.ws[n].times(), a, b) for a, b in wins) / span / self.alone_rate[n]
                   for n in members}
            total = sum(ach[n] for n in running)
            nat = self.res["native"].get("".join(running), {}).get("total")
            row = {"policy": policy, "period_ms": period, "d_busy": d_busy if bursty else None,
                   "running": running, "seconds": span, "target": tgt, "achieved": ach, "total": total,
                   "native_total": nat,
                   "switch_latency_ns": (st or {}).get("switch_latency_ns"),
                   "rm_call_ns": (st or {}).get("rm_call_ns"), "switches": (st or {}).get("switches"),
                   "rm_calls": (st or {}).get("rm_calls")}
            rows.append(row)
            self.res["policies"].append(row)
            self.log(f"{policy} {period}ms" + (f" d {'busy' if d_busy else 'idle'}" if bursty else "") + ": "
                     + " ".join(f"{n} {100 * tgt.get(n, 0):.1f}/{100 * ach[n]:.1f}" for n in members)
                     + f"  total {total:.3f} (native {nat if nat is None else round(nat, 3)})")
        self.res["phases"].append({"phase": f"{policy}-{period}", "t0": t0, "t1": t1, "toggles": toggles,
                                   "status": samples, "final_status": st})
        if st:
            self.log(f"  daemon: {st.get('switches')} switches, {st.get('rm_calls')} RM calls, "
                     f"switch latency {st.get('switch_latency_ns')}, calls {st.get('rm_call_ns')}")

    def crash(self, kills: int, go_on=lambda: True) -> None:
        members = {"a": {"share": 0.6}, "b": {"share": 0.4}}
        self.daemon.write_state("fixed", 50, members)
        self.run_set({"a": "run", "b": "run"})
        sigs = [signal.SIGTERM] * kills + [signal.SIGKILL] * kills
        random.Random(20261123).shuffle(sigs)
        rng = random.Random(7)
        for i, sig in enumerate(sigs):
            if not go_on():
                self.log(f"time budget: crash test stopped after {i} kills")
                break
            ready = self.daemon.start(members=["a", "b"])
            time.sleep(rng.uniform(0.2, 1.0))
            st = self.daemon.read_status() or {}
            tk, gone = self.daemon.signal(sig)
            self.relay.set_target(None)
            time.sleep(1.1)
            rec = {"i": i, "signal": signal.Signals(sig).name, "gated_s": tk - ready, "exit_s": gone,
                   "disabled_at_last_status": st.get("disabled_now")}
            for n in ("a", "b"):
                ts = self.ws[n].times()
                f = sc.first_after(ts, tk)
                rec[f"resume_{n}_ms"] = None if f is None else (f - tk) * 1e3
                i0 = sc.bisect.bisect_left(ts, tk)
                rec[f"idle_before_{n}_ms"] = (tk - ts[i0 - 1]) * 1e3 if i0 else None  # > a matmul: it was gated
                rec[f"rate_{n}_after"] = sc.rate(ts, tk + 0.1, tk + 1.1) / self.alone_rate[n]
            self.res["crash"].append(rec)
            self.log(f"kill {i:2d} {rec['signal']:7s} after {rec['gated_s']:.2f}s gating: resume a "
                     f"{f1(rec['resume_a_ms'])} ms b {f1(rec['resume_b_ms'])} ms; next second a "
                     f"{rec['rate_a_after']:.3f} b {rec['rate_b_after']:.3f} of alone")
        self.run_set({})
        # leftover watchdogs (own session) must all have exited
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", "gpuslice.watchdog"], capture_output=True, text=True).stdout.split()
        self.res["watchdogs_left"] = left
        self.log(f"watchdog processes left after the crash test: {left or 'none'}")

    @property
    def alone_rate(self) -> dict[str, float]:
        return {n: v["first"] for n, v in self.res["alone"].items()}

    def finish(self) -> None:
        for w in self.ws.values():
            w.stop()
        raw = {n: list(w.times()) for n, w in self.ws.items()}
        (self.out / "sched.json").write_text(json.dumps(self.res, indent=1, default=str))
        tsf = Path(self.work) / "timestamps.json"
        tsf.write_text(json.dumps(raw))
        with tarfile.open(self.out / "sched-raw.tgz", "w:gz") as t:
            for p in sorted(Path(self.work).iterdir()):
                if p.suffix in (".json", ".err", ".log") and p.is_file():
                    t.add(p, arcname=p.name)
        shutil.copy(self.daemon.logf.name, self.out / "daemon.log")
        self.report()

    def report(self) -> None:
        r = self.res
        L = []
        L.append("\n## alone (matmuls/s; first = reference, last = drift check)")
        L.append("| workload | size | first | last |")
        L.append("| --- | --- | --- | --- |")
        for n, v in r["alone"].items():
            last = v.get("last")
            L.append(f"| {n} | {SIZES[n]} | {v['first']:.1f} | {'-' if last is None else f'{last:.1f}'} |")
        L.append("\n## native time-slicing, no daemon (normalised throughput)")
        L.append("| set | " + " | ".join(SIZES) + " | total |")
        L.append("| --- |" + " --- |" * (len(SIZES) + 1))
        for k, v in r["native"].items():
            L.append(f"| {k} | " + " | ".join(f"{v['norm'][n]:.3f}" if n in v["norm"] else "-" for n in SIZES)
                     + f" | {v['total']:.3f} |")
        L.append("\n## policies: target / achieved share in % (d: bursty 2 s/2 s in equal, burst)")
        L.append("| policy | period | d | " + " | ".join(SIZES) + " | max abs err (pp) | total | native | total - native (pp) "
                 "| switch latency p50/p99 (us) | disable call p50/p99/max (us) | enable call p50/p99/max (us) |")
        L.append("| --- " * (len(SIZES) + 10) + "|")

        def us(d, k):
            return "-" if not d or d.get(k) is None else f"{d[k] / 1e3:.0f}"

        for row in r["policies"]:
            errs = [abs(100 * (row["achieved"][n] - row["target"].get(n, 0))) for n in row["achieved"]
                    if n in row["running"] or row["target"].get(n, 0) > 0]
            cells = []
            for n in SIZES:
                if n not in row["achieved"]:
                    cells.append("-")
                else:
                    cells.append(f"{100 * row['target'].get(n, 0):.1f} / {100 * row['achieved'][n]:.1f}")
            nat = row["native_total"]
            lat = row.get("switch_latency_ns") or {}
            calls = row.get("rm_call_ns") or {}
            dis, en = calls.get("disable") or {}, calls.get("enable") or {}
            dcol = "-" if row["d_busy"] is None else ("busy" if row["d_busy"] else "idle")
            L.append(f"| {row['policy']} | {row['period_ms']} ms | {dcol} | " + " | ".join(cells)
                     + f" | {max(errs):.1f} | {row['total']:.3f} | {'-' if nat is None else f'{nat:.3f}'} | "
                     + ("-" if nat is None else f"{100 * (row['total'] - nat):+.1f}")
                     + f" | {us(lat, 'p50')}/{us(lat, 'p99')} | {us(dis, 'p50')}/{us(dis, 'p99')}/{us(dis, 'max')}"
                     f" | {us(en, 'p50')}/{us(en, 'p99')}/{us(en, 'max')} |")
        if r["crash"]:
            L.append("\n## crash safety (daemon killed while gating a 60% / b 40%, period 50 ms)")
            for sig in ("SIGTERM", "SIGKILL"):
                ks = [k for k in r["crash"] if k["signal"] == sig]
                if not ks:
                    continue
                res = [max(k["resume_a_ms"] or 1e9, k["resume_b_ms"] or 1e9) for k in ks]
                low = [min(k["rate_a_after"], k["rate_b_after"]) for k in ks]
                L.append(f"{sig}: {len(ks)} kills; time to resume (both workloads, ms) max {max(res):.1f}, "
                         f"median {sorted(res)[len(res) // 2]:.1f}; over 1 s: {sum(x > 1000 for x in res)}; "
                         f"lowest rate in the second after (of alone) {min(low):.3f}")
            L.append("| # | signal | gated for (s) | resume a (ms) | resume b (ms) | a after | b after |")
            L.append("| --- | --- | --- | --- | --- | --- | --- |")
            for k in r["crash"]:
                L.append(f"| {k['i']} | {k['signal']} | {k['gated_s']:.2f} | {f1(k['resume_a_ms'])} | "
                         f"{f1(k['resume_b_ms'])} | {k['rate_a_after']:.3f} | {k['rate_b_after']:.3f} |")
        text = "\n".join(L)
        self.logf.write(text + "\n")
        print(text, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpuslice-out"))
    ap.add_argument("--kills", type=int, default=20, help="kills per signal")
    ap.add_argument("--periods", default="20,50,100")
    ap.add_argument("--policies", default="fixed,weight,equal,burst")
    ap.add_argument("--quick", action="store_true", help="half-length phases")
    ap.add_argument("--budget", type=float, default=470, help="seconds; later phases are cut short to fit")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not sc.FAKE and not sc.have_gpu():
        print("no GPU: nothing to do (GPUSLICE_FAKE_WORKLOAD=1 dry-runs the harness)")
        return 0
    b = Bench(out, a.quick)
    b.log(f"bench_sched start; work dir {b.work}; fake={sc.FAKE}")
    t_start = time.monotonic()

    def left() -> float:
        return a.budget - (time.monotonic() - t_start)

    def guarded(what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # log and go on with the next phase
            b.log(f"{what}: FAILED: {type(e).__name__}: {e}")
            b.res.setdefault("failures", []).append(f"{what}: {type(e).__name__}: {e}")
            if b.daemon.proc is not None and b.daemon.proc.poll() is None:
                b.daemon.stop()

    try:
        b.start()
        b.alone("first", b.dur(3.0))
        for names in (["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]):
            b.native(names, b.dur(5.0))
        for period in [int(x) for x in a.periods.split(",")]:
            for pol in a.policies.split(","):
                if left() < 60 + 3 * a.kills:
                    b.log(f"time budget: skipping {pol} {period} ms")
                    continue
                guarded(f"{pol} {period} ms", b.policy, pol, period,
                        4.0 if a.quick else (8.0 if POLICY_SETS[pol][1] else 5.0))
        b.alone("last", b.dur(2.0))
        if a.kills:
            guarded("crash", b.crash, a.kills, lambda: left() > 15)
    finally:
        if b.daemon.proc is not None and b.daemon.proc.poll() is None:
            b.daemon.stop()
        b.log(f"bench took {time.monotonic() - t_start:.0f} s")
        b.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

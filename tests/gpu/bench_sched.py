"""`gpuctl daemon` gating real PyTorch workloads on one GPU: shares, throughput, switch
cost, crash safety. Run on the GPU machine by `scripts/gpu-run.sh sched`; the results
are in docs/h100-scheduler.md.

  python3 tests/gpu/bench_sched.py [--out DIR] [--kills N] [--quick]

Four workloads (tests/gpu/wl_sched.py: a loop of one SIZE^2 fp32 matmul + synchronize,
completion times recorded) run under LD_PRELOAD=preload/libgpuslice.so with their own
GPUSLICE_INSTANCE, reporting their RM objects to whichever daemon runs: a restarted
daemon gets them back from the library's reporter thread (sched_common.py). The harness runs or pauses
each workload; a paused one has its context and channels but submits nothing.

  a 4096, b 4096, c 3072, d 2048 (d is the bursty one: 4 s busy / 4 s idle where noted)

Normalisation: a workload's throughput in a window, divided by its own throughput when
it ran alone (phase "alone", same process, same loop). "achieved share" is that
fraction; "total" is the sum over the workloads (1.0 = one process alone).

Phases, in order:
  alone      each workload alone, 2 s; repeated after the native phases and after each
             period's policies; a phase is normalised by the mean of the alone blocks
             just before and after it
  native     {a,b}, {a,b,c}, {a,b,c,d} together, no daemon (hardware time-slicing)
  policies   for period 20, 50, 100 ms: fixed a50% b30% c20%; weight a3 b2 c1 (5 s each);
             equal a,b,c,d; burst a1 b1 c1 d3 (16 s each, d bursty)
  crash      a and b under fixed 60/40, period 50 ms; the daemon is killed N times with
             SIGTERM and N times with SIGKILL (random order, random moment 0.2-1.0 s
             after it started gating) and restarted; per kill, the time from the kill to
             each workload's next completed matmul, and both rates in the second after.

Windows skip the first 0.5 s of a phase and the first 1 s after d starts or stops.
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
SETTLE = 0.5  # skipped after a phase starts
BURST_SETTLE = 3.0  # skipped after d starts or stops (the NVML probe holds a busy process 2.5 s)
BURST_S = 8.0  # d's busy / idle time in equal and burst
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
        self.daemon = sc.Daemon(self.work, self.log)
        self.ws: dict[str, sc.Workload] = {}
        self.res: dict = {"phases": [], "alone": {}, "alone_blocks": [], "native": {}, "policies": [], "crash": [],
                          "gpu_samples": []}
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

    def start(self, waits: dict[str, str] | None = None) -> None:
        """waits: how a workload waits for its GPU work (bench_activity.py's modes): spin
        (default), sleep (PyTorch, event polled with sleeps), cpoll / cblock (wl_poll.c)."""
        waits = waits or {}
        poll_bin = os.path.join(self.work, "wl_poll")
        if any(w.startswith("c") for w in waits.values()):
            subprocess.run(["gcc", "-O2", "-Wall", "-o", poll_bin, str(Path(__file__).with_name("wl_poll.c")),
                            "-ldl"], check=True)
        for n, size in SIZES.items():
            w = waits.get(n, "spin")
            if w in ("cpoll", "cblock"):
                kernel_us = str(int(2000 * (size / 4096) ** 3) or 100)
                self.ws[n] = sc.Workload(n, size, self.work, self.daemon.sock, self.log,
                                         cmd=[poll_bin, kernel_us, "4", "500", "poll" if w == "cpoll" else "block"])
            else:
                self.ws[n] = sc.Workload(n, size, self.work, self.daemon.sock, self.log, extra_env={"WL_WAIT": w})
        for w in self.ws.values():
            w.wait_ready()
        self.log(f"workloads ready: {', '.join(f'{n}={w.proc.pid}' for n, w in self.ws.items())}")

    def alone(self, tag: str, seconds: float) -> None:
        block = {"tag": tag, "rates": {}, "t0": time.monotonic()}
        for n, w in self.ws.items():
            self.run_set({n: "run"})
            t0 = time.monotonic()
            time.sleep(seconds)
            t1 = time.monotonic()
            self.pause_all()
            r = sc.rate(w.times(), t0 + 0.3, t1)
            block["rates"][n] = r
            self.res["alone"].setdefault(n, {})[tag] = r
            self.log(f"alone {tag} {n} ({w.size}^2): {r:.1f} matmuls/s")
        block["t1"] = time.monotonic()
        self.res["alone_blocks"].append(block)

    def pause_all(self) -> None:
        self.run_set({})
        time.sleep(0.35)  # the workloads flush their times when they pause

    def alone_at(self, t: float) -> dict[str, float]:
        """Alone rates for a phase at time t: mean of the alone blocks just before and
        just after it (the clocks drift a little over a run)."""
        bl = self.res["alone_blocks"]
        before = [b for b in bl if b["t1"] <= t]
        after = [b for b in bl if b["t0"] >= t]
        use = ([before[-1]] if before else []) + ([after[0]] if after else [])
        return {n: sum(b["rates"][n] for b in use) / len(use) for n in SIZES}

    def native(self, names: list[str], seconds: float) -> None:
        self.run_set({n: "run" for n in names})
        t0 = time.monotonic()
        if len(names) == 4:
            self.nvml_diag("native-abcd", seconds - 0.2)
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        t1 = time.monotonic()
        self.pause_all()
        key = "".join(names)
        self.res["phases"].append({"phase": f"native-{key}", "kind": "native", "names": names,
                                   "t0": t0, "t1": t1})
        norm = {n: sc.rate(self.ws[n].times(), t0 + SETTLE, t1) / self.alone_at(t0)[n] for n in names}
        self.log(f"native {key} (prelim): " + " ".join(f"{n} {v:.3f}" for n, v in norm.items())
                 + f"  total {sum(norm.values()):.3f}")

    def policy(self, policy: str, period: int, seconds: float, probe: str = "nvml") -> None:
        members, bursty = POLICY_SETS[policy]
        self.daemon.probe = probe
        self.daemon.write_state(policy, period, members)
        self.run_set({n: "run" for n in members})
        self.daemon.start(members=list(members))
        toggles: list[tuple[float, bool]] = []
        t0 = time.monotonic()
        toggles.append((t0, True))
        samples = []
        changes: dict[int, list[str]] = {}  # the daemon's active_changes, over the whole phase
        nxt = t0 + BURST_S
        if policy == "fixed" and period == 50:
            threading.Thread(target=self.nvml_diag, args=("fixed-50", seconds - 0.5), daemon=True).start()
        while time.monotonic() < t0 + seconds:
            now = time.monotonic()
            if bursty and now >= nxt:
                busy = not toggles[-1][1]
                self.ws["d"].set("run" if busy else "pause")
                toggles.append((time.monotonic(), busy))
                nxt += BURST_S
            st = self.daemon.read_status()
            if st:
                g = st.get("gpus", {}).get("0", {})
                changes.update({int(t): a for t, a in g.get("active_changes", [])})
                samples.append({"t": now, "switches": st.get("switches"),
                                "active": sorted(n for n, i in g.get("instances", {}).items() if i.get("active")),
                                "shares": {n: round(i.get("share", 0), 4) for n, i in g.get("instances", {}).items()}})
            time.sleep(0.1)
        t1 = time.monotonic()
        st = self.daemon.stop()
        self.pause_all()
        toggles.append((t1, None))  # type: ignore[arg-type]
        if st:
            changes.update({int(t): a for t, a in st.get("gpus", {}).get("0", {}).get("active_changes", [])})
        ph = {"phase": f"{policy}-{period}-{self.daemon.order}-{probe}", "kind": "policy", "policy": policy,
              "period_ms": period, "order": self.daemon.order, "probe": probe,
              "active_changes": sorted(changes.items()),
              "members": members, "bursty": bursty, "t0": t0, "t1": t1, "toggles": toggles,
              "status": samples, "final_status": st}
        self.res["phases"].append(ph)
        for row in self.analyse_policy(ph):
            self.log(f"{row['policy']} {period}ms" + (f" d {'busy' if row['d_busy'] else 'idle'}" if bursty else "")
                     + " (prelim): " + " ".join(f"{n} {100 * row['target'].get(n, 0):.1f}/{100 * row['achieved'][n]:.1f}"
                                               for n in members) + f"  total {row['total']:.3f}")
        if st:
            self.log(f"  daemon: {st.get('switches')} switches, {st.get('rm_calls')} RM calls, "
                     f"switch latency {st.get('switch_latency_ns')}, calls {st.get('rm_call_ns')}")

    def native_total(self, running: list[str], t: float) -> float | None:
        for ph in self.res["phases"]:
            if ph.get("kind") == "native" and ph["names"] == running:
                al = self.alone_at(ph["t0"])
                return sum(sc.rate(self.ws[n].times(), ph["t0"] + SETTLE, ph["t1"]) / al[n] for n in running)
        return None

    def analyse_policy(self, ph: dict) -> list[dict]:
        members, bursty, toggles = ph["members"], ph["bursty"], ph["toggles"]
        alone = self.alone_at(ph["t0"])
        by_state: dict[bool, list[tuple[float, float]]] = {}
        for i, ((ta, busy), (tb, _b)) in enumerate(zip(toggles, toggles[1:])):
            skip = SETTLE if i == 0 else BURST_SETTLE
            if tb - ta > skip + 0.2:
                by_state.setdefault(bool(busy) if bursty else True, []).append((ta + skip, tb))
        st = ph["final_status"] or {}
        rows = []
        for d_busy, wins in sorted(by_state.items(), reverse=True):
            running = [n for n in members if n != "d" or d_busy]
            tgt = sc.target_shares(ph["policy"], members, set(running))
            span = sum(b - a for a, b in wins)
            ach = {n: sum(sc.count(self.ws[n].times(), a, b) for a, b in wins) / span / alone[n] for n in members}
            rows.append({"policy": ph["policy"] + ("" if ph.get("order", "enable-first") == "enable-first"
                                                   else " (" + ph["order"] + ")")
                         + (f" [{ph['probe']}]" if bursty else ""),
                         "reaction_periods": self.reactions(ph, d_busy) if bursty else None,
                         "period_ms": ph["period_ms"], "d_busy": d_busy if bursty else None,
                         "running": running, "seconds": span, "target": tgt, "achieved": ach,
                         "total": sum(ach[n] for n in running), "native_total": self.native_total(running, ph["t0"]),
                         "switch_latency_ns": st.get("switch_latency_ns"), "rm_call_ns": st.get("rm_call_ns"),
                         "switches": st.get("switches"), "rm_calls": st.get("rm_calls"),
                         "probe_right": self.probe_right(ph, d_busy, running)})
        return rows

    @staticmethod
    def reactions(ph: dict, d_busy: bool) -> list[float | None]:
        """For every toggle of d into state ``d_busy`` (the first start excluded): how many
        periods until the daemon's plan had the right active set (0 if it already had it;
        None if it never got it before the next toggle), from the daemon's active_changes
        (period start, active set), CLOCK_MONOTONIC like the toggles."""
        members, toggles = list(ph["members"]), ph["toggles"]
        changes = [(t / 1e9, sorted(a)) for t, a in ph.get("active_changes", [])]
        want = sorted(members if d_busy else [n for n in members if n != "d"])
        period = ph["period_ms"] / 1e3
        out: list[float | None] = []
        for (ta, busy), (tb, _b) in list(zip(toggles, toggles[1:]))[1:]:
            if busy is None or bool(busy) != d_busy:
                continue
            before = [a for t, a in changes if t <= ta]
            if before and before[-1] == want:
                out.append(0.0)
                continue
            hit = [t for t, a in changes if ta < t < tb and a == want]
            out.append((hit[0] - ta) / period if hit else None)
        return out

    @staticmethod
    def probe_right(ph: dict, d_busy: bool, running: list[str]) -> float | None:
        """Fraction of the daemon's status samples (every 0.5 s) in this state, past the
        settle time, whose active set was the set that really ran."""
        if ph["policy"] not in ("equal", "burst"):
            return None
        toggles = ph["toggles"]
        ok = n = 0
        for smp in ph["status"]:
            for i, ((ta, busy), (tb, _b)) in enumerate(zip(toggles, toggles[1:])):
                skip = SETTLE if i == 0 else BURST_SETTLE
                if ta + skip <= smp["t"] < tb and bool(busy) == d_busy:
                    n += 1
                    ok += sorted(smp["active"]) == sorted(running)
        return ok / n if n else None

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
            time.sleep(1.1)
            rec = {"i": i, "signal": signal.Signals(sig).name, "gated_s": tk - ready, "exit_s": gone,
                   "disabled_at_last_status": st.get("disabled_now"),
                   # this start: spawn to both workloads' channels seen and a switch made
                   "rejoin_s": self.daemon.rejoin_s[-1] if self.daemon.rejoin_s and not sc.FAKE else None}
            for n in ("a", "b"):
                ts = self.ws[n].times()
                f = sc.first_after(ts, tk)
                rec[f"resume_{n}_ms"] = None if f is None else (f - tk) * 1e3
                i0 = sc.bisect.bisect_left(ts, tk)
                rec[f"idle_before_{n}_ms"] = (tk - ts[i0 - 1]) * 1e3 if i0 else None  # > a matmul: it was gated
                rec[f"rate_{n}_after"] = sc.rate(ts, tk + 0.1, tk + 1.1) / self.alone_at(tk)[n]
            self.res["crash"].append(rec)
            self.log(f"kill {i:2d} {rec['signal']:7s} (rejoined {f1(rec['rejoin_s'])} s after spawn) "
                     f"after {rec['gated_s']:.2f}s gating: resume a "
                     f"{f1(rec['resume_a_ms'])} ms b {f1(rec['resume_b_ms'])} ms; next second a "
                     f"{rec['rate_a_after']:.3f} b {rec['rate_b_after']:.3f} of alone")
        self.run_set({})
        # leftover watchdogs (own session) must all have exited
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", "gpuslice.sched.watchdog"], capture_output=True, text=True).stdout.split()
        self.res["watchdogs_left"] = left
        self.log(f"watchdog processes left after the crash test: {left or 'none'}")

    def gpu_log(self, stop: threading.Event) -> None:
        """SM clock, power, temperature every 0.5 s (pynvml), to explain drift."""
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:
            self.log(f"no NVML for the clock log: {e}")
            return
        while not stop.wait(0.5):
            try:
                self.res["gpu_samples"].append({
                    "t": time.monotonic(), "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                    "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)})
            except Exception:
                pass

    def nvml_diag(self, tag: str, seconds: float) -> None:
        """What NVML's per-process samples look like (the activity probe's input): poll
        nvmlDeviceGetProcessUtilization every 20 ms, keep the distinct samples."""
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:
            self.log(f"nvml diag: {e}")
            return
        seen: dict[tuple[int, int], int] = {}
        calls = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            t = time.perf_counter()
            try:
                for x in pynvml.nvmlDeviceGetProcessUtilization(h, 0):
                    seen[(int(x.pid), int(x.timeStamp))] = int(x.smUtil)
            except pynvml.NVMLError:
                pass
            calls.append(time.perf_counter() - t)
            time.sleep(0.02)
        pid2n = {w.proc.pid: n for n, w in self.ws.items()}
        out = {"calls": len(calls), "call_ms_median": 1e3 * sorted(calls)[len(calls) // 2] if calls else None,
               "per_workload": {}}
        for pid, n in pid2n.items():
            st = sorted(ts for (p, ts) in seen if p == pid)
            gaps = [(b - a) / 1e3 for a, b in zip(st, st[1:])]
            sm = [seen[(pid, ts)] for ts in st]
            out["per_workload"][n] = {"samples": len(st), "gap_ms_median": sorted(gaps)[len(gaps) // 2] if gaps else None,
                                      "gap_ms_max": max(gaps) if gaps else None, "sm_util": sm[:40]}
        self.res.setdefault("nvml_diag", {})[tag] = out
        self.log(f"nvml samples during {tag} ({seconds:.0f} s, one call {out['call_ms_median']:.2f} ms): "
                 + "; ".join(f"{n}: {v['samples']} samples, gap median {v['gap_ms_median']} ms max {v['gap_ms_max']} ms"
                             for n, v in out["per_workload"].items()))

    def analyse(self) -> None:
        self.res["native"] = {}
        self.res["policies"] = []
        for ph in self.res["phases"]:
            if ph.get("kind") == "native":
                al = self.alone_at(ph["t0"])
                norm = {n: sc.rate(self.ws[n].times(), ph["t0"] + SETTLE, ph["t1"]) / al[n] for n in ph["names"]}
                self.res["native"]["".join(ph["names"])] = {"norm": norm, "total": sum(norm.values())}
            elif ph.get("kind") == "policy":
                self.res["policies"].extend(self.analyse_policy(ph))

    def finish(self) -> None:
        for w in self.ws.values():
            w.stop()
        self.analyse()
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
        tags = [b["tag"] for b in r["alone_blocks"]]
        L.append("\n## alone (matmuls/s), measured between phases; a phase is normalised by the blocks before and after it")
        L.append("| workload | size | " + " | ".join(tags) + " |")
        L.append("| --- " * (len(tags) + 2) + "|")
        for n in SIZES:
            L.append(f"| {n} | {SIZES[n]} | " + " | ".join(f"{b['rates'][n]:.1f}" for b in r["alone_blocks"]) + " |")
        g = r.get("gpu_samples") or []
        if g:
            clk = sorted(x["sm_mhz"] for x in g)
            pw = sorted(x["power_w"] for x in g)
            L.append(f"\nGPU over the run ({len(g)} samples): SM clock min {clk[0]} median {clk[len(clk) // 2]} max "
                     f"{clk[-1]} MHz; power median {pw[len(pw) // 2]:.0f} W max {pw[-1]:.0f} W; temperature max "
                     f"{max(x['temp_c'] for x in g)} C")
        L.append("\n## native time-slicing, no daemon (normalised throughput)")
        L.append("| set | " + " | ".join(SIZES) + " | total |")
        L.append("| --- |" + " --- |" * (len(SIZES) + 1))
        for k, v in r["native"].items():
            L.append(f"| {k} | " + " | ".join(f"{v['norm'][n]:.3f}" if n in v["norm"] else "-" for n in SIZES)
                     + f" | {v['total']:.3f} |")
        L.append(f"\n## policies: target / achieved share in % (d: bursty {BURST_S:.0f} s busy / {BURST_S:.0f} s idle in equal, burst)")
        L.append("| policy | period | d | " + " | ".join(SIZES) + " | max abs err (pp) | total | native | total - native (pp) "
                 "| switch latency p50/p99 (us) | disable call p50/p99/max (us) | enable call p50/p99/max (us) | probe right "
                 "| reaction to d (periods, each toggle) |")
        L.append("| --- " * (len(SIZES) + 12) + "|")

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
                     f" | {us(en, 'p50')}/{us(en, 'p99')}/{us(en, 'max')} | "
                     + ("-" if row.get("probe_right") is None else f"{100 * row['probe_right']:.0f}%") + " | "
                     + ("-" if row.get("reaction_periods") is None else
                        " ".join("never" if x is None else f"{x:.1f}" for x in row["reaction_periods"]) or "-") + " |")
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
    ap.add_argument("--orders", default="enable-first", help="gpuctl daemon --switch-order values to run")
    ap.add_argument("--probes", default="cpu", help="gpuctl daemon --probe values to run equal and burst with")
    ap.add_argument("--waits", default="", help="how workloads wait, e.g. a=cpoll,b=sleep (spin, sleep, cpoll, "
                    "cblock; default spin)")
    ap.add_argument("--no-native", action="store_true", help="skip the native time-slicing phases")
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

    stop_log = threading.Event()
    threading.Thread(target=b.gpu_log, args=(stop_log,), daemon=True).start()
    try:
        b.start(dict(x.split("=", 1) for x in a.waits.split(",") if x))
        b.alone("first", 2.0)
        for names in ([] if a.no_native else (["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"])):
            b.native(names, b.dur(5.0))
        b.alone("after-native", 2.0)
        for period in [int(x) for x in a.periods.split(",")]:
            for order in a.orders.split(","):
                b.daemon.order = order
                for pol in a.policies.split(","):
                    for probe in (a.probes.split(",") if POLICY_SETS[pol][1] else a.probes.split(",")[:1]):
                        if left() < 60 + 3 * a.kills:
                            b.log(f"time budget: skipping {pol} {period} ms {order} {probe}")
                            continue
                        guarded(f"{pol} {period} ms {order} {probe}", b.policy, pol, period,
                                (3 if POLICY_SETS[pol][1] else 1) * BURST_S if a.quick else
                                (3 * BURST_S if POLICY_SETS[pol][1] else 5.0), probe)
            b.alone(f"after-{period}ms", 2.0)
        b.daemon.order = "enable-first"
        if a.kills:
            guarded("crash", b.crash, a.kills, lambda: left() > 15)
    finally:
        if b.daemon.proc is not None and b.daemon.proc.poll() is None:
            b.daemon.stop()
        stop_log.set()
        b.log(f"bench took {time.monotonic() - t_start:.0f} s")
        b.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

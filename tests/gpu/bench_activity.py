"""Activity probes against workloads that wait in different ways (issue 12, item 1), on
the GPU machine, through the user-space build: which probe keeps a busy workload in the
daemon's busy set, and the shares that follow.

  python3 tests/gpu/bench_activity.py [--out DIR] [--seconds S]

Two workloads a and b (tests/gpu/wl_sched.py, 4096^2 fp32 matmuls, 3 queued) under
LD_PRELOAD=preload/libgpuslice.so; `gpuctl daemon --source preload`, policy burst, weights
1:1, period 50 ms. For each wait mode and each probe (cpu, submit = the library's USERD
reports, auto = submit or cpu), both run for S seconds; the first second is skipped.

Wait modes: spin (torch, synchronize spin-waits); sleep (torch, cudaEventQuery polled with
a 0.5 ms sleep, WL_WAIT=sleep); cpoll (tests/gpu/wl_poll.c, a driver-API program: 4
kernels of 2 ms on every SM, then cuStreamQuery polled with usleep(500)); cblock (the
same, waiting in cuStreamSynchronize with CU_CTX_SCHED_BLOCKING_SYNC: asleep in the
driver); each workload is normalised by its own rate alone.

Printed per run: achieved share of each (completions / its rate alone), the fraction of
status samples (every 0.1 s) in which the daemon had both in its busy set, and how often
the busy set changed (active_changes). Then the reaction of the submit probe: b paused
until it is idle in the daemon's view, then run: time from "run" to b in the busy set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sched_common as sc  # noqa: E402
from gpuslice.sched.probes import process_cpu_ns  # noqa: E402  (PYTHONPATH has pyctl: gpu-run.sh)

SIZE = 4096


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpuslice-out"))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--probes", default="cpu,submit,auto")
    ap.add_argument("--waits", default="cpoll,cblock,sleep,spin")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gs-activity-")
    logf = open(out / "activity.txt", "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    log(f"# bench_activity {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    results = []
    d = sc.Daemon(work, log)
    poll_bin = os.path.join(work, "wl_poll")
    if any(w.startswith("c") for w in args.waits.split(",")):
        subprocess.run(["gcc", "-O2", "-Wall", "-o", poll_bin, str(Path(__file__).with_name("wl_poll.c")), "-ldl"],
                       check=True)
    for wait in args.waits.split(","):
        if wait in ("cpoll", "cblock"):
            cmd = [poll_bin, "2000", "4", "500", "poll" if wait == "cpoll" else "block"]
            ws = {n: sc.Workload(n, SIZE, work, d.sock, log, cmd=cmd) for n in ("a", "b")}
        else:
            ws = {n: sc.Workload(n, SIZE, work, d.sock, log, extra_env={"WL_WAIT": wait}) for n in ("a", "b")}
        for w in ws.values():
            w.wait_ready()
        alone = {}
        for n, w in ws.items():
            w.set("run")
            t0 = time.monotonic()
            time.sleep(2.5)
            w.set("pause")
            alone[n] = sc.rate(w.times(), t0 + 0.5, t0 + 2.5)
            time.sleep(0.3)
        log(f"wait={wait}: alone a {alone['a']:.1f}/s b {alone['b']:.1f}/s")
        for probe in args.probes.split(","):
            d.probe = probe
            d.write_state("burst", 50, {"a": {"weight": 1}, "b": {"weight": 1}})
            for w in ws.values():
                w.set("run")
            d.start(members=["a", "b"])
            t0 = time.monotonic()
            cpu0 = {n: process_cpu_ns(w.proc.pid) or 0 for n, w in ws.items()}
            both = samples = 0
            changes: dict[int, list[str]] = {}
            while time.monotonic() < t0 + args.seconds:
                time.sleep(0.1)
                st = d.read_status() or {}
                g = st.get("gpus", {}).get("0", {})
                changes.update({int(t): a for t, a in g.get("active_changes", [])})
                if time.monotonic() > t0 + 1.0 and g:
                    samples += 1
                    both += all(i.get("active") for i in g.get("instances", {}).values())
            t1 = time.monotonic()
            cpu = {n: ((process_cpu_ns(w.proc.pid) or 0) - cpu0[n]) / 1e9 / (t1 - t0) for n, w in ws.items()}
            shares = sc.normalised(ws, alone, t0 + 1.0, t1)
            react = None
            if probe != "cpu":
                # b pauses until the daemon sees it idle, then runs: how long until it is busy again
                ws["b"].set("pause")
                end = time.monotonic() + 5
                while time.monotonic() < end:
                    g = (d.read_status() or {}).get("gpus", {}).get("0", {})
                    if not g.get("instances", {}).get("b", {}).get("active", True):
                        break
                    time.sleep(0.02)
                t_run = time.monotonic()
                ws["b"].set("run")
                while time.monotonic() < t_run + 5:
                    g = (d.read_status() or {}).get("gpus", {}).get("0", {})
                    if g.get("instances", {}).get("b", {}).get("active"):
                        react = time.monotonic() - t_run
                        break
                    time.sleep(0.01)
            st = d.stop()
            for w in ws.values():
                w.set("pause")
            time.sleep(0.3)
            row = {"wait": wait, "probe": probe, "shares": shares, "both_busy": both / samples if samples else None,
                   "active_changes": len(changes), "react_s": react, "cpu": cpu, "switches": (st or {}).get("switches")}
            results.append(row)
            log(f"wait={wait} probe={probe}: a {100 * shares['a']:.1f}% b {100 * shares['b']:.1f}% "
                f"(target 50/50); both in the busy set in {100 * (row['both_busy'] or 0):.0f}% of samples; "
                f"busy set changed {len(changes)} times; CPU a {100 * cpu['a']:.0f}% b {100 * cpu['b']:.0f}%; "
                + (f"b idle->busy seen after {react * 1000:.0f} ms (status every 0.5 s)" if react is not None else ""))
        for w in ws.values():
            w.stop()
    (out / "activity.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

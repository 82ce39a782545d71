"""Online/offline priority on one GPU (issue 14), through the user-space build.

  python3 tests/gpu/bench_priority.py [--out DIR] [--seconds S] [--loads 0.3,0.6,0.9]

An online service (tests/gpu/wl_service.py: a transformer forward pass, Poisson arrivals
at LOAD of its standalone capacity) and an offline trainer (tests/gpu/wl_sched.py: 4096^2
fp32 matmuls, always busy), each under LD_PRELOAD=preload/libgpuslice.so with its own
instance (svc, batch). Per load, four modes:

  alone     the service alone (trainer paused, no daemon)
  native    both, no daemon: the GPU's own time-slicing
  burst     both, `gpuctl daemon` burst with weights 1:1 (both online)
  priority  both, burst, svc online and batch offline (`--priority offline`): the daemon
            preempts batch as soon as svc submits (--preempt-poll 1ms, --probe auto)
  priority@T  the same with `--preempt-after T`: batch is disabled only once svc's work
            has gone on for T; shorter work is left to the hardware's timeslices
  priority:KEY=V[:KEY=V]  the same with daemon options: after (--preempt-after), hold
            (--online-hold), sample (--online-sample; 0: the service's library samples
            at its own SVC_SAMPLE_MS / _US, not as often as the daemon asks)

--kills N (after the modes): N times each SIGTERM and SIGKILL, the daemon is killed
under priority at a random moment of a service phase at load 0.9 (batch preempted most
of the time); per kill, how long batch had made no progress before it, and how long
after it batch and the service completed their next work (kill safety: nobody stalled).

Printed per load and mode: the service's p50 / p99 / p99.9 latency (ms, queueing
included), the trainer's throughput as a fraction of its rate alone and of the capacity
the service leaves idle (1 - LOAD), and under priority the daemon's preemptions and their
latency (first CHANNEL_WORK of the service reaching the daemon -> last offline channel
disabled). Raw latencies: priority.json.

--rounds R: per load, the modes run R times in turn (alone, native, priority, alone, ...)
and each mode's latencies are pooled; the modes of one round are given the same Poisson
arrivals (a seed per round and load), so they differ by the mode, not by the draw; the p99 of each round is printed too, so the drift
of the machine between phases shows beside the differences between modes.

Environment: SERVICE_MS fixes the service time the loads are reckoned from (runs then
compare at the same request rates); SERVICE_KIND=ping makes each request one tiny kernel
(wl_service.py: its latency is how soon the service gets the GPU); SVC_TIMESLICE_US /
BATCH_TIMESLICE_US give each process's TSGs that hardware timeslice
(GPUSLICE_TIMESLICE_US); SVC_INTERLEAVE / BATCH_INTERLEAVE their runlist interleave level
(GPUSLICE_INTERLEAVE); SVC_SAMPLE_MS (default 1) or SVC_SAMPLE_US how often the service's
library looks at its channels; SERVICE_GC=freeze the service's objects frozen out of
Python's garbage collector after its warm-up (wl_service.py); SERVICE_BATCH the service's
batch (wl_service.py, default 4); DAEMON_ARGS more options for `gpuctl daemon` (for example
--preempt-after 10ms).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sched_common as sc  # noqa: E402

HERE = Path(__file__).resolve().parent


def pct(xs: list[float], p: float) -> float:
    v = sorted(xs)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


MODE_KEYS = {"after": "--preempt-after", "hold": "--online-hold", "sample": "--online-sample"}


def mode_args(mode: str) -> list[str]:
    """The daemon's options of a mode: priority@T is --preempt-after T; priority:KEY=V:...
    gives each KEY of MODE_KEYS (after, hold, sample) its option."""
    base, _, at = mode.partition("@")
    out = ["--preempt-after", at] if at else []
    for kv in base.split(":")[1:]:
        k, _, v = kv.partition("=")
        if k not in MODE_KEYS or not v:
            raise SystemExit(f"bench_priority: bad mode {mode!r} (keys: {', '.join(MODE_KEYS)})")
        out += [MODE_KEYS[k], v]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpuslice-out"))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--loads", default="0.3,0.6,0.9")
    ap.add_argument("--modes", default="alone,native,burst,priority")
    ap.add_argument("--kills", type=int, default=0, help="kills per signal under priority (0: none)")
    ap.add_argument("--rounds", type=int, default=1, help="times each load's modes run in turn (pooled)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gs-prio-")
    logf = open(out / "priority.txt", "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    log(f"# bench_priority {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    d = sc.Daemon(work, log, probe="auto")
    # the service's library looks at its channels every 1 ms (default 5): how soon a request is seen
    # hardware timeslices (GPUSLICE_TIMESLICE_US, set by each process on its own TSGs): a
    # short one on the trainer lets the runlist switch to the service sooner while the
    # daemon's disable is on its way; unset: RM's default
    ts = {k: os.environ.get(f"{k.upper()}_TIMESLICE_US", "") for k in ("svc", "batch")}
    il = {k: os.environ.get(f"{k.upper()}_INTERLEAVE", "") for k in ("svc", "batch")}
    kind = os.environ.get("SERVICE_KIND", "")
    log(f"timeslices (us, '' = RM's default): {ts}; interleave levels: {il}; service kind: {kind or 'model'}")
    svc_env = {"GPUSLICE_SAMPLE_MS": os.environ.get("SVC_SAMPLE_MS", "1"), "SERVICE_MS": os.environ.get("SERVICE_MS", ""),
               "SERVICE_KIND": kind, "GPUSLICE_TIMESLICE_US": ts["svc"], "GPUSLICE_INTERLEAVE": il["svc"],
               "SERVICE_GC": os.environ.get("SERVICE_GC", ""), "SERVICE_BATCH": os.environ.get("SERVICE_BATCH", "")}
    if os.environ.get("SVC_SAMPLE_US"):
        svc_env["GPUSLICE_SAMPLE_US"] = os.environ["SVC_SAMPLE_US"]
    svc = sc.Workload("svc", 0, work, d.sock, log, cmd=[sys.executable, str(HERE / "wl_service.py")],
                      extra_env=svc_env)
    trainer = sc.Workload("batch", 4096, work, d.sock, log,
                          extra_env={"GPUSLICE_TIMESLICE_US": ts["batch"], "GPUSLICE_INTERLEAVE": il["batch"]})
    line = svc.proc.stdout.readline()
    info = json.loads(line)
    trainer.wait_ready()
    log(f"service: {info['service_ms']:.2f} ms per request (measured alone: {info['measured_ms']:.2f})")
    trainer.set("run")
    t0 = time.monotonic()
    time.sleep(3)
    trainer.set("pause")
    trainer_alone = sc.rate(trainer.times(), t0 + 0.5, t0 + 3)
    log(f"trainer alone: {trainer_alone:.1f} matmuls/s")
    results = []
    tag_n = 0

    def phase(load: float, diag: dict[str, list[float]] | None = None, seed: int | None = None) -> list[float]:
        nonlocal tag_n
        tag_n += 1
        tag = f"p{tag_n}"
        with open(svc.ctl, "w") as f:
            f.write(f"run {load} {args.seconds} {tag}" + (f" {seed}" if seed is not None else ""))
        end = time.monotonic() + args.seconds + 60
        while time.monotonic() < end:
            try:
                with open(svc.out) as f:
                    for ln in f:
                        rec = json.loads(ln)
                        if rec["tag"] == tag:
                            if diag is not None:
                                for k, v in (rec.get("diag") or {}).items():
                                    diag.setdefault(k, []).extend(v)
                            return rec["lat_ms"]
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("service phase did not finish")

    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        mode_args(m)  # a bad mode fails before anything runs
    for load in (float(x) for x in args.loads.split(",") if x):
        pooled: dict[str, dict] = {m: {"lat": [], "trainer": [], "status": [], "round_p99": [], "diag": {}}
                                   for m in modes}
        for rnd in range(max(1, args.rounds)):
            for mode in modes:
                status = None
                gated = mode == "burst" or mode.startswith("priority")
                if gated:
                    d.write_state("burst", 50, {"svc": {"weight": 1},
                                                "batch": {"weight": 1, "priority": "offline" if mode != "burst"
                                                          else "online"}})
                    d.mode_args = mode_args(mode)
                if mode != "alone":
                    trainer.set("run")
                if gated:
                    d.start(members=["batch"], need_switch=False)
                time.sleep(0.5)
                t_0 = time.monotonic()
                # every mode of a round sees the same arrivals: their difference is the mode's
                lat = phase(load, pooled[mode]["diag"], seed=1000 * rnd + int(load * 100))
                t_1 = time.monotonic()
                if gated:
                    status = d.stop()
                trainer.set("pause")
                time.sleep(0.5)
                pm = pooled[mode]
                pm["lat"] += lat
                pm["round_p99"].append(pct(lat, 0.99))
                pm["trainer"].append(sc.rate(trainer.times(), t_0, t_1) / trainer_alone if mode != "alone" else 0.0)
                g = ((status or {}).get("gpus") or {}).get("0") or {}
                if g.get("preempt_latency_ns"):
                    pm["status"].append(g)
                    # the FIFO_DISABLE_CHANNELS calls alone (under priority nearly all are
                    # the preemptions' disables and the resumes' enables)
                    pm.setdefault("calls", []).append((status or {}).get("rm_call_ns") or {})
        for mode in modes:
            pm = pooled[mode]
            lat = pm["lat"]
            tr = sum(pm["trainer"]) / len(pm["trainer"])
            gs = pm["status"]
            # the daemon's figures of the last round (its window holds the last 10000)
            pl = gs[-1]["preempt_latency_ns"] if gs else {}
            row = {"load": load, "mode": mode, "n": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                   "p999": pct(lat, 0.999), "round_p99": pm["round_p99"], "trainer": tr,
                   "trainer_of_idle": tr / (1 - load) if load < 1 else None,
                   "preemptions": sum(g.get("preemptions") or 0 for g in gs) if gs else None,
                   "preempt_latency_ns": pl or None, "rm_call_ns": pm.get("calls"), "lat_ms": lat,
                   "diag": pm["diag"]}
            results.append(row)
            rounds = "" if len(pm["round_p99"]) < 2 else \
                " (rounds' p99 " + " ".join(f"{x:.2f}" for x in pm["round_p99"]) + ")"
            log(f"load {load:.0%} {mode:13s}: n {len(lat):5d} p50 {row['p50']:7.2f} p99 {row['p99']:7.2f} "
                f"p99.9 {row['p999']:7.2f} ms{rounds}; trainer {tr:.1%} of alone"
                + (f", {row['trainer_of_idle']:.1%} of idle" if load < 1 else "")
                + (f"; preemptions {row['preemptions']}, latency p50 {(pl.get('p50') or 0) / 1e3:.0f} "
                   f"p99 {(pl.get('p99') or 0) / 1e3:.0f} max {(pl.get('max') or 0) / 1e3:.0f} us"
                   if mode.startswith("priority") and pl else "")
                + ("; disable calls p50/p99 per round " + " ".join(
                    f"{((c.get('disable') or {}).get('p50') or 0) / 1e3:.0f}/"
                    f"{((c.get('disable') or {}).get('p99') or 0) / 1e3:.0f}" for c in pm.get("calls", [])) + " us"
                   if mode.startswith("priority") and pm.get("calls") else ""))
            dg = pm["diag"]
            if dg.get("serve_ms"):
                # requests served slowly: by the GPU (its own time) or by the machine (this
                # process waited for a CPU), or neither (the GPU was busy with someone else)
                slow = [i for i, v in enumerate(dg["serve_ms"]) if v > 4 * info["measured_ms"]]
                gpu_slow = sum(1 for i in slow if dg["gpu_ms"][i] is not None and
                               dg["gpu_ms"][i] > 0.5 * dg["serve_ms"][i])
                cpu_slow = sum(1 for i in slow if dg["runq_ms"][i] > 0.25 * dg["serve_ms"][i])
                # launching took most of it (the GPU waited for this process), and the collector ran
                launch = dg.get("launch_ms") or []
                launch_slow = sum(1 for i in slow if i < len(launch) and launch[i] is not None
                                  and launch[i] > 0.5 * dg["serve_ms"][i])
                gcs = dg.get("gc_ms") or []
                gc_slow = sum(1 for i in slow if i < len(gcs) and gcs[i] > 1.0)
                log(f"    slow requests (served in > 4x the time alone): {len(slow)}; of them GPU time > half: "
                    f"{gpu_slow}; waited for a CPU > quarter: {cpu_slow}; launching > half: {launch_slow}; "
                    f"garbage collection > 1 ms: {gc_slow}; serve p50/p99 "
                    f"{pct(dg['serve_ms'], 0.5):.2f}/{pct(dg['serve_ms'], 0.99):.2f} ms, wait p99 "
                    f"{pct(dg['wait_ms'], 0.99):.2f} ms")
    kills = []
    if args.kills:
        import random
        import signal as sg
        import threading

        rng = random.Random(14)
        sigs = [sg.SIGTERM] * args.kills + [sg.SIGKILL] * args.kills
        rng.shuffle(sigs)
        d.write_state("burst", 50, {"svc": {"weight": 1}, "batch": {"weight": 1, "priority": "offline"}})
        d.mode_args = []  # the daemon's defaults, whatever the last mode was
        for i, sig in enumerate(sigs):
            trainer.set("run")
            d.start(members=["batch"], need_switch=False)
            got: list[list[float]] = []
            th = threading.Thread(target=lambda: got.append(phase(0.9)))
            th.start()
            time.sleep(rng.uniform(0.5, 1.5))
            before = trainer.times()
            last = before[-1] if before else float("nan")
            t_kill, gone_s = d.signal(sig)
            resume = None
            end = time.monotonic() + 5
            while time.monotonic() < end and resume is None:
                resume = sc.first_after(trainer.times(), t_kill)
                time.sleep(0.002)
            th.join()
            lat = got[0] if got else []
            trainer.set("pause")
            time.sleep(0.3)
            rec = {"i": i, "signal": sg.Signals(sig).name, "batch_idle_before_ms": (t_kill - last) * 1e3,
                   "batch_resume_ms": (resume - t_kill) * 1e3 if resume else None, "exit_s": gone_s,
                   "svc_p99_ms": pct(lat, 0.99), "svc_max_ms": max(lat) if lat else float("nan")}
            kills.append(rec)
            log(f"kill {i:2d} {rec['signal']:7s}: batch idle {rec['batch_idle_before_ms']:7.1f} ms before, "
                f"resumed {rec['batch_resume_ms'] if rec['batch_resume_ms'] is None else round(rec['batch_resume_ms'], 1)} "
                f"ms after; service p99 {rec['svc_p99_ms']:.2f} max {rec['svc_max_ms']:.2f} ms")
        for s in ("SIGTERM", "SIGKILL"):
            rs = [k["batch_resume_ms"] for k in kills if k["signal"] == s]
            ok = [r for r in rs if r is not None]
            held = sum(1 for k in kills if k["signal"] == s and k["batch_idle_before_ms"] > 20)
            log(f"{s}: {len(rs)} kills, {held} with batch preempted (no progress for 20 ms before); batch resumed "
                f"after max {max(ok) if ok else float('nan'):.1f} ms, median {pct(ok, 0.5):.1f} ms; "
                f"not within 5 s: {len(rs) - len(ok)}")
    with open(svc.ctl, "w") as f:
        f.write("exit")
    trainer.stop()
    svc.proc.wait(timeout=30)
    (out / "priority.json").write_text(json.dumps({"service_ms": info["service_ms"], "trainer_alone": trainer_alone,
                                                   "rows": results, "kills": kills,
                                                   "paired": True}))  # the rounds' arrivals: see --rounds
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark gpuctl's scheduler on the nvstub stand-in (run INSIDE the guest):

    scripts/vm.sh -- bash -c 'insmod tests/standin/nvstub.ko && .venv/bin/python scripts/bench-scheduler.py'

For each scenario (policy, instances with weights/shares, which are busy) it starts one
simulated workload per instance, runs `gpuctl daemon --source nvstub_sched:NvstubSource
--probe nvstub_sched:NvstubProbe` (tests/guest/nvstub_sched.py, on the daemon's
PYTHONPATH), and prints per instance the target share and the achieved share (executed_ns
of the stand-in engine over WINDOW whole periods, aligned to the daemon's period starts, as a
fraction of what the engine executes for them ungated), the total engine utilisation, and the daemon's slot-switch latency (from a
slot boundary to the end of its FIFO_DISABLE_CHANNELS calls). Figures, no asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "guest"))
sys.path.insert(0, str(REPO / "pyctl"))

from workload import Daemon, Workload, measure, native_utilisation  # noqa: E402

from gpuslice import state as S  # noqa: E402
from gpuslice.policy import Claim, compute_shares  # noqa: E402

SCENARIOS = [
    ("fixed", [("a", 1, 0.3), ("b", 1, 0.5)], "ab"),
    ("fixed", [("a", 1, 0.2), ("b", 1, 0.3), ("c", 1, 0.4)], "ac"),
    ("weight", [("a", 1, None), ("b", 3, None)], "ab"),
    ("weight", [("a", 1, None), ("b", 2, None), ("c", 3, None)], "ab"),
    ("equal", [("a", 1, None), ("b", 1, None), ("c", 1, None)], "abc"),
    ("equal", [("a", 1, None), ("b", 1, None), ("c", 1, None), ("d", 1, None)], "abd"),
    ("burst", [("a", 1, None), ("b", 3, None)], "ab"),
    ("burst", [("a", 1, None), ("b", 2, None), ("c", 1, None)], "ab"),
]


def run(policy: str, insts: list[tuple[str, int, float | None]], busy: str, period_ms: int, windows: int,
        window: int, tmp: str, extra: list[str]) -> None:
    st = S.State(instances={n: S.Instance(n, [0], 1 << 30, weight=w, share=f) for n, w, f in insts},
                 gpus={0: S.GpuPolicy(policy, period_ms * 1_000_000)})
    path = os.path.join(tmp, f"state-{policy}.json")
    S.save(st, path)
    target = compute_shares(policy, [Claim(n, w, f) for n, w, f in insts], set(busy))
    target = {n: (t if n in busy else 0.0) for n, t in target.items()}  # an idle one's slot stays idle
    loads = [Workload.start(n, busy=n in busy) for n, _w, _f in insts]
    u0 = max(0.05, native_utilisation(loads, 1.0))
    d = Daemon(path, os.path.join(tmp, "status.json"), *extra)
    try:
        d.wait_periods(min_periods=10)
        raw = [measure(d, loads, periods=window) for _ in range(windows)]
        results = [({n: v / u0 for n, v in r[0].items()}, r[1]) for r in raw]
        rep = d.status()
    finally:
        d.stop()
        for w in loads:
            w.stop()
    label = ", ".join(f"{n}(w={w}{'' if f is None else f' f={f:.0%}'}{'' if n in busy else ' idle'})"
                      for n, w, f in insts)
    print(f"\n## {policy}, period {period_ms} ms: {label} {' '.join(extra)}".rstrip())
    print(f"{'instance':<10}{'target':>8}" + "".join(f"{'win' + str(i + 1):>8}" for i in range(windows))
          + f"{'max err':>9}")
    for n, _w, _f in insts:
        ach = [r[0][n] for r in results]
        err = max(abs(a - target[n]) for a in ach)
        print(f"{n:<10}{target[n] * 100:>7.1f}%" + "".join(f"{a * 100:>7.1f}%" for a in ach) + f"{err * 100:>7.1f}pp")
    print(f"{'total':<10}{sum(target.values()) * 100:>7.1f}%" + "".join(f"{r[1] / u0 * 100:>7.1f}%" for r in results))
    print(f"engine utilisation (executed / wall): ungated {u0 * 100:.1f}%, gated "
          + ", ".join(f"{r[1] * 100:.1f}%" for r in raw))
    lat = rep.get("switch_latency_ns", {})
    print(f"slot switches {rep.get('switches')}, RM calls {rep.get('rm_calls')}, slot boundary to gating done: "
          f"p50 {(lat.get('p50') or 0) / 1e3:.0f} us, p99 {(lat.get('p99') or 0) / 1e3:.0f} us, "
          f"max {(lat.get('max') or 0) / 1e3:.0f} us; wake bias {(rep.get('wake_bias_ns') or 0) / 1e3:.0f} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--period-ms", type=int, default=50, help="scheduling period (default 50)")
    ap.add_argument("--windows", type=int, default=3, help="measurement windows per scenario (default 3)")
    ap.add_argument("--window", type=int, default=10, help="periods per window (default 10)")
    ap.add_argument("--only", help="run only scenarios of this policy")
    ap.add_argument("--daemon-arg", action="append", default=[], help="extra gpuctl daemon argument (repeatable)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a timeout must not lose the output
    if not os.path.exists("/proc/nvstub/engine"):
        print("bench-scheduler: nvstub stand-in not loaded (run in the guest after insmod)", file=sys.stderr)
        return 2
    print(f"# gpuctl scheduler on the nvstub stand-in, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
          f"kernel {os.uname().release}, {os.cpu_count()} CPUs")
    print("# achieved = executed_ns over a window of whole periods / what the engine executed for the same")
    print("# workloads in as long with nobody gating (measured just before the daemon starts);")
    print("# 'engine utilisation' gives the raw fractions of wall time")
    with tempfile.TemporaryDirectory() as tmp:
        for policy, insts, busy in SCENARIOS:
            if args.only and policy != args.only:
                continue
            run(policy, insts, busy, args.period_ms, args.windows, args.window, tmp, args.daemon_arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does FIFO_DISABLE_CHANNELS cost the GPU time of tenants it does not name?

  python3 tests/gpu/probe_stall.py [--out DIR] [--rates 0,20,60,120,240] [--seconds 3]

Two tenants (tests/gpu/wl_mix.py) under the library, reporting to a PreloadSource of this
process: ``a`` (KIND_A, default cupy) runs, ``b`` (torch-block) is paused (it has its
channels, submits nothing). For each rate R, this process disables and re-enables b's
channels R times a second (one FIFO_DISABLE_CHANNELS call each way, as the daemon's gate
makes them) while a runs, and prints a's step rate against R = 0, and the calls' times.
If RM's call stalls the runlist, a loses about R x 2 x (call time) of each second.
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

from gpuslice.sched.rm import RmClient  # noqa: E402
from gpuslice.sched.sources import PreloadSource  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("GPUSLICE_RAW", "/tmp/gpuslice-out"))
    ap.add_argument("--rates", default="0,20,60,120,240,0")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--kind-a", default="cupy")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gs-stall-")
    sock = os.path.join(work, "s.sock")
    src = PreloadSource(sock)
    wl = str(Path(__file__).with_name("wl_mix.py"))
    ws = {n: sc.Workload(n, 0, work, sock, print, cmd=[sys.executable, wl, k])
          for n, k in (("a", a.kind_a), ("b", "torch-block"))}
    for w in ws.values():
        w.wait_ready(timeout=300)
    chans = sc.channels_of(src, ws)
    pairs = sorted(c.pair for c in chans.get("b", set()))
    print(f"channels: a {len(chans.get('a', ()))}, b {len(pairs)}")
    rm = RmClient().open()
    rows = []
    ws["a"].set("run")
    time.sleep(1.0)
    for rate in (int(r) for r in a.rates.split(",")):
        calls: list[float] = []
        t0 = time.monotonic()
        nxt = t0
        while time.monotonic() < t0 + a.seconds:
            src.refresh()
            if rate:
                for dis in (True, False):
                    c0 = time.perf_counter()
                    rm.disable_channels(0, pairs, dis)
                    calls.append(time.perf_counter() - c0)
                nxt += 1.0 / rate
                time.sleep(max(0.0, nxt - time.monotonic()))
            else:
                time.sleep(0.05)
        t1 = time.monotonic()
        r = sc.rate(ws["a"].times(), t0, t1)
        calls.sort()
        rows.append({"pairs_per_s": rate, "a_steps_per_s": r,
                     "call_ms_p50": 1e3 * calls[len(calls) // 2] if calls else None,
                     "call_ms_p99": 1e3 * calls[int(0.99 * len(calls))] if calls else None,
                     "busy_in_calls": sum(calls) / (t1 - t0)})
        time.sleep(0.3)
    ws["a"].set("pause")
    base = [r["a_steps_per_s"] for r in rows if r["pairs_per_s"] == 0]
    ref = sum(base) / len(base)
    print("| disable+enable pairs/s | a steps/s | a vs no calls | call ms p50 / p99 | time in calls |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['pairs_per_s']} | {r['a_steps_per_s']:.1f} | {100 * r['a_steps_per_s'] / ref:.1f}% | "
              f"{r['call_ms_p50'] or 0:.2f} / {r['call_ms_p99'] or 0:.2f} | {100 * r['busy_in_calls']:.1f}% |")
    Path(a.out, "stall.json").write_text(json.dumps(rows, indent=1))
    rm.close()
    for w in ws.values():
        w.stop()
    src.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

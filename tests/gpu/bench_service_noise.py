"""Where a lone service's slow requests come from (issue 14's noise), on the GPU machine.

  python3 tests/gpu/bench_service_noise.py [--load 0.6] [--seconds 6] [--phases 2]

The service of the priority benchmark (wl_service.py) alone on the GPU, no trainer, no
daemon, under three set-ups in turn: without the library, with it (LD_PRELOAD, its
sampler every 1 ms, no controller) and with it and its sampler off (GPUSLICE_SAMPLE_MS=0).
Per set-up: p50 / p99 latency and the requests served in more than 4x the median time
alone, with what their launching took (wall, this thread's CPU time, its voluntary and
involuntary context switches): a launch that blocked in the kernel shows as voluntary
switches with little CPU time; one that spun, as CPU time.
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

HERE = Path(__file__).resolve().parent
LIB = HERE.parent.parent / "preload" / "libgpuslice.so"


def pct(xs: list[float], p: float) -> float:
    v = sorted(xs)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def run(name: str, env: dict[str, str], args: argparse.Namespace, work: str) -> None:
    ctl, out = os.path.join(work, f"{name}.ctl"), os.path.join(work, f"{name}.out")
    e = {**os.environ, "SERVICE_MS": "2.5", **env}
    p = subprocess.Popen([sys.executable, str(HERE / "wl_service.py"), ctl, out], env=e,
                         stdout=subprocess.PIPE, text=True)
    info = json.loads(p.stdout.readline())
    lat: list[float] = []
    diag: dict[str, list] = {}
    for i in range(args.phases):
        tag = f"{name}{i}"
        with open(ctl, "w") as f:
            f.write(f"run {args.load} {args.seconds} {tag}")
        rec = None
        while rec is None:
            time.sleep(0.2)
            try:
                with open(out) as f:
                    for ln in f:
                        r = json.loads(ln)
                        if r["tag"] == tag:
                            rec = r
            except (OSError, ValueError):
                pass
        lat += rec["lat_ms"]
        for k, v in rec["diag"].items():
            diag.setdefault(k, []).extend(v)
    with open(ctl, "w") as f:
        f.write("exit")
    p.wait(timeout=60)
    slow = [i for i, v in enumerate(diag["serve_ms"]) if v > 4 * info["measured_ms"]]
    print(f"{name:14s}: n {len(lat)} p50 {pct(lat, 0.5):.2f} p99 {pct(lat, 0.99):.2f} ms; "
          f"measured alone {info['measured_ms']:.2f} ms; slow {len(slow)}", flush=True)
    for i in slow[:12]:
        sw = diag["launch_switches"][i]
        print(f"    serve {diag['serve_ms'][i]:6.1f} launch {diag['launch_ms'][i]:6.1f} "
              f"(cpu {diag['launch_cpu_ms'][i]:6.1f}, switches vol {sw[0]} invol {sw[1]}) "
              f"gpu {diag['gpu_ms'][i]:6.1f} runq {diag['runq_ms'][i]:.2f} ms", flush=True)
    Path(args.out, f"noise-{name}.json").write_text(json.dumps({"info": info, "lat_ms": lat, "diag": diag}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpuslice-out"))
    ap.add_argument("--load", type=float, default=0.6)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--phases", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gs-noise-")
    sock = os.path.join(work, "nobody.sock")
    pre = {"LD_PRELOAD": str(LIB), "GPUSLICE_INSTANCE": "svc", "GPUSLICE_SOCKET": sock}
    for name, env in (("plain", {}), ("preload", {**pre, "GPUSLICE_SAMPLE_MS": "1"}),
                      ("preload-nosamp", {**pre, "GPUSLICE_SAMPLE_MS": "0"}), ("plain-again", {})):
        run(name, env, args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

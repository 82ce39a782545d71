"""How is a graphics context preempted on this GPU, and what does a disable of its channels wait for?

  python3 tests/gpu/probe_gfx_preempt.py [--out DIR] [--modes native,gfxp,wfi] [--frame-ms 26]
                                         [--seconds 3] [--share 0.05]

For each mode, an OpenGL tenant ``r`` (tests/gpu/wl_mix.py egl, 2048x2048, its fragment shader
raised until a frame takes about --frame-ms, glFinish per frame) and a CuPy tenant ``c`` run
under the library (reporting to a PreloadSource of this process) and under tests/gpu/rmtrace.so,
which records what each driver asks with NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE and what
RM answers; ``native`` passes the request on as asked, ``gfxp`` / ``wfi`` ask for that graphics
mode instead (RMTRACE_PREEMPT). Then:
  1. r alone: frames per second;
  2. r's channels disabled and re-enabled 10 times a second, 20 ms off (FIFO_DISABLE_CHANNELS
     as the daemon's gate calls it): how long each disable call takes, r's rate;
  3. r and c gated by this process as the daemon's slot plan does (enable-first), r in a slot of
     --share of a 50 ms period: r's and c's rates against alone, and the disable calls of r.
Prints a table per mode and writes preempt.json; the rmtrace lines are in DIR/rmtrace.*.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sched_common as sc  # noqa: E402

from gpuslice.sched.rm import RmClient  # noqa: E402
from gpuslice.sched.sources import PreloadSource  # noqa: E402

HERE = Path(__file__).resolve().parent


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def dist(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": 1e3 * pct(xs, 0.5), "p99_ms": 1e3 * pct(xs, 0.99),
            "max_ms": 1e3 * max(xs) if xs else float("nan")}


def one_mode(mode: str, a: argparse.Namespace, rmtrace: str) -> dict:
    work = tempfile.mkdtemp(prefix=f"gs-preempt-{mode}-")
    sock = os.path.join(work, "s.sock")
    src = PreloadSource(sock)
    wl = str(HERE / "wl_mix.py")
    pre = f"{rmtrace}:{sc.SO}"
    out = os.path.join(a.out, f"rmtrace.{mode}")
    env_r = {"LD_PRELOAD": pre, "RMTRACE_OUT": out + ".r", "GS_EGL_FRAME_MS": str(a.frame_ms)}
    env_c = {"LD_PRELOAD": pre, "RMTRACE_OUT": out + ".c"}
    if mode != "native":
        env_r["RMTRACE_PREEMPT"] = mode
    ws = {"r": sc.Workload("r", 0, work, sock, print, extra_env=env_r,
                           cmd=[sys.executable, wl, "egl", "2048"]),
          "c": sc.Workload("c", 0, work, sock, print, extra_env=env_c,
                           cmd=[sys.executable, wl, "cupy"])}
    for w in ws.values():
        w.wait_ready(timeout=300)
    ch = sc.channels_of(src, ws)
    pairs = {n: sorted(c.pair for c in ch.get(n, set())) for n in ws}
    rm = RmClient().open()
    res: dict = {"mode": mode, "channels": {n: len(p) for n, p in pairs.items()}}

    def rate(n: str, t0: float, t1: float) -> float:
        return sc.rate(ws[n].times(), t0, t1)

    # 1. alone
    for n in ("r", "c"):
        ws[n].set("run")
        time.sleep(0.5)
        t0 = time.monotonic()
        time.sleep(a.seconds)
        res[f"{n}_alone_per_s"] = rate(n, t0, time.monotonic())
        ws[n].set("pause")
        time.sleep(0.3)
    # 2. r disabled 20 ms, 10 times a second
    ws["r"].set("run")
    time.sleep(0.5)
    dis: list[float] = []
    t0 = time.monotonic()
    while time.monotonic() < t0 + a.seconds:
        c0 = time.perf_counter()
        rm.disable_channels(0, pairs["r"], True)
        dis.append(time.perf_counter() - c0)
        time.sleep(0.02)
        rm.disable_channels(0, pairs["r"], False)
        time.sleep(0.08)
    res["r_gated_10hz_per_s"] = rate("r", t0, time.monotonic())
    res["disable_r_alone"] = dist(dis)
    # 3. r and c slot-gated, enable-first, r's slot = share x 50 ms
    ws["c"].set("run")
    time.sleep(0.3)
    P = 0.050
    slot_r = a.share * P
    dis_r: list[float] = []
    dis_c: list[float] = []
    t0 = time.monotonic()
    nxt = t0
    while nxt < t0 + 2 * a.seconds:
        rm.disable_channels(0, pairs["r"], False)
        c0 = time.perf_counter()
        rm.disable_channels(0, pairs["c"], True)
        dis_c.append(time.perf_counter() - c0)
        time.sleep(max(0.0, nxt + slot_r - time.monotonic()))
        rm.disable_channels(0, pairs["c"], False)
        c0 = time.perf_counter()
        rm.disable_channels(0, pairs["r"], True)
        dis_r.append(time.perf_counter() - c0)
        nxt += P
        time.sleep(max(0.0, nxt - time.monotonic()))
    t1 = time.monotonic()
    res["slot_r_share"] = a.share
    res["gated_r_per_s"] = rate("r", t0, t1)
    res["gated_c_per_s"] = rate("c", t0, t1)
    res["disable_r_gated"] = dist(dis_r)
    res["disable_c_gated"] = dist(dis_c)
    rm.disable_channels(0, pairs["r"], False)
    for w in ws.values():
        w.set("pause")
    rm.close()
    for w in ws.values():
        w.stop()
    src.close()
    with open(os.path.join(work, "r.err")) as f:
        res["r_stderr"] = [ln.strip() for ln in f if "egl_iters" in ln][:1]
    res["rmtrace"] = []
    for p in glob.glob(out + ".*"):
        with open(p) as f:
            res["rmtrace"] += [ln.strip() for ln in f if '"preempt"' in ln or "0x20801210" in ln
                               or "545264144" in ln]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("GPUSLICE_RAW", "/tmp/gpuslice-out"))
    ap.add_argument("--modes", default="native,gfxp,wfi")
    ap.add_argument("--frame-ms", type=float, default=26.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--share", type=float, default=0.05)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rmtrace = "/tmp/rmtrace.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", rmtrace, str(HERE / "rmtrace.c"),
                    "-ldl", "-lpthread"], check=True)
    rows = []
    for mode in a.modes.split(","):
        try:
            rows.append(one_mode(mode, a, rmtrace))
        except Exception as e:  # noqa: BLE001 - one mode failing must not lose the others
            rows.append({"mode": mode, "error": repr(e)})
        print(json.dumps(rows[-1]), flush=True)
    Path(a.out, "preempt.json").write_text(json.dumps(rows, indent=1))
    print("| mode | r alone /s | r gated 10 Hz /s | disable r alone p50/p99/max ms | slot-gated r, c vs alone "
          "| disable r gated p50/p99/max ms | disable c gated p50/p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['mode']} | error {r['error']} |")
            continue
        d, g, gc = r["disable_r_alone"], r["disable_r_gated"], r["disable_c_gated"]
        print(f"| {r['mode']} | {r['r_alone_per_s']:.1f} | {r['r_gated_10hz_per_s']:.1f} | "
              f"{d['p50_ms']:.1f}/{d['p99_ms']:.1f}/{d['max_ms']:.1f} | "
              f"{100 * r['gated_r_per_s'] / r['r_alone_per_s']:.1f}%, "
              f"{100 * r['gated_c_per_s'] / r['c_alone_per_s']:.1f}% | "
              f"{g['p50_ms']:.1f}/{g['p99_ms']:.1f}/{g['max_ms']:.1f} | {gc['p50_ms']:.1f}/{gc['p99_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can a process's own channel USERD (GPGet/GPPut) tell whether the channel has pending work?

Harness for tests/gpu/probe_userd.c (an LD_PRELOAD tracer that finds each CUDA channel's
USERD mapping and samples GPGet/GPPut every 1 ms); results in docs/h100-userd.md.

  probe_userd.py run --lib /tmp/probe_userd.so --out DIR     # on the GPU machine
  probe_userd.py wl SCHEDULE                                  # the workload (run by `run`)
  probe_userd.py analyse DIR                                  # re-run the analysis only

`run` starts the workload under LD_PRELOAD=LIB (PROBE_USERD_OUT=DIR/trace-TAG), reads the
channel handles the tracer printed (CHAN lines), and during the workload's *_gated phases
gates all of its channels from this process's own RM client with
NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS (bDisable=1, bOnlyDisableScheduling=0), 200 ms off /
200 ms on. Then it joins the tracer's 100 ms windows with the workload's progress and the
gate's state. Also runs a bare spin loop with the sampler off, at 1 ms and at 0.1 ms to
measure what sampling costs the workload.

Workload phases (SCHEDULE = name:seconds,...):
  idle       context exists, no GPU work (time.sleep)
  spin       4096^2 fp32 matmul + torch.cuda.synchronize(), in a loop
  sleeppoll  launch BATCH (8) matmuls, poll torch.cuda.current_stream().query() with
             time.sleep(0.0005) until done, then 10 ms of think time (sleep), repeat
  long       16384^2 fp32 matmul + synchronize (one matmul about 170 ms)
  stream2    as spin, on a second torch.cuda.Stream
  copy       64 MiB host->device then device->host (pinned), synchronize, in a loop
  *_gated    the same, while `run` gates the channels
Plan 1 (default) runs MAIN_SCHEDULE and the cost runs; plan 2 runs SCHEDULE2 with
PROBE_USERD_READ64=1 and the cost runs again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZE = 4096
BATCH = 8
THINK_S = 0.010
POLL_S = 0.0005
MAIN_SCHEDULE = ("idle:2,spin:3,idle:1.5,sleeppoll:3,idle:1,spin_gated:3.2,idle:1,"
                 "sleeppoll_gated:3.2,idle:1,spin:1")
# plan 2: long kernels, a second stream, copies; sampler with one 8-byte load per channel
SCHEDULE2 = "idle:1,long:2.5,idle:1,long_gated:3.2,idle:1,stream2:1.5,idle:0.5,copy:1.5,idle:0.5,spin:1.5"
LONG = 16384
CONTINUOUS = ("spin", "long", "stream2", "copy")
OFF_S = ON_S = 0.2


# ---------------------------------------------------------------- workload
def workload(schedule: str) -> None:
    import torch

    a = torch.randn(SIZE, SIZE, device="cuda")
    b = torch.randn(SIZE, SIZE, device="cuda")
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    s = torch.cuda.current_stream()
    if "long" in schedule:
        la = torch.randn(LONG, LONG, device="cuda")
        lb = torch.randn(LONG, LONG, device="cuda")
        la @ lb
    if "stream2" in schedule:
        s2 = torch.cuda.Stream()
        with torch.cuda.stream(s2):
            a @ b
        s2.synchronize()
    if "copy" in schedule:
        hbuf = torch.empty(16 << 20, dtype=torch.float32, pin_memory=True)
        hbuf2 = torch.empty(16 << 20, dtype=torch.float32, pin_memory=True)
        dbuf = torch.empty(16 << 20, dtype=torch.float32, device="cuda")
        dbuf.copy_(hbuf)
    torch.cuda.synchronize()
    time.sleep(0.3)  # the tracer resolves USERD every 50 ms
    print(f"READY {os.getpid()}", flush=True)
    res = []
    for item in schedule.split(","):
        name, dur = item.split(":")
        dur = float(dur)
        t0 = time.monotonic()
        print(f"PHASE {name} {t0:.6f} {dur}", flush=True)
        end = t0 + dur
        ph = {"name": name, "t0": t0, "dur": dur, "done": [], "batches": []}
        kind = name.replace("_gated", "")
        if kind == "idle":
            time.sleep(dur)
        elif kind == "spin":
            while time.monotonic() < end:
                a @ b
                torch.cuda.synchronize()
                ph["done"].append(time.monotonic())
        elif kind == "long":
            while time.monotonic() < end:
                la @ lb
                torch.cuda.synchronize()
                ph["done"].append(time.monotonic())
        elif kind == "stream2":
            while time.monotonic() < end:
                with torch.cuda.stream(s2):
                    a @ b
                s2.synchronize()
                ph["done"].append(time.monotonic())
        elif kind == "copy":
            while time.monotonic() < end:
                dbuf.copy_(hbuf, non_blocking=True)
                hbuf2.copy_(dbuf, non_blocking=True)
                torch.cuda.synchronize()
                ph["done"].append(time.monotonic())
        elif kind == "sleeppoll":
            while time.monotonic() < end:
                tl = time.monotonic()
                for _ in range(BATCH):
                    a @ b
                polls = 0
                while not s.query():
                    time.sleep(POLL_S)
                    polls += 1
                ph["batches"].append((tl, time.monotonic(), polls))
                time.sleep(THINK_S)
        else:
            raise SystemExit(f"unknown phase {name}")
        ph["t1"] = time.monotonic()
        res.append(ph)
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------- gating (own RM client)
class Gate:
    def __init__(self):
        import ctypes
        import struct

        import rmclient as rc

        self.rc = rc
        self.ctl = os.open("/dev/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        self.gpu = os.open("/dev/nvidia0", os.O_RDWR | os.O_CLOEXEC)
        fdbuf = ctypes.create_string_buffer(struct.pack("<i", self.ctl))
        self.setup = {"register_fd": rc.ioctl(self.gpu, rc.abi.IOCTL_REGISTER_FD, fdbuf)}
        r, e, self.client, st = rc.alloc(self.ctl, 0, 0, 0, rc.abi.NV01_ROOT_CLIENT)
        self.setup["client"] = [r, e, self.client, st]
        probed = ctypes.create_string_buffer(384)
        self.setup["probed"] = list(rc.control(self.ctl, self.client, self.client, 0x214, probed))
        gpu_id = struct.unpack_from("<I", probed, 0)[0]
        att = ctypes.create_string_buffer(struct.pack("<II", gpu_id, 0xFFFFFFFF) + bytes(124), 132)
        self.setup["attach"] = list(rc.control(self.ctl, self.client, self.client, 0x215, att))
        devp = ctypes.create_string_buffer(struct.pack("<II", 0, self.client) + bytes(48))
        self.setup["device"] = list(rc.alloc(self.ctl, self.client, self.client, rc.DEV, rc.abi.NV01_DEVICE_0, devp))
        subp = ctypes.create_string_buffer(struct.pack("<I", 0) + bytes(12))
        self.setup["subdevice"] = list(rc.alloc(self.ctl, self.client, rc.DEV, rc.SUB, rc.abi.NV20_SUBDEVICE_0, subp))
        self.log: list = []  # (what, t_before, t_after, [ret, errno, status])

    def call(self, pairs, on: int):
        t0 = time.monotonic()
        r = self.rc.disable(self.ctl, self.client, pairs, on)
        t1 = time.monotonic()
        self.log.append(("off" if on else "on", t0, t1, list(r)))
        return r

    def usable(self, pairs):
        """The channels RM lets this client disable (all in one call, else one by one)."""
        r = self.call(pairs, 1)
        self.call(pairs, 0)
        if r[0] == 0 and r[2] == 0:
            return pairs
        ok = []
        for p in pairs:
            r = self.call([p], 1)
            self.call([p], 0)
            if r[0] == 0 and r[2] == 0:
                ok.append(p)
        return ok

    def run(self, pairs, t_end: float) -> None:
        try:
            while time.monotonic() < t_end:
                t = time.monotonic()
                self.call(pairs, 1)
                time.sleep(max(0.0, t + OFF_S - time.monotonic()))
                t = time.monotonic()
                self.call(pairs, 0)
                time.sleep(max(0.0, t + ON_S - time.monotonic()))
        finally:
            self.call(pairs, 0)


# ---------------------------------------------------------------- harness
def run_one(args, tag: str, schedule: str, period_us: int, gate: Gate | None, read64: bool = False) -> dict:
    out = Path(args.out)
    env = dict(os.environ, LD_PRELOAD=args.lib, PROBE_USERD_OUT=str(out / f"trace-{tag}"),
               PROBE_USERD_PERIOD_US=str(period_us), PYTHONUNBUFFERED="1",
               PROBE_USERD_READ64="1" if read64 else "0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "wl", schedule]
    print(f"== {tag}: PROBE_USERD_PERIOD_US={period_us} PROBE_USERD_READ64={int(read64)} LD_PRELOAD={args.lib} {' '.join(cmd)}", flush=True)
    t_start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    info: dict = {"tag": tag, "schedule": schedule, "period_us": period_us, "pairs": [], "gates": []}
    threads = []
    wl_lines = []
    for line in p.stdout:
        wl_lines.append(line)
        if line.startswith("READY"):
            pid = int(line.split()[1])
            info["pid"] = pid
            trace = out / f"trace-{tag}.{pid}"
            pairs = []
            for tl in trace.read_text().splitlines():
                m = re.search(r"CHAN idx=(\d+) client=(0x\w+) tsg=0x\w+ h=(0x\w+)", tl)
                if m and int(m.group(1)) >= 0:
                    pairs.append((int(m.group(2), 16), int(m.group(3), 16)))
            info["pairs"] = pairs
            if gate and pairs:
                info["usable"] = gate.usable(pairs)
                print(f"   {len(pairs)} channels; RM lets the gate disable {len(info['usable'])}", flush=True)
        elif line.startswith("PHASE"):
            _, name, t0, dur = line.split()
            print(f"   phase {name} {dur}s", flush=True)
            if name.endswith("_gated") and gate and info.get("usable"):
                th = threading.Thread(target=gate.run, args=(info["usable"], float(t0) + float(dur)))
                th.start()
                threads.append(th)
        elif line.startswith("RESULT"):
            info["phases"] = json.loads(line[len("RESULT "):])
        else:
            print("   wl: " + line.rstrip(), flush=True)
    p.wait()
    for th in threads:
        th.join()
    info["rc"] = p.returncode
    info["wall_s"] = time.monotonic() - t_start
    (out / f"wl-{tag}.txt").write_text("".join(wl_lines))
    (out / f"info-{tag}.json").write_text(json.dumps(info))
    return info


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gate = Gate()
    print("gate client setup:", json.dumps(gate.setup), flush=True)
    r64 = args.plan == 2
    sched = args.schedule or (SCHEDULE2 if args.plan == 2 else MAIN_SCHEDULE)
    run_one(args, "main", sched, 1000, gate, r64)
    (out / "gate-main.json").write_text(json.dumps(gate.log))
    gate.log = []
    for tag, period in (("cost0", 0), ("cost1000", 1000), ("cost100", 100)):
        run_one(args, tag, "spin:3", period, None, r64)
    analyse(out)


# ---------------------------------------------------------------- analysis
WRE = re.compile(r"^([\d.]+) W ([\d.]+) n=(\d+) miss=(\d+) loop_us=([\d.]+)/([\d.]+) reads=(\d+) \|(.*)$")


def parse_trace(path: Path):
    lines = path.read_text().splitlines()
    wins, chans, other = [], {}, []
    for ln in lines:
        m = WRE.match(ln)
        if m:
            per = {}
            for tok in m.group(8).split():
                mm = re.match(r"c(\d+):(\d+)/(\d+)/(\d+)/(\d+),(\d+)", tok)
                if mm:
                    per[int(mm.group(1))] = tuple(int(x) for x in mm.group(2, 3, 4, 5, 6))
            wins.append({"t": float(m.group(2)), "n": int(m.group(3)), "miss": int(m.group(4)),
                         "loop_mean": float(m.group(5)), "loop_max": float(m.group(6)), "per": per})
            continue
        m = re.search(r"CHAN idx=(\d+) .*tsg=(0x\w+) h=(0x\w+) .*tsgEngineType=(\d+)", ln)
        if m:
            chans[int(m.group(1))] = {"tsg": m.group(2), "h": m.group(3), "eng": int(m.group(4))}
        other.append(ln)
    return wins, chans, other


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def analyse(out: Path) -> None:
    out = Path(out)
    rep: list[str] = []

    def p(s=""):
        rep.append(s)
        print(s, flush=True)

    info = json.loads((out / "info-main.json").read_text())
    gl = json.loads((out / "gate-main.json").read_text()) if (out / "gate-main.json").exists() else []
    trace = out / f"trace-main.{info['pid']}"
    wins, chans, other = parse_trace(trace)
    phases = info.get("phases", [])
    # disabled intervals: from the disable call's return to the enable call's return
    off_iv, t_off = [], None
    for what, t0, t1, r in gl:
        if what == "off" and r[0] == 0 and r[2] == 0:
            t_off = t1
        elif what == "on" and t_off is not None:
            off_iv.append((t_off, t1))
            t_off = None
    calls = [(w, (t1 - t0) * 1e3, r) for w, t0, t1, r in gl]
    bad = [c for c in calls if c[2][0] != 0 or c[2][2] != 0]
    p(f"channels: {len(chans)}; gate calls: {len(calls)}, failed: {len(bad)} {bad[:4]}")
    if calls:
        offs = sorted(c[1] for c in calls if c[0] == "off")
        ons = sorted(c[1] for c in calls if c[0] == "on")
        p(f"disable call ms: p50 {offs[len(offs)//2]:.2f} max {offs[-1]:.2f}; "
          f"enable call ms: p50 {ons[len(ons)//2]:.2f} max {ons[-1]:.2f}")
    p("usable for the gate: " + str(len(info.get("usable", []))) + " of " + str(len(info.get("pairs", []))))
    p("")
    p("channel index -> TSG, engineType (1 = GR0, 9+n = COPYn)")
    for i, c in sorted(chans.items()):
        p(f"  c{i}: h={c['h']} tsg={c['tsg']} engine={c['eng']}")
    for ln in other:
        if " RESOLVE " in ln or " UNRESOLVED" in ln or " COST " in ln or " SAMPLER " in ln:
            p("  " + ln)
    p("")
    base = phases[0]["t0"] if phases else 0.0
    active_ch = sorted({c for w in wins for c in w["per"]})
    p("per 100 ms window (t relative to the first phase): phase, off = fraction of the window the "
      "channels were disabled, mm = matmuls completed (spin) / batches completed (sleeppoll), "
      "out = fraction of the window a sleeppoll batch was outstanding, n = samples, "
      "then per channel cI:neq/putadv/getadv (neq = samples with GPGet != GPPut; adv in GPFIFO entries)")
    summary = defaultdict(lambda: defaultdict(float))
    chan_tot = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for w in wins:
        t1, t0 = w["t"], w["t"] - 0.1
        ph = None
        for x in phases:
            if x["t0"] <= t0 and t1 <= x.get("t1", x["t0"] + x["dur"]):
                ph = x
        if ph is None:
            continue
        off = sum(overlap(t0, t1, a, b) for a, b in off_iv) / 0.1
        if ph["name"].replace("_gated", "") in CONTINUOUS:
            mm = sum(1 for t in ph["done"] if t0 <= t < t1)
            outf = 0.0
        else:
            mm = sum(1 for b in ph["batches"] if t0 <= b[1] < t1)
            outf = sum(overlap(t0, t1, b[0], b[1]) for b in ph["batches"]) / 0.1
        per = w["per"]
        neq = sum(v[0] for v in per.values())
        put = sum(v[1] for v in per.values())
        # what a sampler reading once per 100 ms would see: GPPut moved, or GPGet != GPPut now
        coarse = put > 0 or any(v[3] != v[4] for v in per.values())
        kind = ph["name"].replace("_gated", "")
        work = kind in CONTINUOUS or outf > 0 or any(t0 <= b[0] < t1 for b in ph["batches"])
        cells = " ".join(f"c{c}:{v[0]}/{v[1]}/{v[2]}" for c, v in sorted(per.items()))
        p(f"  t={t1 - base:7.3f} {ph['name']:<16} off={off:4.2f} mm={mm:3d} out={outf:4.2f} n={w['n']:3d} "
          f"loop={w['loop_mean']:.1f}/{w['loop_max']:.1f}us | {cells}")
        gstate = "gated" if off >= 0.9 else "open" if off <= 0.1 else "mixed"
        key = (ph["name"], gstate if ph["name"].endswith("_gated") else "-")
        s = summary[key]
        s["windows"] += 1
        s["neq_any"] += neq > 0
        s["put_any"] += put > 0
        s["pending"] += (neq > 0 or put > 0)
        s["work"] += work
        s["coarse"] += coarse
        s["neq_frac"] += (max(v[0] for v in per.values()) / w["n"]) if per and w["n"] else 0.0
        s["mm"] += mm
        s["out"] += outf
        for c, v in per.items():
            for k in range(3):
                chan_tot[ph["name"]][c][k] += v[k]
    p("")
    p("summary per phase (whole windows inside the phase; gated phases split by gate state):")
    p("  work = windows in which the workload had work (continuous loops: all; sleeppoll: a batch launched or")
    p("  outstanding); neq>0 / put>0 / pending(neq|put): windows flagged by the 1 ms sampler; coarse: flagged by")
    p("  GPPut moved over the window or GPGet != GPPut at its end (what one read per 100 ms would see)")
    p("  phase            gate   windows  work  pending(neq|put)  neq>0  put>0  coarse  mean max-ch neq fraction  mm/window  out")
    for (name, g), s in summary.items():
        n = s["windows"]
        p(f"  {name:<16} {g:<6} {int(n):7d} {int(s['work']):5d} {int(s['pending']):17d} {int(s['neq_any']):6d} "
          f"{int(s['put_any']):6d} {int(s['coarse']):7d} {s['neq_frac'] / n:25.3f} {s['mm'] / n:10.2f} {s['out'] / n:5.2f}")
    p("")
    p("per channel totals per phase (neq samples / GPPut advance / GPGet advance); channels not listed: all zero")
    for name, d in chan_tot.items():
        p(f"  {name:<16} " + " ".join(f"c{c}:{v[0]}/{v[1]}/{v[2]}" for c, v in sorted(d.items())))
    p(f"  channels ever active: {active_ch}")
    for ln in other:
        if " SUMMARY " in ln:
            p("  " + ln)
    p("")
    p("cost of sampling to the workload (spin loop, 3 s, matmuls/s over the phase):")
    for tag in ("cost0", "cost1000", "cost100"):
        f = out / f"info-{tag}.json"
        if not f.exists():
            continue
        ci = json.loads(f.read_text())
        ph = ci.get("phases", [{}])[0]
        n = len(ph.get("done", []))
        rate = n / (ph["t1"] - ph["t0"]) if n else 0.0
        tr = out / f"trace-{tag}.{ci.get('pid')}"
        loops = []
        if tr.exists():
            w2, _, o2 = parse_trace(tr)
            loops = [w["loop_mean"] for w in w2 if w["n"]]
            for ln in o2:
                if " COST " in ln:
                    p(f"    {tag}: {ln}")
        lm = sum(loops) / len(loops) if loops else 0.0
        p(f"  {tag:<9} period_us={ci['period_us']:<5} matmuls={n} rate={rate:.1f}/s  mean sampling loop {lm:.1f} us")
    (out / "analysis.txt").write_text("\n".join(rep) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--lib", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--schedule", default="")
    r.add_argument("--plan", type=int, default=1, choices=(1, 2))
    w = sub.add_parser("wl")
    w.add_argument("schedule")
    a = sub.add_parser("analyse")
    a.add_argument("out")
    args = ap.parse_args()
    if args.cmd == "wl":
        workload(args.schedule)
    elif args.cmd == "run":
        run(args)
    else:
        analyse(Path(args.out))


if __name__ == "__main__":
    main()

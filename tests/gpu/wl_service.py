"""An online inference service for the priority benchmark (tests/gpu/bench_priority.py).

  wl_service.py CTLFILE OUTFILE

Builds a small transformer encoder in code (random weights, fp16: 6 layers, d_model 1024,
16 heads, batch 4 x 256 tokens), measures its standalone service time (median of 50
isolated forward passes + synchronize, 5 ms apart), prints {"ready": pid, "service_ms": ...}, then waits for
phases. A line "run LOAD SECONDS TAG [SEED]" in CTLFILE (re-read every 10 ms) runs a phase: Poisson
arrivals at LOAD x (1 / service time) per second for SECONDS, served FIFO one at a time
(with SEED, the arrivals are those of random.Random(SEED): phases given one seed see the
same request times, so modes can be compared on the same arrivals);
each request's latency is its completion minus its arrival (queueing included). At the
end of the phase one JSON line {"tag", "load", "rate", "lat_ms": [...]} is appended to
OUTFILE. "exit" ends the process. SERVICE_MS: the service time the loads are reckoned
from instead of the measured one (the rate is LOAD / SERVICE_MS). SERVICE_GC=freeze: the
objects made before the phases are frozen out of Python's garbage collector (gc.freeze(),
as latency-bound Python servers do), so a collection does not walk the model's.

SERVICE_KIND=graph: the same forward pass captured as a CUDA graph and replayed, one
launch per request (the model's own launches are Python's: about 2 ms of CPU time per
pass, which a busy or slower CPU stretches; replayed, the request's time is the GPU's).

SERVICE_BATCH=N: N sequences of 256 tokens per request instead of 4 (the request's GPU
time grows with it: a larger service, whose p99 alone can hide the hardware's switch).

SERVICE_KIND=ping: each request is one tiny kernel (an add on 256 floats) + synchronize
instead of the model, and its latency runs from the launch, not the arrival: how soon
the service's work gets the GPU (about 0.2 ms alone; beside a busy trainer, until the
trainer leaves the GPU: the takeover latency of a preemption mechanism).
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time


def runq_ns() -> int:
    """This thread's time spent waiting on a run queue so far (0 where not available)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def switches() -> tuple[int, int]:
    """This thread's voluntary and involuntary context switches so far."""
    v = n = 0
    try:
        with open("/proc/thread-self/status") as f:
            for ln in f:
                if ln.startswith("voluntary_ctxt_switches"):
                    v = int(ln.split()[1])
                elif ln.startswith("nonvoluntary_ctxt_switches"):
                    n = int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return v, n


def main() -> None:
    import torch

    ctl, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    marks: dict[str, float] = {}
    gc_ns = [0, 0]  # the collector's time so far, and when the running collection began

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            gc_ns[1] = time.monotonic_ns()
        else:
            gc_ns[0] += time.monotonic_ns() - gc_ns[1]

    gc.callbacks.append(on_gc)
    ping = os.environ.get("SERVICE_KIND") == "ping"
    if ping:
        y = torch.zeros(256, device="cuda")

        def serve() -> None:
            y.add_(1)
            torch.cuda.synchronize()
    else:
        layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 6).cuda().half().eval()
        x = torch.randn(int(os.environ.get("SERVICE_BATCH") or 4), 256, 1024, device="cuda", dtype=torch.half)

        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        graph = None
        if os.environ.get("SERVICE_KIND") == "graph":
            # the forward pass captured once and replayed: one launch per request, as
            # graph-launching inference servers do, so its time is the GPU's, not Python's
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.inference_mode():
                model(x)
            torch.cuda.synchronize()

        def serve() -> None:
            c0, s0 = time.thread_time(), switches()
            e0.record()
            if graph is not None:
                graph.replay()
            else:
                with torch.inference_mode():
                    model(x)
            e1.record()
            marks["launched"] = time.monotonic()
            s1 = switches()
            marks["launch_cpu"] = time.thread_time() - c0
            marks["launch_vol"], marks["launch_invol"] = s1[0] - s0[0], s1[1] - s0[1]
            torch.cuda.synchronize()

    for _ in range(10):
        serve()
    ts = []
    for _ in range(50):  # isolated requests, as Poisson arrivals at low load see them
        time.sleep(0.005)
        t0 = time.monotonic()
        serve()
        ts.append(time.monotonic() - t0)
    measured_s = sorted(ts)[len(ts) // 2]
    if os.environ.get("SERVICE_GC") == "freeze":
        gc.collect()
        gc.freeze()  # what exists now is never looked at again by the collector
    # SERVICE_MS fixes the time the loads are reckoned from, so runs compare at one rate
    # (the measured time moves with the GPU's clocks: 1.7 to 3.3 ms between runs)
    service_s = float(os.environ["SERVICE_MS"]) / 1e3 if os.environ.get("SERVICE_MS") else measured_s
    print(json.dumps({"ready": os.getpid(), "service_ms": service_s * 1e3, "measured_ms": measured_s * 1e3}),
          flush=True)
    rng = random.Random(1)
    done: set[str] = set()
    while True:
        try:
            with open(ctl) as f:
                cmd = f.read().split()
        except OSError:
            cmd = []
        if cmd and cmd[0] == "exit":
            return
        if len(cmd) in (4, 5) and cmd[0] == "run" and cmd[3] not in done:
            load, seconds, tag = float(cmd[1]), float(cmd[2]), cmd[3]
            arrivals = random.Random(int(cmd[4])) if len(cmd) == 5 else rng
            rate = load / service_s
            lat: list[float] = []
            # per request, to tell the machine's stalls from the GPU's: the wait before
            # serving, the serving's wall time, the GPU time between its first and last
            # kernel (CUDA events; model only), and how long this thread waited for a CPU
            # meanwhile (/proc/thread-self/schedstat: run-queue wait)
            # and of the serving: until the last kernel was launched (model only), and in
            # the garbage collector
            diag: dict[str, list[float]] = {"wait_ms": [], "serve_ms": [], "gpu_ms": [], "runq_ms": [],
                                            "launch_ms": [], "gc_ms": [], "launch_cpu_ms": [],
                                            "launch_switches": []}
            t_end = time.monotonic() + seconds
            nxt = time.monotonic() + arrivals.expovariate(rate)
            while nxt < t_end:
                now = time.monotonic()
                if now < nxt:
                    time.sleep(min(nxt - now, 0.0005))
                    continue
                arrival = nxt
                nxt += arrivals.expovariate(rate)
                t_start = time.monotonic()
                if ping:  # from the launch: how late this process woke is not the GPU's
                    arrival = t_start
                q0, g0 = runq_ns(), gc_ns[0]
                serve()
                t_done = time.monotonic()
                lat.append((t_done - arrival) * 1e3)
                diag["wait_ms"].append((t_start - arrival) * 1e3)
                diag["serve_ms"].append((t_done - t_start) * 1e3)
                diag["gpu_ms"].append(e0.elapsed_time(e1) if not ping else None)
                diag["runq_ms"].append((runq_ns() - q0) / 1e6)
                diag["launch_ms"].append((marks["launched"] - t_start) * 1e3 if not ping else None)
                diag["gc_ms"].append((gc_ns[0] - g0) / 1e6)
                # while launching: this thread's CPU time, and its (voluntary, involuntary)
                # context switches: a launch that blocked in the kernel shows as the first
                diag["launch_cpu_ms"].append(marks["launch_cpu"] * 1e3 if not ping else None)
                diag["launch_switches"].append([marks["launch_vol"], marks["launch_invol"]] if not ping else None)
            with open(out, "a") as f:
                f.write(json.dumps({"tag": tag, "load": load, "rate": rate, "lat_ms": lat, "diag": diag}) + "\n")
            done.add(tag)
        time.sleep(0.01)


if __name__ == "__main__":
    main()

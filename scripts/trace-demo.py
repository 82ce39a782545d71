#!/usr/bin/env python3
"""Real `gpuctl trace` output for docs/trace.md (run INSIDE the guest, as root):

    scripts/vm.sh -- .venv/bin/python scripts/trace-demo.py > /tmp/trace-demo.md

Loads the stand-in (tests/standin/nvstub.ko) and kmod/gpuslice.ko unless loaded, starts
three tracers (histograms, refusals, scheduler), drives traffic through two instances
(one of them hitting its memory limit), runs the scheduler daemon against two simulated
workloads for a few seconds, and prints each tracer's command and raw output as markdown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "guest"))
sys.path.insert(0, str(REPO / "pyctl"))

import nvstub  # noqa: E402
from gsinst import Instance, session  # noqa: E402
from workload import Daemon, Workload  # noqa: E402

from gpuslice import state as S  # noqa: E402
from gpuslice.netlink import GpusliceNetlink  # noqa: E402

MIB = 1 << 20
GPUCTL = str(Path(sys.executable).parent / "gpuctl")
READY = "Hit Ctrl-C to end."


def load_modules() -> None:
    if not nvstub.present():
        subprocess.run(["insmod", str(REPO / "tests/standin/nvstub.ko"), "fb_mib=81559"], check=True)
        subprocess.run(["udevadm", "settle"], check=False)
    if not os.path.exists("/sys/module/gpuslice"):
        subprocess.run(["insmod", str(REPO / "kmod/gpuslice.ko")], check=True)


class Tracer:
    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.p = subprocess.Popen([GPUCTL, "trace", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.ready = threading.Event()
        self.threads = [threading.Thread(target=self._drain, args=(f, into), daemon=True)
                        for f, into in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.threads:
            t.start()

    def _drain(self, f, into: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in f:
            into.append(line)
            if READY in line:
                self.ready.set()
        self.ready.set()

    def wait(self) -> None:
        self.ready.wait(900)
        if self.p.poll() is not None:
            raise SystemExit(f"gpuctl trace {' '.join(self.args)} exited: {''.join(self.err)}")

    def result(self) -> str:
        self.p.wait(300)
        for t in self.threads:
            t.join(30)
        return "".join(self.err) + "".join(self.out)


def traffic(nl: GpusliceNetlink) -> None:
    web, batch = Instance(nl, 64 * MIB), Instance(nl, 8 * MIB)
    web.name, batch.name = "web", "batch"
    with web, batch:
        for inst, n in ((web, 20), (batch, 5)):
            s = session(inst)
            try:
                for _ in range(n):
                    s.fb_free_kib()
                hs = [s.alloc_vidmem(2 * MIB)[1] for _ in range(3)]
                if inst is batch:
                    s.alloc_vidmem(32 * MIB)  # over the 8 MiB limit: refused
                for h in hs:
                    s.free(h)
                s.tsg_channel(timeslice_us=2000)
            finally:
                s.close()


def scheduler(tmp: str) -> None:
    st = S.State(instances={n: S.Instance(n, [0], 1 << 30, weight=w) for n, w in (("a", 1), ("b", 3))},
                 gpus={0: S.GpuPolicy("weight", 50 * 1_000_000)})
    path = os.path.join(tmp, "state.json")
    S.save(st, path)
    loads = [Workload.start(n) for n in ("a", "b")]
    d = Daemon(path, os.path.join(tmp, "status.json"))
    try:
        d.status(timeout=240)  # the daemon's start-up is slow under TCG
        d.wait_periods(min_periods=3, timeout=120)
        time.sleep(3)
    except Exception:
        d.stop()
        print(d.proc.stderr.read() if d.proc.stderr else "", file=sys.stderr)
        raise
    finally:
        d.stop()
        for w in loads:
            w.stop()


def main() -> int:
    load_modules()
    interval = "20"
    cmds = {
        "hist": ["-c", "1", "-i", interval],
        "refusals": ["--refusals", "-c", "1", "-i", interval],
    }
    tracers = {k: Tracer(v) for k, v in cmds.items()}
    for t in tracers.values():
        t.wait()
    with GpusliceNetlink() as nl:
        traffic(nl)
    for k, t in tracers.items():
        show(cmds[k], t.result())
    sched = Tracer(["--scheduler"])
    sched.wait()
    with tempfile.TemporaryDirectory() as tmp:
        scheduler(tmp)
    sched.p.send_signal(signal.SIGINT)
    show(sched.args + ["   # Ctrl-C after the daemon ran a few seconds"], sched.result())
    return 0


def show(args: list[str], output: str) -> None:
    print(f"```\n# gpuctl trace {' '.join(args)}\n{output.rstrip()}\n```\n", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""`gpuctl trace` in the guest, against gpuslice.ko on the nvstub stand-in.

One fixture starts four tracers (bcc compiles take about a minute each under TCG),
waits until each has printed its ready line, drives a known set of ioctls through two
instances and the scheduler's control from this process, then collects the outputs.
The tests compare the traced counts with the calls made, exactly.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpuslice import abi

import nvstub
from gsinst import Instance, real_session, session

MIB = 1 << 20
EVENTS = [Path("/sys/kernel/tracing/events/gpuslice"), Path("/sys/kernel/debug/tracing/events/gpuslice")]
GPUCTL = str(Path(sys.executable).parent / "gpuctl")
READY = "Hit Ctrl-C to end."
INTERVAL = 40  # seconds of the -c 1 tracer: covers the traffic with a wide margin under TCG

N_CTL_A, N_MEM_A = 5, 3
N_CTL_B, N_MEM_B = 2, 1
LIMIT_A = 8 * MIB
OVER_A = 16 * MIB
N_SCHED, N_SCHED_OTHER = 6, 3

if not os.path.isdir("/sys/kernel/tracing/events"):  # the guest may boot without tracefs mounted
    subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], capture_output=True, check=False)

pytestmark = pytest.mark.skipif(
    not (any(p.is_dir() for p in EVENTS) and nvstub.present()),
    reason="needs gpuslice.ko (its tracepoints) and nvstub.ko loaded",
)


class Tracer:
    """`gpuctl trace ARGS` in the background; stdout and stderr drained by threads."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.p = subprocess.Popen([GPUCTL, "trace", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.ready = threading.Event()
        self._threads = [threading.Thread(target=self._drain, args=(self.p.stdout, self.out), daemon=True),
                         threading.Thread(target=self._drain, args=(self.p.stderr, self.err), daemon=True)]
        for t in self._threads:
            t.start()

    def _drain(self, f: Any, into: list[str]) -> None:
        for line in f:
            into.append(line)
            if READY in line:
                self.ready.set()
        self.ready.set()  # EOF: the tracer died; wait_ready reports it

    def wait_ready(self, timeout: float = 600) -> None:
        assert self.ready.wait(timeout), f"{self.args}: no ready line in {timeout}s"
        assert self.p.poll() is None, f"{self.args} exited {self.p.returncode}: {''.join(self.err)}"

    def finish(self, interrupt: bool, timeout: float = 300) -> list[dict[str, Any]]:
        """JSON records of the run; interrupt: Ctrl-C it, else wait for it to end by itself."""
        if interrupt and self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
        rc = self.p.wait(timeout)
        for t in self._threads:
            t.join(30)
        assert rc == 0, f"{self.args} exited {rc}: {''.join(self.err)}"
        return [json.loads(line) for line in self.out if line.strip()]

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def uvm_traffic(inst: Instance) -> None:
    """UVM_INITIALIZE and UVM_PAGEABLE_MEM_ACCESS (39, the number of RM's
    NV_ESC_RM_ALLOC_MEMORY) on the instance's nvidia-uvm node."""
    fd = nvstub.open_node(inst.path("nvidia-uvm"))
    try:
        for cmd in (abi.UVM_INITIALIZE, abi.UVM_PAGEABLE_MEM_ACCESS):
            size, st_off, _fd_off = abi.UVM_PARAMS[cmd]
            p = ctypes.create_string_buffer(size)
            assert nvstub.uvm_ioctl(fd, cmd, p) == 0
            assert struct.unpack_from("<I", p, st_off)[0] == abi.NV_OK
    finally:
        os.close(fd)


def traffic(inst: Instance, n_ctl: int, n_mem: int, over: int | None) -> None:
    s = session(inst)  # REGISTER_FD, then RM_ALLOC of a client, a device and a subdevice
    uvm_traffic(inst)
    try:
        for _ in range(n_ctl):
            s.fb_free_kib()
        handles = []
        for _ in range(n_mem):
            st, h, _ = s.alloc_vidmem(MIB)
            assert st == abi.NV_OK
            handles.append(h)
        if over is not None:
            assert s.alloc_vidmem(over)[0] == abi.NV_ERR_NO_MEMORY
        for h in handles:
            assert s.free(h) == abi.NV_OK
    finally:
        s.close()


def expected(n_ctl: int, n_mem: int, refused: int) -> Counter[str]:
    return Counter({
        "REGISTER_FD": 1,
        "RM_ALLOC NV01_ROOT_CLIENT": 1,
        "RM_ALLOC NV01_DEVICE_0": 1,
        "RM_ALLOC NV20_SUBDEVICE_0": 1,
        "RM_CONTROL NV2080_CTRL_CMD_FB_GET_INFO_V2": n_ctl,
        "RM_ALLOC NV01_MEMORY_LOCAL_USER": n_mem + refused,
        "RM_FREE": n_mem,
        "UVM_INITIALIZE": 1,
        "UVM_PAGEABLE_MEM_ACCESS": 1,
    })


SCHED_OTHER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import nvstub
s = nvstub.Session()
for _ in range({N_SCHED_OTHER}):
    nvstub.disable_channels(s.ctl, s.client, s.subdevice, [], True)
s.close()
"""


@pytest.fixture(scope="module")
def run() -> Any:
    from gpuslice.netlink import GpusliceNetlink

    with GpusliceNetlink() as nl, Instance(nl, LIMIT_A) as a, Instance(nl, 64 * MIB) as b:
        tracers = {
            "inst": Tracer("--instance", a.name, "--json"),
            "ref": Tracer("--refusals", "--json"),
            "sched": Tracer("--scheduler", "--pid", str(os.getpid()), "--json"),
        }
        try:
            for t in tracers.values():
                t.wait_ready()
            # started last so that its one interval is not spent waiting for the others
            tracers["all"] = Tracer("-c", "1", "-i", str(INTERVAL), "--json")
            tracers["all"].wait_ready()
            traffic(a, N_CTL_A, N_MEM_A, OVER_A)
            traffic(b, N_CTL_B, N_MEM_B, None)
            r = real_session()
            try:
                for i in range(N_SCHED):
                    assert nvstub.disable_channels(r.ctl, r.client, r.subdevice, [], i % 2 == 0) == abi.NV_OK
            finally:
                r.close()
            subprocess.run([sys.executable, "-c", SCHED_OTHER], check=True, timeout=300)
            res = {
                "all": tracers["all"].finish(interrupt=False),
                "inst": tracers["inst"].finish(interrupt=True),
                "ref": tracers["ref"].finish(interrupt=True),
                "sched": tracers["sched"].finish(interrupt=True),
            }
        finally:
            for t in tracers.values():
                t.kill()
        yield {"a": a.name, "b": b.name, **res}


def calls_of(rec: dict[str, Any], inst: str) -> dict[str, dict[str, Any]]:
    return {c["call"]: c for c in rec["calls"] if c["instance"] == inst}


def check_calls(calls: dict[str, dict[str, Any]], want: Counter[str]) -> None:
    assert Counter({k: c["count"] for k, c in calls.items()}) == want
    for name, c in calls.items():
        assert c["total_ns"] > 0 and c["avg_total_ns"] > 0, name
        assert 0 <= c["drv_ns"] <= c["total_ns"], name
        assert c["overhead_ns"] == c["total_ns"] - c["drv_ns"], name
        assert sum(r["count"] for r in c["hist"]) == c["count"], name
        assert sum(r["count"] for r in c["overhead_hist"]) == c["count"], name
        assert all(r["low"] <= r["high"] for r in c["hist"]), name


def test_interval_counts_equal_calls_made(run: dict[str, Any]) -> None:
    recs = run["all"]
    assert [r["type"] for r in recs] == ["interval"]
    rec = recs[0]
    assert rec["mode"] == "ioctl" and rec["unit"] == "us"
    a = calls_of(rec, run["a"])
    check_calls(a, expected(N_CTL_A, N_MEM_A, 1))
    check_calls(calls_of(rec, run["b"]), expected(N_CTL_B, N_MEM_B, 0))
    mem = a["RM_ALLOC NV01_MEMORY_LOCAL_USER"]
    assert mem["refused"] == 1 and mem["errors"] == 1
    assert mem["what"] == abi.NV01_MEMORY_LOCAL_USER and mem["escape_name"] == "RM_ALLOC"
    # passed-through calls spent time in the real driver
    assert a["RM_FREE"]["drv_ns"] > 0


def test_instance_filter_shows_only_that_instance(run: dict[str, Any]) -> None:
    recs = run["inst"]
    assert [r["type"] for r in recs] == ["totals"]
    rec = recs[0]
    assert {c["instance"] for c in rec["calls"]} == {run["a"]}
    check_calls(calls_of(rec, run["a"]), expected(N_CTL_A, N_MEM_A, 1))


def test_refused_allocation_appears_in_refusals(run: dict[str, Any]) -> None:
    recs = run["ref"]
    events = [r for r in recs if r["type"] == "refusal" and r["instance"] in (run["a"], run["b"])]
    assert len(events) == 1, recs
    ev = events[0]
    assert ev["instance"] == run["a"] and ev["pid"] == os.getpid()
    assert ev["call"] == "RM_ALLOC NV01_MEMORY_LOCAL_USER"
    assert ev["reason"] == "QUOTA"
    assert ev["status"] == abi.NV_ERR_NO_MEMORY and ev["status_name"] == "NV_ERR_NO_MEMORY"
    assert ev["size"] == OVER_A
    totals = [r for r in recs if r["type"] == "totals"]
    assert len(totals) == 1 and {"instance": run["a"], "reason": "QUOTA", "count": 1} in totals[0]["refusals"]


def test_scheduler_control_latency_for_one_pid(run: dict[str, Any]) -> None:
    recs = run["sched"]
    assert [r["type"] for r in recs] == ["totals"]
    procs = recs[0]["procs"]
    assert [p["pid"] for p in procs] == [os.getpid()]  # the other process's controls are filtered out
    p = procs[0]
    assert p["count"] == N_SCHED and p["errors"] == 0
    assert p["avg_ns"] > 0 and p["max_ns"] >= p["avg_ns"]
    assert sum(r["count"] for r in p["hist"]) == N_SCHED

"""Activity probes: which instances have runnable GPU work now (for equal and burst).

A probe is sampled once per scheduling period. An instance counts as active when any
of its channels had work in that sample:

* NvstubProbe - the stand-in's /proc/nvstub/engine: pending_ns > 0, or executed_ns
  grew since the previous sample (guest tests, benchmarks);
* NvmlProbe   - NVML per-process SM utilisation on a real GPU: any of the instance's
  processes used the SMs since the previous sample. Idle instances are left ungated
  by the scheduler under work-conserving policies, so their first work shows up here;
* AllActive   - everyone with a channel is active (no probe available).
"""

from __future__ import annotations

import time
from typing import Mapping, Protocol

from .sources import Channel, parse_engine


class Probe(Protocol):
    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]: ...


class AllActive:
    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        return {n for n, cs in chans.items() if cs}


class NvstubProbe:
    def __init__(self, path: str = "/proc/nvstub/engine") -> None:
        self.path = path
        self._executed: dict[tuple[int, int], int] = {}

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        with open(self.path) as f:
            rows = parse_engine(f.read())
        busy: set[tuple[int, int]] = set()
        executed: dict[tuple[int, int], int] = {}
        for r in rows:
            key = (r["client"], r["channel"])
            executed[key] = r.get("executed_ns", 0)
            if r.get("pending_ns", 0) > 0 or executed[key] > self._executed.get(key, executed[key]):
                busy.add(key)
        self._executed = executed
        return {n for n, cs in chans.items() if any(c.pair in busy for c in cs)}


class NvmlProbe:
    """NVML process utilisation (pynvml).

    NVML takes its per-process samples far less often than a scheduling period (tens to
    hundreds of ms), so most calls find no new sample (NVML_ERROR_NOT_FOUND). A process
    therefore counts as busy while its last busy sample is younger than ``hold_s`` or two
    sample intervals, whichever is longer; a call without new samples keeps that state
    (it used to report everyone idle, which under equal/burst left everyone ungated)."""

    def __init__(self, threshold_pct: int = 1, hold_s: float = 0.3) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.threshold = threshold_pct
        self.hold_s = hold_s
        self._last_us: dict[int, int] = {}  # newest sample timestamp seen per GPU (NVML's lastSeen)
        self._interval_us: dict[int, float] = {}  # smoothed time between samples per GPU
        self._busy_at: dict[int, float] = {}  # pid -> timestamp (s) of its last busy sample
        self._handles: dict[int, object] = {}

    def _handle(self, gpu: int) -> object:
        if gpu not in self._handles:
            self._handles[gpu] = self.nvml.nvmlDeviceGetHandleByIndex(gpu)
        return self._handles[gpu]

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        now = time.time()
        hold = self.hold_s
        for gpu in {c.gpu for cs in chans.values() for c in cs}:
            h = self._handle(gpu)
            since = self._last_us.get(gpu, 0)
            try:
                samples = self.nvml.nvmlDeviceGetProcessUtilization(h, since)
            except self.nvml.NVMLError:
                samples = []  # NVML_ERROR_NOT_FOUND: no samples since `since`
            stamps = sorted({int(s.timeStamp) for s in samples if int(s.timeStamp) > since})
            if since and stamps:
                gap = (stamps[-1] - since) / len(stamps)
                old = self._interval_us.get(gpu)
                self._interval_us[gpu] = gap if old is None else 0.8 * old + 0.2 * gap
            if stamps:
                self._last_us[gpu] = stamps[-1]
            for s in samples:
                if s.smUtil >= self.threshold:
                    pid = int(s.pid)
                    self._busy_at[pid] = max(self._busy_at.get(pid, 0.0), int(s.timeStamp) / 1e6)
            hold = max(hold, 2 * self._interval_us.get(gpu, 0.0) / 1e6)
        busy_pids = {p for p, t in self._busy_at.items() if now - t <= hold}
        self._busy_at = {p: t for p, t in self._busy_at.items() if now - t <= 60}
        return {n for n, cs in chans.items() if any(c.pid in busy_pids for c in cs)}

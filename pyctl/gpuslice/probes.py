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
    """NVML process utilisation (pynvml). ``minors`` maps GPU minor -> NVML index."""

    def __init__(self, threshold_pct: int = 1) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.threshold = threshold_pct
        self._last_us: dict[int, int] = {}
        self._handles: dict[int, object] = {}

    def _handle(self, gpu: int) -> object:
        if gpu not in self._handles:
            self._handles[gpu] = self.nvml.nvmlDeviceGetHandleByIndex(gpu)
        return self._handles[gpu]

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        busy_pids: set[int] = set()
        for gpu in {c.gpu for cs in chans.values() for c in cs}:
            h = self._handle(gpu)
            since = self._last_us.get(gpu, 0)
            self._last_us[gpu] = int(time.time() * 1e6)
            try:
                samples = self.nvml.nvmlDeviceGetProcessUtilization(h, since)
            except self.nvml.NVMLError:
                continue  # NVML_ERROR_NOT_FOUND: no samples since `since`
            for s in samples:
                if s.smUtil >= self.threshold:
                    busy_pids.add(int(s.pid))
        return {n for n, cs in chans.items() if any(c.pid in busy_pids for c in cs)}

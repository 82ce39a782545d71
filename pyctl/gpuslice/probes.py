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
    """NVML process utilisation (pynvml), sampled by a background thread.

    A process counts as busy while its last sample with SM utilisation >= threshold is
    younger than ``hold_s`` (default 2.5 s, see below). The thread asks NVML every ``poll_s`` for the samples of the
    last ``lookback_s`` (not "since the newest sample seen": processes are sampled at
    different moments, and that skipped some), so :meth:`active` costs the scheduler
    nothing at its period boundary (one NVML call took milliseconds on an H100, which
    delayed the first slot of every period), and a call with no new samples no longer
    reports everyone idle (which under equal/burst left everyone ungated)."""

    def __init__(self, threshold_pct: int = 1, hold_s: float | None = None, poll_s: float = 0.05,
                 lookback_s: float | None = None, thread: bool = True) -> None:
        import os
        import threading

        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.threshold = threshold_pct
        # On the H100 (driver 580) a busy process shows up in NVML's samples only about
        # twice a second, irregularly: a 0.5 s hold missed 30-50% of busy processes
        # (docs/h100-scheduler.md). 2.5 s keeps misses rare, at the price of noticing
        # an instance going idle that much later. GPUSLICE_NVML_HOLD_S overrides it.
        if hold_s is None:
            hold_s = float(os.environ.get("GPUSLICE_NVML_HOLD_S", "2.5"))
        self.hold_s = hold_s
        self.poll_s = poll_s
        self.lookback_s = lookback_s if lookback_s is not None else hold_s + 1.0
        self._busy_at: dict[int, float] = {}  # pid -> timestamp (s) of its last busy sample
        self._handles: dict[int, object] = {}
        self._gpus: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._loop, name="nvml-probe", daemon=True)

    def _handle(self, gpu: int) -> object:
        if gpu not in self._handles:
            self._handles[gpu] = self.nvml.nvmlDeviceGetHandleByIndex(gpu)
        return self._handles[gpu]

    def sample(self) -> None:
        """One NVML query per GPU in use; updates the busy times."""
        with self._lock:
            gpus = set(self._gpus)
        since = int((time.time() - self.lookback_s) * 1e6)
        for gpu in gpus:
            try:
                samples = self.nvml.nvmlDeviceGetProcessUtilization(self._handle(gpu), since)
            except self.nvml.NVMLError:
                continue  # NVML_ERROR_NOT_FOUND: no samples in the window
            with self._lock:
                for s in samples:
                    if s.smUtil >= self.threshold:
                        pid = int(s.pid)
                        self._busy_at[pid] = max(self._busy_at.get(pid, 0.0), int(s.timeStamp) / 1e6)

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # keep sampling; the scheduler falls back on the last state
                pass
            time.sleep(self.poll_s)

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        gpus = {c.gpu for cs in chans.values() for c in cs}
        with self._lock:
            new = gpus - self._gpus
            self._gpus |= gpus
        if self._thread is None or new:
            self.sample()  # a GPU seen for the first time (or no thread): ask now
        if self._thread is not None and not self._thread.is_alive():
            self._thread.start()
        now = time.time()
        with self._lock:
            busy_pids = {p for p, t in self._busy_at.items() if now - t <= self.hold_s}
            self._busy_at = {p: t for p, t in self._busy_at.items() if now - t <= 60}
        return {n for n, cs in chans.items() if any(c.pid in busy_pids for c in cs)}

"""Activity probes: which instances have runnable GPU work now (for equal and burst).

A probe is sampled once per scheduling period. An instance counts as active when any
of its channels had work in that sample:

* NvmlProbe   - NVML per-process SM utilisation on a real GPU: any of the instance's
  processes used the SMs since the previous sample. Idle instances are left ungated
  by the scheduler under work-conserving policies, so their first work shows up here.
  On an H100 NVML samples a busy process only about twice a second, so it needs a
  2.5 s hold and reacts seconds late (docs/h100-scheduler.md);
* CpuProbe    - the CPU time of the instance's processes over the last period (one
  clock_gettime per process, ns precision), corrected by NVML: a CUDA process with
  queued or running GPU work is on the CPU (it launches, or spin-waits in a
  synchronize, also while it is gated), an idle one sleeps. Reacts within one period
  in both directions. NVML, when present, covers the case the CPU gets wrong the
  other way: a process NVML saw busy on the GPU after two seconds off the CPU
  (blocking sync) is judged by NVML alone from then on. NVML cannot tell CPU-only
  work from gated GPU work: on an H100 its per-process samples (about every 200 ms)
  alias with the slot rotation and missed busy, gated processes for seconds, so a
  "no GPU sample for the NVML hold" rule dropped busy workloads (docs/h100-scheduler.md);
* SubmitProbe - work submitted on the instance's channels, as the LD_PRELOAD library
  reads it in their USERD (GPPut moved or GPGet != GPPut; preload/userd.c) and reports
  as CHANNEL_WORK events: does not depend on how a process waits (spin, sleep-poll,
  blocking event). A submission, not a completion, signal: an instance counts as busy
  for ``hold_s`` after its last report (a kernel longer than that looks idle; 163 ms
  matmuls needed 200 ms on the H100, docs/h100-userd.md). With --probe auto it is
  or-ed with CpuProbe when the source carries the reports;
* AnyOf       - active for any of several probes;
* AllActive   - everyone with a channel is active (no probe available).

Whatever the probe, the scheduler keeps an instance that was busy when it was gated busy
until it has had the GPU (been enabled) for a whole period in total without being seen
busy: a gated channel shows no new work, and a process whose threads sleep while they
wait looks idle (policy.sticky_active).

`gpuctl daemon --probe MODULE:CLASS` takes any other class with the method of
:class:`Probe`, constructed with no arguments (how tests plug in their own). One that
can also be asked with the scheduler's short hold for online instances declares it as
:class:`HoldProbe` (``takes_hold = True``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from gpuslice.sched.sources import Channel


class Probe(Protocol):
    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]: ...


@runtime_checkable
class HoldProbe(Protocol):
    """A probe that takes a hold of the caller's: ``active(chans, hold_ns=H)`` counts an
    instance busy only within H of its last work (the online hold). ``takes_hold`` says
    whether it does (AnyOf: whether any of its probes does); :func:`hold_probe`."""

    takes_hold: bool

    def active(self, chans: Mapping[str, set[Channel]], hold_ns: int | None = None) -> set[str]: ...


def hold_probe(p: Probe) -> HoldProbe | None:
    """``p`` as a probe that takes a hold, or None where it takes none."""
    return p if isinstance(p, HoldProbe) and p.takes_hold else None


class AllActive:
    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        return {n for n, cs in chans.items() if cs}


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
        self._samples: deque[tuple[int, float]] = deque(maxlen=4096)  # (pid, ts) of busy samples
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
                        pid, ts = int(s.pid), int(s.timeStamp) / 1e6
                        if ts > self._busy_at.get(pid, 0.0):
                            self._busy_at[pid] = ts
                            self._samples.append((pid, ts))

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # keep sampling; the scheduler falls back on the last state
                pass
            time.sleep(self.poll_s)

    def watch(self, chans: Mapping[str, set[Channel]]) -> None:
        """Sample the GPUs of these channels from now on (the first time: at once)."""
        gpus = {c.gpu for cs in chans.values() for c in cs}
        with self._lock:
            new = gpus - self._gpus
            self._gpus |= gpus
        if self._thread is None or new:
            self.sample()  # a GPU seen for the first time (or no thread): ask now
        if self._thread is not None and not self._thread.is_alive():
            self._thread.start()

    def busy_pids(self, now: float) -> set[int]:
        """Processes with a busy sample within the hold."""
        with self._lock:
            busy = {p for p, t in self._busy_at.items() if now - t <= self.hold_s}
            self._busy_at = {p: t for p, t in self._busy_at.items() if now - t <= 60}
        return busy

    def busy_samples(self, since: float) -> list[tuple[int, float]]:
        """(pid, timestamp) of every busy sample newer than ``since``."""
        with self._lock:
            return [(p, t) for p, t in self._samples if t > since]

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        self.watch(chans)
        busy_pids = self.busy_pids(time.time())
        return {n for n, cs in chans.items() if any(c.pid in busy_pids for c in cs)}


class SubmitProbe:
    """Active = a channel of the instance reported submitted work within ``hold_s``, or
    was first seen within ``hold_s`` (a new workload gets a slot before its first report).
    ``source`` is a channel source with work_seen() (sources.EventTracker)."""

    takes_hold = True  # active(chans, hold_ns): the scheduler's short hold for online instances

    def __init__(self, source: Any, hold_s: float = 0.3, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.source = source
        self.hold_ns = int(hold_s * 1e9)
        self.clock = clock
        self._first: dict[tuple[int, int], int] = {}

    def active(self, chans: Mapping[str, set[Channel]], hold_ns: int | None = None) -> set[str]:
        """Busy within ``hold_ns`` (default: the probe's hold) of a report or first sight."""
        hold = self.hold_ns if hold_ns is None else hold_ns
        now = self.clock()
        work = self.source.work_seen()
        live = {c.pair for cs in chans.values() for c in cs}
        for pair in live - set(self._first):
            self._first[pair] = now
        for pair in set(self._first) - live:
            del self._first[pair]
        recent = {p for p in live if now - max(work.get(p, self._first[p]), self._first[p]) <= hold}
        return {n for n, cs in chans.items() if any(c.pair in recent for c in cs)}


class AnyOf:
    """Active for any of ``probes``. ``active(chans, hold_ns)`` (the scheduler's short
    hold for online instances) asks only the probes that take a hold."""

    def __init__(self, *probes: Probe) -> None:
        self.probes = probes
        self.takes_hold = any(hold_probe(p) is not None for p in probes)

    def active(self, chans: Mapping[str, set[Channel]], hold_ns: int | None = None) -> set[str]:
        out: set[str] = set()
        for p in self.probes:
            if hold_ns is None:
                out |= p.active(chans)
            else:
                hp = hold_probe(p)
                if hp is not None:
                    out |= hp.active(chans, hold_ns=hold_ns)
        return out


def process_cpu_ns(pid: int) -> int | None:
    """CPU time (user + system, all threads) of process ``pid`` in ns; None if it is gone.

    The process's CPU-time clock (clock_getcpuclockid(3)): clockid = (~pid << 3) | 2,
    CPUCLOCK_SCHED of the whole thread group (include/linux/posix-timers.h)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return None


class _Proc:
    """What CpuProbe remembers of one process."""

    def __init__(self, now: float, cpu: int) -> None:
        self.at, self.cpu = now, cpu
        self.idle_since: float | None = now  # start of the current CPU-idle stretch; None: busy
        self.low_cpu_gpu = False  # seen busy on the GPU while idle on the CPU: NVML judges it


class CpuProbe:
    """Active = some process of the instance used at least ``threshold`` of a CPU over
    the last sample interval (one scheduling period), with NVML's correction for
    blocking-sync processes (see the module docstring). ``nvml`` is an NvmlProbe or
    None (CPU only).

    A process seen for the first time counts as active (it gets a slot in its first
    period and is judged from its second), so a new workload never waits."""

    def __init__(self, threshold: float = 0.25, nvml: NvmlProbe | None = None,
                 offcpu_s: float = 2.0, read_cpu: Callable[[int], int | None] = process_cpu_ns,
                 clock: Callable[[], float] = time.time) -> None:
        self.threshold = threshold
        self.nvml = nvml
        self.offcpu_s = offcpu_s
        self.read_cpu = read_cpu
        self.clock = clock
        self._procs: dict[int, _Proc] = {}
        self._nvml_seen = 0.0  # newest NVML sample looked at

    def _cpu_busy(self, pid: int, now: float) -> bool | None:
        cpu = self.read_cpu(pid)
        if cpu is None:
            self._procs.pop(pid, None)
            return None
        p = self._procs.get(pid)
        if p is None:
            self._procs[pid] = _Proc(now, cpu)
            return True
        dt = now - p.at
        if dt <= 0:
            return p.idle_since is None
        busy = (cpu - p.cpu) / 1e9 / dt >= self.threshold
        p.at, p.cpu = now, cpu
        if busy:
            p.idle_since = None
        elif p.idle_since is None:
            p.idle_since = now
        return busy

    def _learn_from_nvml(self, nvml: NvmlProbe) -> None:
        """Flag processes NVML saw on the GPU after ``offcpu_s`` or more off the CPU."""
        for pid, ts in nvml.busy_samples(self._nvml_seen):
            self._nvml_seen = max(self._nvml_seen, ts)
            p = self._procs.get(pid)
            if p is not None and p.idle_since is not None and ts - p.idle_since >= self.offcpu_s:
                p.low_cpu_gpu = True

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        now = self.clock()
        nvml_busy: set[int] = set()
        if self.nvml is not None:
            self.nvml.watch(chans)
            self._learn_from_nvml(self.nvml)
            nvml_busy = self.nvml.busy_pids(now)
        pids = {c.pid for cs in chans.values() for c in cs if c.pid}
        busy: set[int] = set()
        for pid in pids:
            on_cpu = self._cpu_busy(pid, now)
            p = self._procs.get(pid)
            if on_cpu is None or p is None:
                continue
            if p.low_cpu_gpu:
                if pid in nvml_busy:
                    busy.add(pid)
            elif on_cpu:
                busy.add(pid)
        for pid in set(self._procs) - pids:
            del self._procs[pid]
        return {n for n, cs in chans.items() if any(c.pid in busy for c in cs)}

"""The daemon loop: per GPU, per period, compute shares, lay out slots, gate channels.

Each GPU runs its own timeline of periods on one monotonic clock; the loop sleeps until
the earliest slot boundary of any GPU and applies that GPU's gating there: the slot's
owner is enabled, every other gated instance of that GPU disabled (outgoing first).
At each period start of a GPU the loop re-reads the state file if it changed (a live
policy or weight change takes effect at the next period start, i.e. within one
period), refreshes the channel source and samples the activity probe.

Who is gated: under fixed and weight every instance of the GPU is confined to its slot
(idle capacity stays idle). Under equal and burst idle instances are left enabled -
they use nothing, and their first work becomes visible to the probe - and get a slot
from the next period on (within two periods of starting work).

:class:`Scheduler` is the loop that wires the parts, each in a module of its own:

* sched/config.py - the state file, the module's instances, what the source is told;
* sched/planner.py - a period's Plan from the configuration, channels and probe;
* sched/switcher.py - slot boundaries, the gate calls, preemption by online work;
* sched/timeline.py - each GPU's timeline (the plan in force, its accounts);
* sched/report.py - the status snapshot and status.json.

The Scheduler itself keeps the channels (refreshed from the source at most every
millisecond) and the timelines, and sleeps between boundaries.

Exit safety is the caller's (cli daemon) together with Scheduler.close():
close() re-enables everything the gate disabled; start() first re-enables every
channel of every instance (a SIGKILLed predecessor may have left some disabled).
"""

from __future__ import annotations

import logging
import os
import select
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from gpuslice import state as st
from gpuslice.sched import config, planner, report
from gpuslice.sched.config import ONLINE_SAMPLE_US, Config
from gpuslice.sched.gate import Gate
from gpuslice.sched.planner import Plan
from gpuslice.sched.probes import Probe
from gpuslice.sched.sources import Channel, Source, Waitable
from gpuslice.sched.switcher import Switcher
from gpuslice.sched.timeline import GpuTimeline

log = logging.getLogger("gpuslice.sched.scheduler")


def on_instance_gpus(chans: Mapping[str, set[Channel]],
                     gpus_of: Mapping[str, Sequence[int]]) -> dict[str, set[Channel]]:
    """Each instance's channels, on its own GPUs only. A channel's GPU is what the source
    says; the user-space build's library says it from inside the container, which can
    lie. One reported on a GPU that is not its instance's is put on every GPU of its
    instance, so that it is gated wherever it can run (before, it was gated nowhere: a
    GPU's plan takes the channels reported on it). On the GPUs it is not on, RM refuses
    the call, and that GPU's switches fall back to one call per channel. Instances the
    state does not know keep their channels as reported."""
    out: dict[str, set[Channel]] = {}
    for name, cs in chans.items():
        gpus = gpus_of.get(name)
        if not gpus:
            out[name] = set(cs)
            continue
        mine = set()
        for c in cs:
            mine |= {c} if c.gpu in gpus else {replace(c, gpu=g) for g in gpus}
        out[name] = mine
    return out


class Scheduler:
    """The loop: wires the configuration, the channel source, the planner, the switcher
    and the report (see the module's docstring), and is the switcher's SwitchHost."""

    def __init__(self, state_path: str | None, source: Source, gate: Gate, probe: Probe,
                 netlink: Any = None, clock: Callable[[], int] = time.monotonic_ns,
                 status_path: str | None = None, wake_fd: int | None = None,
                 state_obj: st.State | None = None, preempt_poll_ns: int = 1_000_000,
                 online_hold_ns: int = 5_000_000, preempt_after_ns: int = 0,
                 online_sample_us: int = ONLINE_SAMPLE_US) -> None:
        self.config = Config(state_path, netlink, state_obj)
        self._source = source
        self._gap = config.gap_source(source)
        self.probe = probe
        self.clock = clock
        self.wake_fd = wake_fd
        self.switcher = Switcher(gate, self, clock, preempt_poll_ns)
        self.status = report.StatusFile(status_path)
        self.timelines: dict[int, GpuTimeline] = {}
        self.chans: dict[str, set[Channel]] = {}
        self._refreshed_at = -1
        self.started = False
        self.stopping = False
        self.wake_bias_ns = 0
        self._source_ready = False
        self.online_hold_ns = online_hold_ns
        # online work must have lasted this long (no quiet gap longer than the online
        # hold) before the offline channels are disabled: shorter bursts are left to the
        # hardware's timeslices (planner.OFFLINE_TIMESLICE_US), which take the GPU from
        # offline work within one offline slice without an RM call
        self.preempt_after_ns = preempt_after_ns
        self.online_sample_us = online_sample_us

    # the parts' state, for callers and tests
    @property
    def state(self) -> st.State:
        return self.config.state

    @property
    def source(self) -> Source:
        return self._source

    @source.setter
    def source(self, source: Source) -> None:
        self._source = source
        self._gap = config.gap_source(source)

    @property
    def gate(self) -> Gate:
        return self.switcher.gate

    @gate.setter
    def gate(self, gate: Gate) -> None:
        self.switcher.gate = gate

    @property
    def preempt_poll_ns(self) -> int:
        return self.switcher.preempt_poll_ns

    @preempt_poll_ns.setter
    def preempt_poll_ns(self, ns: int) -> None:
        self.switcher.preempt_poll_ns = ns

    # --- configuration (sched/config.py) ---
    def reload_state(self, force: bool = False) -> bool:
        return self.config.reload(force)

    def set_state(self, new: st.State) -> None:
        """Replace the configuration directly (tests, benchmarks)."""
        self.config.set_state(new)

    def sync_kernel(self) -> None:
        """Tell the module each instance's weight, share and timeslice."""
        self.config.sync_kernel()

    def hold_ns(self) -> int:
        """The online hold in effect (config.hold_ns)."""
        return config.hold_ns(self.online_hold_ns, self._gap)

    def plan_outdated(self) -> bool:
        """Whether the state file changed since it was read; if so the next plan reads it."""
        if self.config.changed_on_disk():
            self._refreshed_at = -1
            return True
        return False

    # --- lifecycle ---
    def start(self) -> None:
        self.reload_state(force=True)
        self.config.tell_source(self.source, self.online_sample_us, self.online_hold_ns)
        self.source.refresh()
        self.chans = self.source.channels()
        everything = {c for cs in self.chans.values() for c in cs}
        if everything:
            log.info("start: re-enabling %d channel(s) of %d instance(s)", len(everything), len(self.chans))
            self.gate.enable_all(everything)
        now = self.clock()
        self.timelines = {}
        self.started = True
        self._sync_timelines(now)

    def close(self) -> None:
        """Re-enable everything we disabled. Safe to call more than once."""
        self.stopping = True
        self.gate.release_all()
        if self.switcher.switches:
            snap = self.snapshot()
            log.info("%d slot switches, %d RM calls; switch latency %s; FIFO_DISABLE_CHANNELS call ns %s",
                     self.switcher.switches, self.switcher.rm_calls, snap["switch_latency_ns"], snap["rm_call_ns"])

    def _sync_timelines(self, now: int) -> None:
        gpus = set(self.state.used_gpus()) | {c.gpu for cs in self.chans.values() for c in cs}
        for g in gpus:
            if g not in self.timelines:
                self.timelines[g] = GpuTimeline(g, period_start=now)
                self.timelines[g].idx = 0
                self.switcher.start_period(self.timelines[g], now)
        for g in list(self.timelines):
            if g not in gpus:
                del self.timelines[g]
                self.switcher.release(g)

    # --- per period ---
    def refresh(self, now: int) -> None:
        """Re-read the configuration if it changed and the source's channels (at most
        every millisecond)."""
        if self._refreshed_at >= 0 and now - self._refreshed_at < 1_000_000:
            return
        self._refreshed_at = now
        self.reload_state()
        self.config.tell_source(self.source, self.online_sample_us, self.online_hold_ns)
        try:
            self.source.refresh()
        except OSError as e:
            log.warning("channel source: %s", e)
        new = on_instance_gpus(self.source.channels(), {n: i.gpus for n, i in self.state.instances.items()})
        old = {c for cs in self.chans.values() for c in cs}
        cur = {c for cs in new.values() for c in cs}
        gone = old - cur
        if gone:
            self.gate.forget(gone)
        if {n for n, cs in self.chans.items() if cs} != {n for n, cs in new.items() if cs}:
            self.status.soon = True  # which instances have channels changed: reported without the 0.5 s wait
        self.chans = new

    def make_plan(self, gpu: int, now: int) -> Plan:
        """Refresh, then plan ``gpu``'s next period (planner.make_plan)."""
        self.refresh(now)
        return planner.make_plan(gpu, now, state=self.state, chans=self.chans, probe=self.probe,
                                 hold_ns=self.hold_ns, preempt_after_ns=self.preempt_after_ns,
                                 tl=self.timelines.get(gpu))

    def step(self) -> int:
        """Handle every boundary that is due; return ns until the next one."""
        if not self.started:
            self.start()
        now = self.clock()
        if self._source_ready:
            self._refreshed_at = -1  # read the new lines now (else they wake us again)
        for tl in list(self.timelines.values()):
            guard = 0
            while tl.next_boundary() <= now and guard < 1000:
                self.switcher.boundary(tl, now)
                guard += 1
                now = self.clock()
            if tl.plan.watch and (now >= tl.next_watch or self._source_ready):
                self.switcher.watch(tl, now)
                now = self.clock()
        self._source_ready = False
        self._sync_timelines(now)
        if self.status.path and self.status.due(now, self.timelines):
            self.status.last = now
            self.status.soon = False
            self.write_status()
            self.status.cost_ns = int(0.8 * self.status.cost_ns + 0.2 * (self.clock() - now))
        if not self.timelines:
            return 50_000_000
        nxt = min(min(tl.next_boundary(), tl.next_watch if tl.plan.watch else tl.next_boundary())
                  for tl in self.timelines.values())
        return max(0, nxt - self.clock())

    def run(self, should_stop: Callable[[], bool], until_ns: int | None = None) -> None:
        """Loop until ``should_stop()`` (checked after every wake-up) or ``until_ns``.

        Sleeps end ``wake_bias_ns`` early: an average of how late past sleeps ended
        (timer slack, scheduling delay), so that slot switches happen on time."""
        if not self.started:
            self.start()
        while not should_stop():
            if until_ns is not None and self.clock() >= until_ns:
                break
            wait = self.step()
            if until_ns is not None:
                wait = min(wait, max(0, until_ns - self.clock()))
            if wait <= 0:
                continue
            sleep = wait - self.wake_bias_ns
            if sleep < 50_000:  # too close for the bias: just wait for it
                self._wait(wait / 1e9)
                continue
            target = self.clock() + sleep
            self._wait(sleep / 1e9)
            late = self.clock() - target
            if late >= 0:
                self.wake_bias_ns = min(2_000_000, int(0.9 * self.wake_bias_ns + 0.1 * late))

    def _wait(self, seconds: float) -> None:
        """Sleep until the next boundary, a signal (wake_fd), or, while a GPU watches its
        online instances, new lines from a source that can be waited on (CHANNEL_WORK:
        the preemption starts when the report arrives, not at the next poll)."""
        fds = [] if self.wake_fd is None else [self.wake_fd]
        if isinstance(self.source, Waitable) and any(tl.plan.watch for tl in self.timelines.values()):
            fds += self.source.filenos()
        if not fds:
            time.sleep(seconds)
            return
        if max(fds) < 1024:  # select's microseconds, while every fd fits in its FD_SETSIZE
            r, _, _ = select.select(fds, [], [], seconds)
        else:  # many connections: poll (whole milliseconds) rather than a ValueError
            p = select.poll()
            for fd in fds:
                p.register(fd, select.POLLIN)
            r = [fd for fd, _ev in p.poll(max(0.0, seconds) * 1000)]
        if self.wake_fd is not None and self.wake_fd in r:
            try:
                os.read(self.wake_fd, 512)
            except BlockingIOError:
                pass
        if any(fd != self.wake_fd for fd in r):
            self._source_ready = True

    # --- reporting (sched/report.py) ---
    def snapshot(self) -> dict[str, Any]:
        return report.snapshot(self.clock(), self.switcher, self.timelines, self.state, self.chans,
                               self.wake_bias_ns)

    def write_status(self) -> None:
        if not self.status.path:
            return
        self.status.write(self.snapshot())

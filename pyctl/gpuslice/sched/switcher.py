"""Gating: what each slot boundary does to the channels, and preemption between them.

This module owns the gate calls. At a slot boundary of a GPU (:meth:`Switcher.boundary`)
the slot's owner is enabled and every other gated instance of that GPU disabled
(:meth:`Switcher.target_disabled`; the gate decides the order of its calls); at a
period's end the next plan takes over (made ahead, during the period's planning slot,
planner.planning_slot, so that planning never delays a switch). Between boundaries,
on a GPU with online and offline instances, :meth:`Switcher.watch` looks at the online
ones every ``preempt_poll_ns``: their first work disables the offline channels at once
and starts a new period; their end gives the GPU back at once.

What it needs from the loop that drives it is declared by :class:`SwitchHost`: the
channels, the source and probe, plans (made with the configuration the loop keeps),
and whether the configuration changed since the plan made ahead.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Mapping, Protocol

from gpuslice import abi
from gpuslice.sched.gate import EnablesFirst, Gate, OrdersSwitches
from gpuslice.sched.planner import Plan, planning_slot
from gpuslice.sched.probes import Probe, hold_probe
from gpuslice.sched.sources import Channel, SeesWork, Source
from gpuslice.sched.timeline import GpuTimeline

log = logging.getLogger("gpuslice.sched.scheduler")


# The engine groups whose channels the slots gate: GR (graphics and compute share its
# runlist) and the copy engines (each framework's transfers); a channel whose engine is not
# known is gated too. Channels on the video engines (NVDEC, NVJPG, OFA, NVENC: a runlist
# each) are left running: on the H100 a decoder whose NVDEC channel was disabled and
# enabled again at slot boundaries decoded nothing more (docs/render-video.md), and those
# engines hold no tenant's compute back (docs/policies.md, "Engines").
GATED_ENGINE_GROUPS = frozenset({"gr", "copy", "other"})

# A disable that takes longer than this stopped a tenant that is slow to stop: a context
# the GPU leaves only when its work ends, as an OpenGL frame on Hopper (no graphics
# preemption there: the disable waits for the frame; docs/render-video.md). Compute
# contexts are preempted within about a millisecond.
SLOW_TO_STOP_NS = 5_000_000


def gated(c: Channel) -> bool:
    """Whether the slots gate channel ``c`` (GATED_ENGINE_GROUPS)."""
    return abi.engine_group(c.engine) in GATED_ENGINE_GROUPS


class SwitchHost(Protocol):
    """What the switcher reads from the loop that drives it (scheduler.Scheduler)."""

    @property
    def chans(self) -> Mapping[str, set[Channel]]:
        """Each instance's channels, as last refreshed."""

    @property
    def source(self) -> Source: ...

    @property
    def probe(self) -> Probe: ...

    @property
    def preempt_after_ns(self) -> int:
        """How long online work must have lasted before it preempts offline work (0: at once)."""

    def make_plan(self, gpu: int, now: int) -> Plan:
        """Refresh the configuration and channels, then plan ``gpu``'s next period."""

    def refresh(self, now: int) -> None:
        """Refresh the configuration and channels (at most every millisecond)."""

    def plan_outdated(self) -> bool:
        """Whether the configuration changed since it was last read (a plan made ahead
        is then dropped, so that a change applies within a period)."""

    def hold_ns(self) -> int:
        """The online hold in effect."""


class Switcher:
    """Applies plans to the gate, slot by slot, and preempts offline work for online work.

    Counts what it did: ``switches`` (boundaries that changed the gating), ``rm_calls``,
    ``latencies_ns`` (boundary -> gating applied), ``plan_cost_ns`` (a running average
    of planning time, for planner.planning_slot)."""

    def __init__(self, gate: Gate, host: SwitchHost, clock: Callable[[], int],
                 preempt_poll_ns: int = 1_000_000) -> None:
        self.gate = gate
        self.host = host
        self.clock = clock
        self.preempt_poll_ns = preempt_poll_ns
        self.latencies_ns: deque[int] = deque(maxlen=10000)  # boundary -> gating applied
        self.switches = 0
        self.rm_calls = 0
        self.plan_cost_ns = 1_000_000  # running average, for when to plan
        # instances seen slow to stop (SLOW_TO_STOP_NS): a switch to one of them disables
        # the outgoing instance before enabling it, so that its work cannot start inside
        # the outgoing one's disable and be counted as the outgoing one's time
        self.slow_to_stop: set[str] = set()

    def target_disabled(self, tl: GpuTimeline, owner: str | None) -> set[Channel]:
        """The channels of ``tl``'s GPU to hold disabled while ``owner``'s slot runs."""
        out: set[Channel] = set()
        chans = self.host.chans
        for n in tl.members:
            if n == owner or n in tl.ungated:
                continue
            out |= {c for c in chans.get(n, set()) if c.gpu == tl.gpu and gated(c)}
        return out

    def start_period(self, tl: GpuTimeline, now: int) -> None:
        """Start a new period of ``tl`` now, with a plan made now (new timelines)."""
        prev = tl.plan
        tl.plan = self.host.make_plan(tl.gpu, now)
        tl.next_plan = None
        tl.idx = 0
        tl.periods += 1
        tl.started(prev)

    def release(self, gpu: int) -> None:
        """Nothing of ours is left to gate on ``gpu``: enable what is disabled there."""
        self.gate.apply(gpu, set())

    def boundary(self, tl: GpuTimeline, now: int) -> None:
        """Apply ``tl``'s next slot (at a period's end, the next period's first)."""
        if tl.idx >= len(tl.plan.slots):
            nxt = tl.period_start + tl.plan.period_ns
            # fell behind by more than a period (stopped, overloaded): restart the timeline
            if now - nxt < tl.plan.period_ns:
                tl.period_start = nxt
            else:
                tl.period_start = now
                tl.owed, tl.switched = {}, []
            if tl.next_plan is not None and self.host.plan_outdated():
                tl.next_plan = None  # configuration changed since it was planned: a change applies within a period
            prev = tl.plan
            tl.plan = tl.next_plan or self.host.make_plan(tl.gpu, now)
            tl.next_plan = None
            tl.idx = 0
            tl.periods += 1
            tl.started(prev)
        slot = tl.plan.slots[tl.idx]
        due = tl.period_start + slot.start_ns
        calls = self._apply(tl, slot.name)
        done = self.clock()
        if calls:
            self.switches += 1
            self.rm_calls += calls
            self.latencies_ns.append(done - due)
            tl.count_latency(done - due)
        # when the incoming slot really began: after a busy predecessor, once that one was
        # disabled (all calls done); after an idle one (or the idle remainder), already
        # once its own channels were enabled, if the gate enabled them first
        t = done
        inc = self.gate.incoming_at if isinstance(self.gate, EnablesFirst) else None
        if inc is not None and tl.last_owner not in tl.plan.active:
            t = inc
        tl.switched_at(slot, t if calls else due)
        tl.idx += 1
        if tl.next_plan is None and tl.idx - 1 == planning_slot(tl.plan.slots, self.plan_cost_ns):
            # plan the next period now, not at its first boundary: planning reads the
            # channel source and the probe, which must not delay a switch
            t0 = self.clock()
            tl.next_plan = self.host.make_plan(tl.gpu, t0)
            self.plan_cost_ns = int(0.8 * self.plan_cost_ns + 0.2 * (self.clock() - t0))

    def _apply(self, tl: GpuTimeline, owner: str | None) -> int:
        """Gate for ``owner``'s slot. With an enable-first gate, a slot of an instance
        slow to stop is switched to disable-first: enabled first, its work (a frame)
        would start inside the outgoing instance's disable, which then returns only
        when that frame ends, and the frame would be settled as the outgoing slot's
        time. The disable's length tells who is slow: after a disable-first switch it is
        the outgoing instance's alone; after an enable-first one either may be slow,
        and both are taken as slow until a short disable of each clears it (a slow
        instance's disable is long whichever way its switch went)."""
        target = self.target_disabled(tl, owner)
        if not isinstance(self.gate, OrdersSwitches):
            return self.gate.apply(tl.gpu, target)
        first = self.gate.enable_first and owner not in self.slow_to_stop
        calls = self.gate.apply_in_order(tl.gpu, target, first)
        out, took = tl.last_owner, self.gate.disable_took_ns
        if out and out != owner and out in tl.plan.active and took is not None:
            if took <= SLOW_TO_STOP_NS:
                self.slow_to_stop.discard(out)
            else:
                self.slow_to_stop.add(out)
                if first and owner:
                    self.slow_to_stop.add(owner)
        return calls

    def _work_arrival(self, seen: set[str], mine: dict[str, set[Channel]], now: int) -> int:
        """When the online work ``seen`` reached us, if the source says (the arrival of the
        latest CHANNEL_WORK of those instances' channels, sources.SeesWork), else ``now``."""
        source = self.host.source
        if not isinstance(source, SeesWork):
            return now
        ts = [t for pair, t in source.work_seen().items() for n in seen for c in mine[n] if c.pair == pair]
        return min(now, max(ts)) if ts else now

    def watch(self, tl: GpuTimeline, now: int) -> None:
        """Online instances of a GPU with offline ones, every preempt_poll_ns: while the
        offline ones hold the GPU, has an online one got work? Then preempt: a new period
        starts now with the online slots first. While online work holds it, are all the
        online ones quiet (for the online hold)? Then a new period starts now without them."""
        tl.next_watch = now + self.preempt_poll_ns
        if tl.plan.watch_for != "work":
            tl.work_since = None
        self.host.refresh(now)
        chans = self.host.chans
        mine = {n: {c for c in chans.get(n, set()) if c.gpu == tl.gpu} for n in tl.plan.watch}
        preempt_after_ns = self.host.preempt_after_ns
        try:
            probe = self.host.probe
            held = hold_probe(probe)
            seen = held.active(mine, hold_ns=self.host.hold_ns()) if held is not None else probe.active(mine)
        except OSError:
            return
        if tl.plan.watch_for == "work" and preempt_after_ns:
            if not seen:
                tl.work_since = None
                return
            if tl.work_since is None:
                tl.work_since = self._work_arrival(seen, mine, now)
            if now - tl.work_since < preempt_after_ns:
                tl.next_watch = min(tl.next_watch, tl.work_since + preempt_after_ns)
                return
        if (tl.plan.watch_for == "work") != bool(seen):
            return
        since = now
        if seen and preempt_after_ns and tl.work_since is not None:
            # from when it had lasted long enough: the wait before is the policy's
            since = tl.work_since + preempt_after_ns
        elif seen:
            since = self._work_arrival(seen, mine, now)
        done = 0
        if seen:
            # the offline channels off first, in one call, before any planning: that is
            # what the online work waits for
            offline = {c for n in tl.plan.offline for c in chans.get(n, set())
                       if c.gpu == tl.gpu and gated(c)}
            if offline:
                self.gate.apply(tl.gpu, set(self.gate.disabled) | offline)
                done = self.clock()
        prev = tl.plan
        plan = self.host.make_plan(tl.gpu, now)
        if plan.watch_for == prev.watch_for and not done:
            return  # the plan does not see it so after all (sticky / probe disagree)
        tl.plan, tl.next_plan = plan, None
        tl.period_start, tl.idx = now, 0
        tl.periods += 1
        tl.work_since = None
        tl.started(prev)
        self.boundary(tl, now)
        if not seen:
            tl.resumes += 1
            return
        done = done or self.clock()
        tl.preemptions += 1
        tl.preempt_ns.append(done - since)
        log.debug("preempted offline instances of gpu %d for %s in %.2f ms", tl.gpu, ",".join(sorted(seen)),
                  (done - since) / 1e6)

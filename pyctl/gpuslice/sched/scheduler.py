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

Exit safety is the caller's (cli daemon) together with Scheduler.close():
close() re-enables everything the gate disabled; start() first re-enables every
channel of every instance (a SIGKILLed predecessor may have left some disabled).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from gpuslice import abi, instances
from gpuslice import state as st
from gpuslice.policy import (Slot, compute_shares, corrected_shares, gang_order, online_busy, slot_plan, sticky_active,
                     ungated)
from gpuslice.sched.probes import Probe
from gpuslice.sched.sources import Channel, Source
from gpuslice.units import share_to_ppt

log = logging.getLogger("gpuslice.sched.scheduler")
LATENCY_BUCKETS = 32  # of a GPU's switch-latency histogram (log2 ns, as GPUSLICE_LOCK_HIST_BUCKETS)


class GateLike(Protocol):
    disabled: set[Channel]

    def apply(self, gpu: int, target: set[Channel]) -> int: ...
    def enable_all(self, chans: Any) -> None: ...
    def forget(self, chans: Any) -> None: ...
    def release_all(self) -> None: ...


@dataclass
class Plan:
    """One period of one GPU: who gets what, and the slots."""

    policy: str = st.DEFAULT_POLICY
    period_ns: int = st.DEFAULT_PERIOD_NS
    slots: list[Slot] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)
    ungated: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    # what the slots add to (or take from) each share to pay back owed time; "" = idle
    corr: dict[str, float] = field(default_factory=dict)
    # online instances to watch (issue 14): while offline ones hold the GPU, the first
    # work of any preempts them at once; while online work has preempted them, the
    # moment all are quiet (online hold) gives the GPU back at once, not at the next period
    watch: list[str] = field(default_factory=list)
    watch_for: str = ""  # "work" or "quiet"
    offline: set[str] = field(default_factory=set)  # the offline members (Claim.offline)


@dataclass
class GpuTimeline:
    gpu: int
    period_start: int = 0
    plan: Plan = field(default_factory=Plan)
    next_plan: Plan | None = None  # made during the last slot, so a period starts on time
    idx: int = 0  # next slot to apply; == len(plan.slots) -> next period
    periods: int = 0
    # (period start ns, active names) for every period whose active set differed from the
    # one before: when a change of activity reached the plan (status.json, benchmarks)
    active_changes: deque[tuple[int, list[str]]] = field(default_factory=lambda: deque(maxlen=64))
    # closed-loop slot lengths (policy.corrected_shares): what each slot ("" = idle) is
    # owed, in fractions of a period, and this period's (slot, planned ns, switch time)
    owed: dict[str, float] = field(default_factory=dict)
    switched: list[tuple[str, int, int]] = field(default_factory=list)
    last_owner: str | None = None  # the owner of the slot switched to last (None: idle)
    # since the daemon started (status.json, `gpuctl exporter`): each instance's time in
    # its own slots and time gated (another's slot while its channels are disabled),
    # from switch to switch; and the switch latencies as a log2 histogram (bucket i:
    # [2^(i-1), 2^i) ns, as the module's lock histograms) with their sum
    slot_ns: dict[str, int] = field(default_factory=dict)
    gated_ns: dict[str, int] = field(default_factory=dict)
    latency_hist: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS)
    latency_sum_ns: int = 0
    _open: tuple[str, int, frozenset[str]] | None = None  # the slot now running: owner, since, gated
    # policy.sticky_active: each instance's enabled time since the probe last saw it busy,
    # and where the count stood at the last plan (time, gated_ns totals)
    quiet_enabled_ns: dict[str, int] = field(default_factory=dict)
    _quiet_mark: tuple[int, dict[str, int]] | None = None
    next_watch: int = 0  # when to look at plan.watch next
    preemptions: int = 0
    resumes: int = 0  # offline instances given the GPU back the moment online work ended
    preempt_ns: deque[int] = field(default_factory=lambda: deque(maxlen=10000))
    work_since: int | None = None  # online work seen since (preempt_after), while offline hold the GPU

    def note_seen(self, members: list[str], seen: set[str], now: int) -> None:
        """Add the enabled time since the last plan to each quiet instance's count and
        clear the count of those ``seen`` busy."""
        gated = self.totals(now)[1]
        if self._quiet_mark is not None:
            t0, g0 = self._quiet_mark
            for n in members:
                enabled = max(0, (now - t0) - (gated.get(n, 0) - g0.get(n, 0)))
                self.quiet_enabled_ns[n] = self.quiet_enabled_ns.get(n, 0) + enabled
        for n in seen:
            self.quiet_enabled_ns[n] = 0
        for n in set(self.quiet_enabled_ns) - set(members):
            del self.quiet_enabled_ns[n]
        self._quiet_mark = (now, gated)

    def count_latency(self, ns: int) -> None:
        ns = max(0, ns)
        self.latency_hist[min(LATENCY_BUCKETS - 1, ns.bit_length())] += 1
        self.latency_sum_ns += ns

    def started(self, prev: Plan) -> None:
        """A period with a new plan has just started at period_start."""
        act = sorted(self.plan.active)
        if not self.active_changes or self.active_changes[-1][1] != act:
            self.active_changes.append((self.period_start, act))
        if self.plan.shares != prev.shares or self.plan.period_ns != prev.period_ns:
            self.owed, self.switched = {}, []  # new targets: old debts are void
        for n, c in self.plan.corr.items():
            self.owed[n] = self.owed.get(n, 0.0) - c
        if self.plan.watch_for != prev.watch_for:
            self.work_since = None  # preempt_after counts within one stretch of offline holding

    def switched_at(self, slot: Slot, t: int) -> None:
        """Slot ``slot`` began at ``t`` (when its owner could first run). At a period's first
        slot, the previous period's slots are settled: each is owed its planned length
        minus the time from its switch to the next."""
        if slot.start_ns == 0:
            done = self.switched + [("", 0, t)]
            for (n, planned, t0), (_n, _p, t1) in zip(done, done[1:]):
                owe = self.owed.get(n, 0.0) + (planned - (t1 - t0)) / self.plan.period_ns
                self.owed[n] = max(-0.5, min(0.5, owe))
            self.switched = []
        self.switched.append((slot.name or "", slot.length_ns, t))
        self.last_owner = slot.name
        self._account(slot.name or "", t)

    def totals(self, now: int) -> tuple[dict[str, int], dict[str, int]]:
        """slot_ns and gated_ns with the running slot counted up to ``now``."""
        slot, gated = dict(self.slot_ns), dict(self.gated_ns)
        if self._open is not None:
            owner, since, gset = self._open
            dur = max(0, min(now - since, self.plan.period_ns))
            if owner:
                slot[owner] = slot.get(owner, 0) + dur
            for n in gset:
                gated[n] = gated.get(n, 0) + dur
        return slot, gated

    def _account(self, owner: str, t: int) -> None:
        """Close the slot running until ``t`` (at most a period of it: a timeline that
        fell behind restarts) and open ``owner``'s."""
        if self._open is not None:
            prev, since, gated = self._open
            dur = max(0, min(t - since, self.plan.period_ns))
            if prev:
                self.slot_ns[prev] = self.slot_ns.get(prev, 0) + dur
            for n in gated:
                self.gated_ns[n] = self.gated_ns.get(n, 0) + dur
        gated = frozenset(n for n in self.plan.members if n != owner and n not in self.plan.ungated)
        self._open = (owner, t, gated)

    # the current plan's fields, for readers
    @property
    def policy(self) -> str:
        return self.plan.policy

    @property
    def period_ns(self) -> int:
        return self.plan.period_ns

    @property
    def slots(self) -> list[Slot]:
        return self.plan.slots

    @property
    def shares(self) -> dict[str, float]:
        return self.plan.shares

    @property
    def members(self) -> list[str]:
        return self.plan.members

    @property
    def ungated(self) -> set[str]:
        return self.plan.ungated

    @property
    def active(self) -> set[str]:
        return self.plan.active

    def next_boundary(self) -> int:
        if self.idx < len(self.plan.slots):
            return self.period_start + self.plan.slots[self.idx].start_ns
        return self.period_start + self.plan.period_ns


# With offline instances on a GPU (issue 14): until the daemon's disable of the offline
# channels lands (1-3 ms on the H100), the GPU's runlist shares it by timeslice; a short
# one for offline TSGs and a long one for online TSGs let the online work run sooner and
# longer. At 250 us a tiny online kernel beside a busy trainer completed within 0.45 ms
# (p50) / 0.60 ms (p99) of its launch, against 0.21 / 0.40 ms alone and 0.90 / 1.37 ms with
# RM's default slices (docs/h100-priority.md, run 5): the hardware's preemption.
OFFLINE_TIMESLICE_US = 250
ONLINE_TIMESLICE_US = 8000
# How often the user-space build's library looks at an online instance's channels on a
# GPU with offline ones (its own default is 5 ms): each busy period of the online work
# runs beside the offline work until its first submission is seen and the disable lands
# (docs/h100-priority.md, run 6)
ONLINE_SAMPLE_US = 200


# The engine groups whose channels the slots gate: GR (graphics and compute share its
# runlist) and the copy engines (each framework's transfers); a channel whose engine is not
# known is gated too. Channels on the video engines (NVDEC, NVJPG, OFA, NVENC: a runlist
# each) are left running: on the H100 a decoder whose NVDEC channel was disabled and
# enabled again at slot boundaries decoded nothing more (docs/render-video.md), and those
# engines hold no tenant's compute back (docs/policies.md, "Engines").
GATED_ENGINE_GROUPS = frozenset({"gr", "copy", "other"})


def gated(c: Channel) -> bool:
    """Whether the slots gate channel ``c`` (GATED_ENGINE_GROUPS)."""
    return abi.engine_group(c.engine) in GATED_ENGINE_GROUPS


def engine_counts(chans: Iterable[Channel]) -> dict[str, int]:
    """Channels per engine ("GR0": 4, "NVDEC0": 1; abi.engine_name), a channel whose engine
    is not known (0: CUDA's, before its TSG says) under "GR0", where it runs."""
    out: dict[str, int] = {}
    for c in chans:
        name = abi.engine_name(c.engine) or abi.engine_name(abi.NV2080_ENGINE_TYPE_GR0)
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


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


def report_repeat_us(hold_ns: int) -> int:
    """How often the library should report an online channel that keeps submitting:
    within half the online hold, so that busy online work never looks quiet between two
    reports (the library's own default, 10 ms, is longer than the 5 ms hold: under a
    backlog the offline work came back for 5 ms in every 10; docs/h100-priority.md, run 9)."""
    return max(500, min(10_000, hold_ns // 2000))


# The hardware timeslice of every gated instance's TSGs. With RM's default the H100 lost
# 6-8% of the GPU under gating, whatever the period (50 or 100 ms) and switch order,
# and time-slicing alone lost 10-13%: the hardware switches the running TSG out at each
# timeslice even while every other one is disabled. At 8 ms three frameworks under
# weight 3:2:1 and burst came within 1.8 and 1.1 points of target, totals 98-99%
# (docs/h100-scheduler.md, "Mixed frameworks"). A slot of a 50 ms period is at least
# this long for shares of 16% and more; a shorter slot ends by the daemon's disable.
GATED_TIMESLICE_US = 8000
TIMESLICE_MAX_US = 16000


def timeslice_us(policy: str, weight: int, weights: list[int], priority: str = "online",
                 mixed: bool = False) -> int:
    """Hardware timeslice an instance's TSGs get (the module's TIMESLICE_US; the library
    of the user-space build when the daemon asks): GATED_TIMESLICE_US, and under
    weight/burst proportional to weight above it (at most TIMESLICE_MAX_US), which
    matters while several instances run at once (ungated idle ones under equal and
    burst). On a GPU with both online and offline instances (mixed), an offline
    instance gets OFFLINE_TIMESLICE_US and an online one at least ONLINE_TIMESLICE_US.
    Not on a GPU of offline instances only: two TSGs that both have work switch at
    every slice, and at 250 us two trainers got 45% of the GPU between them against 80%
    at RM's default (docs/h100-priority.md, run 6)."""
    if mixed:
        if priority == "offline":
            return OFFLINE_TIMESLICE_US
        return max(ONLINE_TIMESLICE_US, timeslice_us(policy, weight, weights))
    if policy not in ("weight", "burst") or not weights:
        return GATED_TIMESLICE_US
    return int(min(TIMESLICE_MAX_US, GATED_TIMESLICE_US * weight / min(weights)))


class Scheduler:
    def __init__(self, state_path: str | None, source: Source, gate: GateLike, probe: Probe,
                 netlink: Any = None, clock: Callable[[], int] = time.monotonic_ns,
                 status_path: str | None = None, wake_fd: int | None = None,
                 state_obj: st.State | None = None, preempt_poll_ns: int = 1_000_000,
                 online_hold_ns: int = 5_000_000, preempt_after_ns: int = 0,
                 online_sample_us: int = ONLINE_SAMPLE_US) -> None:
        self.state_path = state_path
        self.source = source
        self.gate = gate
        self.probe = probe
        self.netlink = netlink
        self.clock = clock
        self.status_path = status_path
        self.wake_fd = wake_fd
        self.state = state_obj or st.State()
        self._stamp: tuple[int, int, int] | None = None
        self._fixed_state = state_obj is not None
        self.timelines: dict[int, GpuTimeline] = {}
        self.chans: dict[str, set[Channel]] = {}
        self._refreshed_at = -1
        self.latencies_ns: deque[int] = deque(maxlen=10000)  # boundary -> gating applied
        self.switches = 0
        self.rm_calls = 0
        self._last_status = 0
        self.plan_cost_ns = 1_000_000  # running averages, for when to plan and report
        self.status_cost_ns = 1_000_000
        self.started = False
        self.stopping = False
        self.wake_bias_ns = 0
        self.preempt_poll_ns = preempt_poll_ns
        self._source_ready = False
        self.online_hold_ns = online_hold_ns
        # online work must have lasted this long (no quiet gap longer than the online
        # hold) before the offline channels are disabled: shorter bursts are left to the
        # hardware's timeslices (OFFLINE_TIMESLICE_US), which take the GPU from offline
        # work within one offline slice without an RM call
        self.preempt_after_ns = preempt_after_ns
        self.online_sample_us = online_sample_us
        self._fast_of: st.State | None = None  # the configuration the source was told of
        self._status_soon = False

    # --- configuration ---
    def reload_state(self, force: bool = False) -> bool:
        if self._fixed_state:
            return False
        stamp = st.file_stamp(self.state_path)
        if not force and stamp == self._stamp:
            return False
        try:
            new = st.load(self.state_path)
        except st.StateError as e:
            if self._stamp != stamp:
                log.error("%s; keeping the previous configuration", e)
            self._stamp = stamp
            return False
        self._stamp = stamp
        self.state = new
        self.sync_kernel()
        return True

    def set_state(self, new: st.State) -> None:
        """Replace the configuration directly (tests, benchmarks)."""
        self.state = new
        self._fixed_state = True

    def timeslices(self) -> dict[str, int]:
        """Each instance's hardware timeslice (timeslice_us), the largest over its GPUs."""
        slices: dict[str, int] = {}
        for gpu in self.state.used_gpus():
            pol = self.state.policy_of(gpu).policy
            insts = self.state.instances_on(gpu)
            weights = [i.weight for i in insts]
            prios = {i.priority for i in insts}
            mixed = "offline" in prios and len(prios) > 1
            for inst in insts:
                slices[inst.name] = max(slices.get(inst.name, 0),
                                        timeslice_us(pol, inst.weight, weights, inst.priority, mixed))
        return slices

    def sync_kernel(self) -> None:
        """Tell the module each instance's weight, share and timeslice."""
        if self.netlink is None:
            return
        slices = self.timeslices()
        for inst in sorted(self.state.instances.values(), key=lambda i: i.name):
            attrs = {"weight": inst.weight, "share": share_to_ppt(inst.share) if inst.share else None,
                     "timeslice_us": slices.get(inst.name, 0)}
            try:
                try:
                    self.netlink.instance_set(inst.name, **attrs)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise
                    # configured but unknown to the module (reloaded?): create it, unless
                    # it was deleted since this configuration was read (a `gpuctl instance
                    # delete` or a Kubernetes plugin deletes in the module, then saves the
                    # state file, under the exclusive lock: the shared lock waits for both)
                    if self._create_if_configured(inst, attrs):
                        log.info("created instance %s in the kernel", inst.name)
            except OSError as e:
                log.warning("netlink INSTANCE_SET %s: %s", inst.name, e)

    def _create_if_configured(self, inst: st.Instance, attrs: dict[str, Any]) -> bool:
        """Create ``inst`` in the module if the state file still has it, under the shared
        state lock (no delete runs meanwhile). Without a state file: create it."""
        assert self.netlink is not None

        def create() -> None:
            instances.create_in_module(self.netlink, inst, **attrs)

        if self._fixed_state or not os.path.exists(st.state_path(self.state_path)):
            create()
            return True
        with st.shared_lock(self.state_path):
            try:
                if inst.name not in st.load(self.state_path).instances:
                    return False
            except st.StateError:
                pass
            create()
        return True

    def hold_ns(self) -> int:
        """The online hold in effect: --online-hold, but never shorter than the longest gap
        the source leaves between two reports of work that goes on (the module reports an
        instance at most every 50 ms, kmod/activity.c: a shorter hold would let busy online
        work look quiet and the offline work back beside it)."""
        return max(self.online_hold_ns, getattr(self.source, "report_gap_ns", 0))

    def fast_instances(self) -> set[str]:
        """The online instances of each GPU with offline ones: their submissions are what
        preempts, so the sooner they are seen the less the offline work takes from them."""
        out: set[str] = set()
        for gpu in self.state.used_gpus():
            insts = self.state.instances_on(gpu)
            if any(i.priority == "offline" for i in insts):
                out |= {i.name for i in insts if i.priority != "offline"}
        return out

    def _sync_sampling(self) -> None:
        """When the configuration changed, tell a source that listens per instance
        (the user-space build's, PreloadSource.set_instances) which instances there are,
        and one that can ask its processes to sample faster (PreloadSource.set_fast)
        which to ask, and each instance's hardware timeslice (set_timeslices)."""
        if self._fast_of is self.state:
            return
        self._fast_of = self.state
        set_instances = getattr(self.source, "set_instances", None)
        if set_instances is not None:  # a socket per instance (PreloadSource)
            set_instances(self.state.instances)
        set_fast = getattr(self.source, "set_fast", None)
        if set_fast is not None:
            set_fast(self.fast_instances(), self.online_sample_us, report_repeat_us(self.online_hold_ns))
        set_timeslices = getattr(self.source, "set_timeslices", None)
        if set_timeslices is not None:  # the user-space build: the library sets them, as the module does
            set_timeslices(self.timeslices())

    # --- lifecycle ---
    def start(self) -> None:
        self.reload_state(force=True)
        self._sync_sampling()
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
        if self.switches:
            snap = self.snapshot()
            log.info("%d slot switches, %d RM calls; switch latency %s; FIFO_DISABLE_CHANNELS call ns %s",
                     self.switches, self.rm_calls, snap["switch_latency_ns"], snap["rm_call_ns"])

    def _sync_timelines(self, now: int) -> None:
        gpus = set(self.state.used_gpus()) | {c.gpu for cs in self.chans.values() for c in cs}
        for g in gpus:
            if g not in self.timelines:
                self.timelines[g] = GpuTimeline(g, period_start=now)
                self.timelines[g].idx = 0
                self._plan(self.timelines[g], now)
        for g in list(self.timelines):
            if g not in gpus:
                tl = self.timelines.pop(g)
                self.gate.apply(g, set())  # nothing of ours left to gate there
                del tl

    # --- per period ---
    def _refresh(self, now: int) -> None:
        if self._refreshed_at >= 0 and now - self._refreshed_at < 1_000_000:
            return
        self._refreshed_at = now
        self.reload_state()
        self._sync_sampling()
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
            self._status_soon = True  # which instances have channels changed: reported without the 0.5 s wait
        self.chans = new

    def _plan(self, tl: GpuTimeline, now: int) -> None:
        """Start a new period of ``tl`` now (new timelines)."""
        prev = tl.plan
        tl.plan = self._make_plan(tl.gpu, now)
        tl.next_plan = None
        tl.idx = 0
        tl.periods += 1
        tl.started(prev)

    def _make_plan(self, gpu: int, now: int) -> Plan:
        self._refresh(now)
        gp = self.state.policy_of(gpu)
        claims = self.state.claims(gpu)
        mine = {c.name: {ch for ch in self.chans.get(c.name, set()) if ch.gpu == gpu} for c in claims}
        present = {n for n, cs in mine.items() if cs}
        prio = any(c.offline for c in claims) and getattr(self.probe, "takes_hold", False)
        online = {c.name for c in claims if not c.offline} if prio else set()
        try:
            seen = set(self.probe.active(mine))
            if online:  # online instances: busy only within the short online hold
                seen = (seen - online) | set(self.probe.active(  # type: ignore[call-arg]
                    {n: mine[n] for n in online}, hold_ns=self.hold_ns()))
        except OSError as e:
            log.warning("activity probe: %s", e)
            seen = present
        tl = self.timelines.get(gpu)
        active = set(seen) & present
        if tl is not None:
            tl.note_seen([c.name for c in claims], active, now)
            # online instances with the short hold decide by it alone (sticky_active would
            # keep one busy for a period after its last work, and the offline ones out)
            sticky = sticky_active(active, tl.plan.active - online, present, tl.quiet_enabled_ns, gp.period_ns)
            active = sticky | (active & online)
            # --preempt-after: while offline instances hold the GPU, online work that has
            # not lasted that long is the hardware's to handle, not a reason for online slots
            if online and self.preempt_after_ns and tl.plan.watch_for == "work" and \
                    (tl.work_since is None or now - tl.work_since < self.preempt_after_ns):
                active -= online
        shares = compute_shares(gp.policy, claims, active)
        # online first: after a preemption the period starts with their slots; within
        # each, instances of several GPUs first, by name, so that their slots start
        # together on each of their GPUs (periods of one length start together)
        members = gang_order(claims, {n for n, i in self.state.instances.items() if len(i.gpus) > 1})
        free = ungated(gp.policy, claims, active)
        watch = [c.name for c in claims if not c.offline and c.name in present] \
            if any(c.offline for c in claims) else []
        watch_for = "quiet" if online_busy(claims, active) else "work"
        if watch_for == "quiet" and not online:
            watch = []  # without the short hold, quiet is decided at the period's plan
        given = {n: s for n, s in shares.items() if s > 0}
        idle = 1.0 - sum(given.values())
        if idle > 1e-9:
            given[""] = idle  # the idle remainder, nobody's
        fixed = corrected_shares(given, tl.owed if tl is not None and tl.plan.shares == shares else {})
        corr = {n: fixed[n] - given[n] for n in given if fixed[n] != given[n]}
        fixed.pop("", None)
        slots = slot_plan(fixed, gp.period_ns, order=members)
        return Plan(gp.policy, gp.period_ns, slots, shares, members, free, active, corr, watch, watch_for,
                    {c.name for c in claims if c.offline})

    def target_disabled(self, tl: GpuTimeline, owner: str | None) -> set[Channel]:
        out: set[Channel] = set()
        for n in tl.members:
            if n == owner or n in tl.ungated:
                continue
            out |= {c for c in self.chans.get(n, set()) if c.gpu == tl.gpu and gated(c)}
        return out

    def _boundary(self, tl: GpuTimeline, now: int) -> None:
        if tl.idx >= len(tl.plan.slots):
            nxt = tl.period_start + tl.plan.period_ns
            # fell behind by more than a period (stopped, overloaded): restart the timeline
            if now - nxt < tl.plan.period_ns:
                tl.period_start = nxt
            else:
                tl.period_start = now
                tl.owed, tl.switched = {}, []
            if tl.next_plan is not None and not self._fixed_state and st.file_stamp(self.state_path) != self._stamp:
                tl.next_plan = None  # configuration changed since it was planned: a change applies within a period
                self._refreshed_at = -1
            prev = tl.plan
            tl.plan = tl.next_plan or self._make_plan(tl.gpu, now)
            tl.next_plan = None
            tl.idx = 0
            tl.periods += 1
            tl.started(prev)
        slot = tl.plan.slots[tl.idx]
        due = tl.period_start + slot.start_ns
        calls = self.gate.apply(tl.gpu, self.target_disabled(tl, slot.name))
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
        inc = getattr(self.gate, "incoming_at", None)
        if inc is not None and tl.last_owner not in tl.plan.active:
            t = inc
        tl.switched_at(slot, t if calls else due)
        tl.idx += 1
        if tl.next_plan is None and tl.idx - 1 == self._planning_slot(tl.plan.slots):
            # plan the next period now, not at its first boundary: planning reads the
            # channel source and the probe, which must not delay a switch
            t0 = self.clock()
            tl.next_plan = self._make_plan(tl.gpu, t0)
            self.plan_cost_ns = int(0.8 * self.plan_cost_ns + 0.2 * (self.clock() - t0))

    def _planning_slot(self, slots: list[Slot]) -> int:
        """The slot at whose start the next period is planned: the last one long enough
        to plan in (twice the average planning time), else the longest. The later, the
        fresher the probe's view; a slot too short would make its successor late."""
        room = [i for i, sl in enumerate(slots) if sl.length_ns >= 2 * self.plan_cost_ns]
        if room:
            return room[-1]
        return max(range(len(slots)), key=lambda i: slots[i].length_ns)

    def _work_arrival(self, seen: set[str], mine: dict[str, set[Channel]], now: int) -> int:
        """When the online work ``seen`` reached us, if the source says (the arrival of the
        latest CHANNEL_WORK of those instances' channels), else ``now``."""
        work = getattr(self.source, "work_seen", None)
        if work is None:
            return now
        ts = [t for pair, t in work().items() for n in seen for c in mine[n] if c.pair == pair]
        return min(now, max(ts)) if ts else now

    def _watch(self, tl: GpuTimeline, now: int) -> None:
        """Online instances of a GPU with offline ones, every preempt_poll_ns: while the
        offline ones hold the GPU, has an online one got work? Then preempt: a new period
        starts now with the online slots first. While online work holds it, are all the
        online ones quiet (for the online hold)? Then a new period starts now without them."""
        tl.next_watch = now + self.preempt_poll_ns
        if tl.plan.watch_for != "work":
            tl.work_since = None
        self._refresh(now)
        mine = {n: {c for c in self.chans.get(n, set()) if c.gpu == tl.gpu} for n in tl.plan.watch}
        try:
            if getattr(self.probe, "takes_hold", False):
                seen = self.probe.active(mine, hold_ns=self.hold_ns())  # type: ignore[call-arg]
            else:
                seen = self.probe.active(mine)
        except OSError:
            return
        if tl.plan.watch_for == "work" and self.preempt_after_ns:
            if not seen:
                tl.work_since = None
                return
            if tl.work_since is None:
                tl.work_since = self._work_arrival(seen, mine, now)
            if now - tl.work_since < self.preempt_after_ns:
                tl.next_watch = min(tl.next_watch, tl.work_since + self.preempt_after_ns)
                return
        if (tl.plan.watch_for == "work") != bool(seen):
            return
        since = now
        if seen and self.preempt_after_ns and tl.work_since is not None:
            # from when it had lasted long enough: the wait before is the policy's
            since = tl.work_since + self.preempt_after_ns
        elif seen:
            since = self._work_arrival(seen, mine, now)
        done = 0
        if seen:
            # the offline channels off first, in one call, before any planning: that is
            # what the online work waits for
            offline = {c for n in tl.plan.offline for c in self.chans.get(n, set())
                       if c.gpu == tl.gpu and gated(c)}
            if offline:
                self.gate.apply(tl.gpu, set(self.gate.disabled) | offline)
                done = self.clock()
        prev = tl.plan
        plan = self._make_plan(tl.gpu, now)
        if plan.watch_for == prev.watch_for and not done:
            return  # the plan does not see it so after all (sticky / probe disagree)
        tl.plan, tl.next_plan = plan, None
        tl.period_start, tl.idx = now, 0
        tl.periods += 1
        tl.work_since = None
        tl.started(prev)
        self._boundary(tl, now)
        if not seen:
            tl.resumes += 1
            return
        done = done or self.clock()
        tl.preemptions += 1
        tl.preempt_ns.append(done - since)
        log.debug("preempted offline instances of gpu %d for %s in %.2f ms", tl.gpu, ",".join(sorted(seen)),
                  (done - since) / 1e6)

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
                self._boundary(tl, now)
                guard += 1
                now = self.clock()
            if tl.plan.watch and (now >= tl.next_watch or self._source_ready):
                self._watch(tl, now)
                now = self.clock()
        self._source_ready = False
        self._sync_timelines(now)
        if self.status_path and self._status_due(now):
            self._last_status = now
            self._status_soon = False
            self.write_status()
            self.status_cost_ns = int(0.8 * self.status_cost_ns + 0.2 * (self.clock() - now))
        if not self.timelines:
            return 50_000_000
        nxt = min(min(tl.next_boundary(), tl.next_watch if tl.plan.watch else tl.next_boundary())
                  for tl in self.timelines.values())
        return max(0, nxt - self.clock())

    def _status_due(self, now: int) -> bool:
        """Every 0.5 s, and 20 ms after an instance's first channel came or its last went
        (a restarted daemon shows its workloads as soon as their libraries or the module
        gave them back; a process that makes and frees channels does not), at a moment
        with room before the next switch (twice the average time a report takes), so
        writing it never delays a switch; at the latest every 5 s."""
        since = now - self._last_status
        if since < (20_000_000 if self._status_soon else 500_000_000):
            return False
        nxt = min((tl.next_boundary() for tl in self.timelines.values()), default=now + 10**9)
        return nxt - now >= 2 * self.status_cost_ns or since > 5_000_000_000

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
        filenos = getattr(self.source, "filenos", None)
        if filenos is not None and any(tl.plan.watch for tl in self.timelines.values()):
            fds += filenos()
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

    # --- reporting ---
    def snapshot(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ns)

        def pct(p: float) -> int | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

        def dist(xs: Any) -> dict[str, int | None]:
            v = sorted(xs or ())
            return {"n": len(v), "p50": v[len(v) // 2] if v else None,
                    "p99": v[min(len(v) - 1, int(0.99 * len(v)))] if v else None, "max": v[-1] if v else None}

        stats = getattr(self.gate, "stats", None)
        now = self.clock()
        totals = {g: tl.totals(now) for g, tl in self.timelines.items()}
        return {
            "pid": os.getpid(),
            "time": time.time(),
            "switches": self.switches,
            "rm_calls": self.rm_calls,
            "disabled_now": len(self.gate.disabled),
            # channels RM answered as naming no live channel, dropped from the gate's batches
            # (sched/stale.py): each drop since start, and those held out now
            "stale_channels": getattr(stats, "stale", 0),
            "stale_now": len(getattr(self.gate, "dropped", ()) or ()),
            "wake_bias_ns": self.wake_bias_ns,
            "switch_latency_ns": {"p50": pct(0.5), "p99": pct(0.99), "max": lat[-1] if lat else None},
            # duration of each FIFO_DISABLE_CHANNELS call (disable / re-enable), as the daemon saw it
            "rm_call_ns": {"disable": dist(getattr(stats, "disable_ns", None)),
                           "enable": dist(getattr(stats, "enable_ns", None))},
            "gpus": {
                str(g): {
                    "policy": tl.policy,
                    "period_ns": tl.period_ns,
                    "period_start_ns": tl.period_start,  # CLOCK_MONOTONIC
                    "periods": tl.periods,
                    "active_changes": [[t, a] for t, a in tl.active_changes],
                    # online work preempting offline instances: from the online instance's
                    # first work (its CHANNEL_WORK's arrival, else when the probe saw it)
                    # to the last offline channel disabled
                    "preemptions": tl.preemptions,
                    "resumes": tl.resumes,
                    "preempt_latency_ns": dist(tl.preempt_ns),
                    "switch_latency_hist_ns": list(tl.latency_hist),
                    "switch_latency_sum_ns": tl.latency_sum_ns,
                    "instances": {
                        n: {"share": tl.shares.get(n, 0.0), "active": n in tl.active, "gated": n not in tl.ungated,
                            "priority": self.state.instances[n].priority if n in self.state.instances else "online",
                            "owed_ns": int(tl.owed.get(n, 0.0) * tl.period_ns),
                            "slot_ns": totals[g][0].get(n, 0), "gated_ns": totals[g][1].get(n, 0),
                            "channels": len([c for c in self.chans.get(n, set()) if c.gpu == g]),
                            "engines": engine_counts(c for c in self.chans.get(n, set()) if c.gpu == g)}
                        for n in tl.members
                    },
                }
                for g, tl in sorted(self.timelines.items())
            },
        }

    def write_status(self) -> None:
        if not self.status_path:
            return
        d = os.path.dirname(os.path.abspath(self.status_path))
        try:
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".status.", dir=d)
            with os.fdopen(fd, "w") as f:
                json.dump(self.snapshot(), f)
            os.replace(tmp, self.status_path)
        except OSError as e:
            log.debug("status file: %s", e)

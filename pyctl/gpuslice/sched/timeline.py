"""The timeline of one GPU: its periods, the plan in force, and what its slots got.

This module owns the per-GPU record the switcher advances (sched/switcher.py: period
start, next slot, the plan made ahead), the closed-loop accounts the planner reads
(owed time per slot, enabled time since each instance was last seen busy, online work
waiting to preempt), and the counts the report shows (time in slots and gated, switch
latencies, preemptions).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpuslice.policy import Slot
from gpuslice.sched.planner import Plan, keeps_debts

# how much a slot's account may hold, in periods either way: enough for a render tenant
# whose frames outlast the period twice over (its disable waits for the frame, and the
# plan made during one period settles only in the next, so two overruns can stand at once);
# beyond it, time is forgotten rather than repaid over seconds
OWED_MAX = 4.0
LATENCY_BUCKETS = 32  # of a GPU's switch-latency histogram (log2 ns, as GPUSLICE_LOCK_HIST_BUCKETS)


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
        p = self.plan
        if not keeps_debts(prev, p.policy, p.period_ns, p.shares, p.offline):
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
                self.owed[n] = max(-OWED_MAX, min(OWED_MAX, owe))
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

"""Planning: one period of one GPU, from the configuration and what the probe sees.

This module owns the Plan (who gets what share, the slots, who is gated, which online
instances to watch) and the hardware timeslices the configuration gives each instance.
It makes no RM call and keeps no state of its own: :func:`make_plan` reads

* the configuration (``state``: the GPU's policy, its claims, multi-GPU instances),
* the channels of each instance (``chans``, as the channel source reports them),
* the activity probe (``probe``; one that takes a hold is asked with ``hold_ns()``, the
  online hold in effect, for the online instances of a GPU with offline ones,
  probes.HoldProbe),
* the GPU's timeline, where there is one (what the last plan saw active, each slot's
  owed time, each instance's enabled time since it was last seen busy, online work
  waiting for ``preempt_after_ns``),

and returns the Plan. When to plan (:func:`planning_slot`) and what is done with a plan
are the switcher's (sched/switcher.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

from gpuslice import state as st
from gpuslice.policy import (Slot, compute_shares, corrected_shares, gang_order, online_busy, slot_plan, sticky_active,
                             ungated)
from gpuslice.sched.probes import Probe, hold_probe
from gpuslice.sched.sources import Channel

if TYPE_CHECKING:
    from gpuslice.sched.timeline import GpuTimeline

log = logging.getLogger("gpuslice.sched.scheduler")


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
    # online instances to watch: while offline ones hold the GPU, the first work of any
    # preempts them at once; while online work has preempted them, the moment all are
    # quiet (online hold) gives the GPU back at once, not at the next period
    watch: list[str] = field(default_factory=list)
    watch_for: str = ""  # "work" or "quiet"
    offline: set[str] = field(default_factory=set)  # the offline members (Claim.offline)


def keeps_debts(prev: Plan, policy: str, period_ns: int, shares: Mapping[str, float],
                offline: set[str]) -> bool:
    """Whether the slots' accounts carry over from ``prev`` to a plan of ``policy``,
    ``period_ns``, ``shares`` and ``offline`` instances: under one period, with the same
    shares, or under one policy without offline instances whatever the shares (an instance
    becoming active or idle under equal or burst changes every share; a render tenant's
    overrun would otherwise be forgiven each time). A new period length, or new shares
    under a new policy or with priorities (whose preemptions cut periods short on
    purpose), start them afresh."""
    if period_ns != prev.period_ns:
        return False
    return shares == prev.shares or (policy == prev.policy and not offline and not prev.offline)


# With offline instances on a GPU: until the daemon's disable of the offline channels
# lands (1-3 ms on the H100), the GPU's runlist shares it by timeslice; a short one for
# offline TSGs and a long one for online TSGs let the online work run sooner and longer.
# At 250 us a tiny online kernel beside a busy trainer completed within 0.45 ms (p50) /
# 0.60 ms (p99) of its launch, against 0.21 / 0.40 ms alone and 0.90 / 1.37 ms with RM's
# default slices (docs/h100-priority.md, run 5): the hardware's preemption.
OFFLINE_TIMESLICE_US = 250
ONLINE_TIMESLICE_US = 8000

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


def timeslices(state: st.State) -> dict[str, int]:
    """Each instance's hardware timeslice (timeslice_us), the largest over its GPUs."""
    slices: dict[str, int] = {}
    for gpu in state.used_gpus():
        pol = state.policy_of(gpu).policy
        insts = state.instances_on(gpu)
        weights = [i.weight for i in insts]
        prios = {i.priority for i in insts}
        mixed = "offline" in prios and len(prios) > 1
        for inst in insts:
            slices[inst.name] = max(slices.get(inst.name, 0),
                                    timeslice_us(pol, inst.weight, weights, inst.priority, mixed))
    return slices


def fast_instances(state: st.State) -> set[str]:
    """The online instances of each GPU with offline ones: their submissions are what
    preempts, so the sooner they are seen the less the offline work takes from them."""
    out: set[str] = set()
    for gpu in state.used_gpus():
        insts = state.instances_on(gpu)
        if any(i.priority == "offline" for i in insts):
            out |= {i.name for i in insts if i.priority != "offline"}
    return out


def make_plan(gpu: int, now: int, *, state: st.State, chans: Mapping[str, set[Channel]], probe: Probe,
              hold_ns: Callable[[], int], preempt_after_ns: int = 0, tl: GpuTimeline | None = None) -> Plan:
    """The next period of ``gpu`` as of ``now``. With the GPU's timeline ``tl``, its
    quiet counts are brought up to date (tl.note_seen) and activity is sticky
    (policy.sticky_active) and owed time paid back (policy.corrected_shares)."""
    gp = state.policy_of(gpu)
    claims = state.claims(gpu)
    mine = {c.name: {ch for ch in chans.get(c.name, set()) if ch.gpu == gpu} for c in claims}
    present = {n for n, cs in mine.items() if cs}
    held = hold_probe(probe) if any(c.offline for c in claims) else None
    online = {c.name for c in claims if not c.offline} if held is not None else set()
    try:
        seen = set(probe.active(mine))
        if held is not None and online:  # online instances: busy only within the short online hold
            seen = (seen - online) | set(held.active({n: mine[n] for n in online}, hold_ns=hold_ns()))
    except OSError as e:
        log.warning("activity probe: %s", e)
        seen = present
    active = set(seen) & present
    if tl is not None:
        tl.note_seen([c.name for c in claims], active, now)
        # online instances with the short hold decide by it alone (sticky_active would
        # keep one busy for a period after its last work, and the offline ones out)
        sticky = sticky_active(active, tl.plan.active - online, present, tl.quiet_enabled_ns, gp.period_ns)
        active = sticky | (active & online)
        # --preempt-after: while offline instances hold the GPU, online work that has
        # not lasted that long is the hardware's to handle, not a reason for online slots
        if online and preempt_after_ns and tl.plan.watch_for == "work" and \
                (tl.work_since is None or now - tl.work_since < preempt_after_ns):
            active -= online
    shares = compute_shares(gp.policy, claims, active)
    # online first: after a preemption the period starts with their slots; within
    # each, instances of several GPUs first, by name, so that their slots start
    # together on each of their GPUs (periods of one length start together)
    members = gang_order(claims, {n for n, i in state.instances.items() if len(i.gpus) > 1})
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
    offline = {c.name for c in claims if c.offline}
    keep = tl is not None and keeps_debts(tl.plan, gp.policy, gp.period_ns, shares, offline)
    fixed = corrected_shares(given, tl.owed if tl is not None and keep else {})
    corr = {n: fixed[n] - given[n] for n in given if fixed[n] != given[n]}
    fixed.pop("", None)
    slots = slot_plan(fixed, gp.period_ns, order=members)
    return Plan(gp.policy, gp.period_ns, slots, shares, members, free, active, corr, watch, watch_for,
                offline)


def planning_slot(slots: list[Slot], plan_cost_ns: int) -> int:
    """The slot at whose start the next period is planned: the last one long enough to
    plan in (twice ``plan_cost_ns``, the average planning time), else the longest. The
    later, the fresher the probe's view; a slot too short would make its successor late."""
    room = [i for i, sl in enumerate(slots) if sl.length_ns >= 2 * plan_cost_ns]
    if room:
        return room[-1]
    return max(range(len(slots)), key=lambda i: slots[i].length_ns)

"""Pure policy math: who gets which share of a GPU, and the slot schedule of a period.

No I/O here. The scheduler calls :func:`compute_shares` once per period with the
instances of one GPU and the set of instances that have runnable work, then
:func:`slot_plan` to lay those shares out as exclusive slots within the period.
docs/policies.md states the semantics; tests/test_policy.py checks them with hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

POLICIES = ("fixed", "weight", "equal", "burst")
# work-conserving policies hand idle capacity to active instances
WORK_CONSERVING = frozenset({"equal", "burst"})
# online instances preempt offline ones (issue 14, docs/policies.md)
PRIORITIES = ("online", "offline")
WEIGHT_MIN = 1
WEIGHT_MAX = 10000
EPS = 1e-9


@dataclass(frozen=True)
class Claim:
    """One instance's scheduling parameters on one GPU.

    weight: 1..10000 (weight, burst). share: fixed absolute fraction (fixed policy).
    ceiling: at most this fraction (equal, burst); None = no ceiling.
    priority: online or offline (compute_shares). min_share: an offline instance's
    floor while online work runs; None = nothing then.
    """

    name: str
    weight: int = 1
    share: float | None = None
    ceiling: float | None = None
    priority: str = "online"
    min_share: float | None = None

    @property
    def offline(self) -> bool:
        return self.priority == "offline"


@dataclass(frozen=True)
class Slot:
    """``name`` owns [start_ns, start_ns + length_ns) of the period; None = nobody runs."""

    name: str | None
    start_ns: int
    length_ns: int


def validate(policy: str, claims: Sequence[Claim]) -> list[str]:
    """Problems with ``claims`` under ``policy`` (empty list = fine)."""
    errors: list[str] = []
    if policy not in POLICIES:
        return [f"unknown policy {policy!r} (one of {', '.join(POLICIES)})"]
    names = [c.name for c in claims]
    if len(set(names)) != len(names):
        errors.append("duplicate instance names")
    for c in claims:
        if not WEIGHT_MIN <= c.weight <= WEIGHT_MAX:
            errors.append(f"{c.name}: weight {c.weight} outside {WEIGHT_MIN}..{WEIGHT_MAX}")
        if c.share is not None and not 0 < c.share <= 1:
            errors.append(f"{c.name}: share {c.share} outside (0, 1]")
        if c.ceiling is not None and not 0 < c.ceiling <= 1:
            errors.append(f"{c.name}: ceiling {c.ceiling} outside (0, 1]")
        if c.priority not in PRIORITIES:
            errors.append(f"{c.name}: priority {c.priority!r} is not one of {', '.join(PRIORITIES)}")
        if c.min_share is not None and (not 0 < c.min_share <= 1 or not c.offline):
            errors.append(f"{c.name}: min_share {c.min_share} needs an offline instance and (0, 1]")
    floors = sum(c.min_share for c in claims if c.min_share is not None and c.offline)
    if floors > 1 - 0.01 + EPS:
        errors.append(f"offline floors (min_share) sum to {floors * 100:.1f}%: online work needs at least 1%")
    if policy == "fixed":
        total = sum(c.share for c in claims if c.share is not None)
        if total > 1 + EPS:
            errors.append(f"fixed shares sum to {total * 100:.1f}% > 100%")
    return errors


def conflicts(policy: str, claims: Sequence[Claim]) -> list[str]:
    """Settings of valid ``claims`` that ``policy`` ignores or cannot honour, one line
    each, starting with the instance's name (gpuctl prints them as warnings):

    - a share under weight, equal or burst (only fixed uses it), a ceiling under fixed or
      weight (only equal and burst cap), a weight other than 1 under fixed or equal;
    - under fixed, an instance without a share whose fixed peers of the same priority
      take the whole GPU: it gets 0% for ever (the rest is split among those without);
    - under equal or burst, an offline floor above the instance's ceiling: it gets the
      floor beside online work but at most the ceiling without it.
    """
    out: list[str] = []
    for c in claims:
        if c.share is not None and policy != "fixed":
            out.append(f"{c.name}: share {_pct(c.share)} is ignored under {policy} (only the fixed policy uses it)")
        if c.ceiling is not None and policy in ("fixed", "weight"):
            out.append(f"{c.name}: ceiling {_pct(c.ceiling)} is ignored under {policy} (only equal and burst cap)")
        if c.weight != 1 and policy in ("fixed", "equal"):
            out.append(f"{c.name}: weight {c.weight} is ignored under {policy} (only weight and burst use it)")
        if policy == "fixed" and c.share is None:
            fixed = sum(d.share for d in claims if d.priority == c.priority and d.share is not None)
            if fixed >= 1 - EPS:
                out.append(f"{c.name}: gets 0% under fixed: the fixed shares of the {c.priority} instances take "
                           "the whole GPU (give it a --share)")
        if (policy in WORK_CONSERVING and c.offline and c.min_share is not None and c.ceiling is not None
                and c.min_share > c.ceiling + EPS):
            out.append(f"{c.name}: min-share {_pct(c.min_share)} is above its ceiling {_pct(c.ceiling)}: it gets "
                       f"{_pct(c.min_share)} beside online work but at most {_pct(c.ceiling)} without it")
    return out


def _pct(f: float) -> str:
    return f"{f * 100:.1f}%"


def _water_fill(weights: Mapping[str, float], ceilings: Mapping[str, float | None], total: float) -> dict[str, float]:
    """Split ``total`` in proportion to ``weights``; nobody above its ceiling; the excess
    of capped ones goes to the others in proportion to their weights."""
    out: dict[str, float] = {}
    free = dict(weights)
    remaining = total
    while free and remaining > EPS:
        wsum = sum(free.values())
        lam = remaining / wsum
        capped = {n for n, w in free.items() if ceilings.get(n) is not None and ceilings[n] < lam * w}  # type: ignore[operator]
        if not capped:
            for n, w in free.items():
                out[n] = lam * w
            free = {}
            break
        for n in capped:
            cap = ceilings[n]
            assert cap is not None
            out[n] = cap
            remaining -= cap
            del free[n]
    for n in free:
        out.setdefault(n, 0.0)
    return out


def compute_shares(policy: str, claims: Sequence[Claim], active: Collection[str]) -> dict[str, float]:
    """Fraction of the period each instance of one GPU may run (sum <= 1), with priority.

    Without offline instances: the policy alone (_policy_shares). With them:
    - while any online instance is active, each active offline instance gets its
      min_share floor (0 without one) and the online instances share the rest by the
      policy among themselves (idle capacity of fixed/weight stays idle as usual);
    - while no online instance is active, the offline instances share the whole GPU by
      the policy among themselves, and online instances get nothing (the scheduler
      leaves them ungated, so their first work runs at once: gated_when_idle).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    offline = [c for c in claims if c.offline]
    if not offline:
        return _policy_shares(policy, claims, active)
    online = [c for c in claims if not c.offline]
    out = {c.name: 0.0 for c in claims}
    if not any(c.name in active for c in online):
        out.update(_policy_shares(policy, offline, active))
        return out
    floors = {c.name: c.min_share for c in offline if c.name in active and c.min_share}
    rest = max(0.0, 1.0 - sum(floors.values()))  # type: ignore[arg-type]
    out.update({n: s * rest for n, s in _policy_shares(policy, online, active).items()})
    out.update(floors)  # type: ignore[arg-type]
    return _normalise(out)


def shares_online_idle(policy: str, claims: Sequence[Claim]) -> dict[str, float] | None:
    """What each instance of a GPU with online and offline instances gets while every
    offline one is busy and no online one is: the offline instances' share of the GPU
    (while online work runs they get their floor, often 0). None on a GPU without both."""
    if not any(c.offline for c in claims) or all(c.offline for c in claims):
        return None
    return compute_shares(policy, claims, {c.name for c in claims if c.offline})


def online_busy(claims: Sequence[Claim], active: Collection[str]) -> bool:
    """Does any online instance of a GPU with offline instances have work? (Then the
    offline ones are preempted.) False where no instance is offline."""
    return any(c.offline for c in claims) and any(not c.offline and c.name in active for c in claims)


def ungated(policy: str, claims: Sequence[Claim], active: Collection[str]) -> set[str]:
    """Instances the scheduler leaves enabled all period: idle ones under a
    work-conserving policy (their first work runs at once), and idle online ones of a
    GPU with offline instances, whatever the policy (an online request must not wait
    for a slot). While online work runs, offline instances are never left ungated:
    offline work that starts then would run beside it."""
    idle = {c.name for c in claims if c.name not in active}
    out = set(idle) if policy in WORK_CONSERVING else set()
    if any(c.offline for c in claims):
        out |= {c.name for c in claims if not c.offline and c.name in idle}
        if online_busy(claims, active):
            out -= {c.name for c in claims if c.offline}
    return out


def _policy_shares(policy: str, claims: Sequence[Claim], active: Collection[str]) -> dict[str, float]:
    """The policy alone, priority aside.

    fixed  : share f_i as configured; instances without a share split what the fixed
             ones leave equally. Idle capacity stays idle.
    weight : w_i / sum(w) over all instances. Idle capacity stays idle.
    equal  : 1/len(active) to each active instance (ceilings honoured, excess to the
             other active ones); idle instances 0.
    burst  : guarantee w_i/sum(w) over all; what idle instances leave goes to active
             ones in proportion to w, each at most its ceiling.
    """
    if not claims:
        return {}
    if policy == "fixed":
        fixed = {c.name: c.share for c in claims if c.share is not None}
        rest = [c.name for c in claims if c.share is None]
        left = max(0.0, 1.0 - sum(fixed.values()))
        out = {n: float(f) for n, f in fixed.items()}
        for n in rest:
            out[n] = left / len(rest)
        return _normalise(out)
    if policy == "weight":
        wsum = sum(c.weight for c in claims)
        return _normalise({c.name: c.weight / wsum for c in claims})
    act = [c for c in claims if c.name in active]
    out = {c.name: 0.0 for c in claims}
    if not act:
        return out
    weights = {c.name: (1.0 if policy == "equal" else float(c.weight)) for c in act}
    ceilings = {c.name: c.ceiling for c in act}
    out.update(_water_fill(weights, ceilings, 1.0))
    return _normalise(out)


def _normalise(shares: dict[str, float]) -> dict[str, float]:
    """Guard against float drift: never more than the whole GPU in total."""
    total = sum(shares.values())
    if total > 1.0:
        shares = {n: s / total for n, s in shares.items()}
    return shares


def slot_plan(shares: Mapping[str, float], period_ns: int, order: Iterable[str] | None = None) -> list[Slot]:
    """Lay ``shares`` out as consecutive exclusive slots covering one period exactly.

    Lengths are whole nanoseconds by largest remainder, so each differs from
    share*period by less than 1 ns and the slots of instances sum to at most the
    period; what is left is one trailing idle slot (name None). Instances appear in
    ``order`` (default: sorted names); zero-length slots are left out.
    """
    if period_ns <= 0:
        raise ValueError("period must be positive")
    names = list(order) if order is not None else sorted(shares)
    names = [n for n in names if n in shares] + sorted(n for n in shares if n not in set(names))
    exact = {n: max(0.0, shares[n]) * period_ns for n in names}
    lengths = {n: int(exact[n]) for n in names}
    target = min(period_ns, round(sum(exact.values())))
    short = target - sum(lengths.values())
    for n in sorted(names, key=lambda n: (lengths[n] - exact[n], names.index(n)))[: max(0, short)]:
        lengths[n] += 1
    slots: list[Slot] = []
    t = 0
    for n in names:
        if lengths[n] > 0:
            slots.append(Slot(n, t, lengths[n]))
            t += lengths[n]
    if t < period_ns:
        slots.append(Slot(None, t, period_ns - t))
    return slots


def corrected_shares(shares: Mapping[str, float], owed: Mapping[str, float]) -> dict[str, float]:
    """Slot lengths for the next period, corrected by what each slot is owed.

    ``owed[n]`` is how much less than its share slot n really got so far, as a fraction
    of a period (negative: it got more), measured by the scheduler from the moments its
    gating let its owner run. A late switch gives the outgoing slot the time the
    incoming one loses; paying it back next period keeps long-run shares on target
    whatever the daemon's wake-up latency. The scheduler passes the idle remainder of a
    period as a slot of its own (its owner is nobody), so what a late start costs an
    instance after the idle slot comes back out of idle time.

    Corrections sum to zero (the total stays what the policy gave: caps and the idle
    remainder hold on average): owing that every slot shares alike is nobody's.
    Each slot is paid what it is owed (beyond the mean) in one period, as far as the
    others can give it: a slot shrinks at most to nothing. So a tenant whose work cannot
    be stopped at once (an OpenGL frame is left only when it ends, and a disable waits for
    it) and runs past its slots pays the overrun back by skipping whole slots until its
    account is level: its long-run share is its share whatever its frames take
    (tests/test_sched_overrun.py). Slots without a share get none.
    """
    names = [n for n, s in shares.items() if s > 0]
    if len(names) < 2:
        return dict(shares)
    want = {n: owed.get(n, 0.0) for n in names}
    mean = sum(want.values()) / len(names)
    corr = {n: max(-shares[n], want[n] - mean) for n in names}
    excess = sum(corr.values())
    side = [n for n in names if (corr[n] > 0) == (excess > 0) and corr[n] != 0]
    mass = sum(abs(corr[n]) for n in side)
    if excess and mass:
        # shrink the side that overshoots: magnitudes only get smaller, so no slot goes below 0
        for n in side:
            corr[n] -= excess * abs(corr[n]) / mass
    out = dict(shares)
    for n in names:
        out[n] = shares[n] + corr[n]
    return out


def sticky_active(seen: Collection[str], was_active: Collection[str], present: Collection[str],
                  quiet_enabled_ns: Mapping[str, int], hold_ns: int) -> set[str]:
    """The active set for the next period, from what the probe ``seen`` busy now and
    the gating history.

    An instance that was active stays active until it has been *enabled* (had its
    channels runnable) for ``hold_ns`` in total since it was last seen busy
    (``quiet_enabled_ns``): a gated channel submits and completes nothing, and a process
    that sleeps while its channels are gated looks idle, so time spent gated is no
    evidence of idleness. Without this, such an instance was dropped from the busy set
    after each gated period, left ungated, seen busy again, and so on (issue 12: 60/39
    instead of 50/50 under burst on the H100). Only instances that still have channels
    (``present``) can be active.
    """
    keep = {n for n in was_active if quiet_enabled_ns.get(n, 0) < hold_ns}
    return (set(seen) | keep) & set(present)


def gang_order(claims: list[Claim], multi: set[str]) -> list[str]:
    """The order of a GPU's slots: online before offline; in each, the instances of
    several GPUs (``multi``) first, sorted, then the rest in their order. Every GPU of a
    multi-GPU instance thus starts its slot at the same offset of the period as far as
    the instances before it are also multi-GPU ones of the same GPUs."""
    out: list[str] = []
    for offline in (False, True):
        group = [c.name for c in claims if c.offline == offline]
        out += sorted(n for n in group if n in multi) + [n for n in group if n not in multi]
    return out

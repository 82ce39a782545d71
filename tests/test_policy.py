"""Policy math: the properties docs/policies.md promises."""

import pytest
from hypothesis import assume, given, settings, strategies as st

from gpuslice.policy import POLICIES, WORK_CONSERVING, Claim, compute_shares, corrected_shares, slot_plan, validate

TOL = 1e-9
names = st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=6, unique=True)


@st.composite
def scenario(draw: st.DrawFn, policy: str | None = None) -> tuple[str, list[Claim], set[str]]:
    pol = policy or draw(st.sampled_from(POLICIES))
    ns = draw(names)
    claims = []
    budget = 1.0
    for n in ns:
        share = None
        if pol == "fixed" and draw(st.booleans()):
            share = draw(st.floats(min_value=0.001, max_value=1.0))
            if share > budget:
                share = None
            else:
                budget -= share
        ceiling = draw(st.one_of(st.none(), st.floats(min_value=0.01, max_value=1.0)))
        claims.append(Claim(n, draw(st.integers(1, 10000)), share, ceiling))
    active = set(draw(st.lists(st.sampled_from(ns), unique=True)))
    return pol, claims, active


@given(scenario())
def test_shares_sum_to_at_most_one(sc: tuple[str, list[Claim], set[str]]) -> None:
    pol, claims, active = sc
    shares = compute_shares(pol, claims, active)
    assert set(shares) == {c.name for c in claims}
    assert all(s >= 0 for s in shares.values())
    assert sum(shares.values()) <= 1 + TOL


@given(scenario())
def test_ceilings_respected_and_idle_get_nothing_when_work_conserving(sc: tuple[str, list[Claim], set[str]]) -> None:
    pol, claims, active = sc
    assume(pol in WORK_CONSERVING)
    shares = compute_shares(pol, claims, active)
    for c in claims:
        if c.ceiling is not None:
            assert shares[c.name] <= c.ceiling + TOL
        if c.name not in active:
            assert shares[c.name] == 0


@given(scenario())
def test_idle_capacity(sc: tuple[str, list[Claim], set[str]]) -> None:
    """fixed/weight: shares do not depend on who is active (idle capacity stays idle).
    equal/burst: the active ones get everything unless all of them hit their ceiling."""
    pol, claims, active = sc
    shares = compute_shares(pol, claims, active)
    if pol in WORK_CONSERVING:
        act = [c for c in claims if c.name in active]
        if act and not all(c.ceiling is not None and shares[c.name] >= c.ceiling - TOL for c in act):
            assert sum(shares.values()) == pytest.approx(1.0)
    else:
        assert shares == compute_shares(pol, claims, set())
        assert shares == compute_shares(pol, claims, {c.name for c in claims})


@given(scenario(), st.data())
def test_monotone_in_weight(sc: tuple[str, list[Claim], set[str]], data: st.DataObject) -> None:
    pol, claims, active = sc
    i = data.draw(st.integers(0, len(claims) - 1))
    c = claims[i]
    bigger = data.draw(st.integers(c.weight, 10000))
    before = compute_shares(pol, claims, active)[c.name]
    claims2 = list(claims)
    claims2[i] = Claim(c.name, bigger, c.share, c.ceiling)
    after = compute_shares(pol, claims2, active)[c.name]
    assert after >= before - TOL


@given(scenario("burst"))
def test_burst_guarantee(sc: tuple[str, list[Claim], set[str]]) -> None:
    """An active burst instance gets at least its guarantee w/W (or its ceiling)."""
    pol, claims, active = sc
    shares = compute_shares(pol, claims, active)
    wsum = sum(c.weight for c in claims)
    for c in claims:
        if c.name in active:
            floor = c.weight / wsum
            if c.ceiling is not None:
                floor = min(floor, c.ceiling)
            assert shares[c.name] >= floor - TOL


@given(scenario("equal"))
def test_equal_is_equal_without_ceilings(sc: tuple[str, list[Claim], set[str]]) -> None:
    pol, claims, active = sc
    claims = [Claim(c.name, c.weight) for c in claims]
    shares = compute_shares(pol, claims, active)
    for n in active:
        assert shares[n] == pytest.approx(1 / len(active))


def test_examples() -> None:
    cl = [Claim("a", 1, 0.3), Claim("b", 3, 0.5), Claim("c", 1)]
    assert compute_shares("fixed", cl, {"a"}) == pytest.approx({"a": 0.3, "b": 0.5, "c": 0.2})
    assert compute_shares("weight", cl, set()) == pytest.approx({"a": 0.2, "b": 0.6, "c": 0.2})
    assert compute_shares("equal", cl, {"a", "b"}) == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.0})
    # burst: c idle leaves 0.2, shared 1:3 by a and b
    assert compute_shares("burst", cl, {"a", "b"}) == pytest.approx({"a": 0.25, "b": 0.75, "c": 0.0})
    capped = [Claim("a", 1, ceiling=0.1), Claim("b", 1)]
    assert compute_shares("burst", capped, {"a", "b"}) == pytest.approx({"a": 0.1, "b": 0.9})
    assert compute_shares("burst", capped, {"a"}) == pytest.approx({"a": 0.1, "b": 0.0})


def test_validate() -> None:
    assert validate("fixed", [Claim("a", share=0.6), Claim("b", share=0.5)]) == ["fixed shares sum to 110.0% > 100%"]
    assert validate("fixed", [Claim("a", share=0.6), Claim("b", share=0.4)]) == []
    assert validate("nope", []) != []
    assert validate("weight", [Claim("a", weight=0)]) != []
    assert validate("burst", [Claim("a", ceiling=1.5)]) != []
    with pytest.raises(ValueError):
        compute_shares("nope", [Claim("a")], set())


shares_st = st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.floats(0, 1), max_size=6)


@given(shares_st, st.integers(1, 10**9))
@settings(max_examples=300)
def test_slot_plan_covers_period(shares: dict[str, float], period: int) -> None:
    total = sum(shares.values())
    assume(total <= 1)
    slots = slot_plan(shares, period)
    # consecutive, starting at 0, covering exactly the period
    t = 0
    for s in slots:
        assert s.start_ns == t and s.length_ns > 0
        t += s.length_ns
    assert t == period
    got = {s.name: s.length_ns for s in slots if s.name is not None}
    assert len(got) == len([s for s in slots if s.name is not None])  # one slot per instance
    for n, f in shares.items():
        assert abs(got.get(n, 0) - f * period) < 1.0  # within one ns
    assert [s.name for s in slots if s.name is not None] == sorted(got)


def test_slot_plan_order_and_idle() -> None:
    slots = slot_plan({"a": 0.25, "b": 0.5}, 40_000_000, order=["b", "a"])
    assert [(s.name, s.start_ns, s.length_ns) for s in slots] == [
        ("b", 0, 20_000_000), ("a", 20_000_000, 10_000_000), (None, 30_000_000, 10_000_000)]
    assert slot_plan({}, 10) == [slot_plan({}, 10)[0]] and slot_plan({}, 10)[0].name is None
    with pytest.raises(ValueError):
        slot_plan({"a": 1.0}, 0)


@st.composite
def owing(draw: st.DrawFn) -> tuple[dict[str, float], dict[str, float]]:
    n = draw(st.integers(1, 6))
    raw = draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))
    total = draw(st.floats(0.1, 1.0))
    shares = {f"i{k}": total * r / sum(raw) for k, r in enumerate(raw)}
    owed = {k: draw(st.floats(-0.5, 0.5)) for k in shares if draw(st.booleans())}
    return shares, owed


@given(owing())
def test_corrections_keep_the_total_and_pay_at_most_what_is_owed(so: tuple[dict[str, float], dict[str, float]]) -> None:
    shares, owed = so
    out = corrected_shares(shares, owed)
    assert set(out) == set(shares)
    assert sum(out.values()) == pytest.approx(sum(shares.values()), abs=1e-9)
    for n, s in shares.items():
        assert out[n] >= -1e-9  # a slot shrinks to nothing at most
        # and by no more than it is owed less than the mean, grows by no more than owed above it
        live = [m for m in shares if shares[m] > 0]
        if s > 0 and len(live) >= 2:
            rel = owed.get(n, 0.0) - sum(owed.get(m, 0.0) for m in live) / len(live)
            assert min(0.0, rel) - 1e-9 <= out[n] - s <= max(0.0, rel) + 1e-9


@given(owing(), st.floats(-0.5, 0.5))
def test_corrections_pay_differences_only(so: tuple[dict[str, float], dict[str, float]], same: float) -> None:
    shares, _ = so
    assert corrected_shares(shares, {}) == shares
    assert corrected_shares(shares, {n: same for n in shares}) == pytest.approx(shares, abs=1e-12)


@given(owing())
def test_most_owed_slot_never_shrinks(so: tuple[dict[str, float], dict[str, float]]) -> None:
    shares, owed = so
    assume(len(shares) >= 2 and owed)
    out = corrected_shares(shares, owed)
    top = max(shares, key=lambda n: owed.get(n, 0.0))
    low = min(shares, key=lambda n: owed.get(n, 0.0))
    assume(owed.get(top, 0.0) > owed.get(low, 0.0))
    assert out[top] >= shares[top] - 1e-12
    assert out[low] <= shares[low] + 1e-12


def test_an_overrun_is_paid_back_by_skipping_slots() -> None:
    # a render tenant at 5% whose frame ran 24.5 ms past its slot of a 50 ms period
    # (owed -0.49): its slots go to the one it overran until its account is level
    out = corrected_shares({"r": 0.05, "c": 0.95}, {"r": -0.49, "c": 0.49})
    assert out == pytest.approx({"r": 0.0, "c": 1.0})
    # level again: its share
    assert corrected_shares({"r": 0.05, "c": 0.95}, {"r": 0.0, "c": 0.0}) == {"r": 0.05, "c": 0.95}


def test_correction_example() -> None:
    # a's start was 2 ms late in a 40 ms period after an idle slot: paid from the idle slot
    out = corrected_shares({"a": 0.3, "b": 0.5, "": 0.2}, {"a": 0.05, "": -0.05})
    assert out == pytest.approx({"a": 0.35, "b": 0.5, "": 0.15})


names_st = st.sets(st.sampled_from("abcdef"))


@given(seen=names_st, was=names_st, present=names_st,
       quiet=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 10**9)), hold=st.integers(1, 10**9))
def test_sticky_active_keeps_busy_until_a_hold_of_enabled_time(seen, was, present, quiet, hold) -> None:
    from gpuslice.policy import sticky_active

    got = sticky_active(seen, was, present, quiet, hold)
    assert got <= set(present)  # no channels, never active
    assert set(seen) & set(present) <= got  # seen busy: active
    for n in got - set(seen):  # kept only if it was active and not yet enabled for the hold
        assert n in was and quiet.get(n, 0) < hold
    for n in (set(was) & set(present)) - set(seen):
        assert (n in got) == (quiet.get(n, 0) < hold)


@st.composite
def prio_claims(draw):
    n = draw(st.integers(1, 6))
    out = []
    for i in range(n):
        off = draw(st.booleans())
        out.append(Claim(f"i{i}", draw(st.integers(1, 100)), None, None, "offline" if off else "online",
                         draw(st.sampled_from([None, 0.05, 0.1])) if off else None))
    return out


@given(policy=st.sampled_from(["weight", "equal", "burst"]), claims=prio_claims(), data=st.data())
@settings(max_examples=300)
def test_priority_online_work_takes_all_but_the_floors(policy, claims, data) -> None:
    from gpuslice.policy import online_busy, ungated

    active = data.draw(st.sets(st.sampled_from([c.name for c in claims])))
    assert not validate(policy, claims)
    got = compute_shares(policy, claims, active)
    assert sum(got.values()) <= 1 + 1e-9 and all(v >= 0 for v in got.values())
    off = [c for c in claims if c.offline]
    on = [c for c in claims if not c.offline]
    free = ungated(policy, claims, active)
    if off and any(c.name in active for c in on):
        assert online_busy(claims, active)
        for c in off:  # the floor, and only while it has work; never ungated
            assert got[c.name] == pytest.approx((c.min_share or 0.0) if c.name in active else 0.0)
            assert c.name not in free
        floors = sum(c.min_share or 0.0 for c in off if c.name in active)
        # online instances share the rest exactly as the policy would share the whole GPU among them
        alone = compute_shares(policy, on, active)
        for c in on:
            assert got[c.name] == pytest.approx(alone[c.name] * (1 - floors))
    elif off:
        assert not online_busy(claims, active)
        alone = compute_shares(policy, off, active)
        for c in off:
            assert got[c.name] == pytest.approx(alone[c.name])
        for c in on:  # idle online instances: nothing, but ungated (their first work runs at once)
            assert got[c.name] == 0.0 and c.name in free
    else:
        assert got == compute_shares(policy, [Claim(c.name, c.weight) for c in claims], active)


def test_priority_validation() -> None:
    assert validate("burst", [Claim("a", min_share=0.1)])  # a floor on an online instance
    assert validate("burst", [Claim("a", priority="batch")])
    assert validate("burst", [Claim("a", priority="offline", min_share=0.6),
                              Claim("b", priority="offline", min_share=0.5)])  # floors over 99%
    assert not validate("burst", [Claim("a", priority="offline", min_share=0.2), Claim("b")])


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans(), st.booleans()), max_size=8,
                unique_by=lambda t: t[0]),
       st.permutations(list(range(8))))
def test_gang_order(specs, perm) -> None:
    """Online before offline; in each, multi-GPU instances first and sorted, so any two
    GPUs order the multi-GPU instances they share alike, whatever their claims' order."""
    from gpuslice.policy import gang_order

    claims = [Claim(n, 1, None, None, "offline" if off else "online") for n, off, _ in specs]
    multi = {n for n, _, m in specs if m}
    order = gang_order(claims, multi)
    assert sorted(order) == sorted(c.name for c in claims)
    off = {c.name for c in claims if c.offline}
    assert order == [n for n in order if n not in off] + [n for n in order if n in off]
    for group in ([n for n in order if n not in off], [n for n in order if n in off]):
        k = sum(1 for n in group if n in multi)
        assert set(group[:k]) == multi & set(group) and group[:k] == sorted(group[:k])
    other = [claims[i] for i in perm if i < len(claims)]  # another GPU: same claims, another order
    assert [n for n in gang_order(other, multi) if n in multi] == [n for n in order if n in multi]


# ---- conflicts: settings a policy ignores or cannot honour (gpuctl warns) --------------------

@st.composite
def any_claims(draw: st.DrawFn) -> tuple[str, list[Claim]]:
    pol = draw(st.sampled_from(POLICIES))
    claims = []
    budget = 1.0
    for n in draw(names):
        share = draw(st.one_of(st.none(), st.sampled_from([0.1, 0.25, 0.5, 1.0])))
        if share is not None:
            if share > budget:
                share = None
            else:
                budget -= share
        prio = draw(st.sampled_from(["online", "offline"]))
        floor = draw(st.one_of(st.none(), st.sampled_from([0.05, 0.2]))) if prio == "offline" else None
        ceiling = draw(st.one_of(st.none(), st.sampled_from([0.1, 0.5, 1.0])))
        claims.append(Claim(n, draw(st.sampled_from([1, 1, 3])), share, ceiling, prio, floor))
    assume(not validate(pol, claims))
    return pol, claims


def _about(msgs: list[str], name: str, kind: str) -> bool:
    return any(m.startswith(f"{name}: {kind}") for m in msgs)


@given(any_claims())
def test_conflicts_name_each_ignored_setting(sc: tuple[str, list[Claim]]) -> None:
    from gpuslice.policy import conflicts

    pol, claims = sc
    msgs = conflicts(pol, claims)
    for c in claims:
        assert _about(msgs, c.name, "share ") == (c.share is not None and pol != "fixed")  # stored, never used
        assert _about(msgs, c.name, "ceiling ") == (c.ceiling is not None and pol in ("fixed", "weight"))
        assert _about(msgs, c.name, "weight ") == (c.weight != 1 and pol in ("fixed", "equal"))
        zero = compute_shares(pol, claims, {d.name for d in claims if d.priority == c.priority})[c.name] <= TOL
        assert _about(msgs, c.name, "gets 0%") == (pol == "fixed" and c.share is None and zero)  # for ever
        # the floor beside online work, the ceiling without: one of them is broken
        assert _about(msgs, c.name, "min-share ") == (pol in WORK_CONSERVING and c.min_share is not None
                                                      and c.ceiling is not None and c.min_share > c.ceiling)
    assert len(msgs) == len(set(msgs))


def test_conflicts_examples() -> None:
    from gpuslice.policy import conflicts

    assert conflicts("burst", [Claim("a", 3, ceiling=0.5), Claim("b")]) == []
    assert conflicts("fixed", [Claim("a", share=0.3), Claim("b")]) == []  # b gets the 70% a leaves
    assert conflicts("fixed", [Claim("a", share=1.0), Claim("b")]) == [
        "b: gets 0% under fixed: the fixed shares of the online instances take the whole GPU (give it a --share)"]
    assert conflicts("burst", [Claim("a", share=0.3)]) == [
        "a: share 30.0% is ignored under burst (only the fixed policy uses it)"]
    assert conflicts("equal", [Claim("a", priority="offline", ceiling=0.5, min_share=0.6)]) == [
        "a: min-share 60.0% is above its ceiling 50.0%: it gets 60.0% beside online work but at most "
        "50.0% without it"]

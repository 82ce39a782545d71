"""gpuslice.kube.capacity: DRA consumable-capacity arithmetic (KEP-5075) against upstream cases.

The tables below port test cases of Kubernetes (Apache-2.0, (c) The Kubernetes
Authors); each row is named after the upstream case it came from:

- CALC / VIOLATE / FROM_REQUEST: ``structured/internal/incubating/consumable_capacity_test.go``
  (``testCalculateConsumedCapacity``, ``testViolateCapacityRequestPolicy``,
  ``get-consumed-capacity-from-request``) of kubernetes/dynamic-resource-allocation at tag
  v0.36.2 (= Kubernetes v1.36.2, staging/src/k8s.io/dynamic-resource-allocation/...;
  Kubernetes-commit d52dde2e436ddc4d23c267a621a38fb2d44a0989). Upstream's quantities
  one/two/three are the plain integers 1/2/3.
- ALLOCATOR: the ``consumable-capacity-*`` cases of
  ``structured/internal/allocatortesting/allocator_testing.go`` at the same tag, reduced to
  the per-capacity arithmetic (``consumed`` for one request, ``fits`` for several on one
  device). Its helper ``withCapacityRequestPolicyRange`` is default 2, min 2, step 2, max 4;
  ``withCapacityRequestPolicyValidValues(d, ..., extra)`` is default d, validValues [d]+extra.
- VALIDATION: ``TestValidateDeviceCapacity`` in kubernetes/kubernetes
  ``pkg/apis/resource/validation/validation_device_capacity_test.go`` (its integer cases,
  the same in the pre- and post-DRAFractionalCapacityRange versions), checked against
  ``validation.go`` at commit 797475e1137914faab71f4c3b18d9041bf73cfc8.
- PARSE: ``TestQuantityParse`` and the invalid list of ``TestQuantityParseErrors`` in
  kubernetes/apimachinery ``pkg/api/resource/quantity_test.go`` at tag v0.36.2, with the
  expected value turned into ``Quantity.Value()`` (rounded up).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from typing import Any

import pytest
from hypothesis import assume, given, settings, strategies as st

from gpuslice.kube import capacity as cap_mod
from gpuslice.kube.capacity import (
    INT64_MAX,
    NotAllocatable,
    RequestPolicy,
    ValidRange,
    consumed,
    fits,
    format_quantity,
    parse_quantity,
    valid_amount,
    validate_policy,
)

Ki, Mi, Gi, Ti, Pi, Ei = (1 << 10), (1 << 20), (1 << 30), (1 << 40), (1 << 50), (1 << 60)


def rng(default: int | None, lo: int, hi: int | None = None, step: int | None = None) -> RequestPolicy:
    return RequestPolicy(default=default, valid_range=ValidRange(min=lo, max=hi, step=step))


def vals(default: int | None, *values: int) -> RequestPolicy:
    return RequestPolicy(default=default, valid_values=tuple(values))


# --------------------------------------------------------------------------------------------
# consumable_capacity_test.go (v0.36.2)
# --------------------------------------------------------------------------------------------

# name, requested, capacity, policy, upstream calculateConsumedCapacity result, consumed() result
CALC: list[tuple[str, int | None, int, RequestPolicy | None, int, int | type[NotAllocatable]]] = [
    ("empty", None, 1, RequestPolicy(), 1, 1),
    ("min in range", None, 2, rng(1, 1), 1, 1),
    ("default in set", None, 2, vals(1, 1), 1, 1),
    ("more than min in range", 2, 2, rng(1, 1), 2, 2),
    ("less than min in range", 1, 2, rng(1, 2), 2, 2),
    ("with step (round up)", 2, 3, rng(1, 1, step=2), 3, 3),
    ("with step (no remaining)", 2, 2, rng(1, 1, step=1), 2, 2),
    ("valid value in set", 2, 3, vals(1, 1, 2, 3), 2, 2),
    ("set (round up)", 2, 3, vals(1, 1, 3), 3, 3),
    # calculateConsumedCapacity returns the request; violatesPolicy then refuses it
    ("larger than set", 3, 3, vals(1, 1, 2), 3, NotAllocatable),
]


@pytest.mark.parametrize("name,requested,capacity,policy,upstream,expected", CALC, ids=[r[0] for r in CALC])
def test_calculate_consumed_capacity(
    name: str, requested: int | None, capacity: int, policy: RequestPolicy | None, upstream: int,
    expected: int | type[NotAllocatable],
) -> None:
    assert cap_mod._round_up(requested, policy, capacity) == upstream
    if isinstance(expected, int):
        assert consumed(requested, policy, capacity) == expected
        assert valid_amount(expected, policy, capacity)
    else:
        with pytest.raises(expected):
            consumed(requested, policy, capacity)


# name, amount, policy, violates
VIOLATE: list[tuple[str, int, RequestPolicy | None, bool]] = [
    ("no constraint", 1, None, False),
    ("less than maximum", 1, rng(1, 1, 2), False),
    ("more than maximum", 2, rng(1, 1, 1), True),
    ("in set", 1, vals(1, 1), False),
    ("not in set", 2, vals(1, 1), True),
]


@pytest.mark.parametrize("name,amount,policy,violates", VIOLATE, ids=[r[0] for r in VIOLATE])
def test_violate_capacity_request_policy(name: str, amount: int, policy: RequestPolicy | None, violates: bool) -> None:
    assert (cap_mod._violation(amount, policy) is not None) == violates
    # with room to spare, a violation is exactly what makes consumed() refuse the amount
    if violates:
        with pytest.raises(NotAllocatable):
            consumed(amount, policy, 100)
    else:
        assert consumed(amount, policy, 100) == amount


def test_get_consumed_capacity_from_request() -> None:
    # "get-consumed-capacity-from-request": three capacities, every one consumes 1
    assert consumed(1, rng(2, 1), 2) == 1  # capacity-0: with request and default, the request
    assert consumed(None, rng(1, 1), 2) == 1  # capacity-1: no request, the default
    assert consumed(None, None, 1) == 1  # dummy: no request, no policy, the capacity value


# --------------------------------------------------------------------------------------------
# allocator_testing.go (v0.36.2), consumable-capacity-* cases
# --------------------------------------------------------------------------------------------

RANGE_2_2_4 = rng(2, 2, 4, 2)  # withCapacityRequestPolicyRange

# name, per-request (requested, policy, capacity), amounts already on the device, expected:
# a list of consumed amounts and whether all of them fit together, or NotAllocatable
ALLOCATOR: list[tuple[str, list[int | None], RequestPolicy | None, int, list[int], Any]] = [
    ("multi-allocatable-device-without-policy-without-capacity-request", [None], None, 1, [], ([1], True)),
    # two claims, each takes the whole device: the second one does not fit
    ("multi-allocatable-device-without-policy-without-capacity-request-block", [None, None], None, 2, [],
     ([2, 2], False)),
    ("multi-allocatable-device-without-policy-with-capacity-request", [1, 1], None, 2, [], ([1, 1], True)),
    ("multi-allocatable-device-with-policy-without-capacity-request", [None, None], RANGE_2_2_4, 4, [],
     ([2, 2], True)),
    ("multi-allocatable-device-with-zero-request-policy", [None, None], vals(0, 0), 1, [], ([0, 0], True)),
    ("multi-allocatable-device-violates-zero-request-policy", [1], vals(0, 0), 1, [], NotAllocatable),
    ("multi-allocatable-device-with-range-policy-with-capacity-request", [1, 1], RANGE_2_2_4, 4, [],
     ([2, 2], True)),
    ("multi-allocatable-device-with-range-policy-step", [3], RANGE_2_2_4, 4, [], ([4], True)),
    ("multi-allocatable-device-with-valid-values-policy", [2], vals(1, 1, 2), 4, [], ([2], True)),
    ("multi-allocatable-device-with-valid-values-policy-round-up", [2], vals(1, 1, 3), 3, [], ([3], True)),
    ("multi-allocatable-device-with-exceeded-consumable-capacity-request", [1, 2], RANGE_2_2_4, 2, [],
     ([2, 2], False)),
    ("multi-allocatable-device-with-request-over-max-sharing-policy", [6], RANGE_2_2_4, 10, [], NotAllocatable),
    ("multi-allocatable-device-with-allocated-capacity-use-remaining", [2], RANGE_2_2_4, 4, [2], ([2], True)),
    ("multi-allocatable-device-with-allocated-capacity-next-device", [2], RANGE_2_2_4, 2, [2], ([2], False)),
    # subrequests: 4 does not fit a capacity of 2 (it is within max 4), the next subrequest 2 does
    ("multi-allocatable-device-with-subrequest (subReq-0)", [4], RANGE_2_2_4, 2, [], NotAllocatable),
    ("multi-allocatable-device-with-subrequest (subReq-1)", [2], RANGE_2_2_4, 2, [], ([2], True)),
    ("multi-allocatable-device-with-no-available-consumable-capacity", [2], RANGE_2_2_4, 2, [2], ([2], False)),
    ("multi-allocatable-device-allocation-mode-all-filter-out-insufficient-capacity (device-1)", [2], None, 2, [],
     ([2], True)),
    ("multi-allocatable-device-allocation-mode-all-filter-out-insufficient-capacity (device-2)", [2], None, 1, [],
     NotAllocatable),
    ("multi-allocatable-device-allocation-mode-all-allocating-sufficient (device-1)", [1, 1], None, 2, [],
     ([1, 1], True)),
    ("multi-allocatable-device-allocation-mode-all-allocating-insufficient (device-1)", [1, 1], None, 1, [],
     ([1, 1], False)),
    ("multi-allocatable-device-allocation-mode-all-in-use-sufficient (device-1)", [1], None, 2, [1], ([1], True)),
    ("multi-allocatable-device-allocation-mode-all-in-use-insufficient (device-1)", [1], None, 1, [1],
     ([1], False)),
]


@pytest.mark.parametrize("name,requests,policy,capacity,in_use,expected", ALLOCATOR, ids=[r[0] for r in ALLOCATOR])
def test_allocator_cases(
    name: str, requests: list[int | None], policy: RequestPolicy | None, capacity: int, in_use: list[int],
    expected: Any,
) -> None:
    if expected is NotAllocatable:
        with pytest.raises(NotAllocatable):
            for r in requests:
                consumed(r, policy, capacity)
        return
    amounts, together = expected
    assert [consumed(r, policy, capacity) for r in requests] == amounts
    assert fits(in_use + amounts, capacity) == together


# --------------------------------------------------------------------------------------------
# validation_device_capacity_test.go, TestValidateDeviceCapacity
# --------------------------------------------------------------------------------------------

ONE, TWO, MAX, OVER = 1 * Gi, 2 * Gi, 10 * Gi, 20 * Gi

# name, capacity, policy, substrings of the expected errors, in upstream's order
VALIDATION: list[tuple[str, int, RequestPolicy | None, list[str]]] = [
    ("no-policy", ONE, None, []),
    ("policy-without-default", ONE, RequestPolicy(), []),
    ("policy-with-valid-values-without-default", ONE, vals(None, ONE), ["default is required when validValues"]),
    ("policy-with-valid-range-without-default", ONE, rng(None, ONE), ["default is required when validRange"]),
    ("valid-simple-range", MAX, rng(ONE, ONE), []),
    ("valid-range-with-max", MAX, rng(ONE, ONE, MAX), []),
    ("valid-range-with-step", MAX, rng(ONE, ONE, step=ONE), []),
    ("valid-range-with-max-and-step", MAX, rng(ONE, ONE, MAX, ONE), []),
    ("valid-single-option", MAX, vals(ONE, ONE), []),
    ("valid-two-options", MAX, vals(ONE, ONE, MAX), []),
    ("default-without-policy", MAX, RequestPolicy(default=ONE), []),
    ("more-than-one-policy", MAX,
     RequestPolicy(default=ONE, valid_values=(ONE,), valid_range=ValidRange(min=ONE)), ["exactly one policy"]),
    ("invalid-options", MAX, vals(ONE, OVER),
     ["validValues[0] 20Gi: option is larger than capacity value 10Gi", "default 1Gi is not one of validValues"]),
    ("invalid-options-duplicate", MAX, vals(ONE, ONE, ONE), ["validValues[1] 1Gi: duplicate"]),
    ("invalid-options-unsort", MAX, vals(ONE, TWO, ONE), ["validValues[1] 1Gi: values must be sorted"]),
    ("invalid-range-large-min-small-max", MAX, rng(TWO, OVER, ONE),
     ["min 20Gi is larger than capacity value 10Gi", "default 2Gi is less than validRange.min 20Gi",
      "min 20Gi is larger than validRange.max 1Gi", "default 2Gi is more than validRange.max 1Gi"]),
    ("invalid-range-large-max", MAX, rng(ONE, ONE, OVER), ["max 20Gi is larger than capacity value 10Gi"]),
    ("invalid-range-multiple-of-step", MAX, rng(TWO, ONE, MAX, TWO),
     ["default 2Gi is not a multiple of step 2Gi from min 1Gi",
      "validRange.max 10Gi is not a multiple of step 2Gi from min 1Gi"]),
    ("invalid-range-large-step", MAX, rng(ONE, ONE, step=MAX), ["one step 11Gi is larger than capacity value 10Gi"]),
]


@pytest.mark.parametrize("name,capacity,policy,errors", VALIDATION, ids=[r[0] for r in VALIDATION])
def test_validate_device_capacity(name: str, capacity: int, policy: RequestPolicy | None, errors: list[str]) -> None:
    got = validate_policy(policy, capacity)
    assert len(got) == len(errors), got
    for sub, msg in zip(errors, got):
        assert sub in msg


def test_validation_invalid_options_duplicate_normalized() -> None:
    # "invalid-options-duplicate-normalized": 1Ki and 1024 are the same value
    policy = RequestPolicy.from_api({"default": "1Ki", "validValues": ["1Ki", "1024"]})
    assert policy is not None
    errs = validate_policy(policy, MAX)
    assert len(errs) == 1 and "validValues[1] 1Ki: duplicate" in errs[0]


def test_validation_range_without_min_is_refused_when_parsed() -> None:
    # "policy-with-valid-range-without-min": ValidRange cannot be built without min
    with pytest.raises(ValueError, match="min is required"):
        RequestPolicy.from_api({"default": "1Gi", "validRange": {}})


def test_validation_too_many_valid_values() -> None:
    values = tuple(range(1, 12))
    errs = validate_policy(vals(1, *values), 100)
    # upstream's validateSet stops at the size check, so the default is not found either
    assert len(errs) == 2 and "11 entries" in errs[0] and "default 1 is not one of" in errs[1]
    assert validate_policy(vals(1, *values[:10]), 100) == []


@pytest.mark.parametrize("bad", [dict(min=-1), dict(min=0, max=-1), dict(min=0, step=0), dict(min=0, step=-2)])
def test_valid_range_refuses_negative_and_zero_step(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ValidRange(**bad)


def test_request_policy_refuses_negative() -> None:
    with pytest.raises(ValueError):
        RequestPolicy(default=-1)
    with pytest.raises(ValueError):
        RequestPolicy(valid_values=(1, -1))
    with pytest.raises(ValueError):
        consumed(-1, None, 10)
    with pytest.raises(ValueError):
        consumed(1, None, -10)


# --------------------------------------------------------------------------------------------
# Quantities: quantity_test.go (apimachinery v0.36.2)
# --------------------------------------------------------------------------------------------

PARSE: list[tuple[str, int]] = [
    ("0", 0), ("0n", 0), ("0u", 0), ("0m", 0), ("0Ki", 0), ("0k", 0), ("0Mi", 0), ("0M", 0), ("0Gi", 0),
    ("0G", 0), ("0Ti", 0), ("0T", 0),
    ("1", 1),
    ("1Ki", Ki), ("8Ki", 8 * Ki), ("7Mi", 7 * Mi), ("6Gi", 6 * Gi), ("5Ti", 5 * Ti), ("4Pi", 4 * Pi),
    ("3Ei", 3 * Ei), ("10Ti", 10 * Ti), ("100Ti", 100 * Ti),
    ("5n", 1), ("4u", 1), ("3m", 1), ("9", 9), ("8k", 8000), ("50k", 50000), ("7M", 7 * 10**6),
    ("6G", 6 * 10**9), ("5T", 5 * 10**12), ("40T", 40 * 10**12), ("300T", 300 * 10**12), ("2P", 2 * 10**15),
    ("1E", 10**18),
    ("1E-3", 1), ("1e3", 1000), ("1E6", 10**6), ("1e9", 10**9), ("1E12", 10**12), ("1e15", 10**15),
    ("1E18", 10**18), ("1e14", 10**14), ("1e13", 10**13), ("100.035k", 100035),
    ("0.001", 1), ("0.0005k", 1), ("0.005", 1), ("0.05", 1), ("0.5", 1), ("0.00050k", 1), ("0.00500", 1),
    ("0.05000", 1), ("0.50000", 1), ("0.5e0", 1), ("0.5e-1", 1), ("0.5e-2", 1), ("10.035M", 10035000),
    ("1.2e3", 1200), ("1.3E+6", 1300000), ("1.40e9", 1400000000), ("1.53E12", 1530000000000),
    ("1.6e15", 1600000000000000), ("1.7E18", 1700000000000000000),
    ("9.01", 10), ("8.1k", 8100), ("7.123456M", 7123456), ("6.987654321G", 6987654321),
    ("5.444T", 5444000000000), ("40.1T", 40100000000000), ("300.2T", 300200000000000),
    ("2.5P", 2500000000000000), ("1.01E", 1010000000000000000),
    ("3.001n", 1), ("1.1E-9", 1), ("0.0000000001", 1), ("0.5e-9", 1), ("0.9n", 1), ("0.00000012345", 1),
    ("100.035Ki", 102436), ("0.5Mi", Mi // 2), ("0.05Gi", 53687092), ("0.025Ti", 27487790695),
    ("0.000000000001Ki", 1), (".001", 1), (".0001k", 1), ("1.", 1), ("1.G", 10**9),
    # JSON quantities are trimmed (Quantity.UnmarshalJSON), and may be numbers
    (" 1Gi ", Gi), ("-0", 0), ("+5", 5),
]


@pytest.mark.parametrize("text,expected", PARSE, ids=[r[0] for r in PARSE])
def test_parse_quantity(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


# upstream invalid list (" 1" / "1 " are accepted here: UnmarshalJSON trims), plus our refusals
INVALID = ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-",
           "", "+", "-", ".", "1K", "1e", "1Ki5", "1 Gi", "-1", "-1Gi", "-0.5",
           "9Ei", "9223372036854775807Ki", "12E", "1e19", "9223372036854775808"]


@pytest.mark.parametrize("text", INVALID)
def test_parse_quantity_refuses(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_quantity(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", [-1, INT64_MAX + 1, True, 1.5, None, b"1"])
def test_parse_quantity_refuses_other_values(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_quantity(value)


def test_parse_quantity_int64_edge() -> None:
    assert parse_quantity("9223372036854775807") == INT64_MAX
    assert parse_quantity(INT64_MAX) == INT64_MAX
    assert parse_quantity("7Ei") == 7 * Ei


# NewQuantity(n, BinarySI).String(), from quantity_test.go (TestNewSet, TestQuantityString) and the brief
FORMAT = [(0, "0"), (5, "5"), (30, "30"), (1000, "1k"), (1023, "1023"), (1024, "1Ki"), (1025, "1025"),
          (1536, "1536"), (6 * Ki, "6Ki"), (Mi, "1Mi"), (300 * Mi, "300Mi"), (Gi, "1Gi"), (4 * Gi, "4Gi"),
          (1001 * Gi, "1001Gi"), (Ti, "1Ti"), (10**6, "1000000"), (7 * Ei, "7Ei"), (INT64_MAX, str(INT64_MAX))]


@pytest.mark.parametrize("n,text", FORMAT)
def test_format_quantity(n: int, text: str) -> None:
    assert format_quantity(n) == text


@pytest.mark.parametrize("n", [-1, INT64_MAX + 1])
def test_format_quantity_refuses(n: int) -> None:
    with pytest.raises(ValueError):
        format_quantity(n)


# --------------------------------------------------------------------------------------------
# RequestPolicy <-> API JSON
# --------------------------------------------------------------------------------------------


def test_from_api_to_api() -> None:
    d = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "8Gi", "step": "256Mi"}}
    p = RequestPolicy.from_api(d)
    assert p == RequestPolicy(default=Gi, valid_range=ValidRange(min=Gi, max=8 * Gi, step=256 * Mi))
    assert p.to_api() == d
    v = RequestPolicy.from_api({"default": 1073741824, "validValues": ["1Gi", "2048Mi", 4 * Gi]})
    assert v == vals(Gi, Gi, 2 * Gi, 4 * Gi)
    assert v.to_api() == {"default": "1Gi", "validValues": ["1Gi", "2Gi", "4Gi"]}
    assert RequestPolicy.from_api(None) is None
    assert RequestPolicy.from_api({}) == RequestPolicy()
    assert RequestPolicy.from_api({"default": None, "validValues": []}) == RequestPolicy()


@pytest.mark.parametrize("bad", [
    {"default": "1Gb"}, {"default": "-1"}, {"validValues": "1Gi"}, {"validValues": ["1Gi", "x"]},
    {"validRange": ["1Gi"]}, {"validRange": {"min": "1Gi", "step": "0"}}, {"validRange": {"max": "1Gi"}},
])
def test_from_api_refuses(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RequestPolicy.from_api(bad)


def test_consumed_examples_in_gpu_memory() -> None:
    p = RequestPolicy.from_api({"default": "1Gi", "validRange": {"min": "1Gi", "max": "8Gi", "step": "256Mi"}})
    assert consumed(None, p, 16 * Gi) == Gi
    assert consumed(parse_quantity("1.1Gi"), p, 16 * Gi) == Gi + 256 * Mi
    assert consumed(parse_quantity("100Mi"), p, 16 * Gi) == Gi
    with pytest.raises(NotAllocatable, match="above the policy's max 8Gi"):
        consumed(parse_quantity("8.1Gi"), p, 16 * Gi)
    with pytest.raises(NotAllocatable, match="more than the capacity"):
        consumed(parse_quantity("5Gi"), p, 4 * Gi)
    assert valid_amount(Gi + 256 * Mi, p, 16 * Gi)
    assert not valid_amount(Gi + 255 * Mi, p, 16 * Gi)
    assert not valid_amount(9 * Gi, p, 16 * Gi)
    assert not valid_amount(512 * Mi, p, 16 * Gi)
    assert not valid_amount(-1, p, 16 * Gi)
    # no default: no amount means the whole capacity, which the range must allow
    whole = RequestPolicy(valid_range=ValidRange(min=Gi))
    assert consumed(None, whole, 16 * Gi) == 16 * Gi
    assert consumed(None, None, 16 * Gi) == 16 * Gi
    assert fits([Gi, 15 * Gi], 16 * Gi) and not fits([Gi, 15 * Gi, 1], 16 * Gi)
    assert fits([], 0)


def test_default_is_exempt_from_the_policy() -> None:
    # upstream violatesPolicy: an amount equal to the default passes, even off-step (an invalid policy)
    p = rng(3, 2, 10, 2)
    assert validate_policy(p, 10)  # the API server would refuse it...
    assert consumed(None, p, 10) == 3  # ...but the allocator takes the default as is
    assert consumed(3, p, 10) == 4  # an explicit request is rounded up first
    assert valid_amount(3, p, 10)  # 3 can still be produced (no amount requested)
    assert not valid_amount(5, p, 10)


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn, max_capacity: int = 1 << 40) -> tuple[RequestPolicy | None, int]:
    """A capacity and a policy the API server accepts for it."""
    capacity = draw(st.one_of(st.integers(0, 64), st.integers(0, max_capacity)))
    kind = draw(st.sampled_from(["none", "empty", "default", "values", "range"]))
    if kind == "none":
        return None, capacity
    if kind == "empty":
        return RequestPolicy(), capacity
    if kind == "default":
        return RequestPolicy(default=draw(st.integers(0, 2 * capacity + 1))), capacity
    if kind == "values":
        values = sorted(draw(st.sets(st.integers(0, capacity), min_size=1, max_size=10)))
        return RequestPolicy(default=draw(st.sampled_from(values)), valid_values=tuple(values)), capacity
    lo = draw(st.integers(0, capacity))
    step = draw(st.none() | st.integers(1, max(1, capacity - lo))) if capacity > lo else None
    if step is None:
        hi = draw(st.none() | st.integers(lo, capacity))
        default = draw(st.integers(lo, hi if hi is not None else 2 * capacity + 1))
    else:
        top = (capacity - lo) // step
        k = draw(st.none() | st.integers(0, top))
        hi = None if k is None else lo + k * step
        default = lo + step * draw(st.integers(0, k if k is not None else 2 * top + 1))
    return RequestPolicy(default=default, valid_range=ValidRange(min=lo, max=hi, step=step)), capacity


@given(policies())
def test_generated_policies_are_valid(pc: tuple[RequestPolicy | None, int]) -> None:
    policy, capacity = pc
    assert validate_policy(policy, capacity) == []
    if policy is not None:
        assert RequestPolicy.from_api(policy.to_api()) == policy


@given(policies(), st.one_of(st.none(), st.integers(0, 80), st.integers(0, 1 << 41)))
def test_consumed_properties(pc: tuple[RequestPolicy | None, int], requested: int | None) -> None:
    policy, capacity = pc
    try:
        c = consumed(requested, policy, capacity)
    except NotAllocatable:
        # refused requests: the rounded amount breaks the policy or exceeds the capacity
        amount = cap_mod._round_up(requested, policy, capacity)
        assert amount > capacity or cap_mod._violation(amount, policy) is not None
        return
    if requested is not None:
        assert c >= requested
    assert 0 <= c <= capacity
    assert valid_amount(c, policy, capacity)
    assert consumed(c, policy, capacity) == c  # idempotent
    assert fits([c], capacity)


@settings(max_examples=200)
@given(policies(max_capacity=64))
def test_valid_amounts_are_exactly_what_consumed_produces(pc: tuple[RequestPolicy | None, int]) -> None:
    policy, capacity = pc
    produced = set()
    for r in [None, *range(capacity + 3)]:
        try:
            produced.add(consumed(r, policy, capacity))
        except NotAllocatable:
            pass
    assert {a for a in range(capacity + 3) if valid_amount(a, policy, capacity)} == produced


@given(st.lists(st.integers(0, 1 << 40), max_size=8), st.integers(0, 1 << 42))
def test_fits_is_the_sum(amounts: list[int], capacity: int) -> None:
    assert fits(amounts, capacity) == (sum(amounts) <= capacity)
    assert fits(iter(amounts), capacity) == fits(amounts, capacity)


@given(st.one_of(st.integers(0, 1 << 20), st.integers(0, INT64_MAX),
                 st.builds(lambda m, s: m << s, st.integers(1, 1 << 12), st.integers(0, 51))))
def test_format_parse_round_trip(n: int) -> None:
    text = format_quantity(n)
    assert parse_quantity(text) == n
    assert format_quantity(parse_quantity(text)) == text


_SUFFIX_VALUE: dict[str, Decimal] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("0.001"), "k": Decimal(10**3),
    "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(Ki), "Mi": Decimal(Mi), "Gi": Decimal(Gi), "Ti": Decimal(Ti), "Pi": Decimal(Pi), "Ei": Decimal(Ei),
}


@given(st.integers(0, 10**6), st.text("0123456789", max_size=6), st.sampled_from(sorted(_SUFFIX_VALUE)),
       st.booleans())
def test_parse_matches_decimal_ceiling(whole: int, frac: str, suffix: str, dot: bool) -> None:
    text = f"{whole}{'.' + frac if dot or frac else ''}{suffix}"
    with localcontext(prec=80):
        exact = Decimal(f"{whole}.{frac or '0'}") * _SUFFIX_VALUE[suffix]
    expected = math.ceil(exact)
    if expected > INT64_MAX:
        with pytest.raises(ValueError):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == expected


@given(st.integers(-(10**6), 10**6), st.integers(-30, 30))
def test_parse_exponent_form(mantissa: int, exp: int) -> None:
    text = f"{mantissa}e{exp}"
    exact = Decimal(mantissa).scaleb(exp)
    if exact < 0:
        with pytest.raises(ValueError, match="negative"):
            parse_quantity(text)
    elif exact > INT64_MAX:
        with pytest.raises(ValueError, match="too large"):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == math.ceil(exact)


@given(st.text(alphabet="0123456789.+-eEiKMGTPnumk xZ", max_size=12))
def test_parse_only_raises_value_error(text: str) -> None:
    try:
        n = parse_quantity(text)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    assert 0 <= n <= INT64_MAX


@given(st.integers(1, 10**9), st.sampled_from(["", "Ki", "Mi", "k", "e3"]))
def test_negative_quantities_raise(n: int, suffix: str) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_quantity(f"-{n}{suffix}")


@given(st.integers(0, 10**6), st.sampled_from(["K", "B", "KB", "kb", "mi", "gi", "Gib", "i", "ki", "x", "e", "E+"]))
def test_malformed_suffixes_raise(n: int, suffix: str) -> None:
    assume(suffix)
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(f"{n}{suffix}")

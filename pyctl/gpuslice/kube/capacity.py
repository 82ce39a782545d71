"""Consumable-capacity arithmetic of Kubernetes DRA (KEP-5075), as pure functions.

A device published with ``allowMultipleAllocations: true`` may carry a
``requestPolicy`` on each of its capacities (resource.k8s.io/v1
``DeviceCapacity.requestPolicy``). The scheduler's allocator turns the amount a
claim requests into the amount it *consumes* (rounding up to the policy), refuses
requests the policy does not allow, and writes the result to the claim status as
``consumedCapacity``. This module reproduces that arithmetic on integers so that
the gpuslice.dev driver can predict, and check, what the scheduler did.

Everything here is an exact integer in the capacity's unit (bytes for memory);
quantities are parsed with :func:`parse_quantity`.

Upstream sources read (Apache-2.0; no Go code copied, only behaviour):

- allocator: kubernetes/kubernetes
  ``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go``
  (``calculateConsumedCapacity``, ``roundUpRange``, ``roundUpValidValues``,
  ``violatesPolicy``, ``CmpRequestOverCapacity``), read from the published staging
  repository kubernetes/dynamic-resource-allocation at tag v0.36.2 (= Kubernetes
  v1.36.2, Kubernetes-commit d52dde2e436ddc4d23c267a621a38fb2d44a0989); the
  ``internal/experimental`` copy is identical at that tag.
- API validation: kubernetes/kubernetes ``pkg/apis/resource/validation/validation.go``
  (``validateRequestPolicy`` and helpers) at commit
  797475e1137914faab71f4c3b18d9041bf73cfc8 (the integer-only validation, before the
  DRAFractionalCapacityRange gate), and the field documentation of
  ``CapacityRequestPolicy`` in kubernetes/api ``resource/v1/types.go`` at v0.36.2.
- Quantity: kubernetes/apimachinery ``pkg/api/resource/quantity.go`` and
  ``suffix.go`` at tag v0.36.2 (commit ae3f98eb01e4bebb7d90db742081949c5c4b1ef7).

Rounding rules of the allocator (``consumed``):

1. No amount requested: the policy's ``default``, else the whole capacity.
2. No policy: the requested amount as is.
3. ``validRange``: below ``min`` becomes ``min``; with ``step``, rounds up to
   ``min + n*step``; without ``step`` the request is kept as is.
4. ``validValues`` (no ``validRange``): the first listed value >= the request;
   when the request exceeds them all, the request itself, which then fails (5).
5. The result is refused when it breaks the policy (above ``max``, off ``step``,
   not a listed value), unless it equals ``default``; and refused when it exceeds
   the capacity (or, with other allocations, their sum does: :func:`fits`).

Deviations from upstream, all on input upstream would not produce for a sane
driver: fractional quantities are rounded up to an integer at parse time (as
``Quantity.Value()``, which the allocator's step arithmetic uses anyway);
quantities above 2^63-1 are refused rather than capped; ``"+"``, ``"-"`` and
``"."`` (which Go parses as 0) are refused; negative amounts and a ``step`` that
is not positive (Go would divide by zero) are refused when a policy is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = [
    "INT64_MAX",
    "MAX_VALID_VALUES",
    "NotAllocatable",
    "RequestPolicy",
    "ValidRange",
    "consumed",
    "fits",
    "format_quantity",
    "parse_quantity",
    "valid_amount",
    "validate_policy",
]

INT64_MAX = (1 << 63) - 1
"""Largest amount a Quantity's Value() can return."""

MAX_VALID_VALUES = 10
"""``validValues`` may hold at most this many entries (CapacityRequestPolicyDiscreteMaxOptions)."""

# ---------------------------------------------------------------------------
# Quantities
# ---------------------------------------------------------------------------

_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}
_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]?|[eE][+-]?[0-9]+)"
)


def parse_quantity(s: str | int, *, whole: bool = False) -> int:
    """The value of a Kubernetes ``resource.Quantity`` as an exact non-negative integer.

    Accepts what the API server accepts in JSON: a string such as ``"4Gi"``,
    ``"1.5Gi"``, ``"500M"``, ``"1e9"``, ``"1E+6"``, ``"300m"`` (binary suffixes
    Ki..Ei, decimal n u m k M G T P E, exponents), surrounding whitespace
    trimmed as ``Quantity.UnmarshalJSON`` does, or a JSON integer. A value that is
    not an integer rounds up like ``Quantity.Value()`` (``"500m"`` -> 1,
    ``"1.1Ki"`` -> 1127). Raises ValueError on malformed, negative or
    larger-than-int64 input. ``whole``: a value that is not an integer raises
    ValueError instead of rounding up (for amounts the allocator wrote: it writes whole
    amounts on an integer grid, never a fraction).
    """
    if isinstance(s, bool) or not isinstance(s, (str, int)):
        raise ValueError(f"not a quantity: {s!r} (use a string such as '4Gi' or an integer)")
    if isinstance(s, int):
        if s < 0:
            raise ValueError(f"quantity must not be negative: {s}")
        if s > INT64_MAX:
            raise ValueError(f"quantity too large (more than 2^63-1): {s}")
        return s
    text = s.strip()
    m = _QUANTITY_RE.fullmatch(text)
    if m is None or not (m.group("int") or m.group("frac")):
        raise ValueError(f"not a quantity: {s!r} (use e.g. 4Gi, 512Mi, 1e9 or a plain number)")
    digits_int = m.group("int")
    digits_frac = m.group("frac") or ""
    mantissa = int(digits_int + digits_frac or "0")
    suffix = m.group("suffix")
    exp10 = -len(digits_frac)
    exp2 = 0
    if suffix in _BINARY_SUFFIXES:
        exp2 = _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_SUFFIXES:
        exp10 += _DECIMAL_SUFFIXES[suffix]
    else:  # e<signed int>
        exp10 += int(suffix[1:])
    if mantissa == 0:
        return 0  # "-0", "0Gi", "0e5" are all zero, not negative
    if m.group("sign") == "-":
        raise ValueError(f"quantity must not be negative: {s!r}")
    # Bound the exponent before computing exactly: mantissa < 10**len(mantissa_str), 2**60 < 10**19.
    ndigits = len(str(mantissa))
    if exp10 >= 19:
        raise ValueError(f"quantity too large (more than 2^63-1): {s!r}")
    if exp10 < -(ndigits + 19):
        if whole:
            raise ValueError(f"{s!r} is not a whole number")
        return 1  # 0 < value < 1: rounds up to 1
    value = Fraction(mantissa) * Fraction(10) ** exp10 * (1 << exp2)
    if whole and value.denominator != 1:
        raise ValueError(f"{s!r} is not a whole number")
    result = -((-value.numerator) // value.denominator)  # ceil
    if result > INT64_MAX:
        raise ValueError(f"quantity too large (more than 2^63-1): {s!r}")
    return result


def format_quantity(n: int) -> str:
    """The string the API server writes for the integer ``n`` as a BinarySI Quantity.

    This is ``resource.NewQuantity(n, resource.BinarySI).String()``, the form in
    which the allocator writes rounded amounts: below 1024 the value is written
    in decimal SI form (``30`` -> ``"30"``, ``1000`` -> ``"1k"``); from 1024 on,
    with the largest binary suffix that divides it exactly (``4294967296`` ->
    ``"4Gi"``, ``1536`` -> ``"1536"``, ``3145728`` -> ``"3Mi"``), else as a plain
    integer. ``parse_quantity(format_quantity(n)) == n``.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"not an integer amount: {n!r}")
    if n < 0:
        raise ValueError(f"amount must not be negative: {n}")
    if n > INT64_MAX:
        raise ValueError(f"amount too large (more than 2^63-1): {n}")
    if n < 1024:
        # DecimalSI canonical form: the exponent is the largest multiple of 3 that loses nothing.
        k = 0
        while n and n % 1000 == 0:
            n //= 1000
            k += 1
        return f"{n}{['', 'k', 'M', 'G', 'T', 'P', 'E'][k]}"
    for suffix, shift in reversed(_BINARY_SUFFIXES.items()):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


# ---------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------


class NotAllocatable(ValueError):
    """The allocator would not place this request on this device capacity."""


@dataclass(frozen=True)
class ValidRange:
    """``requestPolicy.validRange``: amounts ``min``, ``min+step``, ... up to ``max``."""

    min: int
    max: int | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        for name in ("min", "max", "step"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"validRange.{name} must be an integer amount, not {v!r}")
            if v is not None and v < 0:
                raise ValueError(f"validRange.{name} must not be negative: {v}")
        if self.step is not None and self.step == 0:
            raise ValueError("validRange.step must be greater than zero")


@dataclass(frozen=True)
class RequestPolicy:
    """``DeviceCapacity.requestPolicy`` with amounts as integers.

    An empty ``valid_values`` is stored as None: upstream treats an empty list
    exactly like an absent one.
    """

    default: int | None = None
    valid_values: tuple[int, ...] | None = None
    valid_range: ValidRange | None = None

    def __post_init__(self) -> None:
        if self.default is not None:
            if isinstance(self.default, bool) or not isinstance(self.default, int):
                raise ValueError(f"default must be an integer amount, not {self.default!r}")
            if self.default < 0:
                raise ValueError(f"default must not be negative: {self.default}")
        if self.valid_values is not None:
            values = tuple(self.valid_values)
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"validValues entries must be non-negative integers, not {v!r}")
            object.__setattr__(self, "valid_values", values or None)

    @classmethod
    def from_api(cls, d: Mapping[str, Any] | None) -> RequestPolicy | None:
        """Parse the API's JSON form; None (no requestPolicy) gives None.

        ``{"default": "1Gi", "validValues": [...], "validRange": {"min": "1Gi",
        "max": "8Gi", "step": "256Mi"}}``; quantities may be strings or integers.
        Raises ValueError on malformed input (including a validRange without min,
        which the API server refuses).
        """
        if d is None:
            return None
        if not isinstance(d, Mapping):
            raise ValueError(f"requestPolicy must be an object, not {type(d).__name__}")
        default = _opt_quantity(d.get("default"), "default")
        raw_values = d.get("validValues")
        values: tuple[int, ...] | None = None
        if raw_values is not None:
            if isinstance(raw_values, (str, bytes)) or not isinstance(raw_values, Iterable):
                raise ValueError("requestPolicy.validValues must be a list of quantities")
            values = tuple(_quantity(v, "validValues") for v in raw_values)
        raw_range = d.get("validRange")
        valid_range: ValidRange | None = None
        if raw_range is not None:
            if not isinstance(raw_range, Mapping):
                raise ValueError("requestPolicy.validRange must be an object")
            if raw_range.get("min") is None:
                raise ValueError("requestPolicy.validRange.min is required when validRange is defined")
            valid_range = ValidRange(
                min=_quantity(raw_range["min"], "validRange.min"),
                max=_opt_quantity(raw_range.get("max"), "validRange.max"),
                step=_opt_quantity(raw_range.get("step"), "validRange.step"),
            )
        return cls(default=default, valid_values=values, valid_range=valid_range)

    def to_api(self) -> dict[str, Any]:
        """The API's JSON form, quantities written by :func:`format_quantity`; unset fields omitted."""
        out: dict[str, Any] = {}
        if self.default is not None:
            out["default"] = format_quantity(self.default)
        if self.valid_values is not None:
            out["validValues"] = [format_quantity(v) for v in self.valid_values]
        if self.valid_range is not None:
            r: dict[str, str] = {"min": format_quantity(self.valid_range.min)}
            if self.valid_range.max is not None:
                r["max"] = format_quantity(self.valid_range.max)
            if self.valid_range.step is not None:
                r["step"] = format_quantity(self.valid_range.step)
            out["validRange"] = r
        return out


def _quantity(v: Any, what: str) -> int:
    try:
        return parse_quantity(v)
    except ValueError as e:
        raise ValueError(f"requestPolicy.{what}: {e}") from None


def _opt_quantity(v: Any, what: str) -> int | None:
    return None if v is None else _quantity(v, what)


# ---------------------------------------------------------------------------
# Allocator arithmetic
# ---------------------------------------------------------------------------


def _check_amount(n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"{what} must be an integer amount, not {n!r}")
    if n < 0:
        raise ValueError(f"{what} must not be negative: {n}")


def _round_up(requested: int | None, policy: RequestPolicy | None, capacity: int) -> int:
    """The amount before the policy and capacity checks (upstream calculateConsumedCapacity)."""
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity
    if policy is None:
        return requested
    r = policy.valid_range
    if r is not None:
        if requested < r.min:
            return r.min
        if r.step is None:
            return requested
        n = -(-(requested - r.min) // r.step)  # ceil
        return r.min + n * r.step
    if policy.valid_values is not None:
        for v in policy.valid_values:
            if requested <= v:
                return v
        return requested
    return requested


def _violation(amount: int, policy: RequestPolicy | None) -> str | None:
    """Why ``amount`` breaks ``policy`` (upstream violatesPolicy), or None."""
    if policy is None:
        return None
    if policy.default is not None and amount == policy.default:
        # Upstream compares the Quantity structs: an amount equal to the default is never a
        # violation. For a policy that passes validate_policy() the default is valid anyway.
        return None
    r = policy.valid_range
    if r is not None:
        if r.max is not None and amount > r.max:
            return f"{format_quantity(amount)} is above the policy's max {format_quantity(r.max)}"
        if r.step is not None and (amount - r.min) % r.step != 0:
            return (f"{format_quantity(amount)} is not min {format_quantity(r.min)} "
                    f"plus a multiple of step {format_quantity(r.step)}")
        return None
    if policy.valid_values is not None and amount not in policy.valid_values:
        return (f"{format_quantity(amount)} is not one of the policy's validValues "
                f"({', '.join(format_quantity(v) for v in policy.valid_values)})")
    return None


def consumed(requested: int | None, policy: RequestPolicy | None, capacity: int) -> int:
    """What the scheduler's allocator consumes from a device capacity for one request.

    ``requested`` is the amount the request names for this capacity
    (``DeviceRequest.capacity.requests``), None when it names none; ``capacity``
    is the capacity's ``value`` and ``policy`` its ``requestPolicy``. The result is
    what the allocator writes to ``consumedCapacity``. Raises NotAllocatable where
    the allocator would not use this device for the request (the rounded amount
    breaks the policy, or exceeds the capacity on its own), ValueError on a
    negative amount. Other allocations sharing the device: see :func:`fits`.
    """
    if requested is not None:
        _check_amount(requested, "requested amount")
    _check_amount(capacity, "capacity")
    amount = _round_up(requested, policy, capacity)
    why = _violation(amount, policy)
    if why is not None:
        raise NotAllocatable(f"request of {_fmt_req(requested)}: {why}")
    if amount > capacity:
        raise NotAllocatable(
            f"request of {_fmt_req(requested)} consumes {format_quantity(amount)}, "
            f"more than the capacity {format_quantity(capacity)}"
        )
    return amount


def _fmt_req(requested: int | None) -> str:
    return "no amount" if requested is None else format_quantity(requested)


def valid_amount(amount: int, policy: RequestPolicy | None, capacity: int) -> bool:
    """Whether ``consumed()`` can return ``amount`` for some request (or none).

    The driver uses this to refuse a claim whose ``consumedCapacity`` the scheduler
    cannot have written. Every amount the allocator produces for an explicit
    request is a fixed point of ``consumed``; the one for "no amount" is the
    default (or the whole capacity), which is checked separately since an invalid
    policy's default need not be a fixed point.
    """
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        return False
    for requested in (None, amount):
        try:
            if consumed(requested, policy, capacity) == amount:
                return True
        except NotAllocatable:
            pass
    return False


def fits(amounts: Iterable[int], capacity: int) -> bool:
    """Whether allocations consuming ``amounts`` together fit in ``capacity`` (sum <= capacity).

    This is the allocator's last check: the amounts already consumed on the device,
    those being allocated in the same run and the new one must not exceed the value.
    """
    _check_amount(capacity, "capacity")
    total = 0
    for a in amounts:
        _check_amount(a, "amount")
        total += a
    return total <= capacity


# ---------------------------------------------------------------------------
# API validation
# ---------------------------------------------------------------------------


def validate_policy(policy: RequestPolicy | None, capacity: int) -> list[str]:
    """The API server's objections to ``policy`` on a capacity of value ``capacity``.

    Empty when a ResourceSlice carrying it would be accepted. Follows upstream
    ``validateRequestPolicy`` rule by rule, in its order; the messages name the
    field and the amounts. (Negative amounts and a zero step are already refused
    when the policy is built.)
    """
    _check_amount(capacity, "capacity")
    if policy is None:
        return []
    q = format_quantity
    cap = q(capacity)
    errs: list[str] = []
    values, rng, default = policy.valid_values, policy.valid_range, policy.default
    if values is not None and rng is not None:
        return ['exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time']
    if values is not None:
        if default is None:
            return ["default is required when validValues is defined"]
        for i in range(len(values) - 1):
            if values[i] > values[i + 1]:
                errs.append(f"validValues[{i + 1}] {q(values[i + 1])}: values must be sorted in ascending order")
        if len(values) > MAX_VALID_VALUES:
            # upstream stops checking the entries here, so the default is not found either
            errs.append(f"validValues has {len(values)} entries, at most {MAX_VALID_VALUES} are allowed")
        else:
            for i, v in enumerate(values):
                if v > capacity:
                    errs.append(f"validValues[{i}] {q(v)}: option is larger than capacity value {cap}")
            seen: set[int] = set()
            for i, v in enumerate(values):
                if v in seen:
                    errs.append(f"validValues[{i}] {q(v)}: duplicate value")
                seen.add(v)
        if len(values) > MAX_VALID_VALUES or default not in values:
            errs.append(f"default {q(default)} is not one of validValues")
        return errs
    if rng is not None:
        if default is None:
            return ["default is required when validRange is defined"]
        if rng.min > capacity:
            errs.append(f"validRange.min {q(rng.min)} is larger than capacity value {cap}")
        if default < rng.min:
            errs.append(f"default {q(default)} is less than validRange.min {q(rng.min)}")
        if rng.max is not None:
            if rng.min > rng.max:
                errs.append(f"validRange.min {q(rng.min)} is larger than validRange.max {q(rng.max)}")
            if rng.max > capacity:
                errs.append(f"validRange.max {q(rng.max)} is larger than capacity value {cap}")
            if default > rng.max:
                errs.append(f"default {q(default)} is more than validRange.max {q(rng.max)}")
        if rng.step is not None:
            if rng.min + rng.step > capacity:
                errs.append(f"validRange.step {q(rng.step)}: one step {q(rng.min + rng.step)} "
                            f"is larger than capacity value {cap}")
            on_step: tuple[tuple[str, int | None], ...] = (("default", default), ("validRange.max", rng.max))
            for what, val in on_step:
                if val is not None and (val - rng.min) % rng.step != 0:
                    errs.append(f"{what} {q(val)} is not a multiple of step {q(rng.step)} from min {q(rng.min)}")
    return errs

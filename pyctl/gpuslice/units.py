"""Parse and format the units gpuctl accepts: sizes, shares and durations.

Sizes are Kubernetes quantities with a unit, always: ``Ki Mi Gi Ti`` and ``KiB MiB GiB
TiB`` are powers of 1024, ``k K M G T`` and ``kB KB MB GB TB`` powers of 1000, ``B``
bytes (``8Gi``, ``8GiB``, ``8GB``, ``4096B``); a bare number is refused (``--memory 8``
was once an 8-byte instance), as is a unit of another case (``8gib``, ``8m``: in
Kubernetes ``m`` is milli). Shares are percent of one GPU in (0, 100]: ``30%`` or
``30`` (``0.5%``); a bare number below 1 (``0.3``) is refused as ambiguous. Durations are
``100ns``, ``500us``, ``50ms``, ``2s``, ``1.5s``, ``10m`` or ``1h``; a bare number is seconds
(``5`` is 5s, ``0.05`` is 50ms), in every command and plugin: :class:`Duration` is the
click parameter type they all use. Every parser raises ValueError with a one-line
message that does not repeat the text (the caller names the option and the value).

The preload library's GPUSLICE_MEM_LIMIT keeps its own units (preload/preload.c: bytes,
or K/M/G/T binary): :func:`parse_env_memory`.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Callable

import click

from gpuslice.netlink import MAX_GPUS

# Kubernetes quantities (binary Ki..Ti, decimal k..T), each also with a B; B alone is bytes
_SIZE_UNITS: dict[str, int] = {
    "B": 1,
    **{u: 1 << (10 * e) for e, p in enumerate("KMGT", 1) for u in (p + "i", p + "iB")},
    **{u: 1000**e for e, p in enumerate("KMGT", 1) for u in (p, p + "B")},
    "k": 1000,
    "kB": 1000,
}
SIZE_UNITS_HELP = ("Ki, Mi, Gi, Ti, KiB, MiB, GiB, TiB (powers of 1024), k, K, M, G, T, kB, KB, MB, GB, TB "
                   "(powers of 1000), B (bytes)")
# the preload library's GPUSLICE_MEM_LIMIT (preload/report.c gs_parse_size): whole bytes, or
# K/M/G/T in either case, each optionally followed by i and/or B: all powers of 1024 there
_ENV_SIZE_RE = re.compile(r"([0-9]+)(?:([kmgtKMGT])[iI]?)?[bB]?")

_DURATION_NS: dict[str, int] = {
    "": 1_000_000_000,  # a bare number is seconds
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
DURATION_UNITS_HELP = "ns, us, ms, s, m (minutes) or h; a bare number is seconds"

_NUM = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SIZE_RE = re.compile(_NUM + r"\s*([a-zA-Z]*)")
_DUR_RE = re.compile(_NUM + r"\s*([a-zA-Zµ]*)")
_SHARE_RE = re.compile(_NUM + r"\s*(%?)")

U64_MAX = (1 << 64) - 1


def parse_size(text: str) -> int:
    """Bytes in ``text``, a quantity with a unit (``8Gi``, ``8GiB``, ``8GB``, ``4096B``);
    a fraction of a byte rounds up, as Kubernetes does. Must be > 0 and fit in u64."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise ValueError("not a size (write e.g. 8Gi, 8GiB or 8GB)")
    num, unit = m.group(1), m.group(2)
    if unit not in _SIZE_UNITS:
        if unit == "":
            n = num.rstrip(".")
            raise ValueError(f"no unit; write {n}Gi, {n}GiB or {n}GB (bytes: {n}B)")
        raise ValueError(f"unknown unit {unit!r}; sizes take {SIZE_UNITS_HELP}")
    try:
        value = (Decimal(num) * _SIZE_UNITS[unit]).to_integral_value(ROUND_CEILING)
    except InvalidOperation:
        raise ValueError("not a size (write e.g. 8Gi, 8GiB or 8GB)") from None
    return _bytes(value)


def _bytes(value: Decimal | int) -> int:
    if value < 1:
        raise ValueError("must be at least 1 byte")
    if value > U64_MAX:
        raise ValueError("too large (more than 2^64-1 bytes)")
    return int(value)


MEMORY_MIN = 1 << 20  # a video memory limit: a CUDA context alone takes hundreds of MiB
MEMORY_MAX = 1 << 50  # 1PiB: a typo (99999Ti), not a GPU


def parse_memory(text: str) -> tuple[int, dict[int, int]]:
    """A memory limit: one size for each GPU (``8Gi`` -> (8GiB, {})), or sizes per GPU
    (``0=8Gi,1=4Gi`` -> (8GiB, {0: 8GiB, 1: 4GiB}): the first is then the largest).
    Each within [1MiB, 1PiB]."""
    return _memory(text, _limit)


def _limit(text: str) -> int:
    n = parse_size(text)
    if n < MEMORY_MIN:
        raise ValueError("below 1MiB: a CUDA context alone needs more")
    if n > MEMORY_MAX:
        raise ValueError("above 1PiB: no GPU has that much video memory")
    return n


def parse_env_memory(text: str) -> tuple[int, dict[int, int]]:
    """GPUSLICE_MEM_LIMIT as the preload library reads it (preload/preload.c, report.c):
    bytes, or K/M/G/T powers of 1024 (``4G`` is 4GiB there), per GPU as ``0=8G,1=4G``.
    The guard (--source environ) must read the limit the library enforces."""
    return _memory(text, _env_size)


def _env_size(text: str) -> int:
    m = _ENV_SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError("not a size of the preload library (bytes, or K, M, G, T: powers of 1024)")
    return _bytes(int(m.group(1)) << (10 * (" KMGT".index(m.group(2).upper()) if m.group(2) else 0)))


def _memory(text: str, size: Callable[[str], int]) -> tuple[int, dict[int, int]]:
    if "=" not in text:
        return size(text), {}
    per: dict[int, int] = {}
    for part in text.split(","):
        gpu, sep, one = part.partition("=")
        gpu = gpu.strip()
        if not sep or not gpu.isdigit() or not 0 <= int(gpu) < MAX_GPUS:
            raise ValueError(f"not GPU=SIZE: {part!r} (e.g. 0=8Gi,1=4Gi)")
        if int(gpu) in per:
            raise ValueError(f"GPU {int(gpu)} given twice")
        try:
            per[int(gpu)] = size(one)
        except ValueError as e:
            raise ValueError(f"GPU {int(gpu)}: {e}") from None
    return max(per.values()), per


def format_memory(memory: int, per_gpu: dict[int, int] | None) -> str:
    """The inverse of parse_memory."""
    if not per_gpu:
        return format_size(memory)
    return ",".join(f"{g}={format_size(v)}" for g, v in sorted(per_gpu.items()))


def format_size(n: int) -> str:
    """``n`` bytes in the largest binary unit it reaches: exact (``8GiB``) where it
    divides; else in the largest decimal unit that divides it, as a user wrote it
    (``--memory 16G`` shows as ``16GB``, not ``14.9GiB``); else with one decimal. The
    one formatter of sizes for every table."""
    for p, e in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
        mult = 1 << (10 * e)
        if n >= mult:
            if n % mult == 0:
                return f"{n // mult}{p}iB"
            for dp, de in (("T", 4), ("G", 3), ("M", 2), ("k", 1)):
                if n >= 1000**de and n % 1000**de == 0:
                    return f"{n // 1000**de}{dp}B"
            return f"{n / mult:.1f}{p}iB"
    return f"{n}B"


def parse_share(text: str) -> float:
    """A share of one GPU, in percent, as a fraction in (0, 1]: ``30%`` or ``30`` -> 0.3,
    ``0.5%`` -> 0.005. A bare number below 1 (``0.3``) is refused: 0.3 or 30%?"""
    m = _SHARE_RE.fullmatch(text.strip())
    if not m:
        raise ValueError("not a share (write e.g. 30%)")
    pct = Decimal(m.group(1))
    if not m.group(2) and 0 < pct < 1:
        raise ValueError(f"ambiguous; write {(pct * 100).normalize():f}% (or {m.group(1)}%)")
    if not 0 < pct <= 100:
        raise ValueError("share must be in (0%, 100%]")
    return float(pct) / 100.0


def format_share(f: float) -> str:
    return f"{f * 100:.1f}%"


def share_to_ppt(f: float) -> int:
    """Fraction -> parts per 10000 (the uapi's SHARE unit), rounded to nearest."""
    return max(0, min(10000, round(f * 10000)))


def parse_duration_ns(text: str) -> int:
    """Nanoseconds in ``text``: ``100ns``, ``500us``, ``50ms``, ``1.5s``, ``10m``, ``1h``,
    or a bare number of seconds (``5``, ``0.05``). Units are lower case (``MS`` is taken
    as ``ms``; ``M`` is refused: minutes or mega?). More than 0, at least 1ns."""
    m = _DUR_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a duration (write e.g. 50ms, 500us, 2s; {DURATION_UNITS_HELP})")
    unit = m.group(2)
    if unit in ("M", "H") or unit.lower() not in _DURATION_NS:
        raise ValueError(f"unknown unit {unit!r}; write {DURATION_UNITS_HELP}")
    value = Decimal(m.group(1)) * _DURATION_NS[unit.lower()]
    if value == 0:
        raise ValueError("must be more than 0")
    if value < 1:
        raise ValueError("must be at least 1ns")
    return int(value)


def is_zero_duration(text: str) -> bool:
    """0, 0s, 0ms, 0.0s, ...: a duration that means "off" where an option takes it."""
    m = _DUR_RE.fullmatch(text.strip())
    return bool(m and m.group(2).lower() in _DURATION_NS and m.group(2) not in ("M", "H")
                and Decimal(m.group(1)) == 0)


class OptionValueError(click.BadParameter):
    """A bad option value, said as ``--memory 8: no unit; ...``: the option, the value
    as given, what is wrong with it (a usage error: exit status 2)."""

    def __init__(self, message: str, value: str, ctx: click.Context | None, param: click.Parameter | None) -> None:
        super().__init__(message, ctx, param)
        self.value = value

    def format_message(self) -> str:
        p = self.param
        name = (max(p.opts, key=len) if isinstance(p, click.Option) and p.opts
                else p.human_readable_name if p is not None else "value")
        return f"{name} {self.value}: {self.message}"


class Duration(click.ParamType):  # type: ignore[type-arg]
    """The click parameter type of every duration option (gpuctl's commands, the trace
    command, the Kubernetes plugins): :func:`parse_duration_ns` within [lo_ns, hi_ns]
    (``--period 20s: must be between 1ms and 10s``), converted to nanoseconds (an int),
    or with ``seconds`` to seconds (a float). ``zero``: 0 is also taken (it means "off").
    Errors are one line naming the option and the value as given (exit status 2)."""

    name = "duration"

    def __init__(self, lo_ns: int = 1, hi_ns: int | None = None, zero: bool = False, seconds: bool = False) -> None:
        self.lo_ns, self.hi_ns, self.zero, self.seconds = lo_ns, hi_ns, zero, seconds

    def parse(self, text: str) -> int:
        """Nanoseconds in ``text`` within this type's range; ValueError, one line, if not."""
        if self.zero and is_zero_duration(text):
            return 0
        try:
            ns = parse_duration_ns(text)
        except ValueError as e:
            if not str(e).startswith("not a duration"):
                raise
            examples = [e for e in ("50ms", "20ms", "1s", "2s", "500us", "100ns", "10m")
                        if self.lo_ns <= parse_duration_ns(e) and (self.hi_ns is None or parse_duration_ns(e) <= self.hi_ns)]
            raise ValueError(f"not a duration (write e.g. {', '.join(examples[:3])}; {DURATION_UNITS_HELP})") from None
        if ns < self.lo_ns or (self.hi_ns is not None and ns > self.hi_ns):
            fmt = format_duration_ns
            rng = (f"between {fmt(self.lo_ns)} and {fmt(self.hi_ns)}" if self.hi_ns is not None
                   else f"at least {fmt(self.lo_ns)}")
            raise ValueError(f"must be {'0 (off) or ' if self.zero else ''}{rng}")
        return ns

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # a default given as a number: already converted
        if ctx is not None and param is not None and param.name:
            ctx.meta[f"gpuslice.given.{param.name}"] = value  # for errors that involve other options
        try:
            ns = self.parse(str(value))
        except ValueError as e:
            raise OptionValueError(str(e), str(value), ctx, param) from None
        return ns / 1e9 if self.seconds else ns


def format_duration_ns(ns: int) -> str:
    for unit, mult in (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if ns >= mult and ns % mult == 0:
            return f"{ns // mult}{unit}"
    if ns >= 1_000_000:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1_000:
        return f"{ns / 1e3:.1f}us"
    return f"{ns}ns"

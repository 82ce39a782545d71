"""Parse and format the units gpuctl accepts: sizes, shares and durations.

Sizes are bytes (``8GiB``, ``512MiB``, ``4096``, ``1.5G``); decimal suffixes (kB, MB,
GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and the bare K/M/G/T) powers
of 1024. Shares are fractions of one GPU in (0, 1]: ``30%`` or ``0.3``. Durations are ``50ms``, ``500us``, ``2s`` or ``100000ns``; a bare
number is milliseconds. Every parser raises ValueError with a one-line message.
"""

from __future__ import annotations

import math
import re

from gpuslice.netlink import MAX_GPUS

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 1000**4,
}

_DURATION_NS: dict[str, int] = {
    "": 1_000_000,  # bare numbers are milliseconds
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
}

_NUM = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SIZE_RE = re.compile(_NUM + r"\s*([a-zA-Z]*)")
_DUR_RE = re.compile(_NUM + r"\s*([a-zµ]*)")

U64_MAX = (1 << 64) - 1


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``8GiB``, ``100MB``, ``4096``). Must be > 0 and fit in u64."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 8GiB, 512MiB or bytes)")
    unit = m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {m.group(2)!r} in {text!r} (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)")
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"size must be at least 1 byte: {text!r}")
    result = int(value)
    if result > U64_MAX:
        raise ValueError(f"size too large: {text!r}")
    return result


def parse_memory(text: str) -> tuple[int, dict[int, int]]:
    """A memory limit: one size for each GPU (``8GiB`` -> (8GiB, {})), or sizes per GPU
    (``0=8GiB,1=4GiB`` -> (8GiB, {0: 8GiB, 1: 4GiB}): the first is then the largest)."""
    if "=" not in text:
        return parse_size(text), {}
    per: dict[int, int] = {}
    for part in text.split(","):
        gpu, sep, size = part.partition("=")
        gpu = gpu.strip()
        if not sep or not gpu.isdigit() or not 0 <= int(gpu) < MAX_GPUS:
            raise ValueError(f"not GPU=SIZE: {part!r} in {text!r} (e.g. 0=8GiB,1=4GiB)")
        if int(gpu) in per:
            raise ValueError(f"GPU {int(gpu)} given twice in {text!r}")
        per[int(gpu)] = parse_size(size)
    return max(per.values()), per


def format_memory(memory: int, per_gpu: dict[int, int] | None) -> str:
    """The inverse of parse_memory."""
    if not per_gpu:
        return format_size(memory)
    return ",".join(f"{g}={format_size(v)}" for g, v in sorted(per_gpu.items()))


def format_size(n: int) -> str:
    """Shortest exact binary form of ``n`` bytes (``8GiB``), else one decimal."""
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult:
            if n % mult == 0:
                return f"{n // mult}{unit}"
            return f"{n / mult:.1f}{unit}"
    return f"{n}B"


def parse_share(text: str) -> float:
    """A share of one GPU as a fraction in (0, 1]: ``30%`` -> 0.3, ``0.25`` -> 0.25."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"not a share: {text!r} (use e.g. 30% or 0.3)") from None
    if not math.isfinite(value) or value <= 0 or value > 1:
        raise ValueError(f"share must be in (0%, 100%]: {text!r}")
    return value


def format_share(f: float) -> str:
    return f"{f * 100:.1f}%"


def share_to_ppt(f: float) -> int:
    """Fraction -> parts per 10000 (the uapi's SHARE unit), rounded to nearest."""
    return max(0, min(10000, round(f * 10000)))


def parse_duration_ns(text: str) -> int:
    """Nanoseconds in ``text`` (``50ms``, ``500us``, ``1s``, ``2000000ns``; bare = ms). > 0."""
    m = _DUR_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 50ms, 500us, 1s)")
    unit = m.group(2).lower()
    if unit not in _DURATION_NS:
        raise ValueError(f"unknown duration unit {m.group(2)!r} in {text!r} (ns, us, ms, s)")
    value = float(m.group(1)) * _DURATION_NS[unit]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"duration must be positive: {text!r}")
    return int(value)


def format_duration_ns(ns: int) -> str:
    for unit, mult in (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if ns >= mult and ns % mult == 0:
            return f"{ns // mult}{unit}"
    if ns >= 1_000_000:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1_000:
        return f"{ns / 1e3:.1f}us"
    return f"{ns}ns"

"""tests/gpu/priority_stats.py: the interval of a p99 ratio over resampled rounds. Where
the bench gave each round's modes the same arrivals, a draw must take the same rounds of
both, so that a mode that changes nothing gives an interval of exactly nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from priority_stats import interval  # noqa: E402

rounds = st.lists(st.lists(st.floats(0.1, 1000.0), min_size=5, max_size=40), min_size=2, max_size=6)


@settings(max_examples=50, deadline=None)
@given(rounds, st.floats(0.5, 2.0))
def test_paired_rounds_cancel_the_draw(rs: list[list[float]], scale: float) -> None:
    """The mode is the alone latencies scaled by one factor, round by round (equal-sized
    rounds, as slices() cuts them): paired, every draw's ratio is that factor."""
    n = min(len(r) for r in rs)
    alone = [x for r in rs for x in r[:n]]
    lo, hi = interval([x * scale for x in alone], alone, len(rs), draws=200, paired=True)
    assert abs(lo - scale) < 1e-9 * scale and abs(hi - scale) < 1e-9 * scale


def test_unpaired_rounds_keep_the_draw() -> None:
    """Rounds that differ (a slow one among quick ones): drawn apart, the same data
    compared with itself spreads around 1; paired, it is exactly 1."""
    alone = [1.0] * 100 + [1.0] * 100 + [10.0] * 100
    lo, hi = interval(alone, alone, 3, draws=500)
    assert lo < 1.0 < hi
    assert interval(alone, alone, 3, draws=500, paired=True) == (1.0, 1.0)

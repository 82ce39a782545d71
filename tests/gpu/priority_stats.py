"""How sure a priority.json's p99 differences are (tests/gpu/bench_priority.py --rounds R).

  python3 tests/gpu/priority_stats.py priority.json[.gz] ...

A bench run with R rounds keeps each mode's latencies in round order; the rounds (here,
R equal slices of them) are resampled with replacement, for the mode and for `alone`
alike, 2000 times, and the pooled p99 ratio's 5th and 95th percentiles are printed: how
far the machine's drift between phases leaves the difference from alone uncertain. Where
the bench gave each round's modes the same arrivals ("paired"), a draw takes the same
rounds for the mode and for alone.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_priority import pct  # noqa: E402


def slices(lat: list[float], k: int) -> list[list[float]]:
    n = len(lat)
    return [lat[i * n // k:(i + 1) * n // k] for i in range(k)]


def interval(mode: list[float], alone: list[float], k: int, draws: int = 2000,
             paired: bool = False) -> tuple[float, float]:
    """The 5th and 95th percentiles of the pooled p99 ratio over resampled rounds. Paired
    (the bench gave a round's modes the same arrivals): a draw takes the same rounds of
    both, so the draw's arrivals cancel; else each side's rounds are drawn alone."""
    mc, ac = slices(mode, k), slices(alone, k)
    rng = random.Random(1)
    ratios = []
    for _ in range(draws):
        pick = [rng.randrange(k) for _ in range(k)]
        other = pick if paired else [rng.randrange(k) for _ in range(k)]
        ratios.append(pct([x for i in pick for x in mc[i]], 0.99) / pct([x for i in other for x in ac[i]], 0.99))
    ratios.sort()
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]


def main(paths: list[str]) -> int:
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            doc = json.load(f)
        rows, paired = doc["rows"], bool(doc.get("paired"))
        for load in sorted({r["load"] for r in rows}):
            base = next((r for r in rows if r["load"] == load and r["mode"] == "alone"), None)
            if base is None:
                continue
            k = max(1, len(base.get("round_p99") or [1]))
            for r in rows:
                if r["load"] != load or r["mode"] == "alone":
                    continue
                lo, hi = interval(r["lat_ms"], base["lat_ms"], k, paired=paired)
                print(f"{Path(path).name} load {load:.0%} {r['mode']:14s} p99 {r['p99']:.2f} vs alone "
                      f"{base['p99']:.2f} ms: {r['p99'] / base['p99'] - 1:+.0%} (90% interval {lo - 1:+.0%} .. "
                      f"{hi - 1:+.0%}, {k} rounds{', paired' if paired else ''}); trainer {r['trainer']:.0%} of alone"
                      + (f", {r['trainer'] / (1 - load):.0%} of idle" if load < 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

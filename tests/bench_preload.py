"""Benchmark (figures, no asserts on speed): how often libgpuslice.so reports a channel
that keeps work pending (CHANNEL_WORK), over the mock driver (tests/core/mockrm.c), at the
library's default period (GS_WORK_REPEAT_NS, 10 ms) and at the period a controller asks
({"sample_us":100,"repeat_us":1000}). Not collected by the suite (not test_*.py); run it
by name:

    .venv/bin/python -m pytest -q -s tests/bench_preload.py

tests/test_preload.py asserts what is functional (more reports than the default period
could give); the rates, which depend on the machine's load, are printed here.
"""

from __future__ import annotations


import pytest

from test_preload import built, pending_work_reports  # noqa: F401 (built: the fixture)


@pytest.mark.parametrize("asked", [None, b'{"sample_us":100,"repeat_us":1000}'], ids=["default", "asked-1ms"])
def test_bench_busy_channel_report_rate(built, tmp_path, asked):  # noqa: F811
    pending, secs = pending_work_reports(built, tmp_path, asked)
    what = asked.decode() if asked else "the library's default (10 ms)"
    print(f"\nCHANNEL_WORK of a channel with work pending, {what}: {len(pending)} in {secs:.3f} s, "
          f"{len(pending) / secs:.0f}/s")

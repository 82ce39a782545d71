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

import time

import pytest

from test_preload import WORK, Server, built, start_userd  # noqa: F401 (built: the fixture)


@pytest.mark.parametrize("asked", [None, b'{"sample_us":100,"repeat_us":1000}'], ids=["default", "asked-1ms"])
def test_bench_busy_channel_report_rate(built, tmp_path, asked):  # noqa: F811
    sock = tmp_path / "rep.sock"
    srv = Server(sock)
    p = start_userd(built, sock)
    srv.wait(lambda c: c and any(e["event"] == 3 for e in c[0]), "the channel")
    if asked:
        srv.say(asked + b"\n")
    out, errs = p.communicate(timeout=60)
    assert p.returncode == 0, errs
    t = {w[1]: int(w[2]) for w in (ln.split() for ln in out.splitlines()) if w[0] == "phase"}
    time.sleep(0.3)  # the last lines reach the server's reader
    with srv.lock:
        lines = list(srv.conns[0])
    srv.stop()
    pending = [e for e in lines if e["event"] == WORK and t["pending"] <= e["_t"] < t["fetched"]]
    secs = (t["fetched"] - t["pending"]) / 1e9
    what = asked.decode() if asked else "the library's default (10 ms)"
    print(f"\nCHANNEL_WORK of a channel with work pending, {what}: {len(pending)} in {secs:.3f} s, "
          f"{len(pending) / secs:.0f}/s")

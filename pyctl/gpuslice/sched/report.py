"""Reporting: the daemon's status snapshot, and when and how it is written.

This module owns status.json (what `gpuctl status`, `gpuctl exporter`, `gpuctl doctor`
and `gpuctl trace --scheduler` read): :func:`snapshot` builds it from the switcher's
counts, the GPU timelines, the configuration and the channels; :class:`StatusFile`
decides when a report is due (never at the cost of a switch) and replaces the file
atomically.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Any, Iterable, Mapping

from gpuslice import abi
from gpuslice import state as st
from gpuslice.sched.gate import DropsStale, HasStats
from gpuslice.sched.sources import Channel
from gpuslice.sched.switcher import Switcher
from gpuslice.sched.timeline import GpuTimeline

log = logging.getLogger("gpuslice.sched.scheduler")


def engine_counts(chans: Iterable[Channel]) -> dict[str, int]:
    """Channels per engine ("GR0": 4, "NVDEC0": 1; abi.engine_name), a channel whose engine
    is not known (0: CUDA's, before its TSG says) under "GR0", where it runs."""
    out: dict[str, int] = {}
    for c in chans:
        name = abi.engine_name(c.engine) or abi.engine_name(abi.NV2080_ENGINE_TYPE_GR0)
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def _dist(xs: Iterable[int] | None) -> dict[str, int | None]:
    v = sorted(xs or ())
    return {"n": len(v), "p50": v[len(v) // 2] if v else None,
            "p99": v[min(len(v) - 1, int(0.99 * len(v)))] if v else None, "max": v[-1] if v else None}


def snapshot(now: int, switcher: Switcher, timelines: Mapping[int, GpuTimeline], state: st.State,
             chans: Mapping[str, set[Channel]], wake_bias_ns: int) -> dict[str, Any]:
    """The status as of ``now`` (the scheduler's clock)."""
    lat = sorted(switcher.latencies_ns)

    def pct(p: float) -> int | None:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

    gate = switcher.gate
    stats = gate.stats if isinstance(gate, HasStats) else None
    totals = {g: tl.totals(now) for g, tl in timelines.items()}
    return {
        "pid": os.getpid(),
        "time": time.time(),
        "switches": switcher.switches,
        "rm_calls": switcher.rm_calls,
        "disabled_now": len(gate.disabled),
        # channels RM answered as naming no live channel, dropped from the gate's batches
        # (sched/stale.py): each drop since start, and those held out now
        "stale_channels": stats.stale if stats is not None else 0,
        "stale_now": len(gate.dropped or ()) if isinstance(gate, DropsStale) else 0,
        "wake_bias_ns": wake_bias_ns,
        # instances whose last disable took long (a frame the GPU cannot preempt): switched
        # to disable-first (sched/switcher.py SLOW_TO_STOP_NS)
        "slow_to_stop": sorted(switcher.slow_to_stop),
        "switch_latency_ns": {"p50": pct(0.5), "p99": pct(0.99), "max": lat[-1] if lat else None},
        # duration of each FIFO_DISABLE_CHANNELS call (disable / re-enable), as the daemon saw it
        "rm_call_ns": {"disable": _dist(stats.disable_ns if stats is not None else None),
                       "enable": _dist(stats.enable_ns if stats is not None else None)},
        "gpus": {
            str(g): {
                "policy": tl.policy,
                "period_ns": tl.period_ns,
                "period_start_ns": tl.period_start,  # CLOCK_MONOTONIC
                "periods": tl.periods,
                "active_changes": [[t, a] for t, a in tl.active_changes],
                # online work preempting offline instances: from the online instance's
                # first work (its CHANNEL_WORK's arrival, else when the probe saw it)
                # to the last offline channel disabled
                "preemptions": tl.preemptions,
                "resumes": tl.resumes,
                "preempt_latency_ns": _dist(tl.preempt_ns),
                "switch_latency_hist_ns": list(tl.latency_hist),
                "switch_latency_sum_ns": tl.latency_sum_ns,
                "instances": {
                    n: {"share": tl.shares.get(n, 0.0), "active": n in tl.active, "gated": n not in tl.ungated,
                        "priority": state.instances[n].priority if n in state.instances else "online",
                        "owed_ns": int(tl.owed.get(n, 0.0) * tl.period_ns),
                        "slot_ns": totals[g][0].get(n, 0), "gated_ns": totals[g][1].get(n, 0),
                        "channels": len([c for c in chans.get(n, set()) if c.gpu == g]),
                        "engines": engine_counts(c for c in chans.get(n, set()) if c.gpu == g)}
                    for n in tl.members
                },
            }
            for g, tl in sorted(timelines.items())
        },
    }


class StatusFile:
    """Where and when the status is written. ``soon``: an instance's first channel came
    or its last went (reported without the usual wait)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.last = 0
        self.soon = False
        self.cost_ns = 1_000_000  # running average of a report's time, for when to write

    def due(self, now: int, timelines: Mapping[int, GpuTimeline]) -> bool:
        """Every 0.5 s, and 20 ms after an instance's first channel came or its last went
        (a restarted daemon shows its workloads as soon as their libraries or the module
        gave them back; a process that makes and frees channels does not), at a moment
        with room before the next switch (twice the average time a report takes), so
        writing it never delays a switch; at the latest every 5 s."""
        since = now - self.last
        if since < (20_000_000 if self.soon else 500_000_000):
            return False
        nxt = min((tl.next_boundary() for tl in timelines.values()), default=now + 10**9)
        return nxt - now >= 2 * self.cost_ns or since > 5_000_000_000

    def write(self, snap: Mapping[str, Any]) -> None:
        """Replace the file with ``snap`` (atomically: readers see the old or the new)."""
        if not self.path:
            return
        d = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".status.", dir=d)
            with os.fdopen(fd, "w") as f:
                json.dump(snap, f)
            os.replace(tmp, self.path)
        except OSError as e:
            log.debug("status file: %s", e)

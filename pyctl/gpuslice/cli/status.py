"""`gpuctl status` and `gpuctl top`: the daemon's and guard's reports."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from gpuslice import state as S
from gpuslice import units

from .common import DURATION, GUARD_STATUS, STATUS_PATH, _read_status, emit, json_option, table


def _status_rows(st: S.State, d: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for g in st.used_gpus():
        live = (d or {}).get("gpus", {}).get(str(g), {}) if d and d.get("running") else {}
        for i in st.instances_on(g):
            li = live.get("instances", {}).get(i.name, {})
            rows.append({"gpu": g, "instance": i.name, "policy": st.policy_of(g).policy, "priority": i.priority,
                         "share": units.format_share(li["share"]) if "share" in li else None,
                         "active": ("yes" if li.get("active") else "no") if li else None,
                         "gated": ("yes" if li.get("gated") else "no") if li else None,
                         "channels": li.get("channels"),
                         "engines": ",".join(f"{e}:{n}" for e, n in li.get("engines", {}).items()) if li else None})
    return rows


STATUS_COLS = [("gpu", "GPU"), ("instance", "INSTANCE"), ("policy", "POLICY"), ("priority", "PRIORITY"),
               ("share", "SHARE NOW"),
               ("active", "ACTIVE"), ("gated", "GATED"), ("channels", "CHANNELS"),
               ("engines", "ENGINES")]


@click.command()
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@click.option("--guard-file", default=GUARD_STATUS, show_default=True, help="Where the guard reports.")
@json_option
@click.pass_context
def status(ctx: click.Context, status_file: str, guard_file: str) -> None:
    """Daemon state and each instance's current share (shares are fractions of a GPU)."""
    st = S.load(ctx.obj["state"])
    d = _read_status(status_file, strict=True)
    rows = _status_rows(st, d)

    def text() -> str:
        if d and d.get("running"):
            lat = d.get("switch_latency_ns", {})
            head = (f"daemon: running (pid {d['pid']}), {d.get('switches', 0)} slot switches, "
                    f"{d.get('rm_calls', 0)} RM calls, switch latency p50 "
                    f"{_us(lat.get('p50'))} p99 {_us(lat.get('p99'))}")
            calls = d.get("rm_call_ns") or {}
            if calls:
                head += "\n" + "; ".join(
                    f"{k} call p50 {_us((calls.get(k) or {}).get('p50'))} p99 {_us((calls.get(k) or {}).get('p99'))} "
                    f"max {_us((calls.get(k) or {}).get('max'))} (n={(calls.get(k) or {}).get('n', 0)})"
                    for k in ("disable", "enable"))
            for gpu, tl in sorted((d.get("gpus") or {}).items()):
                if tl.get("preemptions") or tl.get("resumes"):
                    pl = tl.get("preempt_latency_ns") or {}
                    head += (f"\ngpu {gpu}: online work preempted offline instances {tl.get('preemptions', 0)} "
                             f"times (latency p50 {_us(pl.get('p50'))} p99 {_us(pl.get('p99'))} max "
                             f"{_us(pl.get('max'))}), gave the GPU back {tl.get('resumes', 0)} times")
        else:
            head = "daemon: not running"
        if g:
            head += (f"\nguard: {g.get('polls', 0)} polls of RM's per-process memory, "
                     f"{g.get('kills', 0)} processes killed over their instance's limit")
        return head + "\n" + table(rows, STATUS_COLS)

    g = _read_status(guard_file, strict=True)
    emit(ctx, {"daemon": d, "guard": g, "instances": rows}, text)


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.0f}us"


@click.command()
@click.option("--interval", type=DURATION, default="1s", show_default=True, help="Refresh interval, e.g. 500ms or 2s (a bare number is seconds, no longer milliseconds).")
@click.option("-n", "--iterations", type=click.IntRange(min=1), help="Stop after N refreshes (default: until Ctrl-C).")
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@json_option
@click.pass_context
def top(ctx: click.Context, interval: int, iterations: int | None, status_file: str) -> None:
    """Refreshing view of the daemon's shares (JSON: one object per line per refresh)."""
    n = 0
    try:
        while iterations is None or n < iterations:
            if n:
                time.sleep(interval / 1e9)
            st = S.load(ctx.obj["state"])
            d = _read_status(status_file, strict=True)
            rows = _status_rows(st, d)
            if ctx.obj.get("json"):
                click.echo(json.dumps({"time": time.time(), "daemon": d, "instances": rows}))
            else:
                if sys.stdout.isatty():
                    click.clear()
                click.echo(time.strftime("%H:%M:%S ") + ("daemon running" if d and d.get("running")
                                                         else "daemon not running"))
                click.echo(table(rows, STATUS_COLS))
            n += 1
    except KeyboardInterrupt:
        pass

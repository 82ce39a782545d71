"""`gpuctl trace`: live BPF views of the interposer (bcc, imported lazily).

    gpuctl trace [-i SECONDS] [-c N] [--instance NAME] [--pid PID] [--json]
        log2 latency histograms of interposed ioctls per instance and call, and the
        split of each call's time into the real driver and the interposer
    gpuctl trace --refusals      one line per refused call, as it happens
    gpuctl trace --scheduler     latency of the scheduler's FIFO_DISABLE_CHANNELS controls

Without -i it traces until Ctrl-C and prints the totals; with -i it prints every
interval (-c of them, or until Ctrl-C, which prints the totals). The ready line
"Tracing ... Hit Ctrl-C to end." goes to stderr once the probes are attached.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import click

from gpuslice import units
from gpuslice.trace import bpf as tracebpf
from gpuslice.trace import fmt as tracefmt
from gpuslice.state import STATUS_PATH, valid_name

TRACEFS_ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
BCC_HINT = "bcc not importable: apt-get install python3-bpfcc and use a venv made with --system-site-packages"
ROOT_HINT = "must run as root (BPF tracing needs CAP_SYS_ADMIN / CAP_BPF and CAP_PERFMON)"
FOREVER = 99999999.0


class TraceError(Exception):
    """A one-line, user-facing reason for giving up."""


def _fail(msg: str) -> NoReturn:
    click.echo(f"gpuctl trace: {msg}", err=True)
    sys.exit(1)


def load_bcc() -> Any:
    """The bcc module, or TraceError with the way to get it."""
    try:
        import bcc  # type: ignore[import-not-found]
    except Exception as e:  # ImportError, or a broken libbcc raising at import
        raise TraceError(BCC_HINT) from e
    return bcc


def check_root() -> None:
    if os.geteuid() != 0:
        raise TraceError(ROOT_HINT)


def _find_tracefs(roots: tuple[str, ...]) -> str | None:
    for r in roots:
        if os.path.isdir(os.path.join(r, "events")):
            return r
    return None


def tracefs_root(roots: tuple[str, ...] | None = None) -> str:
    """Where tracefs is; mounts it at /sys/kernel/tracing (we are root) if it is nowhere."""
    found = _find_tracefs(roots or TRACEFS_ROOTS)
    if found is None and roots is None and os.path.isdir(TRACEFS_ROOTS[0]):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS_ROOTS[0]], capture_output=True, check=False)
        found = _find_tracefs(TRACEFS_ROOTS)
    if found is None:
        raise TraceError("tracefs not mounted: mount -t tracefs nodev /sys/kernel/tracing")
    return found


def check_events(events: list[str], roots: tuple[str, ...] | None = None) -> None:
    root = tracefs_root(roots)
    for ev in events:
        if not os.path.isdir(os.path.join(root, "events", ev)):
            if ev.startswith("gpuslice/"):
                raise TraceError(f"tracepoint {ev.replace('/', ':')} not found: is gpuslice.ko loaded? (modprobe gpuslice)")
            raise TraceError(f"tracepoint {ev.replace('/', ':')} not found in {root}/events")


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


# ---------------------------------------------------------------- map readers


def read_ioctl(b: Any) -> dict[tracefmt.CallKey, tracefmt.CallStats]:
    sums = []
    for k, v in b["sums"].items():
        sums.append(((_cstr(k.inst), k.escape, k.what), (v.count, v.refused, v.errors, v.total_ns, v.drv_ns)))
    hists = []
    for hk, n in b["hists"].items():
        hists.append(((_cstr(hk.k.inst), hk.k.escape, hk.k.what), hk.kind, hk.slot, n.value))
    return tracefmt.build_stats(sums, hists)


def read_sched(b: Any) -> tuple[dict[tracefmt.SchedKey, tracefmt.SchedStats], dict[tracefmt.SchedKey, int]]:
    sums = [((k.tgid, _cstr(k.comm)), (v.count, v.errors, v.total_ns, 0)) for k, v in b["sums"].items()]
    hists = [((hk.k.tgid, _cstr(hk.k.comm)), hk.slot, n.value) for hk, n in b["hists"].items()]
    maxes: dict[tracefmt.SchedKey, int] = {}
    table = b["maxes"]
    for k, v in list(table.items()):
        maxes[(k.tgid, _cstr(k.comm))] = v.value
        try:
            del table[k]
        except KeyError:
            pass
    return tracefmt.build_sched(sums, hists), maxes


# ---------------------------------------------------------------- output


class Out:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def record(self, rec: dict[str, Any], lines: list[str]) -> None:
        if self.as_json:
            click.echo(json.dumps(rec, sort_keys=False))
        else:
            click.echo("\n".join(lines))
            click.echo("")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _install_signals() -> None:
    # A shell's background job inherits SIGINT ignored; take it back, and treat SIGTERM alike.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)


def _ready(what: str) -> None:
    click.echo(f"Tracing {what}... Hit Ctrl-C to end.", err=True)


def run_intervals(
    interval: float | None,
    count: int | None,
    snapshot: Callable[[], None],
    emit: Callable[[str, float], None],
) -> None:
    """Sleep/snapshot loop shared by the histogram modes.

    emit(kind, seconds) prints "interval" (since the last snapshot) or "totals".
    """
    if interval is None:
        interval = 1.0 if count is not None else FOREVER
    start = time.monotonic()
    last = start
    done = 0
    try:
        while count is None or done < count:
            deadline = last + interval
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, 3600.0))
            snapshot()
            now = time.monotonic()
            if interval != FOREVER:
                emit("interval", now - last)
            last = now
            done += 1
    except KeyboardInterrupt:
        snapshot()
        emit("totals", time.monotonic() - start)


def trace_ioctls(bcc: Any, out: Out, interval: float | None, count: int | None, instance: str | None,
                 pid: int | None, unit: str, overhead_hist: bool) -> None:
    check_events(["gpuslice/gpuslice_ioctl"])
    b = bcc.BPF(text=tracebpf.ioctl_program(tracefmt.UNITS[unit][0], instance, pid))
    state: dict[str, dict[tracefmt.CallKey, tracefmt.CallStats]] = {"prev": {}, "cur": {}}

    def snapshot() -> None:
        state["prev"], state["cur"] = state["cur"], read_ioctl(b)

    def emit(kind: str, seconds: float) -> None:
        stats = state["cur"] if kind == "totals" else tracefmt.diff(state["cur"], state["prev"])
        stats = tracefmt.filter_stats(stats, instance)
        if kind == "totals":
            stats = {k: v for k, v in stats.items() if v.count}
        when = tracefmt.now_iso()
        out.record(tracefmt.ioctl_record(kind, stats, unit, seconds, when),
                   tracefmt.format_ioctl(kind, stats, unit, when, overhead_hist))

    _ready("gpuslice ioctls")
    run_intervals(interval, count, snapshot, emit)


def read_status(path: str) -> dict[str, Any] | None:
    """The daemon's status file, or None (no daemon, or caught mid-write)."""
    try:
        with open(path) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None


def trace_sched(bcc: Any, out: Out, interval: float | None, count: int | None, pid: int | None, unit: str,
                status_file: str) -> None:
    check_events(["syscalls/sys_enter_ioctl", "syscalls/sys_exit_ioctl"])
    b = bcc.BPF(text=tracebpf.sched_program(tracefmt.UNITS[unit][0], pid))
    first = read_status(status_file)
    state: dict[str, Any] = {"prev": {}, "cur": {}, "imax": {}, "tmax": {},
                             "st_first": first, "st_prev": first, "st_cur": first}

    def snapshot() -> None:
        cur, maxes = read_sched(b)
        state["prev"], state["cur"], state["imax"] = state["cur"], cur, maxes
        state["st_prev"], state["st_cur"] = state["st_cur"], read_status(status_file) or state["st_cur"]
        for k, m in maxes.items():
            state["tmax"][k] = max(m, state["tmax"].get(k, 0))

    def emit(kind: str, seconds: float) -> None:
        if kind == "totals":
            stats = {k: v for k, v in state["cur"].items() if v.count}
            maxes = state["tmax"]
        else:
            stats = tracefmt.diff(state["cur"], state["prev"])
            maxes = state["imax"]
        for k, st in stats.items():
            st.max_ns = maxes.get(k, 0)
        when = tracefmt.now_iso()
        # the daemon's preemptions of offline instances (issue 14), from its status file
        pre = tracefmt.preemption_rows(state["st_first"] if kind == "totals" else state["st_prev"],
                                       state["st_cur"])
        rec = tracefmt.sched_record(kind, stats, unit, seconds, when)
        rec["preemptions"] = pre
        engines = tracefmt.engine_rows(state["st_cur"])
        rec["engines"] = engines
        out.record(rec, tracefmt.format_sched(kind, stats, unit, when) + tracefmt.format_preemptions(pre, unit)
                   + tracefmt.format_engines(engines))

    _ready("scheduler slot switches (FIFO_DISABLE_CHANNELS)")
    run_intervals(interval, count, snapshot, emit)


def trace_refusals(bcc: Any, out: Out, interval: float | None, count: int | None, instance: str | None,
                   pid: int | None) -> None:
    check_events(["gpuslice/gpuslice_refusal"])
    b = bcc.BPF(text=tracebpf.refusals_program(instance, pid))
    seen: list[dict[str, Any]] = []
    if not out.as_json:
        click.echo(tracefmt.refusal_header())

    def on_event(cpu: int, data: Any, size: int) -> None:
        ev = b["events"].event(data)
        r = tracefmt.Refusal(ev.ts, ev.inst_id, _cstr(bytes(ev.inst)), ev.pid, ev.escape, ev.what, ev.refusal,
                             ev.status, ev.size)
        rec = tracefmt.refusal_record(r, tracefmt.mono_to_wall(r.ts_ns, time.time(), time.monotonic()))
        seen.append(rec)
        click.echo(json.dumps(rec) if out.as_json else tracefmt.format_refusal(rec))

    b["events"].open_perf_buffer(on_event, page_cnt=64)
    duration = FOREVER if count is None else (interval or 1.0) * count
    _ready("gpuslice refusals")
    deadline = time.monotonic() + duration
    try:
        while time.monotonic() < deadline:
            b.perf_buffer_poll(timeout=100)
        b.perf_buffer_poll(timeout=0)
    except KeyboardInterrupt:
        pass
    totals = tracefmt.refusal_totals(seen)
    if out.as_json:
        click.echo(json.dumps({"type": "totals", "mode": "refusals", "refusals": totals}))
    else:
        click.echo("\n".join(tracefmt.format_refusal_totals(totals)))


@click.command("trace")
@click.option("-i", "--interval", type=units.Duration(lo_ns=10_000_000, seconds=True),
              help="Print every INTERVAL, e.g. 5s, 500ms or 5 (a bare number is seconds; default: at Ctrl-C).")
@click.option("-c", "--count", type=click.IntRange(min=1), help="Stop after N intervals.")
@click.option("--instance", metavar="NAME", help="Only calls of this instance.")
@click.option("--pid", type=click.IntRange(min=1), help="Only calls of this process (tgid).")
@click.option("--refusals", is_flag=True, help="Show refused calls as they happen.")
@click.option("--scheduler", is_flag=True, help="Latency of the scheduler's FIFO_DISABLE_CHANNELS controls.")
@click.option("--unit", type=click.Choice(list(tracefmt.UNITS)), default="us", show_default=True,
              help="Histogram unit.")
@click.option("--overhead-hist", is_flag=True, help="Also print histograms of interposer overhead.")
@click.option("--status-file", default=STATUS_PATH, show_default=True,
              help="The daemon's status file: --scheduler adds its preemptions per GPU.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def trace(interval: float | None, count: int | None, instance: str | None, pid: int | None, refusals: bool,
          scheduler: bool, unit: str, overhead_hist: bool, status_file: str, as_json: bool) -> None:
    """Trace interposed ioctls: latency histograms, refusals, scheduler controls.

    \b
    Default: log2 latency histograms per instance and call, and each call's
    time split into the real driver (DRV) and the interposer (OVH).
    --refusals: one line per refused call.  --scheduler: latency of the
    daemon's FIFO_DISABLE_CHANNELS controls, and its preemptions of offline
    instances per GPU (from --status-file).  Without -i: until Ctrl-C,
    then totals.  Needs root, bcc and (but for --scheduler) gpuslice.ko.
    """
    try:
        if refusals and scheduler:
            raise TraceError("--refusals and --scheduler are exclusive")
        if scheduler and instance is not None:
            raise TraceError("--instance does not apply to --scheduler (the daemon is not in an instance)")
        if instance is not None and not valid_name(instance):
            raise TraceError(f"bad instance name {instance!r}")
        bcc = load_bcc()
        check_root()
        _install_signals()
        out = Out(as_json)
        if refusals:
            trace_refusals(bcc, out, interval, count, instance, pid)
        elif scheduler:
            trace_sched(bcc, out, interval, count, pid, unit, status_file)
        else:
            trace_ioctls(bcc, out, interval, count, instance, pid, unit, overhead_hist)
    except TraceError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        sys.exit(0)
    except Exception as e:  # bcc compile/attach failures: one line, not a traceback
        msg = str(e).strip().splitlines()
        _fail(f"{type(e).__name__}: {msg[0] if msg else ''}")



if __name__ == "__main__":
    trace()

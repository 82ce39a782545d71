"""Pure parts of `gpuctl trace`: name decoding, log2 bucketing, aggregation and output.

Nothing here touches BPF or the kernel; trace.py feeds it what it reads from BPF maps
and perf buffers. Times are nanoseconds everywhere except in histograms, whose
buckets count values in the display unit (see UNITS).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from gpuslice import abi

# enum gs_refusal (kmod/core/core.h); tests/test_trace_format.py checks the order.
REFUSAL_NAMES: dict[int, str] = {
    0: "NONE",
    1: "QUOTA",
    2: "FOREIGN",
    3: "GLOBAL",
    4: "CLASS",
    5: "ESCAPE",
    6: "MALFORMED",
    7: "UNLISTED",
    8: "LIMIT",
    9: "CAPS",
}

# enum gs_file_kind (kmod/core/core.h), the tracepoints' file_kind; checked like the above.
FILE_KINDS: dict[int, str] = {0: "CTL", 1: "GPU", 2: "UVM"}
FILE_UVM = 2
# An nvidia-uvm call's escape is its whole request number, and those overlap the RM
# escapes (UVM_REGISTER_GPU = 37 = 0x25); the bcc programs set this bit in the key's
# escape of a call on a UVM file, and the names below read it back.
UVM_KEY_BIT = 1 << 31

# display unit -> (nanoseconds per unit, histogram label as the bcc tools print it)
UNITS: dict[str, tuple[int, str]] = {
    "ns": (1, "nsecs"),
    "us": (1000, "usecs"),
    "ms": (1000000, "msecs"),
}

STARS = 40


# ---------------------------------------------------------------- names


def escape_name(escape: int) -> str:
    if escape & UVM_KEY_BIT:
        cmd = escape & ~UVM_KEY_BIT
        return abi.UVM_NAMES.get(cmd, f"UVM 0x{cmd:x}")
    return abi.ESCAPE_NAMES.get(escape, f"0x{escape:x}")


def what_name(escape: int, what: int) -> str | None:
    """Class name for RM_ALLOC, control name for RM_CONTROL, hex for unknown; None for 0 elsewhere."""
    if escape & UVM_KEY_BIT:
        return f"0x{what:x}" if what else None
    if escape == abi.NV_ESC_RM_ALLOC:
        return abi.CLASS_NAMES.get(what, f"0x{what:04x}")
    if escape == abi.NV_ESC_RM_CONTROL:
        return abi.CONTROL_NAMES.get(what, f"0x{what:08x}")
    return f"0x{what:x}" if what else None


def call_name(escape: int, what: int) -> str:
    w = what_name(escape, what)
    e = escape_name(escape)
    return f"{e} {w}" if w else e


def refusal_name(refusal: int) -> str:
    return REFUSAL_NAMES.get(refusal, str(refusal))


def status_name(status: int) -> str:
    return abi.STATUS_NAMES.get(status, f"0x{status:x}")


# ---------------------------------------------------------------- log2 histograms


def log2_slot(value: int) -> int:
    """Bucket of a value, as the BPF side computes it: 0 for 0, else floor(log2(v)) + 1."""
    return max(0, value).bit_length()


def slot_bounds(slot: int) -> tuple[int, int]:
    """Inclusive [low, high] of the values in a bucket."""
    return (1 << slot) >> 1, (1 << slot) - 1


def hist_rows(buckets: Mapping[int, int]) -> list[dict[str, int]]:
    """Buckets from the first to the last non-empty one, gaps filled with 0."""
    used = [s for s, n in buckets.items() if n]
    if not used:
        return []
    rows = []
    for s in range(min(used), max(used) + 1):
        low, high = slot_bounds(s)
        rows.append({"low": low, "high": high, "count": buckets.get(s, 0)})
    return rows


def format_log2_hist(buckets: Mapping[int, int], label: str) -> list[str]:
    """bcc-style histogram lines ("     usecs   : count     distribution")."""
    rows = hist_rows(buckets)
    if not rows:
        return []
    most = max(r["count"] for r in rows)
    wide = rows[-1]["high"] >= 1 << 32
    width = 20 if wide else 10
    stars = STARS // 2 if wide else STARS
    out = [f"{' ' * (width - 5)}{label:<{2 * width - 1}} : count     distribution"]
    for r in rows:
        bar = "*" * (r["count"] * stars // most)
        out.append(f"{r['low']:>{width}} -> {r['high']:<{width}} : {r['count']:<8} |{bar:<{stars}}|")
    return out


def _add_buckets(a: Mapping[int, int], b: Mapping[int, int], sign: int = 1) -> dict[int, int]:
    out = dict(a)
    for s, n in b.items():
        out[s] = out.get(s, 0) + sign * n
    return {s: n for s, n in out.items() if n}


# ---------------------------------------------------------------- ioctl latency


CallKey = tuple[str, int, int]  # (instance, escape, what)


@dataclasses.dataclass
class CallStats:
    count: int = 0
    refused: int = 0
    errors: int = 0  # status != NV_OK in the reply
    total_ns: int = 0
    drv_ns: int = 0
    hist: dict[int, int] = dataclasses.field(default_factory=dict)  # total latency, by slot
    overhead_hist: dict[int, int] = dataclasses.field(default_factory=dict)  # total - drv, by slot

    @property
    def overhead_ns(self) -> int:
        return self.total_ns - self.drv_ns

    def minus(self, o: CallStats) -> CallStats:
        return CallStats(
            self.count - o.count,
            self.refused - o.refused,
            self.errors - o.errors,
            self.total_ns - o.total_ns,
            self.drv_ns - o.drv_ns,
            _add_buckets(self.hist, o.hist, -1),
            _add_buckets(self.overhead_hist, o.overhead_hist, -1),
        )


HIST_TOTAL = 0
HIST_OVERHEAD = 1


def build_stats(
    sums: Iterable[tuple[CallKey, tuple[int, int, int, int, int]]],
    hists: Iterable[tuple[CallKey, int, int, int]],
) -> dict[CallKey, CallStats]:
    """Stats from raw map rows: sums (key, (count, refused, errors, total_ns, drv_ns)),
    hists (key, kind HIST_TOTAL/HIST_OVERHEAD, slot, count)."""
    out: dict[CallKey, CallStats] = {}
    for key, (count, refused, errors, total_ns, drv_ns) in sums:
        out[key] = CallStats(count, refused, errors, total_ns, drv_ns)
    for key, kind, slot, n in hists:
        st = out.setdefault(key, CallStats())
        h = st.hist if kind == HIST_TOTAL else st.overhead_hist
        h[slot] = h.get(slot, 0) + n
    return out


class _Counted(Protocol):
    count: int

    def minus(self: _S, other: _S) -> _S: ...


_S = TypeVar("_S", bound=_Counted)
_K = TypeVar("_K")


def diff(cur: Mapping[_K, _S], prev: Mapping[_K, _S]) -> dict[_K, _S]:
    """What happened between two cumulative snapshots (call or scheduler stats); keys
    without calls are dropped."""
    out = {}
    for k, st in cur.items():
        d = st.minus(prev[k]) if k in prev else st
        if d.count:
            out[k] = d
    return out


def filter_stats(stats: Mapping[CallKey, CallStats], instance: str | None) -> dict[CallKey, CallStats]:
    return {k: v for k, v in stats.items() if instance is None or k[0] == instance}


def _sorted_keys(stats: Mapping[CallKey, CallStats]) -> list[CallKey]:
    return sorted(stats, key=lambda k: (k[0], k[1], k[2]))


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def ioctl_record(kind: str, stats: Mapping[CallKey, CallStats], unit: str, seconds: float, when: str) -> dict[str, Any]:
    """One JSON object: kind is "interval" or "totals"."""
    calls = []
    for k in _sorted_keys(stats):
        st = stats[k]
        inst, esc, what = k
        calls.append(
            {
                "instance": inst,
                "call": call_name(esc, what),
                "escape": esc,
                "escape_name": escape_name(esc),
                "what": what,
                "what_name": what_name(esc, what),
                "count": st.count,
                "refused": st.refused,
                "errors": st.errors,
                "total_ns": st.total_ns,
                "drv_ns": st.drv_ns,
                "overhead_ns": st.overhead_ns,
                "avg_total_ns": st.total_ns // st.count if st.count else 0,
                "avg_drv_ns": st.drv_ns // st.count if st.count else 0,
                "avg_overhead_ns": st.overhead_ns // st.count if st.count else 0,
                "hist": hist_rows(st.hist),
                "overhead_hist": hist_rows(st.overhead_hist),
            }
        )
    return {"type": kind, "mode": "ioctl", "time": when, "seconds": round(seconds, 3), "unit": unit, "calls": calls}


def _fmt_time(ns: float, unit: str) -> str:
    return f"{ns / UNITS[unit][0]:.1f}"


def format_ioctl(
    kind: str, stats: Mapping[CallKey, CallStats], unit: str, when: str, overhead_hist: bool = False
) -> list[str]:
    """Histograms per (instance, call), then the driver / interposer split per call."""
    label = UNITS[unit][1]
    out = [f"{when} {kind}"]
    if not stats:
        out.append("no gpuslice ioctls")
        return out
    for k in _sorted_keys(stats):
        st = stats[k]
        out.append("")
        out.append(f"instance = {k[0]}  call = {call_name(k[1], k[2])}")
        out.extend(format_log2_hist(st.hist, label))
        if overhead_hist:
            out.append("  interposer overhead (total - driver):")
            out.extend(format_log2_hist(st.overhead_hist, label))
    out.append("")
    head = ("INSTANCE", "CALL", "COUNT", "REFUSED", "ERRORS", f"AVG_{unit.upper()}", f"DRV_{unit.upper()}",
            f"OVH_{unit.upper()}", "OVH%")
    rows = [head]
    for k in _sorted_keys(stats):
        st = stats[k]
        n = max(st.count, 1)
        pct = f"{100.0 * st.overhead_ns / st.total_ns:.1f}" if st.total_ns else "-"
        rows.append(
            (k[0], call_name(k[1], k[2]), str(st.count), str(st.refused), str(st.errors),
             _fmt_time(st.total_ns / n, unit), _fmt_time(st.drv_ns / n, unit), _fmt_time(st.overhead_ns / n, unit),
             pct)
        )
    out.extend(format_table(rows, right_from=2))
    return out


def format_table(rows: Sequence[Sequence[str]], right_from: int) -> list[str]:
    """Columns padded to their widest cell; columns from right_from on are right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i >= right_from else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


# ---------------------------------------------------------------- refusals


@dataclasses.dataclass(frozen=True)
class Refusal:
    ts_ns: int  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
    inst_id: int
    instance: str
    pid: int
    escape: int
    what: int
    refusal: int
    status: int
    size: int


def mono_to_wall(ts_ns: int, wall_now: float, mono_now: float) -> datetime.datetime:
    """A CLOCK_MONOTONIC stamp as UTC wall time, given both clocks read at one moment."""
    return datetime.datetime.fromtimestamp(wall_now - (mono_now - ts_ns / 1e9), datetime.timezone.utc)


def refusal_record(r: Refusal, when: datetime.datetime) -> dict[str, Any]:
    return {
        "type": "refusal",
        "time": when.isoformat(timespec="microseconds"),
        "instance": r.instance,
        "inst_id": r.inst_id,
        "pid": r.pid,
        "call": call_name(r.escape, r.what),
        "escape": r.escape,
        "what": r.what,
        "reason": refusal_name(r.refusal),
        "refusal": r.refusal,
        "status": r.status,
        "status_name": status_name(r.status),
        "size": r.size,
    }


REFUSAL_COLUMNS = ("TIME", "INSTANCE", "PID", "CALL", "REASON", "STATUS", "SIZE")


def refusal_header() -> str:
    return f"{'TIME':<15} {'INSTANCE':<16} {'PID':>7} {'CALL':<40} {'REASON':<9} {'STATUS':<24} {'SIZE':>12}"


def format_refusal(rec: Mapping[str, Any]) -> str:
    t = datetime.datetime.fromisoformat(rec["time"]).strftime("%H:%M:%S.%f")
    st = f"{rec['status_name']}"
    return (
        f"{t:<15} {rec['instance']:<16} {rec['pid']:>7} {rec['call']:<40} {rec['reason']:<9} {st:<24} "
        f"{rec['size']:>12}"
    )


def refusal_totals(recs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    counts: dict[tuple[str, str], int] = {}
    for r in recs:
        k = (r["instance"], r["reason"])
        counts[k] = counts.get(k, 0) + 1
    return [{"instance": i, "reason": why, "count": n} for (i, why), n in sorted(counts.items())]


def format_refusal_totals(totals: list[dict[str, Any]]) -> list[str]:
    rows = [("INSTANCE", "REASON", "COUNT")] + [(t["instance"], t["reason"], str(t["count"])) for t in totals]
    return ["", "refusals:"] + (format_table(rows, right_from=2) if totals else ["none"])


# ---------------------------------------------------------------- scheduler slot switches


SchedKey = tuple[int, str]  # (tgid, comm)


@dataclasses.dataclass
class SchedStats:
    count: int = 0
    errors: int = 0  # ioctl < 0 or RM status != NV_OK
    total_ns: int = 0
    max_ns: int = 0  # set by the reader: the BPF max map is drained per interval
    hist: dict[int, int] = dataclasses.field(default_factory=dict)

    def minus(self, o: SchedStats) -> SchedStats:
        return SchedStats(
            self.count - o.count, self.errors - o.errors, self.total_ns - o.total_ns, self.max_ns,
            _add_buckets(self.hist, o.hist, -1),
        )


def build_sched(
    sums: Iterable[tuple[SchedKey, tuple[int, int, int, int]]], hists: Iterable[tuple[SchedKey, int, int]]
) -> dict[SchedKey, SchedStats]:
    """sums: (key, (count, errors, total_ns, max_ns)); hists: (key, slot, count)."""
    out: dict[SchedKey, SchedStats] = {}
    for key, (count, errors, total_ns, max_ns) in sums:
        out[key] = SchedStats(count, errors, total_ns, max_ns)
    for key, slot, n in hists:
        st = out.setdefault(key, SchedStats())
        st.hist[slot] = st.hist.get(slot, 0) + n
    return out


def sched_record(kind: str, stats: Mapping[SchedKey, SchedStats], unit: str, seconds: float, when: str) -> dict[str, Any]:
    procs = []
    for k in sorted(stats):
        st = stats[k]
        procs.append(
            {
                "pid": k[0],
                "comm": k[1],
                "control": "NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS",
                "count": st.count,
                "errors": st.errors,
                "total_ns": st.total_ns,
                "avg_ns": st.total_ns // st.count if st.count else 0,
                "max_ns": st.max_ns,
                "hist": hist_rows(st.hist),
            }
        )
    return {"type": kind, "mode": "scheduler", "time": when, "seconds": round(seconds, 3), "unit": unit, "procs": procs}


def format_sched(kind: str, stats: Mapping[SchedKey, SchedStats], unit: str, when: str) -> list[str]:
    label = UNITS[unit][1]
    out = [f"{when} {kind}"]
    if not stats:
        out.append("no FIFO_DISABLE_CHANNELS controls")
        return out
    rows = [("PID", "COMM", "COUNT", "ERRORS", f"AVG_{unit.upper()}", f"MAX_{unit.upper()}")]
    for k in sorted(stats):
        st = stats[k]
        out.append("")
        out.append(f"pid = {k[0]}  comm = {k[1]}  control = NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS")
        out.extend(format_log2_hist(st.hist, label))
        rows.append((str(k[0]), k[1], str(st.count), str(st.errors), _fmt_time(st.total_ns / max(st.count, 1), unit),
                     _fmt_time(st.max_ns, unit)))
    out.append("")
    out.extend(format_table(rows, right_from=2))
    return out


def preemption_rows(prev: Mapping[str, Any] | None, cur: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per GPU of the daemon's status ``cur``: preemptions of offline instances and
    give-backs since ``prev`` (the status an interval earlier; all of them when there is
    none, or when the counters went back: a restarted daemon), and the latency of its
    recent preemptions (first online work seen -> last offline channel disabled)."""
    out: list[dict[str, Any]] = []
    if not cur:
        return out
    before = (prev or {}).get("gpus") or {}
    for g, d in sorted((cur.get("gpus") or {}).items(), key=lambda kv: int(kv[0])):
        p = before.get(g) or {}
        row: dict[str, Any] = {"gpu": int(g)}
        for key in ("preemptions", "resumes"):
            now, was = int(d.get(key) or 0), int(p.get(key) or 0)
            row[key] = now - was if now >= was else now
        lat = d.get("preempt_latency_ns") or {}
        row["latency_ns"] = {k: lat.get(k) for k in ("n", "p50", "p99", "max")}
        out.append(row)
    return out


def format_preemptions(rows: Sequence[Mapping[str, Any]], unit: str) -> list[str]:
    out = []
    for r in rows:
        lat = r["latency_ns"]
        line = f"gpu {r['gpu']}: {r['preemptions']} preemptions, {r['resumes']} give-backs"
        if lat.get("n"):
            parts = [f"{k} {_fmt_time(lat[k], unit)}" for k in ("p50", "p99", "max") if lat.get(k) is not None]
            line += f"; recent preemption latency ({lat['n']}) {', '.join(parts)} {unit}"
        out.append(line)
    return out



def engine_rows(status: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per GPU and instance of the daemon's status: its channels by engine ("GR0": 4,
    "NVDEC0": 1), for the scheduler trace (which engines the slots it times gate)."""
    out: list[dict[str, Any]] = []
    for g, tl in sorted(((status or {}).get("gpus") or {}).items()):
        for name, li in sorted((tl.get("instances") or {}).items()):
            if li.get("engines"):
                out.append({"gpu": g, "instance": name, "engines": dict(li["engines"])})
    return out


def format_engines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    table = [("GPU", "INSTANCE", "CHANNELS BY ENGINE")]
    table += [(str(r["gpu"]), str(r["instance"]), " ".join(f"{e}:{n}" for e, n in r["engines"].items()))
              for r in rows]
    return [""] + format_table(table, right_from=3)

"""Compatibility matrix on a real GPU: each workload of tests/gpu/compat/ runs once without
libgpuslice.so and once with it (LD_PRELOAD, GPUSLICE_MEM_LIMIT per GPU, GPUSLICE_DEBUG=1 so
refusals reach stderr, GPUSLICE_STATS for counters); their results must match within the
tolerance the workload states, and the library must refuse nothing a framework needs. The
workloads with an --oom mode run a third time, with the library and a smaller limit, until the
framework's own out-of-memory error, and must go on working after it.

  python3 tests/gpu/compat.py --out DIR [--limit 8G] [--oom-limit 4G] [--only name,name] [--gpus 1|2]

Writes DIR/compat.json (every figure: both runs' JSON, return codes, durations, refusals),
DIR/compat.txt (the table) and appends each run's command line and output to DIR/raw.txt
(the library's object-event lines left out). Exit code 0 when every row that ran passes:
native ok, gpuslice ok, results match, no refusal but those in EXPECTED_REFUSALS (the OOM
run may also be refused memory: quota), all-reduce bus bandwidth at least BUSBW_MIN_RATIO
of the native run's. A workload whose native run fails (a package the machine lacks) shows
as "native failed" and does not count; two-GPU workloads are skipped with --gpus 1.

The functions above main() are pure (tests/test_compat_runner.py); importing this file
starts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
WL_DIR = HERE / "compat"
TIMEOUT_S = 300.0
BUSBW_MIN_RATIO = 0.98
GiB = 1 << 30

# Refusals the library may make of a call some framework issues, each with the reason it
# is fine. Key: Refusal.call, "<escape> <class or control>" as the debug line names them
# ("RM_CONTROL NV2080_CTRL_CMD_FB_GET_INFO_V2", or the number where the library printed no
# name: "RM_CONTROL 0x20801303"), or just "<escape>" for any call of that escape.
EXPECTED_REFUSALS: dict[str, str] = {
    "RM_CONTROL NV9096_CTRL_CMD_SET_ZBC_COLOR_CLEAR":
        "the ZBC clear table is the whole GPU's (kmod/core/filter.c); answered as RM answers a full table, "
        "and OpenGL and Vulkan clear without it",
}


@dataclass(frozen=True)
class Workload:
    name: str
    gpus: int = 1  # GPUs it needs
    oom: bool = False  # has an --oom mode

    @property
    def script(self) -> Path:
        return WL_DIR / f"{self.name}.py"


WORKLOADS: list[Workload] = [
    Workload("torch_eager", oom=True),
    Workload("torch_compile"),
    Workload("torch_graphs"),
    Workload("torch_amp"),
    Workload("cudnn_conv"),
    Workload("transformers_gen"),
    Workload("jax_default"),
    Workload("jax_noprealloc", oom=True),
    Workload("cupy_ops", oom=True),
    Workload("triton_add"),
    Workload("nvml"),
    Workload("numba_kernels"),
    Workload("lightning_fit"),
    Workload("ddp_nccl", gpus=2),
    Workload("fsdp_nccl", gpus=2),
    Workload("jax_pmap", gpus=2),
    # graphics and video (the graphics and video capabilities; scripts/gpu-run.sh render)
    Workload("egl_render"),  # no out-of-memory probe: OpenGL keeps textures in host memory (its --spill)
    Workload("vulkan_wgpu", oom=True),
    Workload("nvdec_decode", oom=True),
    Workload("nvjpg_decode"),
]


# ---- the library's debug output ----

# preload/report.c gs_report_refusal():
#   "gpuslice: refused %s (%s) escape 0x%x %s what 0x%x %s status 0x%x errno %d\n"
#   refusal kind (kmod/core/names.c), instance, escape number and name ("?" when unknown),
#   what (RM_ALLOC: the class; RM_CONTROL: the command) and its name ("" when unknown),
#   the NV_STATUS the caller got, the errno it got
REFUSAL_RE = re.compile(
    r"gpuslice: refused (?P<kind>\S+) \((?P<instance>.*?)\) escape 0x(?P<escape>[0-9a-fA-F]+) (?P<escape_name>\S+)"
    r" what 0x(?P<what>[0-9a-fA-F]+) (?P<what_name>\S*) ?status 0x(?P<status>[0-9a-fA-F]+) errno (?P<errno>-?\d+)")
ESC_RM_ALLOC_MEMORY, ESC_RM_CONTROL, ESC_RM_ALLOC = 0x27, 0x2A, 0x2B


@dataclass(frozen=True)
class Refusal:
    kind: str  # quota, foreign, global, class, escape, malformed, unlisted, limit
    instance: str
    escape: int
    escape_name: str
    what: int
    what_name: str
    status: int
    errno: int

    @property
    def cls(self) -> int | None:
        return self.what if self.escape in (ESC_RM_ALLOC, ESC_RM_ALLOC_MEMORY) else None

    @property
    def cmd(self) -> int | None:
        return self.what if self.escape == ESC_RM_CONTROL else None

    @property
    def call(self) -> str:
        esc = self.escape_name if self.escape_name not in ("", "?") else f"0x{self.escape:x}"
        if self.what_name:
            return f"{esc} {self.what_name}"
        return f"{esc} 0x{self.what:x}" if self.what else esc

    def as_json(self) -> dict:
        return asdict(self) | {"call": self.call, "class": self.cls, "cmd": self.cmd}


UNPARSED = "unparsed"


def parse_refusals(stderr: str) -> list[Refusal]:
    """Every refusal line in stderr. A line that says "gpuslice: refused" but does not
    parse still counts (kind "unparsed"), so a changed format cannot hide a refusal."""
    out: list[Refusal] = []
    for line in stderr.splitlines():
        if "gpuslice: refused" not in line:
            continue
        found = list(REFUSAL_RE.finditer(line))
        for m in found:
            if m["kind"] == "none":
                # answered by the core as RM answers it, not refused: SYS_PARAMS (0, host-wide)
                # and CUDA's own TSG timeslice (NV_OK, the operator's): kmod/core/core.c
                continue
            out.append(Refusal(kind=m["kind"], instance=m["instance"], escape=int(m["escape"], 16),
                               escape_name=m["escape_name"], what=int(m["what"], 16), what_name=m["what_name"],
                               status=int(m["status"], 16), errno=int(m["errno"])))
        missing = line.count("gpuslice: refused") - len(found)
        out += [Refusal(UNPARSED, "", 0, line.strip()[:200], 0, "", 0, 0)] * missing
    return out


def parse_stats(text: str) -> list[dict]:
    """GPUSLICE_STATS: one JSON line per process that exited with the library."""
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


def parse_last_json(stdout: str) -> dict | None:
    """The workload's JSON: its last stdout line that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            return d
    return None


def is_event_line(line: str) -> bool:
    return line.startswith("gpuslice: {") and '"event":' in line


def expected_reason(r: Refusal, expected: dict[str, str]) -> str | None:
    return expected.get(r.call) or expected.get(r.escape_name)


def unexpected_refusals(refusals: list[Refusal], expected: dict[str, str], allow_quota: bool = False) -> list[Refusal]:
    return [r for r in refusals
            if not (allow_quota and r.kind == "quota") and expected_reason(r, expected) is None]


def unreported_refusals(refusals: list[Refusal], stats: list[dict], allow_quota: bool = False) -> int:
    """Refusals the processes' counters hold beyond the lines on stderr: made in a process
    whose stderr did not reach us (a subprocess's captured output)."""
    counted = sum(int(s.get("refused_filter", 0)) for s in stats)
    lines = sum(1 for r in refusals if r.kind != "quota")
    if not allow_quota:
        counted += sum(int(s.get("refused_quota", 0)) for s in stats)
        lines = len(refusals)
    return max(0, counted - lines)


def refusal_counts(refusals: list[Refusal]) -> dict[str, int]:
    """'<call> (<kind>)' -> how many times, most first."""
    counts: dict[str, int] = {}
    for r in refusals:
        k = f"{r.call} ({r.kind})"
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def refusal_summary(refusals: list[Refusal]) -> str:
    if not refusals:
        return "0"
    c = refusal_counts(refusals)
    return f"{len(refusals)} in {len(c)} call(s): " + ", ".join(f"{k} x{n}" for k, n in c.items())


# ---- comparing results ----

def floats_close(a: float, b: float, tol: float) -> bool:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= tol * max(abs(a), abs(b))


def compare(a: Any, b: Any, tol: float, path: str = "result") -> str | None:
    """None when b matches a; else where and how they differ. Ints, bools and strings compare
    exactly; a float (against a float or an int) within relative tolerance tol; lists and
    dicts element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return None if type(a) is type(b) and a == b else f"{path}: {a!r} != {b!r}"
    if isinstance(a, int) and isinstance(b, int):
        return None if a == b else f"{path}: {a} != {b}"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if floats_close(float(a), float(b), tol):
            return None
        rel = abs(a - b) / max(abs(a), abs(b)) if math.isfinite(a) and math.isfinite(b) else math.inf
        return f"{path}: {a!r} vs {b!r} (relative {rel:.3g} > tol {tol:g})"
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = compare(x, y, tol, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in sorted(a):
            d = compare(a[k], b[k], tol, f"{path}[{k!r}]")
            if d:
                return d
        return None
    return None if type(a) is type(b) and a == b else f"{path}: {a!r} != {b!r}"


def tolerance(out: dict | None) -> float:
    t = (out or {}).get("tol", 0)
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 else 0.0


def busbw_ratios(native: dict | None, lib: dict | None) -> dict[str, float | None]:
    """gpuslice / native bus bandwidth for each size the native run measured."""
    base = (native or {}).get("busbw_gbs") or {}
    got = (lib or {}).get("busbw_gbs") or {}
    out: dict[str, float | None] = {}
    for size, b in base.items():
        v = got.get(size)
        ok = isinstance(b, (int, float)) and b > 0 and isinstance(v, (int, float))
        out[size] = round(v / b, 4) if ok else None
    return out


# ---- runs and verdicts ----

@dataclass
class Run:
    mode: str  # native | gpuslice | oom
    cmd: list[str]
    env: dict[str, str]  # what this run set beyond the runner's environment
    rc: int
    wall: float
    out: dict | None  # the workload's JSON
    refusals: list[Refusal] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)  # GPUSLICE_STATS, one per process
    timed_out: bool = False
    leftovers_killed: bool = False  # processes of its group still there after it exited
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.out is not None and self.out.get("ok") is True

    @property
    def skip(self) -> str | None:
        s = (self.out or {}).get("skip")
        return str(s) if s else None

    def failure(self) -> str:
        if self.timed_out:
            return f"timed out after {self.wall:.0f} s"
        if self.out is None:
            return f"rc {self.rc}, no JSON line"
        err = self.out.get("error")
        why = f"ok={self.out.get('ok')}" + (f": {str(err).splitlines()[0][:200]}" if err else "")
        return why if self.rc == 0 else f"rc {self.rc}, {why}"

    def as_json(self) -> dict:
        d = asdict(self)
        d["refusals"] = [r.as_json() for r in self.refusals[:200]]
        d["refusal_count"] = len(self.refusals)
        d["refusal_calls"] = refusal_counts(self.refusals)
        return d


@dataclass
class Verdict:
    status: str  # pass | fail | native failed | skipped
    counted: bool  # towards the exit code
    match: bool | None = None
    reasons: list[str] = field(default_factory=list)  # why it failed
    notes: list[str] = field(default_factory=list)


def check_refusals(label: str, run: Run, expected: dict[str, str], allow_quota: bool) -> list[str]:
    reasons = []
    bad = unexpected_refusals(run.refusals, expected, allow_quota)
    if bad:
        reasons.append(f"{label}: unexpected refusal(s) " + ", ".join(
            f"{k} x{n}" for k, n in refusal_counts(bad).items()))
    lost = unreported_refusals(run.refusals, run.stats, allow_quota)
    if lost:
        reasons.append(f"{label}: {lost} refusal(s) in GPUSLICE_STATS with no line on stderr")
    return reasons


def check_oom(native: Run, oom: Run, tol: float, expected: dict[str, str]) -> tuple[list[str], str]:
    """(reasons, note) for the --oom run."""
    if not oom.ok:
        return [f"oom run: {oom.failure()}"], "oom: run failed"
    o = (oom.out or {}).get("oom")
    if not isinstance(o, dict):
        return ["oom run: no oom figures"], "oom: ?"
    reasons = []
    note = (f"oom: {o.get('type')} after {o.get('chunks')} x 1 GiB, "
            f"{'works after' if o.get('after_ok') else 'BROKEN after'}")
    if not o.get("raised"):
        reasons.append(f"oom run: the framework's out-of-memory error was not raised "
                       f"({o.get('type')}: {o.get('message')}, {o.get('chunks')} chunks)")
    if not o.get("after_ok"):
        reasons.append(f"oom run: the framework did not work after the error ({o.get('after_error')})")
    d = compare(native.out.get("result") if native.out else None, (oom.out or {}).get("result"), tol)
    if d:
        reasons.append(f"oom run: result differs: {d}")
    reasons += check_refusals("oom run", oom, expected, allow_quota=True)
    return reasons, note


def timing_note(native: Run, lib: Run) -> str:
    return f"wall {native.wall:.1f}/{lib.wall:.1f} s"


def extra_notes(native: dict, lib: dict) -> list[str]:
    """Figures meant to differ under a limit, or worth seeing beside the verdict."""
    notes = []
    if "mem_total" in native or "mem_total" in lib:
        def gib(v: Any) -> str:
            return ",".join(f"{x / GiB:.1f}" for x in v) if isinstance(v, list) else str(v)
        notes.append(f"mem_total GiB {gib(native.get('mem_total'))} -> {gib(lib.get('mem_total'))}")
    if "smi" in lib:
        notes.append(f"smi {'; '.join(map(str, lib.get('smi') or []))}")
    return notes


def decide(w: Workload, native: Run | None, lib: Run | None, oom: Run | None,
           expected: dict[str, str] | None = None, skipped: str | None = None) -> Verdict:
    expected = EXPECTED_REFUSALS if expected is None else expected
    if skipped:
        return Verdict("skipped", False, notes=[skipped])
    if native is None:
        return Verdict("skipped", False, notes=["not run"])
    if native.skip:
        return Verdict("skipped", False, notes=[native.skip])
    if not native.ok:
        return Verdict("native failed", False, notes=[native.failure()])
    if lib is None:
        return Verdict("fail", True, reasons=["gpuslice run missing"])
    reasons: list[str] = []
    notes = [timing_note(native, lib)]
    if not lib.ok:
        reasons.append(f"gpuslice run: {lib.failure()}")
    tol = tolerance(native.out)
    diff = compare(native.out.get("result"), lib.out.get("result"), tol) if lib.out is not None else "no result"
    match = diff is None
    if diff:
        reasons.append(f"result differs: {diff}")
    reasons += check_refusals("gpuslice run", lib, expected, allow_quota=False)
    ratios = busbw_ratios(native.out, lib.out)
    if ratios:
        notes.append("busbw ratio " + " ".join(f"{k} {v if v is not None else '?'}" for k, v in ratios.items()))
        for size, r in ratios.items():
            if r is None or r < BUSBW_MIN_RATIO:
                reasons.append(f"all-reduce busbw at {size}: ratio {r} < {BUSBW_MIN_RATIO}")
    notes += extra_notes(native.out or {}, lib.out or {})
    if oom is not None:
        r, note = check_oom(native, oom, tol, expected)
        reasons += r
        notes.append(note)
        if oom.refusals:
            notes.append(f"oom run refusals {refusal_summary(oom.refusals)}")
    return Verdict("fail" if reasons else "pass", True, match, reasons, notes)


@dataclass
class Row:
    workload: Workload
    verdict: Verdict
    native: Run | None = None
    lib: Run | None = None
    oom: Run | None = None

    def as_json(self) -> dict:
        return {"workload": self.workload.name, "gpus": self.workload.gpus, "status": self.verdict.status,
                "counted": self.verdict.counted, "match": self.verdict.match, "reasons": self.verdict.reasons,
                "notes": self.verdict.notes,
                **{k: (r.as_json() if r else None) for k, r in (("native", self.native), ("gpuslice", self.lib),
                                                                ("oom", self.oom))}}


def exit_code(rows: list[Row]) -> int:
    return 0 if all(r.verdict.status == "pass" for r in rows if r.verdict.counted) else 1


def run_cell(run: Run | None) -> str:
    if run is None:
        return "-"
    if run.skip:
        return "skip"
    return "ok" if run.ok else "FAILED"


def row_cells(row: Row, width: int = 180) -> list[str]:
    v = row.verdict
    match = "-" if v.match is None else ("yes" if v.match else "NO")
    refusals = refusal_summary(row.lib.refusals) if row.lib else "-"
    notes = "; ".join(v.reasons + v.notes)
    if len(notes) > width:
        notes = notes[:width - 3] + "..."
    return [row.workload.name, run_cell(row.native), run_cell(row.lib), match, refusals, v.status.upper(), notes]


HEADER = ["workload", "native ok", "gpuslice ok", "result match", "refusals", "verdict", "notes"]


def format_table(rows: list[Row]) -> str:
    cells = [HEADER] + [row_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER) - 1)]
    lines = [" | ".join([*(c[i].ljust(widths[i]) for i in range(len(widths))), c[-1]]).rstrip() for c in cells]
    lines.insert(1, "-+-".join(["-" * w for w in widths] + ["-----"]))
    return "\n".join(lines)


def select(only: str | None) -> list[Workload]:
    if not only:
        return list(WORKLOADS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {w.name: w for w in WORKLOADS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {', '.join(known)}")
    return [known[n] for n in names]


# ---- running (GPU machine) ----

def _gpu_common() -> ModuleType:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import gpu_common

    return gpu_common


def _read(f: Any) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def run_workload(w: Workload, mode: str, limit: str | None, args: list[str], timeout: float) -> Run:
    """One run of w's script; limit None: without the library."""
    g = _gpu_common()
    fd, stats_name = tempfile.mkstemp(prefix="gs-compat-stats-")
    os.close(fd)
    stats = Path(stats_name)
    env = g.env_for(limit, name=f"compat-{w.name}", stats=stats if limit else None)
    shown = {k: env[k] for k in ("LD_PRELOAD", "GPUSLICE_MEM_LIMIT", "GPUSLICE_INSTANCE", "GPUSLICE_DEBUG",
                                 "GPUSLICE_STATS") if k in env}
    cmd = [sys.executable, str(w.script), *args]
    timed_out = leftovers = False
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        t0 = time.perf_counter()
        # its own process group: ranks and compiler workers it leaves go with it
        p = subprocess.Popen(cmd, env=env, stdout=so, stderr=se, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
        wall = time.perf_counter() - t0
        try:
            os.killpg(p.pid, signal.SIGKILL)
            leftovers = not timed_out
        except ProcessLookupError:
            pass
        stdout, stderr = _read(so), _read(se)
    st = parse_stats(stats.read_text()) if stats.exists() else []
    stats.unlink(missing_ok=True)
    kept = [x for x in stderr.splitlines() if not is_event_line(x)]
    dropped = len(stderr.splitlines()) - len(kept)
    g.raw(f"compat {w.name} {mode}" + (f" GPUSLICE_MEM_LIMIT={limit}" if limit else " (no library)"),
          f"$ {' '.join(f'{k}={v}' for k, v in shown.items())} {' '.join(cmd)}\n"
          f"rc={rc} wall={wall:.2f}s{' TIMED OUT' if timed_out else ''}"
          f"{' (killed processes it left)' if leftovers else ''}\n--- stdout\n{stdout}\n"
          f"--- stderr ({dropped} object-event lines of the library left out)\n" + "\n".join(kept))
    return Run(mode, cmd, shown, 124 if timed_out else rc, round(wall, 3), parse_last_json(stdout),
               parse_refusals(stderr), st, timed_out, leftovers, "\n".join(kept)[-3000:])


def run_row(w: Workload, limit: str, oom_limit: str, gpus: int, timeout: float) -> Row:
    if w.gpus > gpus:
        return Row(w, decide(w, None, None, None, skipped=f"needs {w.gpus} GPUs (--gpus {gpus})"))
    native = run_workload(w, "native", None, [], timeout)
    lib = oom = None
    if native.ok:
        lib = run_workload(w, "gpuslice", limit, [], timeout)
        if w.oom:
            oom = run_workload(w, "oom", oom_limit, ["--oom"], timeout)
    return Row(w, decide(w, native, lib, oom), native, lib, oom)


def detect_gpus() -> int:
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 1
    n = sum(1 for x in p.stdout.splitlines() if x.startswith("GPU "))
    return max(1, min(2, n))


def gpu_env() -> str:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        return p.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi: {e}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", default="8G", help="GPUSLICE_MEM_LIMIT of the gpuslice runs (each GPU)")
    ap.add_argument("--oom-limit", default="4G", help="GPUSLICE_MEM_LIMIT of the --oom runs")
    ap.add_argument("--only", help="comma-separated workloads: " + ",".join(w.name for w in WORKLOADS))
    ap.add_argument("--gpus", type=int, choices=(1, 2), help="GPUs to use (default: what nvidia-smi -L lists)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds for each run")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    chosen = select(a.only)
    a.out.mkdir(parents=True, exist_ok=True)
    g = _gpu_common()
    g.RAW = a.out
    g.build()
    gpus = a.gpus or detect_gpus()
    env = gpu_env()
    print(f"compat: {len(chosen)} workload(s), limit {a.limit} per GPU, oom limit {a.oom_limit}, "
          f"{gpus} GPU(s)\n{env}", flush=True)
    rows = []
    for w in chosen:
        t0 = time.perf_counter()
        row = run_row(w, a.limit, a.oom_limit, gpus, a.timeout)
        rows.append(row)
        print(f"  {w.name}: {row.verdict.status} ({time.perf_counter() - t0:.0f} s) "
              f"{'; '.join(row.verdict.reasons)[:300]}", flush=True)
    rc = exit_code(rows)
    counted = sum(1 for r in rows if r.verdict.counted)
    table = format_table(rows)
    summary = (f"limit {a.limit} per GPU (oom runs {a.oom_limit}), library {g.SO}, {gpus} GPU(s); "
               f"{counted} of {len(rows)} rows compared; exit {rc}")
    text = f"{env}\n{summary}\n\n{table}\n"
    print("\n" + text, flush=True)
    (a.out / "compat.txt").write_text(text)
    (a.out / "compat.json").write_text(json.dumps({
        "limit": a.limit, "oom_limit": a.oom_limit, "gpus": gpus, "so": str(g.SO), "gpu_env": env,
        "python": sys.version.split()[0], "timeout_s": a.timeout, "busbw_min_ratio": BUSBW_MIN_RATIO,
        "expected_refusals": EXPECTED_REFUSALS, "exit_code": rc, "rows": [r.as_json() for r in rows],
    }, indent=1, default=str))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

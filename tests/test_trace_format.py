"""Host tests for the pure parts of `gpuctl trace` (no BPF, no root)."""

from __future__ import annotations

import builtins
import datetime
import json
import pathlib
import re
import sys

import pytest
from click.testing import CliRunner

from gpuslice import abi
from gpuslice.trace import live as trace
from gpuslice.trace import bpf as tracebpf
from gpuslice.trace import fmt as tracefmt

REPO = pathlib.Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- log2 buckets


@pytest.mark.parametrize(
    "value,slot", [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (1023, 10), (1024, 11), (2**63, 64)]
)
def test_log2_slot(value: int, slot: int) -> None:
    assert tracefmt.log2_slot(value) == slot


def test_slot_bounds_contain_their_values() -> None:
    for v in list(range(0, 5000)) + [2**32 - 1, 2**32, 2**40 + 5]:
        low, high = tracefmt.slot_bounds(tracefmt.log2_slot(v))
        assert low <= v <= high


def test_slot_bounds_tile_the_line() -> None:
    prev_high = -1
    for s in range(0, 64):
        low, high = tracefmt.slot_bounds(s)
        assert low == prev_high + 1
        prev_high = high


def test_hist_rows_fill_gaps_and_strip_ends() -> None:
    rows = tracefmt.hist_rows({3: 2, 6: 1, 0: 0})
    assert [r["low"] for r in rows] == [4, 8, 16, 32]
    assert [r["count"] for r in rows] == [2, 0, 0, 1]
    assert tracefmt.hist_rows({}) == []
    assert tracefmt.hist_rows({5: 0}) == []


def test_format_log2_hist_like_bcc() -> None:
    lines = tracefmt.format_log2_hist({2: 4, 3: 2}, "usecs")
    assert lines[0] == "     usecs               : count     distribution"
    assert lines[1] == "         2 -> 3          : 4        |" + "*" * 40 + "|"
    assert lines[2] == "         4 -> 7          : 2        |" + "*" * 20 + " " * 20 + "|"
    assert tracefmt.format_log2_hist({}, "usecs") == []


# ---------------------------------------------------------------- names


def test_call_names_decode_from_abi() -> None:
    assert tracefmt.call_name(abi.NV_ESC_RM_ALLOC, abi.NV01_MEMORY_LOCAL_USER) == "RM_ALLOC NV01_MEMORY_LOCAL_USER"
    assert (
        tracefmt.call_name(abi.NV_ESC_RM_CONTROL, 0x2080110B) == "RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS"
    )
    assert tracefmt.call_name(abi.NV_ESC_RM_FREE, 0) == "RM_FREE"
    assert tracefmt.call_name(abi.NV_ESC_CARD_INFO, 0) == "CARD_INFO"


def test_unknown_names_are_hex() -> None:
    assert tracefmt.call_name(abi.NV_ESC_RM_ALLOC, 0xBEEF) == "RM_ALLOC 0xbeef"
    assert tracefmt.call_name(abi.NV_ESC_RM_CONTROL, 0x12345678) == "RM_CONTROL 0x12345678"
    assert tracefmt.call_name(0x7F, 0) == "0x7f"
    assert tracefmt.call_name(0x7F, 5) == "0x7f 0x5"
    assert tracefmt.status_name(0x51) == "NV_ERR_NO_MEMORY"
    assert tracefmt.status_name(0xABC) == "0xabc"
    assert tracefmt.refusal_name(1) == "QUOTA"
    assert tracefmt.refusal_name(99) == "99"


def test_refusal_names_match_core_h() -> None:
    text = (REPO / "kmod/core/core.h").read_text()
    body = re.search(r"enum gs_refusal\s*\{(.*?)\};", text, re.S)
    assert body is not None
    names = re.findall(r"^\s*GS_REFUSE_(\w+)\s*,", body.group(1), re.M)
    assert names, "no GS_REFUSE_ values parsed"
    assert tracefmt.REFUSAL_NAMES == dict(enumerate(names))


def test_file_kinds_match_core_h() -> None:
    text = (REPO / "kmod/core/core.h").read_text()
    body = re.search(r"enum gs_file_kind\s*\{(.*?)\};", text, re.S)
    assert body is not None
    names = re.findall(r"^\s*GS_FILE_(\w+)\s*,", body.group(1), re.M)
    assert tracefmt.FILE_KINDS == dict(enumerate(names))
    assert tracefmt.FILE_KINDS[tracefmt.FILE_UVM] == "UVM"


def test_uvm_calls_are_named_apart_from_rm_escapes() -> None:
    # UVM_REGISTER_GPU (37) is also an RM escape number (0x25)
    uvm = tracefmt.UVM_KEY_BIT | abi.UVM_REGISTER_GPU
    assert tracefmt.call_name(uvm, 0) == "UVM_REGISTER_GPU"
    assert tracefmt.call_name(abi.UVM_REGISTER_GPU, 0) != "UVM_REGISTER_GPU"
    assert tracefmt.call_name(tracefmt.UVM_KEY_BIT | abi.UVM_INITIALIZE, 0) == "UVM_INITIALIZE"
    assert tracefmt.call_name(tracefmt.UVM_KEY_BIT | 0x77, 0) == "UVM 0x77"
    # every UVM request fits below the bit
    assert all(not v & tracefmt.UVM_KEY_BIT for v in abi.UVM_NAMES)


def test_bpf_programs_mark_uvm_calls() -> None:
    from gpuslice.trace import bpf as tracebpf

    for prog in (tracebpf.ioctl_program(1000, None, None), tracebpf.refusals_program(None, None)):
        assert f"file_kind == {tracefmt.FILE_UVM}" in prog and f"|= {tracefmt.UVM_KEY_BIT}u" in prog


# ---------------------------------------------------------------- aggregation

K_CTL = ("a", abi.NV_ESC_RM_CONTROL, 0x2080110B)
K_MEM = ("a", abi.NV_ESC_RM_ALLOC, 0x40)
K_B = ("b", abi.NV_ESC_RM_FREE, 0)


def _snapshot(n_ctl: int, n_b: int) -> dict[tracefmt.CallKey, tracefmt.CallStats]:
    sums = [(K_CTL, (n_ctl, 0, 0, 7000 * n_ctl, 5000 * n_ctl)), (K_B, (n_b, 0, 0, 100 * n_b, 60 * n_b))]
    hists = [
        (K_CTL, tracefmt.HIST_TOTAL, 3, n_ctl),
        (K_CTL, tracefmt.HIST_OVERHEAD, 2, n_ctl),
        (K_B, tracefmt.HIST_TOTAL, 0, n_b),
        (K_B, tracefmt.HIST_OVERHEAD, 0, n_b),
    ]
    return tracefmt.build_stats(sums, hists)


def test_build_stats_groups_by_instance_and_call() -> None:
    st = _snapshot(3, 2)
    assert set(st) == {K_CTL, K_B}
    assert st[K_CTL].count == 3
    assert st[K_CTL].overhead_ns == 6000
    assert st[K_CTL].hist == {3: 3}
    assert st[K_CTL].overhead_hist == {2: 3}


def test_diff_stats_is_the_interval_and_drops_idle_calls() -> None:
    d = tracefmt.diff(_snapshot(5, 2), _snapshot(3, 2))
    assert set(d) == {K_CTL}
    assert d[K_CTL].count == 2
    assert d[K_CTL].total_ns == 14000
    assert d[K_CTL].drv_ns == 10000
    assert d[K_CTL].hist == {3: 2}
    new = tracefmt.diff(_snapshot(1, 1), {})
    assert set(new) == {K_CTL, K_B}


def test_filter_stats_by_instance() -> None:
    st = _snapshot(1, 1)
    assert set(tracefmt.filter_stats(st, "b")) == {K_B}
    assert set(tracefmt.filter_stats(st, None)) == {K_CTL, K_B}
    assert tracefmt.filter_stats(st, "zz") == {}


def test_ioctl_record_json_shape() -> None:
    rec = tracefmt.ioctl_record("interval", _snapshot(4, 1), "us", 2.0, "T")
    rec = json.loads(json.dumps(rec))
    assert rec["type"] == "interval" and rec["mode"] == "ioctl" and rec["unit"] == "us"
    by = {(c["instance"], c["call"]): c for c in rec["calls"]}
    c = by[("a", "RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS")]
    assert c["count"] == 4
    assert c["escape"] == 0x2A and c["escape_name"] == "RM_CONTROL"
    assert c["what"] == 0x2080110B and c["what_name"] == "NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS"
    assert c["avg_total_ns"] == 7000 and c["avg_drv_ns"] == 5000 and c["avg_overhead_ns"] == 2000
    assert c["hist"] == [{"low": 4, "high": 7, "count": 4}]
    assert c["overhead_hist"] == [{"low": 2, "high": 3, "count": 4}]
    assert by[("b", "RM_FREE")]["what_name"] is None


def test_format_ioctl_table_shows_split() -> None:
    lines = tracefmt.format_ioctl("interval", _snapshot(4, 1), "us", "T")
    text = "\n".join(lines)
    assert "instance = a  call = RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS" in text
    row = next(ln for ln in lines if ln.startswith("a ") and "FIFO_DISABLE" in ln)
    assert row.split()[-4:] == ["7.0", "5.0", "2.0", "28.6"]
    assert tracefmt.format_ioctl("totals", {}, "us", "T")[-1] == "no gpuslice ioctls"


def test_sched_aggregation_and_record() -> None:
    key = (42, "gpuctl")
    cur = tracefmt.build_sched([(key, (5, 1, 5_000_000, 0))], [(key, 10, 5)])
    prev = tracefmt.build_sched([(key, (2, 0, 2_000_000, 0))], [(key, 10, 2)])
    d = tracefmt.diff(cur, prev)
    assert d[key].count == 3 and d[key].errors == 1 and d[key].hist == {10: 3}
    rec = tracefmt.sched_record("interval", d, "us", 1.0, "T")
    assert rec["procs"][0]["pid"] == 42 and rec["procs"][0]["avg_ns"] == 1_000_000
    assert rec["procs"][0]["hist"] == [{"low": 512, "high": 1023, "count": 3}]
    assert "pid = 42  comm = gpuctl" in "\n".join(tracefmt.format_sched("interval", d, "us", "T"))


def test_refusal_record_and_line() -> None:
    r = tracefmt.Refusal(10**9, 3, "web", 77, abi.NV_ESC_RM_ALLOC, 0x40, 1, 0x51, 1 << 30)
    when = tracefmt.mono_to_wall(10**9, wall_now=1000.0, mono_now=3.0)
    assert when == datetime.datetime.fromtimestamp(998.0, datetime.timezone.utc)
    rec = tracefmt.refusal_record(r, when)
    assert rec["reason"] == "QUOTA" and rec["status_name"] == "NV_ERR_NO_MEMORY"
    assert rec["call"] == "RM_ALLOC NV01_MEMORY_LOCAL_USER" and rec["size"] == 1 << 30
    line = tracefmt.format_refusal(json.loads(json.dumps(rec)))
    assert line.split() == ["00:16:38.000000", "web", "77", "RM_ALLOC", "NV01_MEMORY_LOCAL_USER", "QUOTA",
                            "NV_ERR_NO_MEMORY", str(1 << 30)]
    tot = tracefmt.refusal_totals([rec, rec, dict(rec, instance="x")])
    assert tot == [{"instance": "web", "reason": "QUOTA", "count": 2}, {"instance": "x", "reason": "QUOTA", "count": 1}]


# ---------------------------------------------------------------- BPF text


def test_inst_filter_compares_every_byte_and_the_nul() -> None:
    c = tracebpf.inst_filter_c("ab", "k.inst")
    assert c == "if (k.inst[0] != 97 || k.inst[1] != 98 || k.inst[2] != 0) return 0;"
    assert tracebpf.inst_filter_c(None, "k.inst") == ""
    with pytest.raises(ValueError):
        tracebpf.inst_filter_c('a"; bad', "k.inst")
    with pytest.raises(ValueError):
        tracebpf.inst_filter_c("x" * 32, "k.inst")


def test_programs_embed_filters_and_constants() -> None:
    p = tracebpf.ioctl_program(1000, "ab", 7)
    assert "args->pid != 7" in p and "k.inst[2] != 0" in p and "/ 1000" in p
    assert "args->pid" not in tracebpf.ioctl_program(1, None, None).split("TRACEPOINT_PROBE")[1].split("TP_DATA")[0]
    s = tracebpf.sched_program(1, 9)
    assert f"{0xC020462A}u" in s and f"{0x2080110B}u" in s and "args->arg + 8" in s
    assert "(u32)(id >> 32) != 9" in s
    assert "ev.inst[1] != 0" in tracebpf.refusals_program("a", None)


# ---------------------------------------------------------------- CLI errors


def test_missing_bcc_one_line_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *a: object, **kw: object) -> object:
        if name == "bcc" or name.startswith("bcc."):
            raise ImportError("No module named 'bcc'")
        return real_import(name, *a, **kw)

    monkeypatch.delitem(sys.modules, "bcc", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    res = CliRunner().invoke(trace.trace, [])
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [f"gpuctl trace: {trace.BCC_HINT}"]
    assert "apt-get install python3-bpfcc" in res.stderr
    assert res.stdout == ""


def test_not_root_one_line_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "load_bcc", lambda: object())
    monkeypatch.setattr(trace.os, "geteuid", lambda: 1000)
    res = CliRunner().invoke(trace.trace, ["--refusals"])
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [f"gpuctl trace: {trace.ROOT_HINT}"]


def test_missing_module_one_line_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    (tmp_path / "events" / "syscalls").mkdir(parents=True)
    monkeypatch.setattr(trace, "TRACEFS_ROOTS", (str(tmp_path),))
    monkeypatch.setattr(trace, "load_bcc", lambda: object())
    monkeypatch.setattr(trace.os, "geteuid", lambda: 0)
    for args in ([], ["--refusals"]):
        res = CliRunner().invoke(trace.trace, args)
        assert res.exit_code == 1
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "is gpuslice.ko loaded" in lines[0], lines


def test_check_events_tracefs(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    (tmp_path / "events" / "gpuslice" / "gpuslice_ioctl").mkdir(parents=True)
    trace.check_events(["gpuslice/gpuslice_ioctl"], (str(tmp_path),))
    with pytest.raises(trace.TraceError, match="tracefs not mounted"):
        trace.check_events(["gpuslice/gpuslice_ioctl"], (str(tmp_path / "nope"),))


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--refusals", "--scheduler"], "exclusive"),
        (["--scheduler", "--instance", "a"], "does not apply"),
        (["--instance", "bad name"], "bad instance name"),
        (["--instance", ".."], "bad instance name"),
    ],
)
def test_bad_option_combinations(args: list[str], msg: str) -> None:
    res = CliRunner().invoke(trace.trace, args)
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0]


# ---------------------------------------------------------------- the command, on a fake bcc


class _Rows:
    """A bcc table stand-in: items() gives (key, value) objects with the fields by name."""

    def __init__(self, rows: list[tuple[object, object]]) -> None:
        self.rows = rows

    def items(self) -> list[tuple[object, object]]:
        return list(self.rows)


class _Obj:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


class _FakeBPF:
    texts: list[str] = []

    def __init__(self, text: str) -> None:
        _FakeBPF.texts.append(text)
        key = _Obj(inst=b"web", escape=abi.NV_ESC_RM_CONTROL, what=abi.NV2080_CTRL_CMD_FB_GET_INFO_V2)
        self.tables = {
            "sums": _Rows([(key, _Obj(count=3, refused=0, errors=0, total_ns=3000, drv_ns=2400))]),
            "hists": _Rows([(_Obj(k=key, kind=0, slot=1), _Obj(value=3)),
                            (_Obj(k=key, kind=1, slot=0), _Obj(value=3))]),
        }

    def __getitem__(self, name: str) -> _Rows:
        return self.tables[name]


def _fake_env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    (tmp_path / "events" / "gpuslice" / "gpuslice_ioctl").mkdir(parents=True)
    monkeypatch.setattr(trace, "TRACEFS_ROOTS", (str(tmp_path),))
    monkeypatch.setattr(trace, "load_bcc", lambda: _Obj(BPF=_FakeBPF))
    monkeypatch.setattr(trace.os, "geteuid", lambda: 0)
    monkeypatch.setattr(trace, "_install_signals", lambda: None)
    _FakeBPF.texts = []


def test_intervals_are_differences_of_snapshots(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _fake_env(monkeypatch, tmp_path)
    res = CliRunner().invoke(trace.trace, ["-c", "2", "-i", "0.01", "--json", "--instance", "web"])
    assert res.exit_code == 0, res.output
    assert "Hit Ctrl-C to end." in res.stderr
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [r["type"] for r in recs] == ["interval", "interval"]
    (c,) = recs[0]["calls"]
    assert (c["instance"], c["call"], c["count"]) == ("web", "RM_CONTROL NV2080_CTRL_CMD_FB_GET_INFO_V2", 3)
    assert (c["avg_drv_ns"], c["avg_overhead_ns"]) == (800, 200)
    assert c["hist"] == [{"low": 1, "high": 1, "count": 3}]
    assert recs[1]["calls"] == []  # nothing new in the second interval
    assert "k.inst[3] != 0" in _FakeBPF.texts[0]  # --instance went into the BPF program


def test_ctrl_c_prints_totals_and_exits_0(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _fake_env(monkeypatch, tmp_path)

    def interrupted_sleep(_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(trace.time, "sleep", interrupted_sleep)
    res = CliRunner().invoke(trace.trace, [])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].endswith(" totals")
    assert "RM_CONTROL NV2080_CTRL_CMD_FB_GET_INFO_V2" in res.stdout
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("web "))
    assert row.split()[-4:] == ["1.0", "0.8", "0.2", "20.0"]


def test_preemption_rows_are_interval_differences() -> None:
    prev = {"gpus": {"0": {"preemptions": 5, "resumes": 4}, "1": {"preemptions": 2, "resumes": 2}}}
    cur = {"gpus": {"1": {"preemptions": 1, "resumes": 0},  # restarted daemon: its counters anew
                    "0": {"preemptions": 8, "resumes": 7,
                          "preempt_latency_ns": {"n": 8, "p50": 1_200_000, "p99": 3_000_000, "max": 3_100_000}}}}
    rows = tracefmt.preemption_rows(prev, cur)
    assert [(r["gpu"], r["preemptions"], r["resumes"]) for r in rows] == [(0, 3, 3), (1, 1, 0)]
    assert tracefmt.preemption_rows(None, cur)[0]["preemptions"] == 8
    assert tracefmt.preemption_rows(prev, None) == []
    lines = tracefmt.format_preemptions(rows, "ms")
    assert lines[0] == "gpu 0: 3 preemptions, 3 give-backs; recent preemption latency (8) p50 1.2, p99 3.0, max 3.1 ms"
    assert lines[1] == "gpu 1: 1 preemptions, 0 give-backs"


class _Maxes(_Rows):
    def __delitem__(self, key: object) -> None:
        self.rows = [(k, v) for k, v in self.rows if k is not key]


class _FakeSchedBPF:
    def __init__(self, text: str) -> None:
        key = _Obj(tgid=42, comm=b"gpuctl")
        self.tables = {"sums": _Rows([(key, _Obj(count=2, errors=0, total_ns=2_000_000))]),
                       "hists": _Rows([(_Obj(k=key, slot=10), _Obj(value=2))]),
                       "maxes": _Maxes([(key, _Obj(value=1_500_000))])}

    def __getitem__(self, name: str) -> _Rows:
        return self.tables[name]


def test_scheduler_mode_adds_the_daemons_preemptions(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _fake_env(monkeypatch, tmp_path)
    monkeypatch.setattr(trace, "load_bcc", lambda: _Obj(BPF=_FakeSchedBPF))
    monkeypatch.setattr(trace, "check_events", lambda events, roots=None: None)
    status = tmp_path / "status.json"
    seq = iter([3, 10, 12, 3, 5])  # at start, then one read per snapshot

    def read_status(path: str) -> dict:
        assert path == str(status)
        n = next(seq)
        return {"gpus": {"0": {"preemptions": n, "resumes": n - 1, "preempt_latency_ns": {"n": n, "p50": 1000}}}}

    monkeypatch.setattr(trace, "read_status", read_status)
    res = CliRunner().invoke(trace.trace, ["--scheduler", "-c", "2", "-i", "0.01", "--json",
                                           "--status-file", str(status)])
    assert res.exit_code == 0, res.output
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [r["preemptions"][0]["preemptions"] for r in recs[:2]] == [7, 2]
    res = CliRunner().invoke(trace.trace, ["--scheduler", "-c", "1", "-i", "0.01", "--status-file", str(status)])
    assert res.exit_code == 0, res.output
    assert "gpu 0: 2 preemptions, 2 give-backs; recent preemption latency (5) p50 1.0 us" in res.stdout


def test_engine_rows_from_the_daemon_status() -> None:
    st = {"gpus": {"0": {"instances": {"b": {"engines": {"GR0": 2, "NVDEC1": 1}}, "a": {"engines": {}}}},
                   "1": {"instances": {"c": {"engines": {"NVJPG0": 4}}}}}}
    rows = tracefmt.engine_rows(st)
    assert rows == [{"gpu": "0", "instance": "b", "engines": {"GR0": 2, "NVDEC1": 1}},
                    {"gpu": "1", "instance": "c", "engines": {"NVJPG0": 4}}]
    lines = tracefmt.format_engines(rows)
    assert lines[1].split() == ["GPU", "INSTANCE", "CHANNELS", "BY", "ENGINE"]
    assert lines[2].split() == ["0", "b", "GR0:2", "NVDEC1:1"]
    assert tracefmt.engine_rows(None) == [] and tracefmt.format_engines([]) == []

"""tests/gpu/compat.py's pure parts on the host (no GPU): comparing results, reading the
library's refusal lines, and each row's verdict."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent / "gpu" / "compat.py"


def _load():
    before = list(sys.path)
    spec = importlib.util.spec_from_file_location("gpuslice_compat_runner", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    assert sys.path == before, "importing the runner changed sys.path"
    return mod


cr = _load()

# preload/libgpuslice.so with GPUSLICE_DEBUG=1 over the mock driver (tests/core/mockrm.c,
# preload_client.c): refusal lines, object events, the stats line, and a refusal line of a
# process whose stderr was interleaved with another's.
SAMPLE = """\
gpuslice: pid 2944 instance box1 limit 1073741824
gpuslice: {"event":1,"name":"box1","pid":2944,"client":3238756353,"handle":1543503873,"parent":0,"class":0,"engine":0,"gpu":255,"obj_kind":1,"size":0,"status":0,"cmd":0}
gpuslice: refused quota (box1) escape 0x2b RM_ALLOC what 0x40 NV01_MEMORY_LOCAL_USER status 0x51 errno 0
gpuslice: {"event":7,"name":"box1","pid":2944,"client":3238756353,"handle":1543507972,"parent":1543503873,"class":64,"engine":0,"gpu":0,"obj_kind":3,"size":1,"status":81,"cmd":43}
gpuslice: refused quota (box1) escape 0x2b RM_ALLOC what 0x40 NV01_MEMORY_LOCAL_USER status 0x51 errno 0
gpuslice: refused foreign (box1) escape 0x2a RM_CONTROL what 0x2080110b NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS status 0x1b errno 0
gpuslice: refused global (box1) escape 0x2a RM_CONTROL what 0x20800130 NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES status 0x1b errno 0
gpuslice: refused malformed (box1) escape 0x2b RM_ALLOC what 0x0  status 0x0 errno 22
gpuslice: refused escape (box1) escape 0xd3 IOCTL_XFER_CMD what 0x0  status 0x0 errno 1
gpuslice: refused unlisted (my box) escape 0x2a RM_CONTROL what 0x20801799  status 0x1b errno 0
gpuslice: refused class (box1) escape 0x4f ? what 0x0  status 0x1b errno 0
[rank1]: some warning gpuslice: refused limit (box1) escape 0x2b RM_ALLOC what 0xc86f  status 0x1b errno 0
gpuslice: stats {"name":"box1","pid":2944,"limit":1073741824,"used":0,"peak":1073741824,"ioctls":2182,"refused_quota":401,"refused_filter":5,"objects":3,"lock_acquired":3961,"lock_contended":476,"lock_hold_max_ns":105061,"lock_wait_max_ns":1733331}
"""


# ---- comparing results ----

def test_compare_exact_and_within_tolerance():
    assert cr.compare(1.0, 1.0, 0) is None
    assert cr.compare(1.0, 1.0 + 1e-9, 0) is not None  # tol 0: exact
    assert cr.compare(100.0, 100.005, 1e-4) is None  # relative 5e-5
    assert cr.compare(100.0, 100.02, 1e-4) is not None  # relative 2e-4
    assert cr.compare(-3.0, -3.0000001, 1e-6) is None
    assert cr.compare(1e-20, -1e-20, 1e-3) is not None  # relative, no absolute floor
    assert cr.compare(float("nan"), float("nan"), 0) is None
    assert cr.compare(float("inf"), float("inf"), 1e-4) is None
    assert cr.compare(float("inf"), 1e308, 1e-4) is not None
    assert cr.compare(float("nan"), 1.0, 1.0) is not None


def test_compare_ints_are_exact_whatever_the_tolerance():
    assert cr.compare(7, 7, 0.5) is None
    assert cr.compare(1000, 1001, 0.5) == "result: 1000 != 1001"
    assert cr.compare(2, 2.0, 0) is None  # an int against a float compares as floats
    assert cr.compare(True, 1, 0.5) is not None  # a bool is not a number here
    assert cr.compare(True, True, 0) is None


def test_compare_nested_lists_and_dicts():
    a = [[1, 2, 3], [4.0, [5.0, 6.0]], {"x": 1.0, "ids": [9, 9]}]
    assert cr.compare(a, [[1, 2, 3], [4.00001, [5.0, 6.0]], {"x": 1.0, "ids": [9, 9]}], 1e-4) is None
    d = cr.compare(a, [[1, 2, 3], [4.0, [5.0, 6.1]], {"x": 1.0, "ids": [9, 9]}], 1e-4)
    assert d.startswith("result[1][1][1]: 6.0 vs 6.1")
    assert cr.compare(a, [[1, 2, 4], [4.0, [5.0, 6.0]], {"x": 1.0, "ids": [9, 9]}], 1.0) == "result[0][2]: 3 != 4"
    assert cr.compare([1, 2], [1, 2, 3], 0) == "result: length 2 != 3"
    assert "keys" in cr.compare({"a": 1}, {"b": 1}, 0)
    assert cr.compare([[1, 2]], [[1, 2]], 0) is None  # token ids, tol 0
    assert cr.compare(None, None, 0) is None
    assert cr.compare(None, [1], 0) is not None
    assert cr.compare("a", "b", 1.0) is not None


def test_tolerance_from_the_workload():
    assert cr.tolerance({"tol": 1e-4}) == 1e-4
    assert cr.tolerance({"tol": 0}) == 0.0
    assert cr.tolerance({}) == 0.0 and cr.tolerance(None) == 0.0
    assert cr.tolerance({"tol": -1}) == 0.0 and cr.tolerance({"tol": "x"}) == 0.0 and cr.tolerance({"tol": True}) == 0.0


# ---- the library's debug output ----

def test_parse_refusals_from_debug_output():
    rs = cr.parse_refusals(SAMPLE)
    assert len(rs) == 9  # not the stats line ("refused_quota") nor event lines
    q = rs[0]
    assert (q.kind, q.instance, q.escape, q.escape_name, q.what, q.what_name, q.status, q.errno) == (
        "quota", "box1", 0x2B, "RM_ALLOC", 0x40, "NV01_MEMORY_LOCAL_USER", 0x51, 0)
    assert q.cls == 0x40 and q.cmd is None and q.call == "RM_ALLOC NV01_MEMORY_LOCAL_USER"
    f = rs[2]
    assert f.kind == "foreign" and f.cmd == 0x2080110B and f.cls is None
    assert f.call == "RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS" and f.status == 0x1B
    m = rs[4]  # no class name: two spaces before "status"
    assert (m.kind, m.what, m.what_name, m.errno, m.call) == ("malformed", 0, "", 22, "RM_ALLOC")
    assert rs[5].call == "IOCTL_XFER_CMD" and rs[5].escape == 0xD3
    u = rs[6]
    assert u.instance == "my box" and u.call == "RM_CONTROL 0x20801799" and u.cmd == 0x20801799
    assert rs[7].call == "0x4f" and rs[7].kind == "class"  # escape the library could not name
    assert rs[8].kind == "limit" and rs[8].call == "RM_ALLOC 0xc86f" and rs[8].cls == 0xC86F
    assert cr.parse_refusals("nothing here\ngpuslice: stats {\"refused_filter\":0}\n") == []


def test_the_cores_own_answers_are_not_refusals():
    """SYS_PARAMS and CUDA's TSG timeslice are answered by the core (status 0), logged as
    'refused none' (seen on the H100): not counted."""
    text = ("gpuslice: refused none (x) escape 0xd6 SYS_PARAMS what 0x0  status 0x0 errno 0\n"
            "gpuslice: refused none (x) escape 0x2a RM_CONTROL what 0xa06c0103 NVA06C_CTRL_CMD_SET_TIMESLICE"
            " status 0x0 errno 0\n"
            "gpuslice: refused class (x) escape 0x2b RM_ALLOC what 0xf8 NV_MEMORY_FABRIC status 0x1b errno 0\n")
    rs = cr.parse_refusals(text)
    assert [(r.kind, r.call) for r in rs] == [("class", "RM_ALLOC NV_MEMORY_FABRIC")]


def test_a_refusal_line_that_does_not_parse_still_counts():
    rs = cr.parse_refusals("gpuslice: refused quota (box1) escape garbled\n")
    assert len(rs) == 1 and rs[0].kind == cr.UNPARSED
    assert cr.unexpected_refusals(rs, {}, allow_quota=True) == rs


def test_refusal_counts_and_summary():
    rs = cr.parse_refusals(SAMPLE)
    c = cr.refusal_counts(rs)
    assert next(iter(c.items())) == ("RM_ALLOC NV01_MEMORY_LOCAL_USER (quota)", 2)
    assert sum(c.values()) == len(rs)
    assert cr.refusal_summary([]) == "0"
    assert cr.refusal_summary(rs).startswith("9 in 8 call(s): RM_ALLOC NV01_MEMORY_LOCAL_USER (quota) x2")


def test_expected_and_quota_refusals():
    rs = cr.parse_refusals(SAMPLE)
    assert len(cr.unexpected_refusals(rs, {})) == 9
    assert len(cr.unexpected_refusals(rs, {}, allow_quota=True)) == 7
    expected = {"RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS": "why", "IOCTL_XFER_CMD": "whole escape"}
    left = cr.unexpected_refusals(rs, expected, allow_quota=True)
    assert [r.call for r in left] == ["RM_CONTROL NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES", "RM_ALLOC",
                                      "RM_CONTROL 0x20801799", "0x4f", "RM_ALLOC 0xc86f"]


def test_unreported_refusals_from_stats():
    rs = cr.parse_refusals(SAMPLE)[:2]  # two quota lines
    stats = [{"refused_quota": 2, "refused_filter": 0}, {"refused_quota": 0, "refused_filter": 1}]
    assert cr.unreported_refusals(rs, stats) == 1  # a child process's filter refusal: no line
    assert cr.unreported_refusals(rs, stats, allow_quota=True) == 1
    assert cr.unreported_refusals(rs, stats[:1]) == 0
    assert cr.unreported_refusals([], [{"refused_quota": 3, "refused_filter": 0}], allow_quota=True) == 0


def test_parse_stats_and_last_json():
    assert cr.parse_stats('{"refused_quota":1}\nnot json\n{"refused_quota":2}\n') == [
        {"refused_quota": 1}, {"refused_quota": 2}]
    assert cr.parse_last_json('jax.devices(): [cuda(id=0)]\n{"ok": true, "result": [1]}\n') == {
        "ok": True, "result": [1]}
    assert cr.parse_last_json('{"ok": false}\n{"ok": true}\nNCCL INFO bye\n') == {"ok": True}
    assert cr.parse_last_json("Traceback\n{broken\n") is None
    assert cr.is_event_line(SAMPLE.splitlines()[1]) and not cr.is_event_line(SAMPLE.splitlines()[2])


# ---- verdicts ----

W = cr.Workload("torch_eager", oom=True)
DDP = cr.Workload("ddp_nccl", gpus=2)


def run(mode="native", rc=0, refusals=None, stats=None, timed_out=False, **out):
    body = {"ok": True, "result": [1.0, 2.0], "tol": 1e-4, "oom": None} | out
    return cr.Run(mode, ["python3", "x.py"], {}, rc, 1.0, body, refusals or [], stats or [], timed_out)


def refused(line):
    return cr.parse_refusals(line)


OOM_OK = {"raised": True, "type": "OutOfMemoryError", "chunks": 3, "after_ok": True}
QUOTA = "gpuslice: refused quota (c) escape 0x2b RM_ALLOC what 0x40 NV01_MEMORY_LOCAL_USER status 0x51 errno 0"
FOREIGN = ("gpuslice: refused foreign (c) escape 0x2a RM_CONTROL what 0x2080110b "
           "NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS status 0x1b errno 0")


def test_verdict_pass_and_exit_code():
    v = cr.decide(W, run(), run("gpuslice", result=[1.0, 2.00001]), run("oom", oom=OOM_OK, refusals=refused(QUOTA)),
                  expected={})
    assert (v.status, v.counted, v.match, v.reasons) == ("pass", True, True, [])
    assert any(n.startswith("oom: OutOfMemoryError after 3") for n in v.notes)
    row = cr.Row(W, v)
    assert cr.exit_code([row]) == 0
    assert cr.exit_code([row, cr.Row(W, cr.Verdict("fail", True))]) == 1


def test_verdict_result_mismatch_and_gpuslice_failure():
    v = cr.decide(W, run(), run("gpuslice", result=[1.0, 2.1]), None, expected={})
    assert v.status == "fail" and v.match is False and "result differs" in v.reasons[0]
    v = cr.decide(W, run(), run("gpuslice", rc=1, ok=False, error="RuntimeError: CUDA error\nmore"), None, expected={})
    assert v.status == "fail" and v.reasons[0] == "gpuslice run: rc 1, ok=False: RuntimeError: CUDA error"
    lib = cr.Run("gpuslice", [], {}, 124, 300.0, None, timed_out=True)
    v = cr.decide(W, run(), lib, None, expected={})
    assert v.status == "fail" and "timed out" in v.reasons[0] and v.match is False
    assert cr.decide(W, run(), None, None).status == "fail"


def test_verdict_refusals():
    lib = run("gpuslice", refusals=refused(FOREIGN))
    v = cr.decide(W, run(), lib, None, expected={})
    assert v.status == "fail" and "unexpected refusal(s) RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS" in v.reasons[0]
    ok = cr.decide(W, run(), lib, None, expected={"RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS": "reason"})
    assert ok.status == "pass"
    # quota refusals are no part of a normal run; the stats may hold refusals stderr lacks
    assert cr.decide(W, run(), run("gpuslice", refusals=refused(QUOTA)), None, expected={}).status == "fail"
    v = cr.decide(W, run(), run("gpuslice", stats=[{"refused_quota": 0, "refused_filter": 2}]), None, expected={})
    assert v.status == "fail" and "2 refusal(s) in GPUSLICE_STATS" in v.reasons[0]


def test_verdict_oom_run():
    native, lib = run(), run("gpuslice")
    bad = [
        (run("oom", oom=OOM_OK | {"raised": False, "type": "RuntimeError"}), "was not raised"),
        (run("oom", oom=OOM_OK | {"after_ok": False, "after_error": "x"}), "did not work after"),
        (run("oom", oom=None), "no oom figures"),
        (run("oom", oom=OOM_OK, result=[1.0, 3.0]), "oom run: result differs"),
        (run("oom", oom=OOM_OK, refusals=refused(QUOTA + "\n" + FOREIGN)), "oom run: unexpected refusal"),
        (run("oom", rc=1, ok=False, oom=OOM_OK), "oom run: rc 1"),
    ]
    for oom, why in bad:
        v = cr.decide(W, native, lib, oom, expected={})
        assert v.status == "fail" and any(why in r for r in v.reasons), (why, v.reasons)


def test_verdict_native_failed_and_skipped_do_not_count():
    nf = cr.decide(W, run(rc=1, ok=False, error="ModuleNotFoundError: No module named 'cupy'"), None, None)
    assert (nf.status, nf.counted) == ("native failed", False) and "cupy" in nf.notes[0]
    nojson = cr.Run("native", [], {}, 1, 0.5, None)
    assert cr.decide(W, nojson, None, None).status == "native failed"
    sk = cr.decide(DDP, run(ok=False, skip="needs 2 GPUs", result=None), None, None)
    assert (sk.status, sk.counted, sk.notes) == ("skipped", False, ["needs 2 GPUs"])
    sk = cr.decide(DDP, None, None, None, skipped="needs 2 GPUs (--gpus 1)")
    assert sk.status == "skipped" and not sk.counted
    rows = [cr.Row(W, nf), cr.Row(DDP, sk), cr.Row(W, cr.Verdict("pass", True))]
    assert cr.exit_code(rows) == 0


def test_verdict_busbw_ratio():
    bw = {"64MiB": 100.0, "256MiB": 200.0, "1GiB": 300.0}
    native = run(busbw_gbs=bw)
    good = cr.decide(DDP, native, run("gpuslice", busbw_gbs={"64MiB": 99.0, "256MiB": 200.0, "1GiB": 310.0}),
                     None, expected={})
    assert good.status == "pass" and "busbw ratio 64MiB 0.99 256MiB 1.0 1GiB 1.0333" in good.notes
    slow = cr.decide(DDP, native, run("gpuslice", busbw_gbs={"64MiB": 97.9, "256MiB": 200.0}), None, expected={})
    assert slow.status == "fail"
    assert any("64MiB: ratio 0.979" in r for r in slow.reasons) and any("1GiB: ratio None" in r for r in slow.reasons)
    assert cr.busbw_ratios({"busbw_gbs": {"a": 0}}, {"busbw_gbs": {"a": 5}}) == {"a": None}
    assert cr.busbw_ratios({}, {}) == {}


def test_table_and_selection():
    v = cr.decide(W, run(), run("gpuslice", refusals=refused(FOREIGN)), None, expected={})
    rows = [cr.Row(W, v, run(), run("gpuslice", refusals=refused(FOREIGN))),
            cr.Row(DDP, cr.decide(DDP, None, None, None, skipped="needs 2 GPUs (--gpus 1)"))]
    t = cr.format_table(rows).splitlines()
    assert t[0].startswith("workload") and "refusals" in t[0] and len(t) == 4
    assert "torch_eager" in t[2] and "| FAIL" in t[2] and "1 in 1 call(s)" in t[2]
    assert "ddp_nccl" in t[3] and "SKIPPED" in t[3]
    js = rows[0].as_json()
    assert js["gpuslice"]["refusal_count"] == 1 and js["gpuslice"]["refusals"][0]["cmd"] == 0x2080110B
    assert [w.name for w in cr.select("nvml,ddp_nccl")] == ["nvml", "ddp_nccl"]
    assert len(cr.select(None)) == len(cr.WORKLOADS)
    with pytest.raises(SystemExit):
        cr.select("nope")


def test_every_workload_has_its_script():
    for w in cr.WORKLOADS:
        assert w.script.is_file(), w.script
        text = w.script.read_text()
        assert ("--oom" in text or "want_oom" in text) == w.oom, w.name
        assert "C.main(work)" in text

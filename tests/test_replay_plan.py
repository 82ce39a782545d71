"""Host tests of the replayer's pure parts: the implemented-list parser, block
rewriting, outcome comparison and the plan over the real traces (--dry-run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice import abi
from gpuslice.trace import replay as rp
from gpuslice.trace import records as t

TRACES = Path(__file__).resolve().parent / "traces"

IMPL_TEXT = """esc 0x2b
esc 0x2a
esc 0x29
esc 0xc8
class 0x41
class 0x80
ctrl 0x20801303
uvm 0x30000001
"""


def test_implemented_parse() -> None:
    impl = rp.Implemented.parse(IMPL_TEXT)
    assert impl.escapes == {0x2B, 0x2A, 0x29, 0xC8}
    assert impl.classes == {0x41, 0x80}
    assert impl.controls == {0x20801303}
    assert impl.uvm == {0x30000001}
    with pytest.raises(ValueError):
        rp.Implemented.parse("bogus 0x1\n")


def alloc_call(index: int, h_root: int, h_parent: int, h_new: int, cls: int, status: int = 0) -> t.TraceCall:
    a_in = abi.NVOS64.pack(h_root, h_parent, h_new, cls, 0, 0, 0, 0, 0)
    a_out = abi.NVOS64.pack(h_root, h_parent, h_new, cls, 0, 0, 0, 0, status)
    return t.TraceCall(index, 1, 8, "/dev/nvidiactl", abi.IOCTL_RM_ALLOC, 0, 1.0, a_in, a_out, None, None)


def control_call(index: int, h_client: int, h_obj: int, cmd: int) -> t.TraceCall:
    blk = abi.NVOS54.pack(h_client, h_obj, cmd, 0, 0, 0, 0)
    return t.TraceCall(index, 1, 8, "/dev/nvidiactl", abi.IOCTL_RM_CONTROL, 0, 1.0, blk, blk, None, None)


def test_missing_labels() -> None:
    impl = rp.Implemented.parse(IMPL_TEXT)
    # every root class counts as 0x41, as RM allocates it
    assert impl.missing(alloc_call(0, 0, 0, 0, abi.NV01_ROOT)) is None
    assert impl.missing(alloc_call(0, 1, 1, 2, abi.NV01_DEVICE_0)) is None
    assert impl.missing(alloc_call(0, 1, 1, 2, abi.KEPLER_CHANNEL_GROUP_A)) == "class 0xa06c"
    assert impl.missing(control_call(0, 1, 2, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2)) is None
    assert impl.missing(control_call(0, 1, 2, abi.NVA06C_CTRL_CMD_SET_TIMESLICE)) == "ctrl 0xa06c0103"
    uvm = t.TraceCall(0, 1, 9, "/dev/nvidia-uvm", 0x4B, 0, 1.0, None, None, None, None)
    assert impl.missing(uvm) == "uvm 0x4b"


def test_plan_marks_dependents_of_unimplemented_objects() -> None:
    impl = rp.Implemented.parse(IMPL_TEXT)
    calls = [
        alloc_call(0, 0, 0, 0, abi.NV01_ROOT_CLIENT),
        alloc_call(1, 0xC1, 0xC1, 0x10, abi.NV01_DEVICE_0),
        alloc_call(2, 0xC1, 0x10, 0x20, abi.KEPLER_CHANNEL_GROUP_A),  # unimplemented
        alloc_call(3, 0xC1, 0x20, 0x30, abi.NV01_DEVICE_0),  # child of it: dependent
        control_call(4, 0xC1, 0x30, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2),  # grandchild: dependent
        control_call(5, 0xC1, 0x10, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2),  # fine
        t.TraceCall(6, 1, 9, "/dev/nvidia-uvm", 0x4B, 0, 1.0, None, None, None, None),
    ]
    cats = [s.category for s in rp.plan(calls, impl)]
    assert cats == [None, None, "unimplemented", "dependent", "dependent", None, "not_replayable"]
    # without a list, everything but UVM is replayed
    assert [s.category for s in rp.plan(calls, None)] == [None] * 6 + ["not_replayable"]


@given(st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=40),
       st.dictionaries(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), max_size=5))
def test_remap_words(words: list[int], mapping: dict[int, int]) -> None:
    block = b"".join(w.to_bytes(4, "little") for w in words) + b"\x01\x02"  # odd tail untouched
    out = rp.remap_words(block, mapping)
    assert len(out) == len(block) and out[-2:] == b"\x01\x02"
    got = [int.from_bytes(out[i:i + 4], "little") for i in range(0, len(words) * 4, 4)]
    assert got == [mapping.get(w, w) for w in words]


def test_field_writers() -> None:
    blk = bytes(16)
    assert rp.get_u64(rp.put_u64(blk, 8, 0x1122334455667788), 8) == 0x1122334455667788
    assert rp.get_i32(rp.put_i32(blk, 4, -1), 4) == -1
    assert len(rp.put_i32(blk, 12, 7)) == 16


def test_outcome_reads_status_and_replies() -> None:
    blk = bytearray(abi.NVOS64.size)
    blk[40:44] = abi.NV_ERR_NO_MEMORY.to_bytes(4, "little")
    assert rp.outcome(abi.NV_ESC_RM_ALLOC, 0, bytes(blk)) == (True, 0x51, None)
    assert rp.outcome(abi.NV_ESC_RM_ALLOC, -22, bytes(blk)) == (False, None, None)
    ver = abi.RM_API_VERSION.pack(0, 1, b"580.159.04")
    assert rp.outcome(abi.NV_ESC_CHECK_VERSION_STR, 0, ver) == (True, None, 1)
    assert rp.outcome(abi.NV_ESC_CARD_INFO, 0, bytes(2304)) == (True, None, None)
    assert "status=0x51" in rp.fmt_outcome((True, 0x51, None))


@pytest.mark.parametrize("name", ["torch-matmul", "cuda-driver-alloc", "nvidia-smi-q"])
def test_dry_run_plans_every_call(name: str) -> None:
    calls = t.read_trace(TRACES / f"{name}.log.gz")
    impl = rp.Implemented.parse("\n".join(
        [f"esc {e:#x}" for e in abi.ESCAPE_NAMES] + ["class 0x41", "class 0x80", "class 0x2080", "class 0x40"]))
    rep = rp.replay(calls, impl, trace_name=name, dry_run=True)
    s = rep.summary()
    assert sum(s.values()) == len(calls)
    assert s["not_replayable"] == sum(1 for c in calls if c.kind == "uvm")
    assert s["match"] == s["mismatch"] == 0 and s["planned"] > 0
    # every control is unimplemented in this list, so none is planned
    planned = {r.name for r in rep.by("planned")}
    assert not any(n.startswith("RM_CONTROL") for n in planned)
    text = rp.format_report(rep)
    assert text.startswith(f"trace {name}:") and "unimplemented:" in text


def test_cli_dry_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    impl = tmp_path / "impl"
    impl.write_text(IMPL_TEXT)
    rc = rp.main([str(TRACES / "nvidia-smi-q.log.gz"), "--dry-run", "--json", "--implemented", str(impl)])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["not_replayable"] == 4
    assert len(doc["results"]) == 188


def test_channellist_handles_are_rebuilt_in_our_memory() -> None:
    import ctypes
    r = rp.Replayer("/nonexistent/")
    r.channels = [0x5C00001C, 0x5C000020]
    r.handles = {0x5C000020: 0xABCD0020}
    pin = abi.FIFO_GET_CHANNELLIST.pack(2, 0x7FFD826A6EFC, 0x1A9F6528)
    out, note = r.channellist_params(pin)
    n, p_handles, p_ids = abi.FIFO_GET_CHANNELLIST.unpack(out)
    assert n == 2 and p_handles not in (0, 0x7FFD826A6EFC) and p_ids not in (0, 0x1A9F6528)
    assert ctypes.string_at(p_handles, 8) == (0x5C00001C).to_bytes(4, "little") + (0xABCD0020).to_bytes(4, "little")
    assert ctypes.string_at(p_ids, 8) == bytes(8)
    assert "0x5c000020" in note
    # more channels asked for than were allocated: left alone (the driver decides)
    assert r.channellist_params(abi.FIFO_GET_CHANNELLIST.pack(3, 1, 2)) == (abi.FIFO_GET_CHANNELLIST.pack(3, 1, 2), "")


def test_consequences_of_a_failed_alloc_are_dependent(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [
        alloc_call(0, 0, 0, 0xC1, abi.NV01_ROOT_CLIENT),
        alloc_call(1, 0xC1, 0xC1, 0x10, abi.NV01_DEVICE_0),  # will fail in "replay"
        control_call(2, 0xC1, 0x10, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2),  # on it: dependent
        alloc_call(3, 0xC1, 0x10, 0x20, abi.NV20_SUBDEVICE_0),  # child: dependent, taints 0x20
        control_call(4, 0xC1, 0x20, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2),  # grandchild: dependent
        control_call(5, 0xC1, 0xC1, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2),  # unrelated: mismatch
        control_call(6, 0xC1, 0xC1, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2),  # unrelated: match
    ]
    answers = {0: (True, 0, None), 1: (True, 0x40, None), 2: (True, 0x57, None), 3: (True, 0x57, None),
               4: (True, 0x57, None), 5: (True, 0x1F, None), 6: (True, 0, None)}
    monkeypatch.setattr(rp.Replayer, "run_call", lambda self, c: (answers[c.index], ""))
    rep = rp.replay(calls, None, "/nonexistent/")
    assert [r.category for r in rep.results] == ["match", "mismatch", "dependent", "dependent", "dependent",
                                                 "mismatch", "match"]
    assert "failed at [1]" in rep.results[2].reason and "failed at [3]" in rep.results[4].reason

"""The trace decoder, checked against the facts tests/traces/README.md states, by
decoding the real H100 traces (tests/traces)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from gpuslice import abi
from gpuslice.trace import records as t

TRACES = Path(__file__).resolve().parent / "traces"
NAMES = ("torch-matmul", "cuda-driver-alloc", "nvidia-smi-q")
MIB = 1 << 20
GIB = 1 << 30



def load(name: str) -> list[t.TraceCall]:
    return t.read_trace(TRACES / f"{name}.log.gz")


# ---- the line format, on hand-made lines ----

ALLOC_LINE = (
    "811 8 /dev/nvidiactl req=c030462b ret=0 us=49.0 "
    "in=" + "00" * 48 + " out=00000000000000004c00d0c1410000000000000000000000000000000000000000000000000000000000000000000000"
)


def test_parse_alloc_line() -> None:
    c = t.parse_line(ALLOC_LINE, 7)
    assert (c.index, c.pid, c.fd, c.path, c.ret, c.us) == (7, 811, 8, "/dev/nvidiactl", 0, 49.0)
    assert c.kind == "nv" and c.nr == abi.NV_ESC_RM_ALLOC and c.size == 48
    assert c.pin is None and c.pout is None
    out = t.decode_alloc(c.arg_out or b"")
    assert (out.h_new, out.h_class, out.status) == (0xC1D0004C, abi.NV01_ROOT_CLIENT, 0)
    assert t.call_status(c) == 0
    assert c.name == "RM_ALLOC(NV01_ROOT_CLIENT)" or c.name.startswith("RM_ALLOC(NV01_ROOT")


def test_parse_uvm_line_has_no_blocks() -> None:
    c = t.parse_line("755 11 /dev/nvidia-uvm req=0000004b ret=0 us=1.9")
    assert c.kind == "uvm" and c.nr == abi.UVM_MM_INITIALIZE and c.arg_in is None
    assert c.name == "UVM_MM_INITIALIZE"
    assert t.call_status(c) is None


@pytest.mark.parametrize("bad", [
    "",
    "811 8 /dev/nvidiactl req=c030462b ret=0",  # too few fields
    "x 8 /dev/nvidiactl req=c030462b ret=0 us=1 in=00",
    "811 8 /dev/nvidiactl req=c030462b ret=0 us=1 in=0g",
    "811 8 /dev/nvidiactl req=c030462b ret=0 us=1 in=00 out=00",  # size 48 in req, 1 byte block
    "811 8 /dev/nvidiactl ret=0 us=1 in=00 out=00 pin=00",  # no req
])
def test_malformed_lines_are_rejected(bad: str) -> None:
    with pytest.raises(t.TraceFormatError):
        t.parse_line(bad)


def test_status_needs_the_right_block_size() -> None:
    assert t.rm_status(abi.NV_ESC_RM_CONTROL, bytes(31)) is None
    blk = bytearray(abi.NVOS54.size)
    blk[28:32] = (0x57).to_bytes(4, "little")
    assert t.rm_status(abi.NV_ESC_RM_CONTROL, bytes(blk)) == 0x57
    assert t.rm_status(abi.NV_ESC_CARD_INFO, bytes(2304)) is None


def test_memory_size_offset() -> None:
    p = bytearray(256)
    p[64:72] = (1 * GIB).to_bytes(8, "little")
    assert t.memory_size(bytes(p)) == GIB
    with pytest.raises(ValueError):
        t.memory_size(bytes(70))


# ---- the README's facts, on the real traces ----

@pytest.mark.parametrize("name", NAMES)
def test_every_line_decodes(name: str) -> None:
    calls = load(name)
    raw = [ln for ln in gzip.open(TRACES / f"{name}.log.gz", "rt") if ln.strip()]
    assert len(calls) == len(raw) > 100
    assert [c.index for c in calls] == list(range(len(calls)))
    for c in calls:
        assert c.path.startswith("/dev/nvidia")
        if c.kind == "nv":
            assert c.arg_in is not None and c.arg_out is not None
            if c.nr == abi.NV_ESC_RM_ALLOC:
                # a parameter block was read exactly when the call pointed at one
                has = t.decode_alloc(c.arg_in).p_alloc_parms != 0
                assert (c.pin is not None) == (c.pout is not None) == has
                assert not has or len(c.pin or b"") == 256
            if c.nr == abi.NV_ESC_RM_CONTROL:
                ctl = t.decode_control(c.arg_in)
                assert (c.pin is not None) == (ctl.params != 0)
                # the recorder caps a block at 8 KiB: the replayer pads the rest with zeros
                assert c.pin is None or len(c.pin) == min(ctl.params_size, t.MAX_RECORDED_PARAMS)
            if c.nr in (abi.NV_ESC_RM_ALLOC, abi.NV_ESC_RM_CONTROL):
                assert "ESC_" not in c.name


def test_torch_1gib_tensor_is_one_1024mib_local_alloc() -> None:
    allocs = list(t.memory_allocs(load("torch-matmul")))
    gib = [a for a in allocs if a.requested == GIB]
    assert len(gib) == 1
    assert gib[0].h_class == abi.NV01_MEMORY_LOCAL_USER == 0x40
    assert gib[0].granted == 1024 * MIB and gib[0].status == abi.NV_OK and gib[0].ret == 0
    # no allocation is larger: the tensor was not split or padded
    assert max(a.requested for a in allocs) == GIB
    assert {a.h_class for a in allocs} == {abi.NV01_MEMORY_LOCAL_USER, abi.NV01_MEMORY_SYSTEM}


def test_failed_200gib_alloc_is_status_0x51_with_ioctl_ret_0() -> None:
    allocs = list(t.memory_allocs(load("cuda-driver-alloc")))
    failed = [a for a in allocs if a.status != abi.NV_OK]
    assert failed, "the 200 GiB allocation must be in the trace"
    for a in failed:
        assert a.requested == 200 * GIB
        assert a.h_class == abi.NV01_MEMORY_LOCAL_USER
        assert a.status == abi.NV_ERR_NO_MEMORY == 0x51
        assert a.ret == 0
    ok_sizes = {a.requested for a in allocs if a.status == abi.NV_OK and a.h_class == abi.NV01_MEMORY_LOCAL_USER}
    assert {64 * MIB, 128 * MIB, 192 * MIB} <= ok_sizes


@pytest.mark.parametrize("name", ["torch-matmul", "cuda-driver-alloc"])
def test_context_has_4_tsgs_and_20_channels(name: str) -> None:
    calls = load(name)
    by_class = t.allocs_by_class(calls)
    assert by_class[abi.KEPLER_CHANNEL_GROUP_A] == 4
    assert by_class[abi.HOPPER_CHANNEL_GPFIFO_A] == 20
    controls = t.controls_by_cmd(calls)
    assert controls.get(abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, 0) >= 4
    # the TSGs are created before the channels that live in them
    first_tsg = min(c.index for c in calls if c.nr == abi.NV_ESC_RM_ALLOC and c.kind == "nv"
                    and t.decode_alloc(c.arg_in or b"").h_class == abi.KEPLER_CHANNEL_GROUP_A)
    first_ch = min(c.index for c in calls if c.nr == abi.NV_ESC_RM_ALLOC and c.kind == "nv"
                   and t.decode_alloc(c.arg_in or b"").h_class == abi.HOPPER_CHANNEL_GPFIFO_A)
    assert first_tsg < first_ch


def test_fb_get_info_v2_six_times_in_torch() -> None:
    calls = load("torch-matmul")
    assert t.controls_by_cmd(calls)[abi.NV2080_CTRL_CMD_FB_GET_INFO_V2] == 6
    assert "RM_CONTROL(NV2080_CTRL_CMD_FB_GET_INFO_V2)" in {c.name for c in calls}


def test_root_clients_are_driver_handles() -> None:
    for name in NAMES:
        clients = t.root_clients(load(name))
        assert clients and all(h & 0xFFFFFF00 == 0xC1D00000 for h in clients)
        assert len(set(clients)) == len(clients)


def test_nvidia_smi_nonzero_statuses() -> None:
    calls = load("nvidia-smi-q")
    statuses = {t.call_status(c) for c in calls} - {None}
    assert {abi.NV_OK, abi.NV_ERR_NOT_SUPPORTED, abi.NV_ERR_OBJECT_NOT_FOUND} <= statuses
    assert all(c.ret == 0 for c in calls)

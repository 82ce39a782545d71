"""rm.py packs the same bytes that CUDA and nvidia-smi sent on a real H100 (traces)."""

import gzip
import os
from pathlib import Path
import struct
from typing import Iterator

import pytest

from gpuslice import abi
from gpuslice.sched import rm

TRACES = os.environ.get("GPUSLICE_TRACES", str(Path(__file__).resolve().parent / "traces"))


def trace_lines(name: str) -> Iterator[dict[str, str]]:
    path = os.path.join(TRACES, name)
    if not os.path.exists(path):
        pytest.fail(f"no trace {path}")
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            kv = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
            kv["path"] = parts[2]
            yield kv


def controls(name: str, cmd: int) -> list[dict[str, str]]:
    out = []
    for kv in trace_lines(name):
        if int(kv["req"], 16) == abi.IOCTL_RM_CONTROL and "pin" in kv:
            if struct.unpack_from("<I", bytes.fromhex(kv["in"]), 8)[0] == cmd:
                out.append(kv)
    return out


def allocs(name: str, cls: int) -> list[dict[str, str]]:
    out = []
    for kv in trace_lines(name):
        if int(kv["req"], 16) == abi.IOCTL_RM_ALLOC:
            if abi.NVOS64.unpack(bytes.fromhex(kv["in"]))[3] == cls:
                out.append(kv)
    return out


def test_version_check_matches_nvidia_smi() -> None:
    lines = [kv for kv in trace_lines("nvidia-smi-q.log.gz") if int(kv["req"], 16) == abi.IOCTL_CHECK_VERSION_STR]
    assert lines
    assert rm.pack_version_check("580.159.04") == bytes.fromhex(lines[0]["in"])
    reply, ver = rm.unpack_version_check(bytes.fromhex(lines[0]["out"]))
    assert (reply, ver) == (abi.NV_RM_API_VERSION_REPLY_RECOGNIZED, "580.159.04")


def test_root_client_alloc_matches() -> None:
    for trace in ("nvidia-smi-q.log.gz", "torch-matmul.log.gz"):
        first = next(kv for kv in trace_lines(trace) if int(kv["req"], 16) == abi.IOCTL_RM_ALLOC)
        assert rm.pack_alloc(0, 0, 0, abi.NV01_ROOT) == bytes.fromhex(first["in"])
        out = abi.NVOS64.unpack(bytes.fromhex(first["out"]))
        assert out[3] == abi.NV01_ROOT_CLIENT and out[2] >> 16 == 0xC1D0  # RM-chosen handle


def test_device_and_subdevice_alloc_match() -> None:
    dev = allocs("nvidia-smi-q.log.gz", abi.NV01_DEVICE_0)[0]
    h_client, h_parent, h_new, h_class, p_params, *_ = abi.NVOS64.unpack(bytes.fromhex(dev["in"]))
    assert rm.pack_alloc(h_client, h_parent, h_new, h_class, p_params) == bytes.fromhex(dev["in"])
    # only the first sizeof(NV0080_ALLOC_PARAMETERS) bytes of the 256-byte window count
    assert rm.pack_device_params(0) == bytes.fromhex(dev["pin"])[: abi.DEVICE_ALLOC_PARAMS.size]
    # CUDA shares the device with its own client
    cuda_dev = allocs("torch-matmul.log.gz", abi.NV01_DEVICE_0)[0]
    cuda_client = abi.NVOS64.unpack(bytes.fromhex(cuda_dev["in"]))[0]
    assert rm.pack_device_params(0, cuda_client, va_mode=2) == bytes.fromhex(cuda_dev["pin"])[:56]
    sub = allocs("nvidia-smi-q.log.gz", abi.NV20_SUBDEVICE_0)[0]
    assert rm.pack_subdevice_params(0) == bytes.fromhex(sub["pin"])[:4]
    assert abi.DEVICE_ALLOC_PARAMS.size == 56


@pytest.mark.parametrize("trace", ["nvidia-smi-q.log.gz", "torch-matmul.log.gz", "cuda-driver-alloc.log.gz"])
def test_fb_get_info_v2_request_and_control_block(trace: str) -> None:
    calls = controls(trace, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2)
    assert calls
    for kv in calls:
        pin = bytes.fromhex(kv["pin"])
        assert len(pin) == abi.FB_GET_INFO_V2_SIZE == 1028
        n = int.from_bytes(pin[:4], "little")
        indices = [int.from_bytes(pin[4 + 8 * i : 8 + 8 * i], "little") for i in range(n)]
        assert rm.pack_fb_info_request(indices) == pin
        h_client, h_obj, cmd, flags, ptr, size, status = abi.NVOS54.unpack(bytes.fromhex(kv["in"]))
        assert rm.pack_control(h_client, h_obj, cmd, ptr, size) == bytes.fromhex(kv["in"])
        assert size == 1028
        # the reply decodes to one value per asked index
        assert set(rm.unpack_fb_info(bytes.fromhex(kv["pout"]))) == set(indices)


def test_fb_info_reply_values() -> None:
    kv = next(k for k in controls("nvidia-smi-q.log.gz", abi.NV2080_CTRL_CMD_FB_GET_INFO_V2)
              if bytes.fromhex(k["pin"])[:4] == b"\x03\0\0\0")
    info = rm.unpack_fb_info(bytes.fromhex(kv["pout"]))
    # an 80 GB H100: total RAM in KiB ~ 80 GiB, heap free <= heap size
    total = info[abi.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE] * 1024
    assert 79 << 30 < total <= 81 << 30
    assert info[abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE] <= info[abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE]


def test_gpfifo_schedule_matches_cuda() -> None:
    calls = controls("torch-matmul.log.gz", abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE)
    assert len(calls) == 4  # one per TSG of the context
    for kv in calls:
        assert rm.pack_gpfifo_schedule(True) == bytes.fromhex(kv["pin"])
        h_client, h_obj, cmd, flags, ptr, size, _ = abi.NVOS54.unpack(bytes.fromhex(kv["in"]))
        assert size == abi.GPFIFO_SCHEDULE.size == 3


def test_disable_channels_layout() -> None:
    """Not in the traces: check against ctrl2080fifo.h's layout (536 bytes; client list
    at 24, channel list at 24 + 4*64)."""
    pairs = [(0xC1D00047, 0x5C000010 + i) for i in range(3)]
    b = rm.pack_disable_channels(pairs, True)
    assert len(b) == 536 == abi.DISABLE_CHANNELS_SIZE
    assert b[0] == 1 and int.from_bytes(b[4:8], "little") == 3 and b[8] == 0 and b[9] == 0
    assert b[16:24] == bytes(8)
    assert [int.from_bytes(b[24 + 4 * i : 28 + 4 * i], "little") for i in range(3)] == [p[0] for p in pairs]
    assert [int.from_bytes(b[280 + 4 * i : 284 + 4 * i], "little") for i in range(3)] == [p[1] for p in pairs]
    assert b[36:280] == bytes(244) and b[292:] == bytes(536 - 292)
    assert rm.pack_disable_channels(pairs, False)[0] == 0
    assert rm.pack_disable_channels(pairs, True, only_disable_scheduling=True)[8] == 1
    with pytest.raises(ValueError):
        rm.pack_disable_channels([(1, i) for i in range(65)], True)


def test_batches_64() -> None:
    pairs = [(1, i) for i in range(130)] + [(1, 5)]
    bs = rm.batches(pairs)
    assert [len(b) for b in bs] == [64, 64, 2]
    assert sorted(p for b in bs for p in b) == sorted(set(pairs))


def test_timeslice_and_control_words() -> None:
    assert rm.pack_timeslice(4000) == (4000).to_bytes(8, "little")
    assert abi.IOCTL_RM_CONTROL == 0xC020462A and abi.IOCTL_RM_ALLOC == 0xC030462B
    assert abi.IOCTL_CHECK_VERSION_STR == 0xC04846D2


def test_rm_error_message() -> None:
    e = rm.RmError("RM_CONTROL X", abi.NV_ERR_INVALID_CLIENT)
    assert "0x23" in str(e) and "NV_ERR_INVALID_CLIENT" in str(e) and e.status == 0x23


def test_open_missing_node_fails_cleanly(tmp_path) -> None:
    c = rm.RmClient(str(tmp_path / "nvidiactl"))
    with pytest.raises(OSError):
        c.open()
    assert c.fd == -1
    assert c.gpu_path_fmt == str(tmp_path / "nvidia{}")


def test_only_an_nvidia_file_is_asked_about_a_channel(tmp_path) -> None:
    """rm.owns_channel (the preload socket's proof) issues its RM control only on a
    character device of major 195: a regular file, /dev/null or a pipe a container
    passed is refused without an ioctl (the RM request number could mean anything to
    another driver)."""
    import socket

    f = tmp_path / "nvidiactl"
    f.write_bytes(b"")
    r, w = os.pipe()
    a, b = socket.socketpair()
    fds = [os.open(f, os.O_RDONLY), os.open("/dev/null", os.O_RDONLY), r, a.fileno()]
    try:
        for fd in fds:
            assert not rm.nvidia_file(fd)
            assert not rm.owns_channel(fd, 0xC1D00001, 0x5C000010)
        assert not rm.nvidia_file(9999)  # not open
    finally:
        for fd in fds[:2]:
            os.close(fd)
        os.close(r)
        os.close(w)
        a.close()
        b.close()

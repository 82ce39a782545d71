"""A second process with its own RM client that tries to gate someone else's channels.

  rmclient.py HOLD_SECONDS CLIENT:CHANNEL [CLIENT:CHANNEL ...]

Opens /dev/nvidiactl and /dev/nvidia0 itself, allocates a client (0x41), a device (0x80)
and a subdevice (0x2080) like libcuda does in the traces, then issues
NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS (bDisable=1) naming the given (client, channel)
pairs, waits HOLD_SECONDS, and re-enables them (bDisable=0). ioctl goes through libc, so
LD_PRELOAD=libgpuslice.so sees it. Prints one JSON line with the RM statuses.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pyctl"))
from gpuslice import abi  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
DEV, SUB = 0xB0000001, 0xB0000002


def ioctl(fd: int, req: int, buf) -> tuple[int, int]:
    r = libc.ioctl(fd, req, ctypes.addressof(buf))
    return r, ctypes.get_errno() if r < 0 else 0


def alloc(ctl, root, parent, new, klass, params=None):
    arg = ctypes.create_string_buffer(abi.NVOS64.pack(root, parent, new, klass,
                                                      ctypes.addressof(params) if params else 0,
                                                      0, 0, 0, 0))
    r, e = ioctl(ctl, abi.IOCTL_RM_ALLOC, arg)
    f = abi.NVOS64.unpack(arg.raw[: abi.NVOS64.size])
    return r, e, f[2], f[8]


def disable(ctl, client, pairs, on: int) -> tuple[int, int, int]:
    p = ctypes.create_string_buffer(abi.DISABLE_CHANNELS_SIZE)
    abi.DISABLE_CHANNELS_HEAD.pack_into(p, 0, on, len(pairs), 0, 0, 0)
    base = abi.DISABLE_CHANNELS_HEAD.size
    for i, (c, h) in enumerate(pairs):
        struct.pack_into("<I", p, base + 4 * i, c)
        struct.pack_into("<I", p, base + 4 * abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES + 4 * i, h)
    arg = ctypes.create_string_buffer(abi.NVOS54.pack(client, SUB, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, 0,
                                                      ctypes.addressof(p), abi.DISABLE_CHANNELS_SIZE, 0))
    r, e = ioctl(ctl, abi.IOCTL_RM_CONTROL, arg)
    return r, e, abi.NVOS54.unpack(arg.raw[: abi.NVOS54.size])[6]


def control(ctl, client, obj, cmd, params) -> tuple[int, int, int]:
    arg = ctypes.create_string_buffer(abi.NVOS54.pack(client, obj, cmd, 0, ctypes.addressof(params),
                                                      len(params), 0))
    r, e = ioctl(ctl, abi.IOCTL_RM_CONTROL, arg)
    return r, e, abi.NVOS54.unpack(arg.raw[: abi.NVOS54.size])[6]


def main() -> None:
    hold = float(sys.argv[1])
    pairs = [tuple(int(x, 0) for x in a.split(":")) for a in sys.argv[2:]]
    ctl = os.open("/dev/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
    gpu = os.open("/dev/nvidia0", os.O_RDWR | os.O_CLOEXEC)
    fdbuf = ctypes.create_string_buffer(struct.pack("<i", ctl))
    out = {"register_fd": ioctl(gpu, abi.IOCTL_REGISTER_FD, fdbuf)}
    r, e, client, st = alloc(ctl, 0, 0, 0, abi.NV01_ROOT_CLIENT)
    out["client"] = [r, e, client, st]
    # as libcuda does (traces): probed GPU ids (0x214), attach them (0x215)
    probed = ctypes.create_string_buffer(384)
    out["probed"] = list(control(ctl, client, client, 0x214, probed))
    gpu_id = struct.unpack_from("<I", probed, 0)[0]
    att = ctypes.create_string_buffer(struct.pack("<II", gpu_id, 0xFFFFFFFF) + bytes(124), 132)
    out["attach"] = list(control(ctl, client, client, 0x215, att))
    devp = ctypes.create_string_buffer(struct.pack("<II", 0, client) + bytes(48))
    out["device"] = list(alloc(ctl, client, client, DEV, abi.NV01_DEVICE_0, devp))
    subp = ctypes.create_string_buffer(struct.pack("<I", 0) + bytes(12))
    out["subdevice"] = list(alloc(ctl, client, DEV, SUB, abi.NV20_SUBDEVICE_0, subp))
    t0 = time.perf_counter()
    out["disable"] = list(disable(ctl, client, pairs, 1))
    out["disable_us"] = (time.perf_counter() - t0) * 1e6
    time.sleep(hold)
    out["enable"] = list(disable(ctl, client, pairs, 0))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

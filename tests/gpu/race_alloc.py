"""A hostile process: allocates video memory while a second thread rewrites the nested
size between the interposer's check and RM's own read of it (issue 10's race).

  race_alloc.py SMALL_MIB BIG_MIB SECONDS [race|direct|readonly]

Opens /dev/nvidiactl and /dev/nvidia0, sets up a client, device and subdevice as libcuda
does (as rmclient.py), then loops RM_ALLOC of NV01_MEMORY_LOCAL_USER asking SMALL_MIB
while the other thread flips the size field between SMALL and BIG as fast as it can. The
ioctl goes through libc (ctypes releases the GIL, so the flipper runs during the call),
so LD_PRELOAD=libgpuslice.so checks it: whenever the check read SMALL and RM read BIG,
RM holds BIG while SMALL was charged. `direct` instead allocates BIG through the ioctl
syscall itself, which LD_PRELOAD cannot see: in user space, the simplest allocation the
core never checks, and for the guard the same as a race won every time. `readonly` asks
BIG with the parameters on a read-only page: RM allocates, cannot write them back, and
answers NV_ERR_INVALID_ADDRESS with the memory alive (the core must charge it anyway). What RM really holds is read from RM by whoever
watches (the size RM writes back is rewritten by the flipper too). Prints one JSON line of
totals at the end; the guard (gpuctl guard --source environ) is expected to kill it first.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pyctl"))
from gpuslice import abi  # noqa: E402
from rmclient import DEV, SUB, alloc, control, ioctl  # noqa: E402

MIB = 1 << 20
# NV_MEMORY_ALLOCATION_PARAMS of a 2 MiB cuMemAlloc (cuda-driver-alloc trace): flags
# 0x1c101 at 8, attr 0x18000000 at 24, size and 2 MiB alignment at 64 and 72; owner (0)
# becomes the client
TEMPLATE = bytes.fromhex(
    "000000000000000001c101000000000000000000000000000000001800000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "0000200000000000000020000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
)


def main() -> None:
    small, big, seconds = int(sys.argv[1]) * MIB, int(sys.argv[2]) * MIB, float(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "race"
    direct = mode == "direct"
    ctl = os.open("/dev/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
    gpu = os.open("/dev/nvidia0", os.O_RDWR | os.O_CLOEXEC)
    ioctl(gpu, abi.IOCTL_REGISTER_FD, ctypes.create_string_buffer(struct.pack("<i", ctl)))
    _, _, client, st = alloc(ctl, 0, 0, 0, abi.NV01_ROOT_CLIENT)
    assert st == 0, st
    probed = ctypes.create_string_buffer(384)
    control(ctl, client, client, 0x214, probed)
    gpu_id = struct.unpack_from("<I", probed, 0)[0]
    control(ctl, client, client, 0x215, ctypes.create_string_buffer(struct.pack("<II", gpu_id, 0xFFFFFFFF) + bytes(124), 132))
    assert alloc(ctl, client, client, DEV, abi.NV01_DEVICE_0,
                 ctypes.create_string_buffer(struct.pack("<II", 0, client) + bytes(48)))[3] == 0
    assert alloc(ctl, client, DEV, SUB, abi.NV20_SUBDEVICE_0, ctypes.create_string_buffer(bytes(16)))[3] == 0

    page = mmap.mmap(-1, mmap.PAGESIZE)
    params = (ctypes.c_char * 128).from_buffer(page)
    ctypes.memmove(ctypes.addressof(params), TEMPLATE, 128)
    struct.pack_into("<I", params, 0, client)
    size_at = ctypes.addressof(params) + 64
    small_b, big_b = small.to_bytes(8, "little"), big.to_bytes(8, "little")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            ctypes.memmove(size_at, big_b, 8)
            ctypes.memmove(size_at, small_b, 8)

    t = threading.Thread(target=flip, daemon=True)
    if mode == "readonly":
        ctypes.memmove(size_at, big_b, 8)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(ctypes.addressof(params), mmap.PAGESIZE, 1) == 0
    elif direct:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        ctypes.memmove(size_at, big_b, 8)

        def alloc_direct(h: int) -> tuple[int, int]:
            arg = ctypes.create_string_buffer(abi.NVOS64.pack(client, DEV, h, abi.NV01_MEMORY_LOCAL_USER,
                                                              ctypes.addressof(params), 0, 0, 0, 0))
            r = libc.syscall(16, ctypes.c_long(ctl), ctypes.c_ulong(abi.IOCTL_RM_ALLOC), ctypes.c_void_p(ctypes.addressof(arg)))
            return int(r), abi.NVOS64.unpack(arg.raw[: abi.NVOS64.size])[8]
    else:
        t.start()
    h, n, ok, refused, first = 0xB1000000, 0, 0, 0, None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        h += 1
        if direct:
            r, st = alloc_direct(h)
            time.sleep(0.05)
        elif mode == "readonly":
            r, _, _, st = alloc(ctl, client, DEV, h, abi.NV01_MEMORY_LOCAL_USER, params)
            ok += st == abi.NV_ERR_INVALID_ADDRESS  # allocated, reply lost
            time.sleep(0.05)
        else:
            ctypes.memmove(size_at, small_b, 8)
            r, _, _, st = alloc(ctl, client, DEV, h, abi.NV01_MEMORY_LOCAL_USER, params)
        n += 1
        if r == 0 and st == 0:
            ok += 1
        else:
            refused += 1
            first = first if first is not None else [r, st]
            time.sleep(0.001)
    stop.set()
    print(json.dumps({"calls": n, "ok": ok, "refused": refused, "first_refusal": first}), flush=True)

if __name__ == "__main__":
    main()

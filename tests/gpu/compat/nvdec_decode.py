"""Compatibility workload: H.264 1080p decode on NVDEC through PyNvVideoCodec (wheel
pynvvideocodec 2.2.4: picks its CUDA-13 module on driver >= 580's NVENC API 13; needs
libnvcuvid.so.1 and libnvidia-encode.so.1 from the driver, i.e. the "video" capability).

  nvdec_decode.py [--oom]   result: [frames, sha256 over all NV12 frames as 4 ints]
  --oom: afterwards, decoders (each fed the first 8 packets, so its 1080p surfaces exist)
         until decoder creation or decoding fails with CUDA out-of-memory; then a decode
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import compat_common as C

CLIP = Path(__file__).resolve().parent / "media" / "clip1080.h264"  # 300 frames, testsrc2, libx264
FRAMES = 300


def open_decoder():  # type: ignore[no-untyped-def]
    import PyNvVideoCodec as nvc

    dmx = nvc.CreateDemuxer(filename=str(CLIP))
    dec = nvc.CreateDecoder(gpuid=0, codec=dmx.GetNvCodecId(), usedevicememory=True)
    return dmx, dec


def frame_bytes(frame) -> bytes:  # type: ignore[no-untyped-def]
    """The NV12 frame (luma then chroma, contiguous from plane 0) copied to the host."""
    import cupy as cp
    import numpy as np

    n = int(frame.framesize())
    host = np.empty(n, dtype=np.uint8)
    cp.cuda.runtime.memcpy(host.ctypes.data, int(frame.GetPtrToPlane(0)), n, cp.cuda.runtime.memcpyDeviceToHost)
    return host.tobytes()


def decode_all(limit: int | None = None) -> tuple[int, bytes, list[int]]:
    dmx, dec = open_decoder()
    h = hashlib.sha256()
    n, sums = 0, []
    for pkt in dmx:
        for fr in dec.Decode(pkt):
            b = frame_bytes(fr)
            h.update(b)
            if n % 50 == 0:
                sums.append(sum(b[::4096]))
            n += 1
            if limit and n >= limit:
                return n, h.digest(), sums
    return n, h.digest(), sums


def is_cuda_oom(e: BaseException) -> bool:
    """CUDA's out-of-memory error, or PyNvVideoCodec's answer to it: a decoder whose surfaces
    cannot be allocated fails in its sequence callback (cuvidCreateDecoder returns
    CUDA_ERROR_OUT_OF_MEMORY there) and PyNvVideoCodec raises "HandleVideoSequence" without
    the code. The probe allocates nothing else, so that is the decoder's out-of-memory error."""
    s = str(e).upper()
    return "OUT_OF_MEMORY" in s or "OUT OF MEMORY" in s or (
        type(e).__name__ == "PyNvVCException" and "HANDLEVIDEOSEQUENCE" in s)


def nvdec_oom() -> dict:
    held: list = []

    def alloc():  # type: ignore[no-untyped-def]
        dmx, dec = open_decoder()
        k = 0
        for pkt in dmx:
            dec.Decode(pkt)
            k += 1
            if k >= 8:
                break
        held.append((dmx, dec))
        return dec

    def release() -> None:
        held.clear()

    def after() -> bool:
        n, _, _ = decode_all(limit=30)
        return n == 30

    out = C.oom_probe(alloc, is_cuda_oom, release, after,
                      max_chunks=int(os.environ.get("GS_COMPAT_OOM_MAX", 2000)))
    out["chunk"] = "one 1080p H.264 decoder after 8 packets (its decode surfaces), not 1 GiB"
    return out


def work(argv: list[str]) -> dict:
    import PyNvVideoCodec as nvc

    n, digest, sums = decode_all()
    d2 = decode_all(limit=20)
    out = {"ok": n == FRAMES, "result": [n, *struct.unpack("<4Q", digest)], "tol": 0,
           "sample_sums": sums, "pynvvideocodec": getattr(nvc, "__version__", None)}
    if C.want_oom(argv):
        out["oom"] = nvdec_oom()
    out["ok"] = out["ok"] and d2[0] == 20
    return out


if __name__ == "__main__":
    C.main(work)

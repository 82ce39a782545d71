"""Compatibility workload: JPEG decode on the NVJPG hardware engine: nvJPEG (ctypes) with
nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE), the batched API (nvjpegDecodeBatchedInitialize,
nvjpegDecodeBatched) into interleaved RGB in device memory (CuPy), of baseline 4:2:0 JPEGs
that pillow makes at start (deterministic).

  nvjpg_decode.py           result: [sha256 over the decoded RGB images as 4 ints]
  oom: none (null): nvJPEG's hardware state allocates little; there is no 1 GiB unit to count.

ok is false where the hardware backend is missing (nvjpegCreateEx answers ARCH_MISMATCH or
IMPLEMENTATION_NOT_SUPPORTED, or nvjpegDecodeBatchedSupported refuses the images): the
hybrid/GPU backends are never used as a fallback. Also compares with pillow's decode
(max_abs_diff; IDCT and upsampling differ, so a small tolerance).

libnvjpeg: torchvision's bundled torchvision.libs/libnvjpeg*.so.13, else the nvidia-nvjpeg
wheel's nvidia/cu13/lib/libnvjpeg.so.13, else libnvjpeg.so.13 on the loader path.
"""

from __future__ import annotations

import ctypes as ct
import glob
import hashlib
import io
import os
import struct
import sys

import compat_common as C

NVJPEG_BACKEND_HARDWARE = 3
NVJPEG_OUTPUT_RGBI = 5
NVJPEG_MAX_COMPONENT = 4
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "INVALID_PARAMETER", 3: "BAD_JPEG", 4: "JPEG_NOT_SUPPORTED",
          5: "ALLOCATOR_FAILURE", 6: "EXECUTION_FAILED", 7: "ARCH_MISMATCH", 8: "INTERNAL_ERROR",
          9: "IMPLEMENTATION_NOT_SUPPORTED", 10: "INCOMPLETE_BITSTREAM"}
SIZES = [(1920, 1080), (1280, 720), (640, 480), (1024, 1024)]
BATCH = len(SIZES)
# pillow (libjpeg islow IDCT, fancy chroma upsampling) against NVJPG: the two upsample chroma
# differently, which at the test images' hard colour edges moves single pixels by up to ~100,
# so the check is on the mean (a wrong decode is off by tens everywhere)
MAX_MEAN_DIFF = 2.0


class nvjpegImage_t(ct.Structure):  # nvjpeg.h: unsigned char *channel[4]; size_t pitch[4];  (64 bytes)
    _fields_ = [("channel", ct.c_void_p * NVJPEG_MAX_COMPONENT), ("pitch", ct.c_size_t * NVJPEG_MAX_COMPONENT)]


class NvjpegError(RuntimeError):
    def __init__(self, call: str, st: int) -> None:
        super().__init__(f"{call}: NVJPEG_STATUS_{STATUS.get(st, st)} ({st})")
        self.status = st


def find_lib() -> str:
    cands = []
    for p in sys.path:
        cands += sorted(glob.glob(os.path.join(p, "torchvision.libs", "libnvjpeg*.so*")))
        cands += sorted(glob.glob(os.path.join(p, "nvidia", "cu13", "lib", "libnvjpeg.so*")))
    return cands[0] if cands else "libnvjpeg.so.13"


def make_jpegs() -> list[bytes]:
    import numpy as np
    from PIL import Image

    out = []
    for k, (w, h) in enumerate(SIZES):
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([(x * 255 // w), (y * 255 // h), ((x ^ y) + 37 * k) & 255], -1).astype(np.uint8)
        b = io.BytesIO()
        Image.fromarray(img, "RGB").save(b, "JPEG", quality=90, subsampling=2, progressive=False, optimize=False)
        out.append(b.getvalue())
    return out


class HwDecoder:
    def __init__(self, batch: int = BATCH) -> None:
        self.path = find_lib()
        L = self.lib = ct.CDLL(self.path)
        vp = ct.c_void_p
        L.nvjpegCreateEx.argtypes = [ct.c_int, vp, vp, ct.c_uint, ct.POINTER(vp)]
        L.nvjpegJpegStateCreate.argtypes = [vp, ct.POINTER(vp)]
        L.nvjpegDecodeBatchedInitialize.argtypes = [vp, vp, ct.c_int, ct.c_int, ct.c_int]
        L.nvjpegDecodeBatched.argtypes = [vp, vp, ct.POINTER(ct.c_char_p), ct.POINTER(ct.c_size_t),
                                          ct.POINTER(nvjpegImage_t), vp]
        L.nvjpegGetImageInfo.argtypes = [vp, ct.c_char_p, ct.c_size_t, ct.POINTER(ct.c_int), ct.POINTER(ct.c_int),
                                         ct.POINTER(ct.c_int), ct.POINTER(ct.c_int)]
        L.nvjpegJpegStreamCreate.argtypes = [vp, ct.POINTER(vp)]
        L.nvjpegJpegStreamParse.argtypes = [vp, ct.c_char_p, ct.c_size_t, ct.c_int, ct.c_int, vp]
        L.nvjpegDecodeBatchedSupported.argtypes = [vp, vp, ct.POINTER(ct.c_int)]
        for f in ("nvjpegDestroy", "nvjpegJpegStateDestroy", "nvjpegJpegStreamDestroy"):
            getattr(L, f).argtypes = [vp]
        for f in ("nvjpegCreateEx", "nvjpegJpegStateCreate", "nvjpegDecodeBatchedInitialize", "nvjpegDecodeBatched",
                  "nvjpegGetImageInfo", "nvjpegJpegStreamCreate", "nvjpegJpegStreamParse",
                  "nvjpegDecodeBatchedSupported", "nvjpegDestroy", "nvjpegJpegStateDestroy", "nvjpegJpegStreamDestroy"):
            getattr(L, f).restype = ct.c_int
        self.handle, self.state, self.stream = vp(), vp(), vp()
        self.ck("nvjpegCreateEx", L.nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, None, None, 0, ct.byref(self.handle)))
        self.ck("nvjpegJpegStateCreate", L.nvjpegJpegStateCreate(self.handle, ct.byref(self.state)))
        self.ck("nvjpegDecodeBatchedInitialize",
                L.nvjpegDecodeBatchedInitialize(self.handle, self.state, batch, 1, NVJPEG_OUTPUT_RGBI))
        self.ck("nvjpegJpegStreamCreate", L.nvjpegJpegStreamCreate(self.handle, ct.byref(self.stream)))
        self.batch = batch

    @staticmethod
    def ck(call: str, st: int) -> None:
        if st != 0:
            raise NvjpegError(call, st)

    def info(self, data: bytes) -> tuple[int, int, int, int]:
        n, css = ct.c_int(), ct.c_int()
        w, h = (ct.c_int * 4)(), (ct.c_int * 4)()
        self.ck("nvjpegGetImageInfo", self.lib.nvjpegGetImageInfo(self.handle, data, len(data), ct.byref(n),
                                                                   ct.byref(css), w, h))
        return n.value, css.value, w[0], h[0]

    def supported(self, data: bytes) -> bool:
        self.ck("nvjpegJpegStreamParse", self.lib.nvjpegJpegStreamParse(self.handle, data, len(data), 0, 0, self.stream))
        s = ct.c_int(-1)
        self.ck("nvjpegDecodeBatchedSupported", self.lib.nvjpegDecodeBatchedSupported(self.handle, self.stream, ct.byref(s)))
        return s.value == 0  # 0: supported

    def decode(self, jpegs: list[bytes]):  # type: ignore[no-untyped-def]
        """Decoded RGB CuPy arrays (h, w, 3), one per JPEG; synchronized."""
        import cupy as cp

        assert len(jpegs) == self.batch
        outs, imgs = [], (nvjpegImage_t * self.batch)()
        for i, d in enumerate(jpegs):
            _, _, w, h = self.info(d)
            a = cp.empty((h, w, 3), dtype=cp.uint8)
            outs.append(a)
            imgs[i].channel[0] = a.data.ptr
            imgs[i].pitch[0] = w * 3
        bufs = (ct.c_char_p * self.batch)(*jpegs)
        lens = (ct.c_size_t * self.batch)(*[len(d) for d in jpegs])
        self.ck("nvjpegDecodeBatched", self.lib.nvjpegDecodeBatched(self.handle, self.state, bufs, lens, imgs, None))
        cp.cuda.runtime.deviceSynchronize()  # the legacy default stream (NULL) was used
        return outs

    def close(self) -> None:
        self.lib.nvjpegJpegStreamDestroy(self.stream)
        self.lib.nvjpegJpegStateDestroy(self.state)
        self.lib.nvjpegDestroy(self.handle)


def work(argv: list[str]) -> dict:
    import cupy as cp
    import numpy as np
    from PIL import Image

    cp.cuda.runtime.getDeviceCount()  # CUDA (the primary context) up first
    jpegs = make_jpegs()
    try:
        dec = HwDecoder()
    except NvjpegError as e:
        return {"ok": False, "result": None, "tol": 0, "oom": None, "lib": find_lib(),
                "error": f"no NVJPG hardware backend: {e}"}
    infos = [dec.info(d) for d in jpegs]
    sup = [dec.supported(d) for d in jpegs]
    if not all(sup):
        return {"ok": False, "result": None, "tol": 0, "oom": None, "lib": dec.path, "infos": infos,
                "error": f"nvjpegDecodeBatchedSupported refused some images on the hardware backend: {sup}"}
    outs = dec.decode(jpegs)
    host = [cp.asnumpy(a) for a in outs]
    again = [cp.asnumpy(a) for a in dec.decode(jpegs)]
    dec.close()
    h = hashlib.sha256()
    for a in host:
        h.update(a.tobytes())
    ref = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in jpegs]
    diffs = [int(np.abs(a.astype(np.int16) - r.astype(np.int16)).max()) for a, r in zip(host, ref)]
    means = [round(float(np.abs(a.astype(np.int16) - r.astype(np.int16)).mean()), 3) for a, r in zip(host, ref)]
    same = all(np.array_equal(a, b) for a, b in zip(host, again))
    return {"ok": bool(same and max(means) <= MAX_MEAN_DIFF and all(i[1] == 2 for i in infos)),
            "result": list(struct.unpack("<4Q", h.digest())), "tol": 0, "oom": None,
            "oom_note": "no out-of-memory mode: nvJPEG's hardware path has no 1 GiB unit to count",
            "max_abs_diff_vs_pillow": diffs, "mean_abs_diff_vs_pillow": means, "repeat_identical": same, "lib": dec.path,
            "infos": infos, "jpeg_bytes": [len(d) for d in jpegs]}


if __name__ == "__main__":
    C.main(work)

"""Compatibility workload: Vulkan through wgpu-py (wgpu-native): a WGSL compute pipeline of
integer math over a storage buffer and a render pipeline into a 512x512 rgba8unorm texture
(integer-exact colours), both copied back and hashed.

  vulkan_wgpu.py [--oom]    result: [sha256(storage) as 4 ints, sha256(texture) as 4 ints]
  --oom: afterwards, buffers of min(1 GiB, max_buffer_size) cleared on the GPU, until wgpu's
         GPUOutOfMemoryError (wgpu-py raises it in the call); then a dispatch

The adapter must be Vulkan and name NVIDIA, or ok is false (a CPU fallback never passes;
GS_COMPAT_ALLOW_SOFTWARE=1 lifts the NVIDIA check, for lavapipe). Needs the wheels wgpu,
cffi, pycparser (rendercanvas for the import on some versions) and libvulkan.so.1.
"""

from __future__ import annotations

import hashlib
import os
import struct

import compat_common as C

N = 1 << 20
ROUNDS = 256
TW = TH = 512

CS = """
@group(0) @binding(0) var<storage, read_write> v: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    var x = v[i];
    for (var r = 0u; r < %ROUNDS%u; r = r + 1u) { x = x * 1664525u + 1013904223u; x = x ^ (x >> 13u); x = x + i; }
    v[i] = x;
}
""".replace("%ROUNDS%", str(ROUNDS))

RS = """
@vertex
fn vs(@builtin(vertex_index) k: u32) -> @builtin(position) vec4<f32> {
    var p = array<vec2<f32>, 3>(vec2<f32>(-1.0, -1.0), vec2<f32>(3.0, -1.0), vec2<f32>(-1.0, 3.0));
    return vec4<f32>(p[k], 0.0, 1.0);
}
fn h(x0: u32) -> u32 { var x = x0; x = x ^ (x >> 16u); x = x * 0x7feb352du; x = x ^ (x >> 15u); x = x * 0x846ca68bu; x = x ^ (x >> 16u); return x; }
@fragment
fn fs(@builtin(position) pos: vec4<f32>) -> @location(0) vec4<f32> {
    var x = u32(pos.x) + 4096u * u32(pos.y);
    for (var i = 0u; i < 64u; i = i + 1u) { x = h(x + i); }
    return vec4<f32>(vec4<u32>(x & 255u, (x >> 8u) & 255u, (x >> 16u) & 255u, 255u)) / 255.0;
}
"""


def sha_ints(b: bytes) -> list[int]:
    return list(struct.unpack("<4Q", hashlib.sha256(b).digest()))


def adapter_and_device(extra_limits: bool = False):  # type: ignore[no-untyped-def]
    import wgpu

    ads = [a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("backend_type") == "Vulkan"]
    if not ads:
        raise RuntimeError("wgpu found no Vulkan adapter (is libvulkan.so.1 there, and the ICD?)")
    ads.sort(key=lambda a: (a.info.get("adapter_type") != "DiscreteGPU", "NVIDIA" not in str(a.info).upper()))
    ad = ads[0]
    lim = {}
    if extra_limits:
        for k in ("max-buffer-size", "max-storage-buffer-binding-size"):
            lim[k] = ad.limits[k]
    return ad, ad.request_device_sync(required_limits=lim)


class Compute:
    def __init__(self, dev) -> None:  # type: ignore[no-untyped-def]
        import wgpu

        self.wgpu, self.dev = wgpu, dev
        self.buf = dev.create_buffer(size=N * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                                     | wgpu.BufferUsage.COPY_DST)
        sm = dev.create_shader_module(code=CS)
        self.pipe = dev.create_compute_pipeline(layout="auto", compute={"module": sm, "entry_point": "main"})
        self.bg = dev.create_bind_group(layout=self.pipe.get_bind_group_layout(0),
                                        entries=[{"binding": 0, "resource": {"buffer": self.buf}}])

    def run(self, read: bool = True) -> bytes | None:
        import numpy as np

        self.dev.queue.write_buffer(self.buf, 0, np.arange(N, dtype=np.uint32).tobytes())
        enc = self.dev.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(self.pipe)
        p.set_bind_group(0, self.bg)
        p.dispatch_workgroups(N // 256)
        p.end()
        self.dev.queue.submit([enc.finish()])
        if read:
            return bytes(self.dev.queue.read_buffer(self.buf))
        self.dev.queue.read_buffer(self.buf, 0, 4)  # waits (on_submitted_work_done_sync is broken in 0.32)
        return None


def ref_compute() -> bytes:
    import numpy as np

    i = np.arange(N, dtype=np.uint32)
    x = i.copy()
    with np.errstate(over="ignore"):
        for _ in range(ROUNDS):
            x = x * np.uint32(1664525) + np.uint32(1013904223)
            x ^= x >> np.uint32(13)
            x += i
    return x.tobytes()


def render(dev) -> bytes:  # type: ignore[no-untyped-def]
    import wgpu

    fmt = wgpu.TextureFormat.rgba8unorm
    tex = dev.create_texture(size=(TW, TH, 1), format=fmt,
                             usage=wgpu.TextureUsage.RENDER_ATTACHMENT | wgpu.TextureUsage.COPY_SRC)
    sm = dev.create_shader_module(code=RS)
    pipe = dev.create_render_pipeline(layout="auto", vertex={"module": sm, "entry_point": "vs"},
                                      fragment={"module": sm, "entry_point": "fs", "targets": [{"format": fmt}]},
                                      primitive={"topology": wgpu.PrimitiveTopology.triangle_list})
    out = dev.create_buffer(size=TW * TH * 4, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.MAP_READ)
    enc = dev.create_command_encoder()
    rp = enc.begin_render_pass(color_attachments=[{"view": tex.create_view(), "load_op": "clear", "store_op": "store",
                                                   "clear_value": (0, 0, 0, 1)}])
    rp.set_pipeline(pipe)
    rp.draw(3)
    rp.end()
    enc.copy_texture_to_buffer({"texture": tex}, {"buffer": out, "bytes_per_row": TW * 4, "rows_per_image": TH},
                               (TW, TH, 1))
    dev.queue.submit([enc.finish()])
    out.map_sync("READ")
    data = bytes(out.read_mapped())
    out.unmap()
    return data


def ref_pixel(px: int, py: int) -> tuple[int, int, int, int]:
    M = 0xFFFFFFFF
    x = (px + 4096 * py) & M
    for i in range(64):
        x = (x + i) & M
        x ^= x >> 16; x = (x * 0x7FEB352D) & M; x ^= x >> 15; x = (x * 0x846CA68B) & M; x ^= x >> 16
    return (x & 255, (x >> 8) & 255, (x >> 16) & 255, 255)


def wgpu_oom(dev, ad) -> dict:  # type: ignore[no-untyped-def]
    import wgpu

    size = min(C.GiB, int(ad.limits["max-buffer-size"]) // 4 * 4)

    def alloc():  # type: ignore[no-untyped-def]
        buf = dev.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
                                | wgpu.BufferUsage.COPY_SRC)
        enc = dev.create_command_encoder()
        enc.clear_buffer(buf)
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(buf, size - 4, 4)  # waits; wgpu-py raises GPUOutOfMemoryError itself
        return buf

    held: list = []

    def keep():  # type: ignore[no-untyped-def]
        b = alloc()
        held.append(b)
        return b

    def release() -> None:
        for b in held:
            b.destroy()
        held.clear()

    def after() -> bool:
        return Compute(dev).run() == ref_compute()

    def is_oom(e: BaseException) -> bool:
        # wgpu checks each allocation against the device's memory heap, whose size Vulkan takes
        # from RM (under an instance: its limit) and reports a full heap as a validation error
        # without a message of its own; RM's refusal (GPUOutOfMemoryError) comes at the same
        # limit for allocations that pass that check
        return (isinstance(e, (wgpu.GPUOutOfMemoryError, wgpu.GPUValidationError))
                or "out of memory" in str(e).lower())

    out = C.oom_probe(keep, is_oom, release, after, max_chunks=int(os.environ.get("GS_COMPAT_OOM_MAX", C.MAX_CHUNKS)))
    out["chunk_bytes"] = size
    return out


def work(argv: list[str]) -> dict:
    import wgpu

    oom = C.want_oom(argv)
    ad, dev = adapter_and_device(extra_limits=oom)
    info = {k: ad.info.get(k) for k in ("vendor", "device", "description", "adapter_type", "backend_type", "vendor_id")}
    storage = Compute(dev).run()
    pix = render(dev)
    pts = [(0, 0), (TW - 1, 0), (100, 300), (TW - 1, TH - 1)]
    px_ok = [tuple(pix[(y * TW + x) * 4:(y * TW + x) * 4 + 4]) for x, y in pts] == [ref_pixel(x, y) for x, y in pts]
    cs_ok = storage == ref_compute()
    vk = info["backend_type"] == "Vulkan"
    nvidia = "NVIDIA" in f"{info['vendor']} {info['device']}".upper() or info.get("vendor_id") == 0x10DE
    soft = os.environ.get("GS_COMPAT_ALLOW_SOFTWARE") == "1"
    out = {"ok": bool(cs_ok and px_ok and vk and (nvidia or soft)), "result": [*sha_ints(storage), *sha_ints(pix)],
           "tol": 0, "adapter": info, "nvidia": nvidia, "compute_ok": cs_ok, "pixels_ok": px_ok,
           "wgpu": wgpu.__version__, "max_buffer_size": ad.limits["max-buffer-size"]}
    if not nvidia:
        out["why"] = "the Vulkan adapter is not NVIDIA (a CPU or other fallback)"
    if oom:
        out["oom"] = wgpu_oom(dev, ad)
    return out


if __name__ == "__main__":
    C.main(work)

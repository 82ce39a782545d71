"""Compatibility workload: headless OpenGL through EGL (moderngl, backend='egl'): a graphics
pipeline (a fragment shader of integer hashing into a 1024x1024 RGBA8 framebuffer) and a
GL 4.3 compute shader over an SSBO of uint, each read back and hashed (integer-exact).

  egl_render.py [--spill N]  result: [sha256(frame) as 4 ints, sha256(ssbo) as 4 ints, frame byte sum]
  --spill N: afterwards, N 16384x16384 RGBA8 textures (1 GiB each), each cleared through a
         framebuffer, their GL errors and times recorded; then released and a small render
         checked. NVIDIA's OpenGL does not fail a texture the GPU has no room for: it keeps it
         in host memory (GL_NO_ERROR, slower), on a full GPU as at an instance's limit; this
         mode shows where the textures went (the library's peak against its limit) and that
         GL goes on working, in place of an out-of-memory probe (docs/render-video.md).

Needs the wheels moderngl + glcontext and an EGL loader (libEGL.so.1) with NVIDIA's vendor
file. ok only when GL_VENDOR / GL_RENDERER name NVIDIA (GS_COMPAT_ALLOW_SOFTWARE=1 lifts
that, for trying it on Mesa's llvmpipe).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import time

import compat_common as C

W = H = 1024
ITERS = 256  # hash rounds per pixel (the "heavy" part)

VS = """
#version 430
in vec2 pos;
void main() { gl_Position = vec4(pos, 0.0, 1.0); }
"""

FS = """
#version 430
uniform uint iters;
uniform uint frame;
out vec4 color;
uint h(uint x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x; }
void main() {
    uvec2 p = uvec2(gl_FragCoord.xy);
    uint x = p.x + 4096u * p.y + 0x9e3779b9u * frame;
    uint acc = 0u;
    for (uint i = 0u; i < iters; ++i) { x = h(x + i); acc += x >> 24; }
    uvec4 c = uvec4(x & 255u, (x >> 8) & 255u, acc & 255u, 255u);
    color = vec4(c) / 255.0;  // k/255 converts back to exactly k in UNORM8
}
"""

CS = """
#version 430
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Buf { uint v[]; };
uniform uint rounds;
void main() {
    uint i = gl_GlobalInvocationID.x;
    uint x = v[i];
    for (uint r = 0u; r < rounds; ++r) { x = x * 1664525u + 1013904223u; x ^= x >> 13; x += i; }
    v[i] = x;
}
"""

N_CS = 1 << 20
CS_ROUNDS = 512


def sha_ints(b: bytes) -> list[int]:
    return list(struct.unpack("<4Q", hashlib.sha256(b).digest()))


def is_nvidia(info: dict) -> bool:
    s = f"{info.get('GL_VENDOR', '')} {info.get('GL_RENDERER', '')}"
    return "NVIDIA" in s.upper()


class Scene:
    """The context, a fullscreen quad and the heavy fragment program; render() one frame."""

    def __init__(self, width: int = W, height: int = H, iters: int = ITERS) -> None:
        import moderngl
        import numpy as np

        self.mgl = moderngl
        self.ctx = moderngl.create_standalone_context(backend="egl", require=430)
        self.prog = self.ctx.program(vertex_shader=VS, fragment_shader=FS)
        self.prog["iters"].value = iters
        quad = np.array([-1, -1, 1, -1, -1, 1, -1, 1, 1, -1, 1, 1], dtype="f4")
        self.vbo = self.ctx.buffer(quad.tobytes())
        self.vao = self.ctx.vertex_array(self.prog, [(self.vbo, "2f", "pos")])
        self.fbo = self.ctx.simple_framebuffer((width, height), components=4)

    def render(self, frame: int = 0, read: bool = True) -> bytes | None:
        self.fbo.use()
        self.fbo.clear(0.0, 0.0, 0.0, 1.0)
        self.prog["frame"].value = frame
        self.vao.render(self.mgl.TRIANGLES)
        if not read:
            self.ctx.finish()
            return None
        return self.fbo.read(components=4, alignment=1)

    def compute(self, n: int = N_CS, rounds: int = CS_ROUNDS) -> bytes:
        import numpy as np

        cs = self.ctx.compute_shader(CS)
        cs["rounds"].value = rounds
        buf = self.ctx.buffer(np.arange(n, dtype=np.uint32).tobytes())
        buf.bind_to_storage_buffer(0)
        cs.run(group_x=n // 256)
        self.ctx.memory_barrier()
        data = buf.read()
        buf.release()
        cs.release()
        return data


def ref_compute(n: int, rounds: int) -> bytes:
    import numpy as np

    i = np.arange(n, dtype=np.uint32)
    x = i.copy()
    with np.errstate(over="ignore"):
        for _ in range(rounds):
            x = x * np.uint32(1664525) + np.uint32(1013904223)
            x ^= x >> np.uint32(13)
            x += i
    return x.tobytes()


def ref_pixels(iters: int, pts: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """The fragment shader on the CPU for a few pixels (frame 0)."""
    M = 0xFFFFFFFF

    def h(x: int) -> int:
        x ^= x >> 16; x = (x * 0x7FEB352D) & M; x ^= x >> 15; x = (x * 0x846CA68B) & M; x ^= x >> 16
        return x

    out = []
    for px, py in pts:
        x, acc = (px + 4096 * py) & M, 0
        for i in range(iters):
            x = h((x + i) & M)
            acc = (acc + (x >> 24)) & M
        out.append((x & 255, (x >> 8) & 255, acc & 255, 255))
    return out


def gl_spill(sc: Scene, n: int) -> dict:
    ctx = sc.ctx
    side = 16384  # 16384^2 * 4 B = 1 GiB
    held: list = []
    errors, seconds = [], []
    for _ in range(n):
        t = time.monotonic()
        tex = ctx.texture((side, side), 4)
        fbo = ctx.framebuffer(color_attachments=[tex])
        fbo.use()
        fbo.clear(0.25, 0.5, 0.75, 1.0)  # make it resident
        ctx.finish()
        errors.append(ctx.error)
        seconds.append(round(time.monotonic() - t, 3))
        held.append((fbo, tex))
    for fbo, tex in held:
        fbo.release()
        tex.release()
    ctx.error  # noqa: B018 - reading it clears a stale error of the releases
    small = ctx.simple_framebuffer((64, 64), components=4)
    s2 = Scene.__new__(Scene)
    s2.__dict__.update(sc.__dict__)
    s2.fbo = small
    data = s2.render(0)
    want = ref_pixels(ITERS, [(0, 0), (63, 63)])
    got = [tuple(data[0:4]), tuple(data[(63 * 64 + 63) * 4:(63 * 64 + 63) * 4 + 4])]
    return {"chunks": n, "chunk_bytes": side * side * 4, "gl_errors": errors, "seconds": seconds,
            "after_ok": got == want}


def work(argv: list[str]) -> dict:
    sc = Scene()
    info = {k: sc.ctx.info.get(k) for k in ("GL_VENDOR", "GL_RENDERER", "GL_VERSION")}
    frame = sc.render(0)
    assert frame is not None and len(frame) == W * H * 4
    pts = [(0, 0), (W - 1, 0), (17, 513), (W - 1, H - 1)]
    want_px = ref_pixels(ITERS, pts)
    got_px = [tuple(frame[(y * W + x) * 4:(y * W + x) * 4 + 4]) for x, y in pts]
    frame2 = sc.render(0)
    ssbo = sc.compute()
    cs_ok = ssbo == ref_compute(N_CS, CS_ROUNDS)
    nvidia = is_nvidia(info)
    soft_ok = os.environ.get("GS_COMPAT_ALLOW_SOFTWARE") == "1"
    err = sc.ctx.error
    out = {"ok": bool(got_px == want_px and frame2 == frame and cs_ok and err == "GL_NO_ERROR"
                      and (nvidia or soft_ok)),
           "result": [*sha_ints(frame), *sha_ints(ssbo), sum(frame)], "tol": 0,
           "gl": info, "nvidia": nvidia, "pixels_ok": got_px == want_px, "repeat_ok": frame2 == frame,
           "compute_ok": cs_ok, "gl_error": err}
    if not nvidia:
        out["why"] = "GL_VENDOR/GL_RENDERER is not NVIDIA (a software or other fallback)"
    if "--spill" in argv:
        out["spill"] = gl_spill(sc, int(argv[argv.index("--spill") + 1]))
    return out


if __name__ == "__main__":
    C.main(work)

"""libgpuslice.so against the real NVIDIA driver (run on the GPU machine by scripts/gpu-run.sh).

Skipped without /dev/nvidiactl and libcuda. Every workload's raw output goes to
$GPUSLICE_RAW/raw.txt for docs/real-gpu.md. Runs under pytest, or alone:
python3 tests/gpu/test_gpu.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common as g  # noqa: E402

try:
    import pytest

    pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not g.have_gpu(), reason="no NVIDIA GPU / libcuda")]
except ImportError:  # the GPU machine may have no pytest: see __main__
    pytest = None

LIMIT = "4GiB"
L = 4 * g.GiB
WL_TORCH = str(g.HERE / "wl_torch.py")
WL_CUDA = str(g.HERE / "wl_cuda.py")
RESULTS: dict = {}


def setup_module(module=None):
    if g.have_gpu():
        g.build()


def teardown_module(module=None):
    if RESULTS:
        (g.RAW / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def _torch_limit(extra: dict, title: str) -> dict:
    out, err, st = g.run([WL_TORCH, "limit", "256"], LIMIT, title, extra=extra)
    assert out["_rc"] == 0, err[-3000:]
    ctx = out["total0"] - out["free0"]
    RESULTS[title] = {"ctx_reserved_mib": ctx / g.MiB, "allocated_mib": out["allocated"] / g.MiB,
                      "stats": st}
    assert out["total0"] == L and out["total1"] == L and out["total2"] == L
    assert 0 < ctx < 1 * g.GiB  # the context's own memory is charged to the instance
    assert out["oom"] is not None and out["second"] == "OutOfMemoryError" and out["ok_after"]
    # up to the limit: no more than the limit, and less than one chunk (+ padding) short of it
    assert out["allocated"] + ctx <= L
    assert out["allocated"] + ctx > L - 256 * g.MiB - 64 * g.MiB
    assert out["free1"] < 256 * g.MiB + 64 * g.MiB
    assert abs(out["free2"] - out["free0"]) <= 64 * g.MiB  # empty_cache gave it back
    assert st["refused_filter"] == 0, "deny-by-default refused a call PyTorch needs"
    assert st["refused_quota"] >= 1 and st["peak"] <= L + 8 * g.MiB
    return out


def test_torch_limit_oom_and_mem_get_info():
    _torch_limit({}, "torch 4GiB: allocate 256 MiB tensors until OutOfMemoryError")


def test_torch_limit_expandable_segments():
    _torch_limit({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                 "torch 4GiB, expandable_segments (cuMemCreate)")


def test_fork_after_cuda():
    """DataLoader workers and subprocesses fork a process that holds CUDA: the child gets a
    fresh instance (no inherited lock), the parent's accounting is untouched."""
    out, err, st = g.run([WL_TORCH, "fork"], LIMIT, "torch: CUDA, then DataLoader(num_workers=2) and fork+exec")
    assert out["_rc"] == 0, err[-3000:]
    RESULTS["fork"] = {k: v for k, v in out.items() if not k.startswith("_")}
    assert out["sum"] == sum(range(4096)) and out["true_rc"] == 0 and out["gpu_ok"]
    assert out["total0"] == L and out["free1"] == out["free0"]
    assert st["refused_filter"] == 0


def test_cuda_driver_alloc():
    out, err, st = g.run([WL_CUDA, "alloc", "256"], LIMIT, "driver API: cuMemAlloc 256 MiB until OOM")
    assert out["_rc"] == 0, err[-3000:]
    ctx = out["total0"] - out["free0"]
    RESULTS["cuda alloc"] = {"ctx_reserved_mib": ctx / g.MiB, "allocated_mib": out["allocated"] / g.MiB}
    assert out["total0"] == L and out["error"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert out["allocated"] + ctx <= L and out["allocated"] + ctx > L - 320 * g.MiB
    assert out["free2"] == out["free0"]
    assert st["refused_filter"] == 0 and st["refused_quota"] >= 1


def test_cuda_driver_vmm():
    out, err, st = g.run([WL_CUDA, "vmm", "256"], LIMIT, "driver API: cuMemCreate 256 MiB until OOM")
    assert out["_rc"] == 0, err[-3000:]
    RESULTS["cuda vmm"] = {"allocated_mib": out["allocated"] / g.MiB, "error": out["error"]}
    assert out["total0"] == L and out["error"] == 2
    assert out["allocated"] <= L and out["allocated"] > L - 1 * g.GiB
    assert st["refused_filter"] == 0


def test_managed_memory_behaviour():
    """cuMemAllocManaged goes through nvidia-uvm: not counted (documented), but must work."""
    out, err, st = g.run([WL_CUDA, "managed", "512"], LIMIT, "driver API: cuMemAllocManaged 512 MiB + memset")
    assert out["_rc"] == 0, err[-3000:]
    RESULTS["managed"] = {k: v for k, v in out.items() if not k.startswith("_")} | {"stats": st}
    assert out["alloc_error"] == 0 and out["total0"] == L


def test_nvidia_smi_sees_the_limit():
    for args, title in ((["nvidia-smi", "--query-gpu=name,memory.total,memory.used,memory.free",
                          "--format=csv,noheader,nounits"], "nvidia-smi query under the preload"),
                        (["nvidia-smi", "-q", "-d", "MEMORY"], "nvidia-smi -q -d MEMORY under the preload")):
        out, err, st = g.run(args, LIMIT, title)
        RESULTS[title] = {"rc": out["_rc"], "stats": st}
    full, err, st = g.run(["nvidia-smi", "-q"], LIMIT, "nvidia-smi -q (all of it) under the preload")
    RESULTS["nvidia-smi -q"] = {"rc": full["_rc"], "stats": st}
    assert full["_rc"] == 0 and st["refused_filter"] == 0, err[-2000:]
    plain = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    g.raw("nvidia-smi query without the preload", plain.stdout + plain.stderr)
    p = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"],
                       env=g.env_for(LIMIT), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    total, free = (int(x) for x in p.stdout.strip().splitlines()[0].split(","))
    assert total == 4096, p.stdout


def test_foreign_disable_channels_refused_but_works_without():
    lst = g.Listener()
    victim = subprocess.Popen([sys.executable, WL_TORCH, "victim", "12"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=g.env_for(LIMIT, name="victim", sock=lst.path))
    line = victim.stdout.readline()
    assert "ready" in line, victim.stderr.read()[-3000:]
    time.sleep(1.0)
    ev = lst.snapshot()
    chans = [(e["client"], e["handle"]) for e in ev if e.get("event") == 3]  # proof_file lines have none
    assert len(chans) >= 1
    pairs = [f"{c:#x}:{h:#x}" for c, h in chans[:64]]
    time.sleep(1.0)
    t_with = time.perf_counter()
    refused, err1, st1 = g.run([str(g.HERE / "rmclient.py"), "1.0", *pairs], LIMIT,
                               "second process, own client, FIFO_DISABLE_CHANNELS on the victim: WITH preload")
    time.sleep(1.5)
    t_without = time.perf_counter()
    worked, err2, _ = g.run([str(g.HERE / "rmclient.py"), "1.5", *pairs], None,
                            "same call WITHOUT preload (real driver decides)")
    t_end = time.perf_counter()
    vout, verr = victim.communicate(timeout=60)
    g.raw("victim (matmuls per 0.5 s window)", vout + "\n" + "\n".join(
        x for x in verr.splitlines() if '"event":' not in x)[-3000:])
    v = json.loads(vout.strip().splitlines()[-1])
    RESULTS["disable"] = {"with": refused, "without": worked, "victim": v["windows"],
                          "t_with": t_with, "t_without": t_without, "t_end": t_end, "channels": len(chans)}
    assert refused["client"][3] == 0 and refused["subdevice"][3] == 0
    assert refused["disable"][2] == 0x1B and refused["enable"][2] == 0x1B
    assert st1["refused_filter"] == 2
    assert worked["disable"][2] == 0 and worked["enable"][2] == 0, worked
    assert victim.returncode == 0


if __name__ == "__main__":
    if not g.have_gpu():
        print("SKIP: no GPU")
        sys.exit(0)
    setup_module()
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASS {name}", flush=True)
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    teardown_module()
    print(json.dumps(RESULTS, indent=1, default=str))
    sys.exit(1 if failed else 0)

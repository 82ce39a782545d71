"""Instances of two GPUs on a machine with two GPUs, through the user-space build (docs/multigpu.md):
PyTorch DDP (2 processes, NCCL all-reduce) and a model-parallel matmul under per-GPU
limits (GPUSLICE_MEM_LIMIT=0=8GiB,1=4GiB), OutOfMemoryError at each GPU's limit, the
limits nvidia-smi shows, CUDA IPC within and across instances, shareable VMM handles
(wl_vmm_share.py), and all-reduce bandwidth with and without the library. Prints a table; raw output to $GPUSLICE_RAW/raw.txt.

  python3 tests/gpu/bench_multigpu.py --out DIR [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import HERE, SO, env_for, raw, run  # noqa: E402

LIMIT = "0=8GiB,1=4GiB"
GIB = 1 << 30
WL = str(HERE / "wl_multigpu.py")


def ddp(limit: str | None, port: int, sizes: list[int]) -> dict:
    """Both ranks at once; rank 0's figures, and each rank's refusals and NCCL transports."""
    procs, stats = [], []
    for rank in (0, 1):
        st = Path(tempfile.mktemp(prefix="gs-stats-"))
        stats.append(st)
        env = env_for(limit, name="ddp", stats=st, extra={"NCCL_DEBUG": "INFO"})
        procs.append(subprocess.Popen([sys.executable, WL, "ddp", str(rank), "2", str(port), *map(str, sizes)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out: dict = {"limit": limit, "ranks": []}
    for rank, (p, st) in enumerate(zip(procs, stats)):
        try:
            so, se = p.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        res = next((json.loads(x) for x in reversed(so.splitlines()) if x.startswith("{")), {})
        transports = sorted({x.split(" via ", 1)[1].strip() for x in (so + se).splitlines()  # NCCL logs to stdout
                             if "NCCL INFO Channel" in x and " via " in x})
        refused = [x for x in se.splitlines() if "gpuslice: refused" in x]
        counters = json.loads(st.read_text().splitlines()[-1]) if st.exists() and st.read_text() else {}
        st.unlink(missing_ok=True)
        keep = "\n".join(x for x in se.splitlines() if '"event":' not in x)[-5000:]
        raw(f"ddp rank {rank} limit={limit}", f"rc={p.returncode}\n--- stdout\n{so[-3000:]}\n--- stderr\n{keep}")
        out["ranks"].append({"rc": p.returncode, **res, "transports": transports, "refused": refused[:10],
                             "refused_filter": counters.get("refused_filter"),
                             "refused_quota": counters.get("refused_quota")})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="64,256,1024", help="all-reduce sizes, MiB")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GPUSLICE_RAW", str(a.out))
    sizes = [int(s) for s in a.sizes.split(",")]
    res: dict = {"limit": LIMIT}

    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    raw("nvidia-smi topo -m", topo)
    smi = {}
    for limit in (None, LIMIT):
        p = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total,memory.used", "--format=csv,noheader"],
                           env=env_for(limit, name="smi"), capture_output=True, text=True)
        raw(f"nvidia-smi limit={limit}", p.stdout + p.stderr[-2000:])
        smi[str(limit)] = p.stdout.strip().splitlines()
    res["nvidia_smi"] = smi

    res["oom"] = [run([WL, "oom", str(g)], LIMIT, f"oom gpu {g}")[0] for g in (0, 1)]
    res["mp"] = {str(lim): run([WL, "mp"], lim, f"model parallel limit={lim}")[0] for lim in (None, LIMIT)}
    res["ipc"] = {name: run([WL, "ipc", name], LIMIT, f"ipc to {name}", name="ipc-a")[0]
                  for name in ("ipc-a", "ipc-b")}
    # shareable handles through a POSIX fd: within a process, to another process of the
    # instance (preload/siblings.c), and to a process of another instance (refused)
    res["vmm_share"] = {mode: run([str(HERE / "wl_vmm_share.py"), mode, "64"], LIMIT, f"vmm share {mode}")[0]
                        for mode in ("same", "fork", "other")}
    res["ddp"] = []
    for r in range(a.rounds):
        for lim in (None, LIMIT):
            res["ddp"].append(ddp(lim, 29500 + 2 * r + (lim is not None), sizes))

    (a.out / "multigpu.json").write_text(json.dumps(res, indent=1))
    lines = [f"limits {LIMIT} (GPUSLICE_MEM_LIMIT), library {SO}"]
    lines.append("nvidia-smi memory.total: " + json.dumps(smi))
    for o in res["oom"]:
        lines.append(f"oom gpu {o.get('gpu')}: allocated {o.get('allocated', 0) / GIB:.2f} GiB, "
                     f"OutOfMemoryError={o.get('oom')}, mem_get_info total {o.get('mem_get_info_total', 0) / GIB:.2f} GiB")
    for k, m in res["mp"].items():
        lines.append(f"model parallel limit={k}: ok={m.get('ok')} rel_err={m.get('rel_err')} "
                     f"peer={m.get('peer_access')} {m.get('iter_ms', 0):.2f} ms/iter rc={m.get('_rc')}")
    for k, m in res["ipc"].items():
        lines.append(f"ipc ipc-a -> {k}: child {m.get('child')} want {m.get('want_sum')} "
                     f"refusals {m.get('child_refusals')}")
    for k, m in res["vmm_share"].items():
        lines.append(f"shareable handle ({k}): ok={m.get('ok')} child={m.get('child')} error={m.get('error')}")
    base = {s: [] for s in map(str, sizes)}
    lib = {s: [] for s in map(str, sizes)}
    for d in res["ddp"]:
        r0 = d["ranks"][0]
        lines.append(f"ddp limit={d['limit']}: rc={[x['rc'] for x in d['ranks']]} "
                     f"sum_ok={[x.get('sum_ok') for x in d['ranks']]} busbw={r0.get('busbw_gbs')} "
                     f"transports={r0.get('transports')} refused_filter={[x.get('refused_filter') for x in d['ranks']]}")
        for s, v in (r0.get("busbw_gbs") or {}).items():
            (lib if d["limit"] else base)[s].append(v)
    for s in base:
        if base[s] and lib[s]:
            b, lb = sorted(base[s])[len(base[s]) // 2], sorted(lib[s])[len(lib[s]) // 2]
            lines.append(f"all-reduce {s} MiB busbw median: without {b} GB/s, with {lb} GB/s, ratio {lb / b:.3f}")
    text = "\n".join(lines)
    print(text)
    (a.out / "multigpu.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

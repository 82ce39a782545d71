#!/usr/bin/env bash
# Runs INSIDE the guest (scripts/demo.sh boots it): the stand-in NVIDIA driver,
# gpuslice.ko, two instances, CUDA's recorded init through an instance's nodes
# bind-mounted at /dev/nvidia*, the memory limit, and the scheduler.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" GPUSLICE_STATE=/tmp/gpuslice-state.json
PY=.venv/bin/python
step() { printf '\n==== %s\n' "$*"; }

step "load the stand-in driver (test double of nvidia.ko) and gpuslice.ko"
insmod tests/standin/nvstub.ko fb_mib=81559
insmod kmod/gpuslice.ko require_device_cgroup=0  # the shipped module, as DKMS builds it
ls -l /dev/nvidiactl /dev/nvidia0 /dev/nvidia-uvm
dmesg | grep -E 'gpuslice|nvstub' | tail -n 5

step "gpuctl instance create (limits: web 4 GiB, batch 512 MiB)"
gpuctl instance create web --gpu 0 --memory 4GiB --weight 3
gpuctl instance create batch --gpu 0 --memory 512MiB --weight 1
gpuctl instance list
ls -l /dev/gpuslice/web /dev/gpuslice/batch

for inst in web batch; do
    step "PyTorch's recorded H100 session (1 GiB tensor) replayed through '$inst', nodes bind-mounted at /dev/nvidia*"
    rc=0
    unshare -m bash -c "
        for n in nvidiactl nvidia0 nvidia-uvm; do mount --bind /dev/gpuslice/$inst/\$n /dev/\$n; done
        $PY -m gpuslice.trace.replay --json tests/traces/torch-matmul.log.gz" >"/tmp/replay-$inst.json" || rc=$?
    # web (4 GiB) must answer every call as the H100 did; batch (512 MiB) must differ
    # only where the 1 GiB allocation is refused with NV_ERR_NO_MEMORY, as RM refuses it.
    $PY - "$inst" "$rc" "/tmp/replay-$inst.json" <<'PYEOF'
import json, sys
inst, rc, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rep = json.load(open(path))
print(f"trace {rep['trace']}: " + " ".join(f"{k}={v}" for k, v in rep["summary"].items()))
bad = [r for r in rep["results"] if r["category"] == "mismatch"]
for r in bad:
    print(f"  [{r['index']}] mismatch {r['name']}: expected {r['expected']}, got {r['got']}")
if inst == "web" and (rc != 0 or bad):
    sys.exit("demo: the replay through 'web' did not answer as the H100 did")
if inst == "batch" and not (bad and "NV_ERR_NO_MEMORY" in bad[0]["got"]):
    sys.exit("demo: through 'batch' the 1 GiB allocation was not refused with NV_ERR_NO_MEMORY")
PYEOF
done
echo "(through 'batch' the 1 GiB allocation is refused with NV_ERR_NO_MEMORY, as RM itself refuses)"

step "memory: allocate 64 MiB at a time through 'batch' until refused; FB_GET_INFO_V2 as CUDA sees it"
$PY - <<'PYEOF'
import sys
sys.path[:0] = ["tests/guest", "pyctl"]
from gpuslice import abi
from gpuslice.netlink import GpusliceNetlink
import gsinst
MIB = 1 << 20
nl = GpusliceNetlink()
s = gsinst.InstSession(gsinst.node("batch", "nvidiactl"), gsinst.node("batch", "nvidia0"))
def mem() -> str:
    (d,) = nl.instances("batch")
    return (f"FB_GET_INFO_V2 heap free {s.fb_free_kib() // 1024} MiB; "
            f"instance limit {d['mem_limit'] // MIB} MiB used {d['mem_used'] // MIB} MiB peak {d['mem_peak'] // MIB} MiB")
print("before:", mem())
handles = []
while True:
    st, h, size = s.alloc_vidmem(64 * MIB)
    if st != abi.NV_OK:
        print(f"allocation {len(handles) + 1} refused: status {st:#x} ({abi.STATUS_NAMES.get(st)})")
        break
    handles.append(h)
print(f"{len(handles)} x 64 MiB allocated:", mem())
for h in handles:
    s.free(h)
print("after free:", mem())
s.close()
PYEOF

step "gpuctl status"
gpuctl instance show batch

step "scheduler on the stand-in's simulated engine (weight policy 1:3, then burst)"
$PY scripts/bench-scheduler.py --only weight --windows 2 || true

step "unload"
rmmod gpuslice
rmmod nvstub
echo "demo done"

#!/bin/bash
# The driver-release checks on a GPU host (docs/driver-versions.md): the driver's release,
# its installed source (/usr/src/nvidia-<version>, when the driver ships it) against the
# values abi/versions.tsv gives that release, the library's choice of table, doctor's
# driver check, then tests/gpu through scripts/gpu-run.sh. Raw output: $OUT (default
# /tmp/gpuslice-out): driver.txt, and gpu-run.sh's files.
# Usage: scripts/gpu-driver-check.sh   (carry .whl and .whlop for doctor's pip install)
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpuslice-out}"
mkdir -p "$OUT"
{
set -x
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
v="$(cat /sys/module/nvidia/version)"
ls -d /usr/src/nvidia* 2>&1
for d in "/usr/src/nvidia-$v" "/usr/src/nvidia-open-$v"; do
    [ -d "$d" ] && python3 scripts/nvrm-abi.py extract --source "$d" --compare "$v"
done
make -s -C preload
GPUSLICE_DEBUG=1 GPUSLICE_MEM_LIMIT=4GiB LD_PRELOAD="$PWD/preload/libgpuslice.so" python3 -c '
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("1 GiB: allocated")
try:
    y = torch.empty(6 << 30, dtype=torch.uint8, device="cuda"); print("6 GiB: allocated (limit not held)")
except torch.cuda.OutOfMemoryError as e:
    print("6 GiB: OutOfMemoryError:", str(e).splitlines()[0][:100])
' 2>&1 | grep -v '"event"' | head -20
python3 -m venv --system-site-packages /tmp/op && /tmp/op/bin/pip install -q --no-index --find-links .whl --find-links .whlop . 2>&1 | tail -3
/tmp/op/bin/gpuctl doctor 2>&1 | grep -i -A1 'driver'
} > "$OUT/driver.txt" 2>&1
OUT="$OUT" bash scripts/gpu-run.sh tests

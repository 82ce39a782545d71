#!/usr/bin/env bash
# The nvidia-uvm hole on a real GPU (device tool): tests/gpu/uvm_hole.py natively, under
# the current preload library at a 4 GiB limit and, when PRELOAD_BEFORE names the preload/
# folder of an earlier source tree (with its ../kmod/core beside it), under that library
# too; tests/gpu/uvm_legit.py natively and under the libraries. Raw output goes to $OUT
# (default /tmp/gpuslice-out):
#   env.txt                   GPU, driver, versions
#   hole-native.json          uvm_hole.py CHUNK N, no library             (.err: its stderr)
#   hole-native-unmap.json    uvm_hole.py CHUNK N --unmap, no library
#   build.txt                 make -C preload (and PRELOAD_BEFORE)
#   hole-preload.json         under LD_PRELOAD=preload/libgpuslice.so GPUSLICE_MEM_LIMIT=4G
#   hole-preload-before.json  the same under the earlier library
#   stats.json, stats-before.json   the library's GPUSLICE_STATS for those two runs
#   legit-native.jsonl        uvm_legit.py, no library (one JSON line per case)
#   legit-preload.jsonl       uvm_legit.py under the current library, GPUSLICE_MEM_LIMIT=4G
#   legit-preload-before.jsonl      the same under the earlier library
#   hole-preload-unmap.json   uvm_hole.py CHUNK N --unmap under the current library
#   regions-native.json       uvm_regions.py 20000 (page tables alone), no library
#   regions-preload.json      the same under the current library (capped)
# Usage: [PRELOAD_BEFORE=dir] tests/gpu/uvm_hole_run.sh [CHUNK_MIB N]   (default 1024 6)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpuslice-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
chunk="${1:-1024}"
n="${2:-6}"
before="${PRELOAD_BEFORE:-}"
{
	date -u
	uname -r
	nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,persistence_mode,compute_mode --format=csv
	cat /proc/driver/nvidia/version
	python3 -c 'import sys; print("python", sys.version.split()[0])'
	python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
	python3 -c 'import cupy; print("cupy", cupy.__version__)'
	python3 -c 'import pynvml; print("pynvml", getattr(pynvml, "__version__", "?"))'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

hole() { # name, then the command
	local name=$1
	shift
	timeout 60 "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
	echo "== $name rc=$?"
	cat "$OUT/$name.json"
	tail -5 "$OUT/$name.err"
}
legit() { # name, then the command
	local name=$1
	shift
	timeout 100 "$@" >"$OUT/$name.jsonl" 2>"$OUT/$name.err"
	echo "== $name rc=$?"
	cat "$OUT/$name.jsonl"
	tail -5 "$OUT/$name.err"
}

cur=""
old=""
make -C preload >"$OUT/build.txt" 2>&1 && cur="$PWD/preload/libgpuslice.so"
if [[ -n $before ]]; then
	make -C "$before" >>"$OUT/build.txt" 2>&1 && old="$(cd "$before" && pwd)/libgpuslice.so"
fi
echo "== libraries: current=${cur:-BUILD FAILED} before=${old:-none}"
[[ -n $cur ]] || tail -20 "$OUT/build.txt"

hole hole-native python3 tests/gpu/uvm_hole.py "$chunk" "$n"
if [[ -n $old ]]; then
	hole hole-preload-before env LD_PRELOAD="$old" GPUSLICE_MEM_LIMIT=4G GPUSLICE_STATS="$OUT/stats-before.json" \
		python3 tests/gpu/uvm_hole.py "$chunk" "$n"
	echo "== stats-before.json"
	cat "$OUT/stats-before.json" 2>/dev/null
	echo
fi
if [[ -n $cur ]]; then
	hole hole-preload env LD_PRELOAD="$cur" GPUSLICE_MEM_LIMIT=4G GPUSLICE_STATS="$OUT/stats.json" \
		python3 tests/gpu/uvm_hole.py "$chunk" "$n"
	echo "== stats.json"
	cat "$OUT/stats.json" 2>/dev/null
	echo
fi
legit legit-native python3 tests/gpu/uvm_legit.py
[[ -n $cur ]] && legit legit-preload env LD_PRELOAD="$cur" GPUSLICE_MEM_LIMIT=4G python3 tests/gpu/uvm_legit.py
hole hole-native-unmap python3 tests/gpu/uvm_hole.py "$chunk" "$n" --unmap
[[ -n $cur ]] && hole hole-preload-unmap env LD_PRELOAD="$cur" GPUSLICE_MEM_LIMIT=4G \
	python3 tests/gpu/uvm_hole.py "$chunk" "$n" --unmap
# page tables alone (UVM_MAP_DYNAMIC_PARALLELISM_REGION): natively, then capped by the library
hole regions-native python3 tests/gpu/uvm_regions.py 20000
[[ -n $cur ]] && hole regions-preload env LD_PRELOAD="$cur" GPUSLICE_MEM_LIMIT=4G \
	python3 tests/gpu/uvm_regions.py 20000
[[ -n $old ]] && legit legit-preload-before env LD_PRELOAD="$old" GPUSLICE_MEM_LIMIT=4G python3 tests/gpu/uvm_legit.py
nvidia-smi --query-gpu=memory.used --format=csv >>"$OUT/env.txt" 2>&1
exit 0

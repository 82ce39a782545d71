#!/usr/bin/env bash
# Probe: what JAX and NCCL ask RM, with and without libgpuslice.so (rmtrace counts).
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/probe}; mkdir -p "$OUT/t"
make -s -C preload >/dev/null || exit 1
gcc -O2 -shared -fPIC -o /tmp/rmtrace.so tests/gpu/rmtrace.c -ldl -lpthread || exit 1
nvidia-smi -q | grep -i -A3 "fabric" | head -20 > "$OUT/env.txt"
nvidia-smi topo -m >> "$OUT/env.txt" 2>&1
ls -la /dev/nvidia* /dev/nvidia-caps* 2>&1 >> "$OUT/env.txt"
systemctl is-active nvidia-fabricmanager >> "$OUT/env.txt" 2>&1
cat /proc/driver/nvidia/params | grep -i imex >> "$OUT/env.txt"
SO=$PWD/preload/libgpuslice.so
run() { # name mode cmd...
	local name=$1 mode=$2; shift 2
	local pre=/tmp/rmtrace.so lim=()
	[[ $mode != native ]] && pre="/tmp/rmtrace.so:$SO" && lim=(GPUSLICE_MEM_LIMIT=${mode#lim} GPUSLICE_DEBUG=1)
	[[ $mode == lim ]] && lim=(GPUSLICE_DEBUG=1)
	echo "==== $name $mode" >> "$OUT/runs.txt"
	( env "${lim[@]}" LD_PRELOAD=$pre RMTRACE_OUT="$OUT/t/$name-$mode" timeout 300 "$@" ) > "$OUT/t/$name-$mode.out" 2>&1
	echo "rc=$?" >> "$OUT/runs.txt"
	tail -3 "$OUT/t/$name-$mode.out" >> "$OUT/runs.txt"
	grep "gpuslice: refused" "$OUT/t/$name-$mode.out" | sort | uniq -c | sort -rn | head -20 >> "$OUT/runs.txt"
}
run jax native python3 tests/gpu/probe/jax_min.py
run jax lim python3 tests/gpu/probe/jax_min.py
run jax lim8G python3 tests/gpu/probe/jax_min.py
run ddp native python3 tests/gpu/probe/ddp_min.py
run ddp lim8G python3 tests/gpu/probe/ddp_min.py
run torch native python3 -c 'import torch; x=torch.randn(4096,4096,device="cuda"); print((x@x).sum().item())'
cat "$OUT/runs.txt"
tar czf "$OUT/traces.tgz" -C "$OUT" t
python3 - "$OUT" <<'PY'
import glob, json, sys, collections
out = sys.argv[1]
for pre in sorted({f.rsplit(".", 1)[0] for f in glob.glob(out + "/t/*-*.[0-9]*")}):
    c = collections.Counter(); fab = []
    for f in glob.glob(pre + ".*"):
        if f.endswith(".out"): continue
        for l in open(f):
            d = json.loads(l)
            if "fabric" in d: fab.append(d["fabric"]); continue
            if d["status"] != 0: c[(hex(d["esc"]), hex(d["what"]), hex(d["status"]))] += d["n"]
    print("##", pre.rsplit("/", 1)[1], "non-OK:", dict(c))
    for x in fab[:4]: print("   fabric", x)
    allc = collections.Counter()
    for f in glob.glob(pre + ".*"):
        if f.endswith(".out"): continue
        for l in open(f):
            d = json.loads(l)
            if "esc" in d and (d["what"] in (0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xe0) or (d["what"] >> 16) in (0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xe0)): allc[(hex(d["esc"]), hex(d["what"]), hex(d["status"]))] += d["n"]
    print("   fabric-ish classes:", dict(allc))
PY

#!/usr/bin/env bash
# What runs on the GPU machine (the device tool): builds preload/libgpuslice.so from
# source there, runs tests/gpu (pytest if present, else the file's own runner), then
# the overhead benchmark. Raw output goes to $OUT (default /tmp/gpuslice-out):
#   env.txt      date, GPU, driver, kernel, versions
#   tests.txt    test run
#   bench.txt    overhead figures
#   raw.txt      every workload's command line and raw output
#   results.json figures the tests measured
# sched (not part of all): `gpuctl daemon` gating real workloads (tests/gpu/bench_sched.py,
# then tests/gpu/test_sched.py); docs/h100-scheduler.md. Its files:
#   sched.txt    log and tables     sched.json     every figure
#   daemon.log   the daemon's log   sched-raw.tgz  completion times, status samples
#   sched-tests.txt                 pytest of tests/gpu/test_sched.py (SCHED_TESTS=0: skipped)
# SCHED_ARGS: extra arguments for bench_sched.py.
# activity (not part of all): tests/gpu/bench_activity.py, activity probes against
# spinning and sleep-polling workloads: activity.txt, activity.json, daemon.log.
# priority (not part of all): tests/gpu/bench_priority.py, an online service beside an
# offline trainer (PRIORITY_ARGS): priority.txt, priority.json.
# multigpu (not part of all; two GPUs): tests/gpu/bench_multigpu.py, DDP, model
# parallel, OOM per GPU, CUDA IPC across instances under per-GPU limits: multigpu.txt,
# multigpu.json, raw.txt.
# compat (not part of all): tests/gpu/compat.py, the compatibility matrix: each workload of
# tests/gpu/compat/ (PyTorch eager, torch.compile, CUDA graphs, AMP, cuDNN, transformers,
# JAX, CuPy, Triton, NVML; DDP, FSDP and pmap on two GPUs) without and with the library,
# results compared; COMPAT_ARGS: extra arguments (--limit 8G --only a,b --gpus 1|2). Its files:
#   compat.txt   the table      compat.json   every figure, both runs' JSON, refusals
#   raw.txt      each run's command line and output
# The daemon needs click, pyroute2 and nvidia-ml-py; a folder .devsite (carried with the
# device tool, git-ignored) is added to PYTHONPATH for what the machine lacks (pyroute2).
# kube (not part of all): tests/gpu/kube_h100.py, the DRA plugin on the real driver (inventory
# from NVML and RM, slices, a prepared claim, PyTorch under the claim's limit): kube.txt, raw.txt.
# It needs grpcio, protobuf and kubernetes (in .devsite) and the generated kube/gen (carried).
# mix (not part of all): tests/gpu/bench_mix.py, three frameworks under each policy with the
# daemon on its default paths, RM calls per switch, daemon restarts (MIX_ARGS): mix.txt,
# mix.json, mix-work/daemon.log.
# render (not part of all): the render and video workloads (EGL, Vulkan, NVDEC, NVJPG) of
# tests/gpu/compat/, each first alone under tests/gpu/rmtrace.so (every RM call the real
# driver sees, and the device files opened: render-trace.jsonl), then through compat.py
# (without and with the library, results compared: compat.txt, compat.json, raw.txt).
# Needs the loaders and wheels scripts/gpu-gfx-setup.sh installs (carry .gl and .whlgfx).
# Usage: scripts/gpu-run.sh [tests|bench|all|sched|activity|priority|multigpu|compat|kube|mix|render]   (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpuslice-out}"
mkdir -p "$OUT"
export GPUSLICE_RAW="$OUT" PYTHONUNBUFFERED=1
what="${1:-all}"
rc=0

{
	date -u
	uname -r
	nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode,compute_mode --format=csv
	cat /proc/driver/nvidia/version
	python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
	gcc --version | head -1
	python3 -m pytest --version 2>&1 | head -1
} >"$OUT/env.txt" 2>&1

make -C preload clean >/dev/null
if ! make -C preload >"$OUT/build.txt" 2>&1; then
	cat "$OUT/build.txt"
	exit 1
fi

if [[ $what == all || $what == tests ]]; then
	if python3 -c 'import pytest' 2>/dev/null; then
		python3 -m pytest -v -rA -p no:cacheprovider tests/gpu/test_gpu.py 2>&1 | tee "$OUT/tests.txt"
	else
		python3 tests/gpu/test_gpu.py 2>&1 | tee "$OUT/tests.txt"
	fi
	rc=${PIPESTATUS[0]}
fi
if [[ $what == all || $what == bench ]]; then
	python3 tests/gpu/bench_overhead.py 5 5 2>&1 | tee "$OUT/bench.txt"
fi
if [[ $what == sched || $what == activity || $what == priority || $what == kube || $what == mix ]]; then
	export PYTHONPATH="$PWD/pyctl${PYTHONPATH:+:$PYTHONPATH}"
	[[ -d .devsite ]] && export PYTHONPATH="$PYTHONPATH:$PWD/.devsite"
	python3 -c 'import click, pyroute2, pynvml' || echo "gpu-run: a package the daemon needs is missing" >&2
fi
if [[ $what == multigpu ]]; then
	python3 tests/gpu/bench_multigpu.py --out "$OUT" ${MULTIGPU_ARGS:-}
	rc=$?
fi
if [[ $what == kube ]]; then
	python3 tests/gpu/kube_h100.py 2>&1 | tee "$OUT/kube.txt"
	rc=${PIPESTATUS[0]}
fi
if [[ $what == compat ]]; then
	python3 tests/gpu/compat.py --out "$OUT" ${COMPAT_ARGS:-}
	rc=$?
fi
if [[ $what == render ]]; then
	# shellcheck source=scripts/gpu-gfx-setup.sh
	source scripts/gpu-gfx-setup.sh >"$OUT/gfx-setup.txt" 2>&1 || { cat "$OUT/gfx-setup.txt"; exit 1; }
	gcc -O2 -shared -fPIC -o /tmp/rmtrace.so tests/gpu/rmtrace.c -ldl -lpthread || exit 1
	work=$(mktemp -d)
	: >"$OUT/render-trace.jsonl"
	for w in ${RENDER_WORKLOADS:-egl_render vulkan_wgpu nvdec_decode nvjpg_decode}; do
		RMTRACE_OUT="$work/$w" LD_PRELOAD=/tmp/rmtrace.so timeout 300 python3 "tests/gpu/compat/$w.py" \
			>"$work/$w.out" 2>&1
		echo "== $w native under rmtrace: rc $?" >>"$OUT/gfx-setup.txt"
		tail -3 "$work/$w.out" >>"$OUT/gfx-setup.txt"
		for f in "$work/$w".[0-9]*; do
			[[ -f $f ]] && sed "s/^{/{\"workload\":\"$w\",/" "$f" >>"$OUT/render-trace.jsonl"
		done
	done
	python3 tests/gpu/compat.py --out "$OUT" --only "$(echo ${RENDER_WORKLOADS:-egl_render vulkan_wgpu nvdec_decode nvjpg_decode} | tr ' ' ,)" ${COMPAT_ARGS:-}
	rc=$?
fi
if [[ $what == priority ]]; then
	python3 tests/gpu/bench_priority.py --out "$OUT" ${PRIORITY_ARGS:-}
	rc=$?
fi
if [[ $what == activity ]]; then
	python3 tests/gpu/bench_activity.py --out "$OUT" ${ACTIVITY_ARGS:-}
	rc=$?
fi
if [[ $what == mix ]]; then
	python3 tests/gpu/bench_mix.py --out "$OUT" ${MIX_ARGS:-}
	rc=$?
fi
if [[ $what == sched ]]; then
	python3 tests/gpu/bench_sched.py --out "$OUT" ${SCHED_ARGS:-}
	rc=$?
	if [[ ${SCHED_TESTS:-1} == 1 ]] && python3 -c 'import pytest' 2>/dev/null; then
		python3 -m pytest -v -rA -p no:cacheprovider tests/gpu/test_sched.py 2>&1 | tee "$OUT/sched-tests.txt"
		[[ ${PIPESTATUS[0]} == 0 ]] || rc=1
	fi
fi
exit "$rc"

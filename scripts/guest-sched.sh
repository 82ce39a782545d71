#!/usr/bin/env bash
# Runs INSIDE the guest: the scheduler's guest tests and its benchmark in one boot.
#   scripts/vm.sh --timeout 1500 -- bash scripts/guest-sched.sh [pytest args]
# Writes the benchmark's raw output to docs/scheduler-bench.txt (the repo is shared).
set -uo pipefail
cd "$(dirname "$0")/.."
export GPUSLICE_GUEST=1
insmod tests/standin/nvstub.ko || { echo "guest-sched: insmod nvstub failed" >&2; exit 1; }
echo "== tests"
timeout 1000 .venv/bin/python -m pytest -q -p no:cacheprovider tests/guest/test_scheduler.py -rfE "$@" 2>&1
rc=$?
echo "== bench"
{ timeout 600 .venv/bin/python scripts/bench-scheduler.py --windows 2
  [[ -n "${SCHED_BENCH_ORDERS:-}" ]] && timeout 100 .venv/bin/python scripts/bench-scheduler.py --windows 2 \
    --only weight --daemon-arg=--switch-order=disable-first | grep -v '^#'; } | tee docs/scheduler-bench.txt
echo "== with the interposer"
# the test build: allow_test_escapes is one of its parameters (kmod/inject.h)
if [[ -f build/test-kmod/gpuslice.ko ]] && insmod build/test-kmod/gpuslice.ko allow_test_escapes=1 require_device_cgroup=0; then
    timeout 300 .venv/bin/python -m pytest -q -p no:cacheprovider tests/guest/test_gpuctl_kernel.py -rfE 2>&1 | tail -60
    rmmod gpuslice || rc=1
fi
echo "== engine after"
cat /proc/nvstub/engine
rmmod nvstub || rc=1
dmesg | grep -E 'BUG:|Oops|WARNING:' && rc=1
exit "$rc"

#!/usr/bin/env bash
# Runs INSIDE the guest: the scheduler's guest tests and its benchmark in one boot.
#   scripts/vm.sh --timeout 1500 -- bash scripts/guest-sched.sh [pytest args]
# Writes the benchmark's raw output to docs/scheduler-bench.txt (the repo is shared).
set -uo pipefail
cd "$(dirname "$0")/.."
export GPUSLICE_GUEST=1
insmod tests/standin/nvstub.ko || { echo "guest-sched: insmod nvstub failed" >&2; exit 1; }
echo "== smoke"
timeout 60 .venv/bin/python - <<'PY'
import sys, time
sys.path.insert(0, "tests/guest")
from workload import Workload, engine
ws = [Workload.start("a"), Workload.start("b")]
time.sleep(1)
for k, r in engine().items():
    print(hex(k[0]), hex(k[1]), r)
for w in ws:
    w.stop()
PY
echo "== tests"
timeout 900 .venv/bin/python -m pytest -q -p no:cacheprovider tests/guest/test_scheduler.py -rA "$@" 2>&1 | tail -80
rc=${PIPESTATUS[0]}
echo "== bench"
timeout 400 .venv/bin/python scripts/bench-scheduler.py | tee docs/scheduler-bench.txt
echo "== with the interposer"
if [[ -f kmod/gpuslice.ko ]] && insmod kmod/gpuslice.ko; then
    timeout 300 .venv/bin/python -m pytest -q -p no:cacheprovider tests/guest/test_gpuctl_kernel.py -rA 2>&1 | tail -40
    rmmod gpuslice || rc=1
fi
echo "== engine after"
cat /proc/nvstub/engine
rmmod nvstub || rc=1
dmesg | grep -E 'BUG:|Oops|WARNING:' && rc=1
exit "$rc"

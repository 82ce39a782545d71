#!/usr/bin/env bash
# Runs INSIDE the guest: the scheduler's guest tests and its benchmark in one boot.
#   scripts/vm.sh --timeout 1500 -- bash scripts/guest-sched.sh [pytest args]
# Writes the benchmark's raw output to docs/scheduler-bench.txt (the repo is shared).
set -uo pipefail
cd "$(dirname "$0")/.."
export GPUSLICE_GUEST=1
insmod tests/standin/nvstub.ko || { echo "guest-sched: insmod nvstub failed" >&2; exit 1; }
echo "== smoke"
timeout 120 .venv/bin/python - <<'PY'
import json, os, signal, sys, time
sys.path.insert(0, "tests/guest")
from workload import Daemon, Workload, engine
from gpuslice import state as S
os.makedirs("/tmp/smoke", exist_ok=True)
S.save(S.State(instances={n: S.Instance(n, [0], 1 << 30, weight=w) for n, w in (("a", 1), ("b", 3))},
               gpus={0: S.GpuPolicy("weight", 50_000_000)}), "/tmp/smoke/state.json")
ws = [Workload.start("a"), Workload.start("b")]
t0 = time.monotonic()
d = Daemon("/tmp/smoke/state.json", "/tmp/smoke/status.json", "-vv")
try:
    print("status:", json.dumps(d.wait_periods(min_periods=3)), "after", round(time.monotonic() - t0, 2), "s")
    e0 = {w.name: w.executed() for w in ws}; time.sleep(1); e1 = {w.name: w.executed() for w in ws}
    print("shares over 1 s:", {n: round((e1[n] - e0[n]) / 1e9, 3) for n in e0})
except Exception as e:
    print("smoke failed:", e)
print("rc", d.stop(), "log:", d.log_tail(40))
for k, r in engine().items():
    print(hex(k[0]), hex(k[1]), r)
for w in ws:
    w.stop()
PY
echo "== tests"
timeout 1000 .venv/bin/python -m pytest -q -p no:cacheprovider tests/guest/test_scheduler.py -rfE "$@" 2>&1
rc=$?
echo "== bench"
{ timeout 300 .venv/bin/python scripts/bench-scheduler.py --windows 2
  timeout 100 .venv/bin/python scripts/bench-scheduler.py --windows 2 --only weight --daemon-arg=--switch-order=disable-first \
    | grep -v '^#'; } | tee docs/scheduler-bench.txt
echo "== with the interposer"
if [[ -f kmod/gpuslice.ko ]] && insmod kmod/gpuslice.ko allow_test_escapes=1; then
    timeout 300 .venv/bin/python -m pytest -q -p no:cacheprovider tests/guest/test_gpuctl_kernel.py -rfE 2>&1 | tail -60
    rmmod gpuslice || rc=1
fi
echo "== engine after"
cat /proc/nvstub/engine
rmmod nvstub || rc=1
dmesg | grep -E 'BUG:|Oops|WARNING:' && rc=1
exit "$rc"

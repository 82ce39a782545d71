#!/usr/bin/env bash
# Runs every test: host tests, then the guest suite in one QEMU boot
# (stand-in NVIDIA driver + gpuslice.ko) and the scheduler-through-the-module
# tests in a second. Installs what it needs first.
# Usage: sudo scripts/test.sh [pytest args for the host run]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build-modules.sh

echo "== host tests"
host_rc=0
.venv/bin/python -m pytest -q tests "$@" || host_rc=$?
# pytest exit 5 = nothing collected: that is a failure for us too.

echo "== guest tests (QEMU, stand-in driver)"
guest_rc=0
bash scripts/vm.sh --timeout 3000 -- bash scripts/guest-tests.sh -rfE --durations=25 || guest_rc=$?

# The daemon through the module (netlink source): its workloads submit through their
# instances with the stand-in's test escape, which the module lets through only when
# loaded with allow_test_escapes=1 (a parameter of the test build, build/test-kmod/, which
# both boots load; never set in the main run, whose isolation tests check that instances
# refuse it): a second boot for those tests alone.
echo "== guest tests, scheduler through the module (allow_test_escapes=1)"
bash scripts/vm.sh --timeout 1800 -- env GPUSLICE_ARGS="require_device_cgroup=0 allow_test_escapes=1" \
    bash scripts/guest-tests.sh -rfE --durations=10 -k test_gpuctl_kernel || guest_rc=$?

echo "== host rc=$host_rc guest rc=$guest_rc"
[ "$host_rc" -eq 0 ] && [ "$guest_rc" -eq 0 ]

#!/usr/bin/env bash
# Runs every test: host tests, then the guest suite in one QEMU boot
# (stand-in NVIDIA driver answering as 580.159.04, the newest supported release, +
# gpuslice.ko), again with the stand-in answering as 535.288.01 (the oldest branch:
# docs/driver-versions.md), and the scheduler-through-the-module tests in a third boot.
# Installs what it needs first.
# Usage: sudo scripts/test.sh [pytest args for the host run]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build-modules.sh

echo "== host tests"
host_rc=0
.venv/bin/python -m pytest -q tests "$@" || host_rc=$?
# pytest exit 5 = nothing collected: that is a failure for us too.

echo "== guest tests (QEMU, stand-in driver as 580.159.04)"
guest_rc=0
bash scripts/vm.sh --timeout 3000 -- bash scripts/guest-tests.sh -rfE --durations=25 || guest_rc=$?

# The oldest supported branch: the stand-in answers with 535's layouts where they differ
# (struct nvstub_table, from NVIDIA's vendored headers), and the module decodes with 535's table. The files of the suite that
# reach the driver's ABI; the others (DKMS, podman, Kubernetes, exporter, netlink, the
# daemon's gating, the USERD sampler, tracing, the 64-process load) test what does not
# depend on it, and would add 10 minutes (docs/driver-versions.md).
echo "== guest tests (QEMU, stand-in driver as 535.288.01)"
abi_files=(test_standin test_standin_model test_standin_uvm test_interposer test_interposer_load
           test_isolation test_quota_hostile test_export test_faults test_fuzz test_multigpu
           test_render_guest test_replay)
files="$(printf 'tests/guest/%s.py ' "${abi_files[@]}")"
bash scripts/vm.sh --timeout 3000 -- env NVSTUB_ARGS="fb_mib=81559 version=535.288.01" GUEST_FILES="$files" \
    bash scripts/guest-tests.sh -rfE --durations=10 || guest_rc=$?

# The daemon through the module (netlink source): its workloads submit through their
# instances with the stand-in's test escape, which the module lets through only when
# loaded with allow_test_escapes=1 (a parameter of the test build, build/test-kmod/, which
# both boots load; never set in the main run, whose isolation tests check that instances
# refuse it): a third boot for those tests alone.
echo "== guest tests, scheduler through the module (allow_test_escapes=1)"
bash scripts/vm.sh --timeout 1800 -- env GPUSLICE_ARGS="require_device_cgroup=0 allow_test_escapes=1" \
    bash scripts/guest-tests.sh -rfE --durations=10 -k test_gpuctl_kernel || guest_rc=$?

echo "== host rc=$host_rc guest rc=$guest_rc"
[ "$host_rc" -eq 0 ] && [ "$guest_rc" -eq 0 ]

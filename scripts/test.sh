#!/usr/bin/env bash
# Runs every test: host tests, then the guest suite in one QEMU boot
# (stand-in NVIDIA driver + gpuslice.ko). Installs what it needs first.
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
bash scripts/vm.sh --timeout 3000 -- bash scripts/guest-tests.sh -rfE || guest_rc=$?

echo "== host rc=$host_rc guest rc=$guest_rc"
[ "$host_rc" -eq 0 ] && [ "$guest_rc" -eq 0 ]

#!/usr/bin/env bash
# The main job: set up, build, boot a QEMU guest with the stand-in NVIDIA driver,
# load gpuslice.ko and show it working (scripts/demo-guest.sh runs inside).
# Usage: sudo scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build-modules.sh
exec bash scripts/vm.sh --timeout 900 -- bash scripts/demo-guest.sh

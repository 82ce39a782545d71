#!/usr/bin/env bash
# Build the kernel modules against the kernel that scripts/vm.sh boots (not uname -r):
#   tests/standin  -> tests/standin/nvstub.ko   (skipped if tests/standin has no Kbuild/Makefile)
#   Kbuild (repo)  -> kmod/gpuslice.ko          (skipped if kmod/Kbuild is absent)
# Usage: scripts/build-modules.sh [clean]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVER="$("$REPO/scripts/guest-kver.sh")"
KDIR="/lib/modules/$KVER/build"
[[ -d "$KDIR" ]] || { echo "build-modules: no $KDIR (run scripts/setup.sh)" >&2; exit 1; }
TARGET="${1:-modules}"
JOBS="$(nproc 2>/dev/null || echo 2)"

build() {  # build DIR NAME
    local dir="$1" name="$2" log
    log="$(mktemp /tmp/gpuslice-build.XXXXXX)"
    if make -C "$KDIR" M="$dir" -j"$JOBS" "$TARGET" >"$log" 2>&1; then
        # Show warnings (they matter in kernel code) but not the make chatter.
        grep -E 'warning:|error:' "$log" >&2 || true
        echo "build-modules: $name ok ($KVER)" >&2
        rm -f "$log"
    else
        cat "$log" >&2
        rm -f "$log"
        echo "build-modules: $name FAILED" >&2
        return 1
    fi
}

rc=0
if [[ -f "$REPO/tests/standin/Kbuild" || -f "$REPO/tests/standin/Makefile" ]]; then
    build "$REPO/tests/standin" nvstub || rc=1
else
    echo "build-modules: tests/standin not buildable yet, skipped" >&2
fi
if [[ -f "$REPO/kmod/Kbuild" || -f "$REPO/kmod/Makefile" ]]; then
    build "$REPO" gpuslice || rc=1
else
    echo "build-modules: kmod/Kbuild absent, skipped" >&2
fi
exit "$rc"

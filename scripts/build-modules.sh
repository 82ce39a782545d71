#!/usr/bin/env bash
# Build the kernel modules against the kernel that scripts/vm.sh boots (not uname -r):
#   tests/standin  -> tests/standin/nvstub.ko   (skipped if tests/standin has no Kbuild/Makefile)
#   Kbuild (repo)  -> kmod/gpuslice.ko          the shipped module, as DKMS builds it (the
#                                               demo loads it); skipped if kmod/Kbuild is absent
#   kmod/Kbuild GPUSLICE_TEST=1 -> build/test-kmod/gpuslice.ko
#                                               the test build: the same module plus the test
#                                               hooks and their parameters (kmod/inject.h);
#                                               the guest suite loads it
#   dkms.conf      -> build/dkms/gpuslice-*.dkms.tar.gz (scripts/dkms.sh tarball; needs dkms, root)
# Usage: scripts/build-modules.sh [clean]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVER="$("$REPO/scripts/guest-kver.sh")"
KDIR="/lib/modules/$KVER/build"
[[ -d "$KDIR" ]] || { echo "build-modules: no $KDIR (run scripts/setup.sh)" >&2; exit 1; }
TARGET="${1:-modules}"
JOBS="$(nproc 2>/dev/null || echo 2)"

build() {  # build DIR NAME [MAKE VARIABLES...]
    local dir="$1" name="$2" log
    shift 2
    log="$(mktemp /tmp/gpuslice-build.XXXXXX)"
    if make -C "$KDIR" M="$dir" -j"$JOBS" "$@" "$TARGET" >"$log" 2>&1; then
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

# The test build's tree: kmod/'s sources, linked file by file into build/test-kmod/ (so
# its objects never mix with the shipped module's and neither build undoes the other's),
# with kmod/Kbuild as its top level. Links to sources gone from kmod/ are dropped.
TEST_DIR="$REPO/build/test-kmod"
test_tree() {
    local f
    mkdir -p "$TEST_DIR"
    find "$TEST_DIR" -xtype l -delete
    (cd "$REPO/kmod" && find . \( -name '*.c' -o -name '*.h' -o -name Kbuild \) ! -name '*.mod.c' -print) |
        while read -r f; do
            mkdir -p "$TEST_DIR/$(dirname "$f")"
            ln -sfn "$REPO/kmod/${f#./}" "$TEST_DIR/$f"
        done
}

rc=0
# The build the module states in its version (kmod/version.h), before test_tree links it
bash "$REPO/scripts/dkms.sh" build-h "$REPO/kmod/gpuslice_build.h"
if [[ -f "$REPO/tests/standin/Kbuild" || -f "$REPO/tests/standin/Makefile" ]]; then
    build "$REPO/tests/standin" nvstub || rc=1
else
    echo "build-modules: tests/standin not buildable yet, skipped" >&2
fi
if [[ -f "$REPO/kmod/Kbuild" || -f "$REPO/kmod/Makefile" ]]; then
    build "$REPO" gpuslice || rc=1
    test_tree
    build "$TEST_DIR" "gpuslice (test build)" GPUSLICE_TEST=1 || rc=1
else
    echo "build-modules: kmod/Kbuild absent, skipped" >&2
fi
# The DKMS binary tarball of gpuslice.ko for the guest kernel (scripts/dkms.sh tarball:
# built here, where compiling is fast; tests/guest/test_dkms.py installs it in the guest).
# Rebuilt only when the sources changed; needs dkms and root.
if [[ "$TARGET" == modules && -f "$REPO/dkms.conf" ]]; then
    if ! command -v dkms >/dev/null || [[ $EUID -ne 0 ]]; then
        echo "build-modules: dkms tarball skipped (needs dkms and root)" >&2
    elif log="$(bash "$REPO/scripts/dkms.sh" tarball "$KVER" "$REPO/build/dkms" 2>&1)"; then
        echo "build-modules: dkms tarball ok ($KVER)" >&2
    else
        echo "$log" >&2
        echo "build-modules: dkms tarball FAILED" >&2
        rc=1
    fi
fi
exit "$rc"

#!/usr/bin/env bash
# Runs INSIDE the QEMU guest (scripts/vm.sh -- bash scripts/guest-tests.sh [pytest args]):
# loads the stand-in driver (tests/standin/nvstub.ko) and gpuslice.ko's test build
# (build/test-kmod/gpuslice.ko: the shipped module plus its test hooks, kmod/inject.h) when
# they are built (scripts/build-modules.sh),
# runs the guest test suite, unloads the modules, and exits with pytest's code
# (or 1 if pytest passed but a module would not unload or the kernel logged an oops/BUG/WARNING).
# Extra module parameters: NVSTUB_ARGS="..." GPUSLICE_ARGS="...". GUEST_FILES: below. The stand-in gets
# the traced H100's 81559 MiB of video memory unless NVSTUB_ARGS says otherwise (the
# trace replay needs more than the stand-in's 1 GiB default).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export GPUSLICE_GUEST=1

if [[ "$(cat /proc/sys/kernel/osrelease)" != "$("$REPO/scripts/guest-kver.sh")" ]]; then
    echo "guest-tests: not in the guest kernel (use scripts/vm.sh -- bash scripts/guest-tests.sh)" >&2
    exit 2
fi

STANDIN_KO="$REPO/tests/standin/nvstub.ko"
# The test build: the suite sets its test parameters (fail_alloc_every, race_delay_fd_us,
# allow_test_escapes), which the shipped kmod/gpuslice.ko does not have.
GPUSLICE_KO="$REPO/build/test-kmod/gpuslice.ko"

dmesg -C 2>/dev/null || true
loaded=()
load() {  # load KO ARGS...
    local ko="$1"; shift
    if insmod "$ko" "$@"; then
        loaded+=("$(basename "$ko" .ko)")
        echo "guest-tests: loaded $(basename "$ko")" >&2
    else
        echo "guest-tests: insmod $ko FAILED" >&2
        dmesg | tail -n 30 >&2
        exit 1
    fi
}

# Exported: tests that reload the modules (test_interposer_load.py) reload them so.
export NVSTUB_ARGS="${NVSTUB_ARGS-fb_mib=81559}" GPUSLICE_ARGS="${GPUSLICE_ARGS-require_device_cgroup=0}"
if [[ -f "$STANDIN_KO" ]]; then
    # shellcheck disable=SC2086
    load "$STANDIN_KO" $NVSTUB_ARGS
    udevadm settle 2>/dev/null || true
else
    echo "guest-tests: $STANDIN_KO not built: stand-in tests will skip" >&2
fi
if [[ -f "$GPUSLICE_KO" ]]; then
    # shellcheck disable=SC2086
    load "$GPUSLICE_KO" ${GPUSLICE_ARGS:-}
else
    echo "guest-tests: $GPUSLICE_KO not built (scripts/build-modules.sh): interposer tests will skip" >&2
fi

# GUEST_FILES="tests/guest/a.py ...": those files only (default: the whole suite)
# shellcheck disable=SC2086
"$REPO/.venv/bin/python" -m pytest -q -p no:cacheprovider ${GUEST_FILES:-tests/guest} "$@"
rc=$?

# Unload in reverse order; a module that will not unload leaks a reference.
for ((i = ${#loaded[@]} - 1; i >= 0; i--)); do
    m="${loaded[$i]}"
    if ! rmmod "$m"; then
        echo "guest-tests: rmmod $m FAILED" >&2
        ((rc == 0)) && rc=1
    fi
done

if dmesg | grep -E 'BUG:|Oops|WARNING:|general protection|KASAN|list_del corruption' >/dev/null; then
    echo "guest-tests: the kernel log shows a bug:" >&2
    dmesg | grep -E -A 20 'BUG:|Oops|WARNING:|general protection|KASAN|list_del corruption' | head -n 80 >&2
    ((rc == 0)) && rc=1
fi
exit "$rc"

#!/usr/bin/env bash
# The ioctl fuzzer's accounting mode (tests/guest/fuzz_ioctl.py) for N consecutive seeds in
# one QEMU guest boot, then "seeds passed: K/N" and each failing seed. Not run by CI.
#
#   scripts/fuzz-seeds.sh [--seeds 20] [--first-seed 1] [--seconds 28] [--sample-calls 2000]
#                         [--slub-debug] [--no-build] [--out DIR]
#
#   --seeds N         how many seeds (default 20): FIRST, FIRST+1, ... FIRST+N-1
#   --first-seed S    the first seed (default 1); a seed is fuzz_ioctl.py's --seed
#   --seconds T       fuzzing time per seed (default 28, the guest suite's accounting run)
#   --sample-calls C  compare the accounting every C calls, with every thread parked
#                     between two calls (default 2000; 0: at the end of each seed only)
#   --slub-debug      boot with slub_debug=FZPU page_poison=1 (slower)
#   --no-build        use the modules already built (default: scripts/build-modules.sh)
#   --out DIR         where guest.log, reports.jsonl and summary.txt go
#                     (default /tmp/gpuslice-fuzz-seeds-<UTC time>)
#
# One seed again, in the guest with the modules loaded (as scripts/guest-tests.sh loads them):
#   .venv/bin/python tests/guest/fuzz_ioctl.py --seed S --seconds T
# The guest lock (/tmp/gpuslice-vm.lock) is waited for up to 30 minutes (scripts/vm.sh).
# Exit code: 0 when every seed passed, both modules unloaded and the kernel log is clean.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEEDS=20
FIRST=1
SECS=28
SAMPLE=2000
SLUB=0
BUILD=1
OUT=""

usage() { sed -n '2,21p' "$0" >&2; exit 2; }
while (($#)); do
    case "$1" in
        --seeds) SEEDS="$2"; shift 2 ;;
        --first-seed) FIRST="$2"; shift 2 ;;
        --seconds) SECS="$2"; shift 2 ;;
        --sample-calls) SAMPLE="$2"; shift 2 ;;
        --slub-debug) SLUB=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "fuzz-seeds.sh: unknown option $1" >&2; usage ;;
    esac
done
[[ "$SEEDS" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz-seeds.sh: --seeds takes a positive number" >&2; exit 2; }
[[ "$FIRST" =~ ^[0-9]+$ ]] || { echo "fuzz-seeds.sh: --first-seed takes a number" >&2; exit 2; }
[[ "$SECS" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "fuzz-seeds.sh: --seconds takes a number" >&2; exit 2; }
[[ "$SAMPLE" =~ ^[0-9]+$ ]] || { echo "fuzz-seeds.sh: --sample-calls takes a number" >&2; exit 2; }
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${OUT:-/tmp/gpuslice-fuzz-seeds-$STAMP}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# The guest writes into the repository only (the rest of the host is read-only there).
JSONL="$REPO/.fuzz-seeds-$STAMP.jsonl"
trap 'rm -f "$JSONL"' EXIT

((BUILD)) && bash "$REPO/scripts/build-modules.sh"

APPEND=()
((SLUB)) && APPEND=(--append "slub_debug=FZPU page_poison=1")
# per seed: the fuzzing, instance set-up, the stop (a hung call is given 60 s) and the samples
TIMEOUT=$(python3 -c "print(int($SEEDS * (float('$SECS') + 90) + 300))")
echo "fuzz-seeds.sh: seeds $FIRST..$((FIRST + SEEDS - 1)), ${SECS}s each, sample every $SAMPLE calls," \
     "guest timeout ${TIMEOUT}s, output in $OUT" >&2

# In the guest: the stand-in and the test build of gpuslice.ko loaded as scripts/guest-tests.sh
# loads them, the seeds, the modules unloaded, the kernel log checked.
GUEST='
set -u
export PYTHONPATH="$PWD/pyctl${PYTHONPATH:+:$PYTHONPATH}"  # this tree'"'"'s package
dmesg -C
insmod tests/standin/nvstub.ko fb_mib=81559 || exit 3
udevadm settle 2>/dev/null || true
insmod build/test-kmod/gpuslice.ko require_device_cgroup=0 || { rmmod nvstub; exit 3; }
.venv/bin/python -B tests/guest/fuzz_ioctl.py --seeds "$FZ_SEEDS" --seed "$FZ_FIRST" --seconds "$FZ_SECS" \
    --sample-calls "$FZ_SAMPLE" --jsonl "$FZ_JSONL"
rc=$?
rmmod gpuslice || { echo "fuzz-seeds: rmmod gpuslice FAILED"; rc=1; }
rmmod nvstub || { echo "fuzz-seeds: rmmod nvstub FAILED"; rc=1; }
if dmesg | grep -E "BUG:|Oops|WARNING:|general protection|list_del corruption" >/dev/null; then
    echo "fuzz-seeds: the kernel log shows a bug:"
    dmesg | grep -E -A 20 "BUG:|Oops|WARNING:|general protection|list_del corruption" | head -n 60
    rc=1
fi
exit $rc'

set +e
bash "$REPO/scripts/vm.sh" --timeout "$TIMEOUT" "${APPEND[@]}" -- \
    env FZ_SEEDS="$SEEDS" FZ_FIRST="$FIRST" FZ_SECS="$SECS" FZ_SAMPLE="$SAMPLE" FZ_JSONL="$JSONL" \
    bash -c "$GUEST" 2>&1 | tee "$OUT/guest.log"
rc=${PIPESTATUS[0]}
set -e
[[ -f "$JSONL" ]] && mv "$JSONL" "$OUT/reports.jsonl"

{
    echo "fuzz-seeds.sh: seeds $FIRST..$((FIRST + SEEDS - 1)), ${SECS}s each, sample every $SAMPLE calls, guest exit $rc"
    grep -E '^SEED ' "$OUT/guest.log" || true
    if grep -qE '^seeds passed: ' "$OUT/guest.log"; then
        grep -E '^(seeds passed: |failing seed )' "$OUT/guest.log"
    else
        echo "seeds passed: ?/$SEEDS (the guest run ended before its summary: see $OUT/guest.log)"
    fi
    grep -E '^fuzz-seeds: ' "$OUT/guest.log" || true
} | tee "$OUT/summary.txt"
exit "$rc"

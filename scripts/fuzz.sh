#!/usr/bin/env bash
# The long fuzz run (issue 11): the ioctl and netlink fuzzers of tests/guest/test_fuzz.py
# for N minutes in one QEMU guest booted with slab and page poisoning, then a summary.
#
#   scripts/fuzz.sh [--minutes 30] [--seed S] [--no-races] [--no-slub-debug] [--out DIR]
#
#   --minutes N      fuzzing time in all (default 30), shared between the tests as in
#                    test_fuzz.py's SHARES (ioctl accounting 35%, chaos 40%, netlink 12%,
#                    churn 10%, unprivileged netlink 3%)
#   --seed S         master seed (default: random; printed, and in the summary)
#   --no-races       the chaos run does not rewrite other threads' blocks mid-call (by
#                    default it does: the TOCTOU of issues 10 and 11, closed by
#                    kmod/shadow.c); --races is accepted and is the default
#   --no-slub-debug  boot without slub_debug=FZPU page_poison=1
#   --out DIR        where the log, the JSON reports and summary.md go
#                    (default /tmp/gpuslice-fuzz-<UTC time>)
#
# Exit code: the guest suite's (0: every run passed, the kernel log is clean and both
# modules unloaded). docs/fuzzing.md says what a run can and cannot detect.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MINUTES=30
SEED=""
RACES=1
SLUB=1
OUT=""

usage() { sed -n '2,20p' "$0" >&2; exit 2; }
while (($#)); do
    case "$1" in
        --minutes) MINUTES="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --races) RACES=1; shift ;;
        --no-races) RACES=0; shift ;;
        --no-slub-debug) SLUB=0; shift ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "fuzz.sh: unknown option $1" >&2; usage ;;
    esac
done
[[ "$MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "fuzz.sh: --minutes takes a number" >&2; exit 2; }
[[ -z "$SEED" ]] && SEED=$(( $(od -An -N4 -tu4 /dev/urandom) ))
SECONDS_TOTAL=$(python3 -c "print(int(float('$MINUTES') * 60))")
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${OUT:-/tmp/gpuslice-fuzz-$STAMP}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# The guest writes its JSON reports into the repository (the only host directory it can
# write); they are moved to $OUT afterwards.
JSONL="$REPO/.fuzz-$STAMP.jsonl"
trap 'rm -f "$JSONL"' EXIT

bash "$REPO/scripts/build-modules.sh"

APPEND=()
BOOTARGS=""
if ((SLUB)); then
    # F: sanity checks on every free (double free, bad pointers), Z: red zones,
    # P: poisoning of freed objects (checked when they are handed out again), U: owner tracking
    BOOTARGS="slub_debug=FZPU page_poison=1"
    APPEND=(--append "$BOOTARGS")
fi

# Guest time: the fuzzing, plus boot, module loads, instance set-up and the stop of each
# run (a hung call is given 60 s before it is reported), with room.
TIMEOUT=$(( SECONDS_TOTAL + 900 ))
echo "fuzz.sh: seed $SEED, ${MINUTES} min of fuzzing, boot args '${BOOTARGS:-none}', output in $OUT" >&2

set +e
bash "$REPO/scripts/vm.sh" --timeout "$TIMEOUT" "${APPEND[@]}" -- \
    env GPUSLICE_FUZZ_SECONDS="$SECONDS_TOTAL" GPUSLICE_FUZZ_SEED="$SEED" GPUSLICE_FUZZ_RACES="$RACES" \
        GPUSLICE_FUZZ_SUMMARY="$JSONL" \
    bash -c 'echo "guest cmdline: $(cat /proc/cmdline)";
             echo "slab sanity checks (kmalloc-64): $(cat /sys/kernel/slab/kmalloc-64/sanity_checks 2>/dev/null || echo ?)";
             exec bash scripts/guest-tests.sh -k fuzz -rfEx --durations=10' \
    2>&1 | tee "$OUT/guest.log"
rc=${PIPESTATUS[0]}
set -e
[[ -f "$JSONL" ]] && mv "$JSONL" "$OUT/reports.jsonl"

python3 - "$OUT" "$rc" "$SEED" "$MINUTES" "$BOOTARGS" <<'PY' | tee "$OUT/summary.md"
import json, re, sys
from pathlib import Path

out, rc, seed, minutes, bootargs = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
log = (out / "guest.log").read_text(errors="replace") if (out / "guest.log").exists() else ""
reps = []
if (out / "reports.jsonl").exists():
    reps = [json.loads(l) for l in (out / "reports.jsonl").read_text().splitlines() if l.strip()]
print(f"# gpuslice fuzz run: seed {seed}, {minutes} min, boot args `{bootargs or 'none'}`\n")
print(f"- guest suite exit code: {rc} ({'pass' if rc == 0 else 'FAIL'})")
kbug = "guest-tests: the kernel log shows a bug" in log
print(f"- kernel log after the suite: {'BUG/Oops/WARNING found' if kbug else 'clean'}")
unload = [l for l in log.splitlines() if "rmmod" in l and "FAILED" in l]
print(f"- module unload at the end: {'FAILED: ' + '; '.join(unload) if unload else 'both unloaded'}")
m = re.search(r"(\d+ (?:passed|failed)[^\n]*) in ([\d.]+)s", log)
print(f"- pytest: {m.group(0) if m else '?'}\n")
print("| test | seed | seconds | calls | result |")
print("| --- | --- | --- | --- | --- |")
total = 0
for r in reps:
    calls = r.get("calls") or r.get("sent") or 0
    total += calls
    res = "pass" if not r.get("problems") else "FAIL: " + r["problems"][0].splitlines()[0][:120]
    print(f"| {r['test']} | {r.get('seed')} | {r.get('seconds', '')} | {calls} | {res} |")
print(f"\ncalls in all: {total}\n")
for r in reps:
    if "per_category" in r:
        print(f"- {r['test']}: per category {r['per_category']}; errno {r.get('errno')}; "
              f"victim {r.get('victim')}; accounting {r.get('held_during')} -> {r.get('after_a_exit')}")
    elif "results" in r:
        print(f"- {r['test']}: {r.get('results')}")
    elif "counts" in r:
        print(f"- {r['test']}: {r.get('counts')}")
xf = re.findall(r"XFAIL (\S+)", log)
if xf:
    print("\nknown bugs still reproduced (xfail): " + ", ".join(xf))
PY
exit "$rc"

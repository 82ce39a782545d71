#!/usr/bin/env bash
# Boot the newest Debian kernel under QEMU/TCG (virtme-ng, host root fs) and run a
# command in it as root, with cwd = repo root. Prints the command's output and exits
# with its exit code (125 when the guest never reported one, 124 on timeout).
#
#   scripts/vm.sh [--mem 2G] [--cpus 2] [--timeout 600] [--lock-wait 1800] [--append ARGS] -- CMD...
#
# --append adds kernel command-line arguments (e.g. "slub_debug=FZPU"); it may repeat.
# Guest runs are serialised between everyone on this machine by an exclusive
# flock on /tmp/gpuslice-vm.lock (2 cores: two TCG guests at once crawl).
# Inside the guest: the repo is read-write, the rest of the root fs is read-only
# (use /tmp, a tmpfs, for scratch); GPUSLICE_GUEST=1 is set. The guest's output
# (stdout and stderr together) goes to stdout through a pipe: QEMU's direct writes to
# an inherited file are unreliable.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MEM=2G
CPUS=2
TIMEOUT=600
LOCK_WAIT=1800
LOCK=/tmp/gpuslice-vm.lock
APPEND=()

usage() { sed -n '2,13p' "$0" >&2; exit 2; }
while (($#)); do
    case "$1" in
        --mem) MEM="$2"; shift 2 ;;
        --cpus) CPUS="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --lock-wait) LOCK_WAIT="$2"; shift 2 ;;
        --append) APPEND+=(--append "$2"); shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "vm.sh: unknown option $1 (put the command after --)" >&2; usage ;;
    esac
done
(($#)) || usage

[[ -x "$REPO/.venv/bin/vng" ]] || { echo "vm.sh: no .venv/bin/vng: run scripts/setup.sh" >&2; exit 2; }
KVER="$("$REPO/scripts/guest-kver.sh")"
KIMG="/boot/vmlinuz-$KVER"
# vng runs its helpers (virtme-run, ...) from PATH.
export PATH="$REPO/.venv/bin:$PATH"

RUNDIR="$(mktemp -d /tmp/gpuslice-vm.XXXXXX)"
trap 'rm -rf "$RUNDIR"' EXIT

# The guest script: cd to the repo, run the command, record its exit code in a file
# that the host reads back (vng's own exit code is not trusted: a panic or a lost
# console would otherwise look like success or like the command's failure).
cmd_q=""
for a in "$@"; do cmd_q+=" $(printf '%q' "$a")"; done
cat >"$RUNDIR/run.sh" <<GUEST
#!/bin/bash
cd $(printf '%q' "$REPO") || exit 125
export GPUSLICE_GUEST=1
export PATH=$(printf '%q' "$REPO/.venv/bin"):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
${cmd_q# }
echo \$? > $(printf '%q' "$RUNDIR/rc")
GUEST
chmod +x "$RUNDIR/run.sh"

HOLDER="$LOCK.holder"  # who holds the lock, for the people waiting on it
exec 9>>"$LOCK"
if ! flock -n 9; then
    echo "vm.sh: waiting for the guest lock, held by: $(cat "$HOLDER" 2>/dev/null || echo '?')" >&2
    if ! flock -w "$LOCK_WAIT" 9; then
        echo "vm.sh: could not get $LOCK within ${LOCK_WAIT}s" >&2
        exit 125
    fi
fi
printf 'pid %s since %s: %s\n' "$$" "$(date -u +%H:%M:%S)" "${cmd_q# }" >"$HOLDER" 2>/dev/null || true

set +e
timeout -k 15 "$TIMEOUT" vng --run "$KIMG" --user root --disable-kvm \
    --memory "$MEM" --cpus "$CPUS" "${APPEND[@]}" \
    --rwdir "$REPO" --rwdir "$RUNDIR" --cwd "$REPO" \
    --exec "/bin/bash $RUNDIR/run.sh" </dev/null 2>&1 | cat
vrc=${PIPESTATUS[0]}
set -e

if [[ -s "$RUNDIR/rc" ]]; then
    exit "$(cat "$RUNDIR/rc")"
fi
if ((vrc == 124 || vrc == 137)); then
    echo "vm.sh: guest timed out after ${TIMEOUT}s" >&2
    exit 124
fi
echo "vm.sh: guest reported no exit code (vng exit $vrc)" >&2
exit 125

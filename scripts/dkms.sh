#!/usr/bin/env bash
# gpuslice.ko through DKMS (dkms.conf at the repository root), so that a kernel update
# rebuilds it (AUTOINSTALL=yes):
#
#   scripts/dkms.sh version              the package version (pyproject.toml, read through dkms.conf)
#   scripts/dkms.sh stage DIR            copy what DKMS builds from (dkms.conf, pyproject.toml,
#                                        Kbuild, kmod/ sources; no build output) into DIR
#   sudo scripts/dkms.sh install [KVER]  dkms add (a staged copy) + build + install for KVER
#                                        (default: the running kernel); replaces an earlier
#                                        add of the same version
#   sudo scripts/dkms.sh remove          dkms remove gpuslice/VERSION --all, and its /usr/src copy
#
# The module lands in /lib/modules/KVER/updates/dkms/gpuslice.ko; `modprobe gpuslice` loads it.
# tests/guest/test_dkms.py runs `install` in the QEMU guest.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=gpuslice

log() { printf 'dkms.sh: %s\n' "$*" >&2; }
run() { log "+ $*"; "$@"; }

version() {  # what dkms will read: dkms.conf sourced as dkms sources it
    # shellcheck disable=SC1091
    (kernel_source_dir=/nonexistent dkms_tree=/nonexistent; . "$REPO/dkms.conf"; echo "$PACKAGE_VERSION")
}

stage() {  # stage DIR
    local dir="$1" f
    mkdir -p "$dir"
    cp "$REPO/dkms.conf" "$REPO/pyproject.toml" "$REPO/Kbuild" "$dir/"
    (cd "$REPO" && find kmod \( -name '*.c' -o -name '*.h' -o -name Kbuild \) ! -name '*.mod.c' -print) |
        while read -r f; do
            mkdir -p "$dir/$(dirname "$f")"
            cp "$REPO/$f" "$dir/$f"
        done
}

need_root() { [[ $EUID -eq 0 ]] || { log "run as root"; exit 1; }; }
need_dkms() { command -v dkms >/dev/null || { log "dkms is not installed (apt-get install dkms)"; exit 1; }; }

remove() {  # remove VERSION
    local v="$1"
    if [[ -n "$(dkms status -m "$NAME" -v "$v" 2>/dev/null)" ]]; then
        run dkms remove "$NAME/$v" --all
    fi
    rm -rf "/usr/src/$NAME-$v"
}

cmd="${1:-}"
case "$cmd" in
    version)
        version ;;
    stage)
        [[ $# -eq 2 ]] || { log "usage: $0 stage DIR"; exit 2; }
        stage "$2" ;;
    install)
        need_root; need_dkms
        kver="${2:-$(uname -r)}"
        v="$(version)"
        [[ -n "$v" ]] || { log "no version in pyproject.toml"; exit 1; }
        [[ -e "/lib/modules/$kver/build" ]] || { log "no headers for $kver (/lib/modules/$kver/build)"; exit 1; }
        remove "$v"
        tmp="$(mktemp -d /tmp/gpuslice-dkms.XXXXXX)"
        trap 'rm -rf "$tmp"' EXIT
        stage "$tmp/$NAME-$v"
        run dkms add "$tmp/$NAME-$v"
        run dkms build -m "$NAME" -v "$v" -k "$kver"
        run dkms install -m "$NAME" -v "$v" -k "$kver"
        log "installed $NAME $v for $kver: $(modinfo -k "$kver" -n "$NAME" 2>/dev/null || echo '?')" ;;
    remove)
        need_root; need_dkms
        remove "$(version)" ;;
    *)
        sed -n '2,14p' "$0" >&2
        exit 2 ;;
esac

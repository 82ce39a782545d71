#!/usr/bin/env bash
# gpuslice.ko through DKMS (dkms.conf at the repository root), so that a kernel update
# rebuilds it (AUTOINSTALL=yes):
#
#   scripts/dkms.sh version                 the package version (pyproject.toml, read through dkms.conf)
#   scripts/dkms.sh stage DIR               what DKMS builds from, into DIR: dkms.conf (version
#                                           written in), Kbuild, kmod/ sources; no build output
#   scripts/dkms.sh srchash                 a hash of that staged tree (names tarballs)
#   scripts/dkms.sh build-h FILE            the build the module states in its version
#                                           (kmod/version.h): `git describe` of this checkout,
#                                           as FILE (gpuslice_build.h), rewritten only if it changed
#   scripts/dkms.sh tarball-name KVER       the name `tarball` gives its file for KVER
#   sudo scripts/dkms.sh install [KVER]     dkms add (a staged copy), build, install for KVER
#                                           (default: the running kernel); replaces an earlier
#                                           add of the same version
#   sudo scripts/dkms.sh tarball KVER DIR   build for KVER without installing anything: in a
#                                           sandbox (below), then `dkms mktarball --binaries-only`
#                                           to DIR/gpuslice-VERSION-SRCHASH-kernelKVER-ARCH.dkms.tar.gz
#                                           (kept when it exists: the sources did not change)
#   sudo scripts/dkms.sh install-tarball FILE [KVER]
#                                           dkms ldtarball FILE, then dkms install (no compiler)
#   sudo scripts/dkms.sh remove             dkms remove gpuslice/VERSION --all, and its /usr/src copy
#   sudo scripts/dkms.sh sandbox KVER -- CMD...
#                                           CMD in a private mount namespace where what dkms writes
#                                           (/var/lib/dkms, /usr/src, /lib/modules/KVER) goes to
#                                           overlays on a tmpfs: nothing outside changes
#
# The module lands in /lib/modules/KVER/updates/dkms/gpuslice.ko; `modprobe gpuslice` loads it.
# scripts/build-modules.sh makes the tarball for the guest kernel; tests/guest/test_dkms.py
# installs and loads it in the QEMU guest.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=gpuslice

log() { printf 'dkms.sh: %s\n' "$*" >&2; }
run() {  # run CMD...: logged, with the seconds it took
    local t0=$SECONDS
    log "+ $*"
    "$@"
    log "  ($((SECONDS - t0)) s)"
}

version() {  # what dkms reads: dkms.conf sourced as dkms sources it
    # shellcheck disable=SC1091
    (kernel_source_dir=/nonexistent dkms_tree=/nonexistent; . "$REPO/dkms.conf"; echo "$PACKAGE_VERSION")
}

stage() {  # stage DIR
    local dir="$1" v
    v="$(version)"
    [[ -n "$v" ]] || { log "no version in pyproject.toml"; exit 1; }
    mkdir -p "$dir"
    cp "$REPO/Kbuild" "$dir/"
    # The copy names its version itself: it must not depend on pyproject.toml, which a
    # binaries-only tarball and dkms's own copies do not carry.
    sed "s/^PACKAGE_VERSION=.*/PACKAGE_VERSION=\"$v\"/" "$REPO/dkms.conf" >"$dir/dkms.conf"
    (cd "$REPO" && find kmod \( -name '*.c' -o -name '*.h' -o -name Kbuild \) ! -name '*.mod.c' -print0 |
        xargs -0 cp --parents -t "$dir")
    build_h "$dir/kmod/gpuslice_build.h"  # the staged copy has no git to ask
}

# The module's build (kmod/version.h): the same `git describe` that gpuctl records at its
# install (pyctl/gpuslice/version.py), so that `gpuctl doctor` can tell one checkout.
build_h() {  # build_h FILE
    local d want
    d="$(git -c safe.directory="$REPO" -C "$REPO" describe --always --dirty --tags --abbrev=12 2>/dev/null || true)"
    [[ "$d" =~ ^[A-Za-z0-9._+-]{1,80}$ ]] || d=unknown
    want="#define GPUSLICE_BUILD \"$d\""
    [[ -f "$1" && "$(cat "$1")" == "$want" ]] || printf '%s\n' "$want" >"$1"
}

srchash() {
    local tmp
    tmp="$(mktemp -d /tmp/gpuslice-dkms.XXXXXX)"
    stage "$tmp/s"
    # the build (gpuslice_build.h) changes at every commit, the sources not: a tarball
    # of unchanged sources is kept, with the build it was made at
    (cd "$tmp/s" && find . -type f ! -name gpuslice_build.h | LC_ALL=C sort | xargs sha256sum | sha256sum |
        cut -c1-12)
    rm -rf "$tmp"
}

need_root() { [[ $EUID -eq 0 ]] || { log "run as root"; exit 1; }; }
need_dkms() { command -v dkms >/dev/null || { log "dkms is not installed (apt-get install dkms)"; exit 1; }; }
need_headers() {
    [[ -e "/lib/modules/$1/build" ]] || { log "no headers for $1 (/lib/modules/$1/build)"; exit 1; }
}

remove() {  # remove VERSION
    local v="$1"
    if [[ -n "$(dkms status -m "$NAME" -v "$v" 2>/dev/null)" ]]; then
        run dkms remove "$NAME/$v" --all
    fi
    rm -rf "/usr/src/$NAME-$v"
}

add_staged() {  # add_staged VERSION: dkms add of a staged copy (dkms copies it to /usr/src)
    local tmp
    tmp="$(mktemp -d /tmp/gpuslice-dkms.XXXXXX)"
    stage "$tmp/$NAME-$1"
    run dkms add "$tmp/$NAME-$1"
    rm -rf "$tmp"
}

sandbox_inner() {  # in the new mount namespace: sandbox_inner KVER TMPFS CMD...
    local kver="$1" w="$2" d
    shift 2
    mount -t tmpfs -o mode=0755 gpuslice-dkms "$w"
    for d in /var/lib/dkms /usr/src "/lib/modules/$kver"; do
        [[ -d "$d" ]] || { log "sandbox: no $d"; exit 1; }
        mkdir -p "$w/upper$d" "$w/work$d"
        mount -t overlay gpuslice-dkms -o "lowerdir=$d,upperdir=$w/upper$d,workdir=$w/work$d" "$d"
    done
    "$@"
}

sandbox() {  # sandbox KVER CMD...
    local kver="$1" w rc=0
    shift
    need_root
    w="$(mktemp -d /tmp/gpuslice-dkms-sandbox.XXXXXX)"
    unshare -m --propagation private bash "$0" _sandbox_inner "$kver" "$w" "$@" || rc=$?
    rmdir "$w" 2>/dev/null || true
    return "$rc"
}

tarball_name() {  # tarball_name VERSION HASH KVER
    echo "$NAME-$1-$2-kernel$3-$(uname -m).dkms.tar.gz"
}

cmd="${1:-}"
(($#)) && shift
case "$cmd" in
    version)
        version ;;
    stage)
        [[ $# -eq 1 ]] || { log "usage: $0 stage DIR"; exit 2; }
        stage "$1" ;;
    srchash)
        srchash ;;
    build-h)
        [[ $# -eq 1 ]] || { log "usage: $0 build-h FILE"; exit 2; }
        build_h "$1" ;;
    tarball-name)
        [[ $# -eq 1 ]] || { log "usage: $0 tarball-name KVER"; exit 2; }
        tarball_name "$(version)" "$(srchash)" "$1" ;;
    install)
        need_root; need_dkms
        kver="${1:-$(uname -r)}"
        need_headers "$kver"
        v="$(version)"
        remove "$v"
        add_staged "$v"
        run dkms build -m "$NAME" -v "$v" -k "$kver"
        run dkms install -m "$NAME" -v "$v" -k "$kver"
        log "installed $NAME $v for $kver: $(modinfo -k "$kver" -n "$NAME" 2>/dev/null || echo '?')" ;;
    install-tarball)
        need_root; need_dkms
        [[ $# -ge 1 ]] || { log "usage: $0 install-tarball FILE [KVER]"; exit 2; }
        file="$(readlink -f "$1")"
        kver="${2:-$(uname -r)}"
        v="$(version)"
        remove "$v"
        # dkms exits 1 after loading a binaries-only tarball (there is no source to
        # add); what counts is that the module is now built for the kernel
        run dkms ldtarball "$file" || true
        [[ "$(dkms status -m "$NAME" -v "$v" -k "$kver")" == *": built" ]] || {
            log "$file holds no $NAME $v built for $kver: $(dkms status -m "$NAME" -v "$v" -k "$kver")"
            exit 1
        }
        run dkms install -m "$NAME" -v "$v" -k "$kver"
        log "installed $NAME $v for $kver from $file: $(modinfo -k "$kver" -n "$NAME" 2>/dev/null || echo '?')" ;;
    tarball)
        need_root; need_dkms
        [[ $# -eq 2 ]] || { log "usage: $0 tarball KVER DIR"; exit 2; }
        kver="$1"
        need_headers "$kver"
        mkdir -p "$2"
        out="$(cd "$2" && pwd)"
        v="$(version)"
        name="$(tarball_name "$v" "$(srchash)" "$kver")"
        if [[ -f "$out/$name" ]]; then
            log "up to date: $out/$name"
            exit 0
        fi
        # the build and mktarball run in the sandbox, the tarball is written to $out
        tmp="$(mktemp -d "$out/.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        sandbox "$kver" bash "$0" _tarball_inner "$kver" "$v" "$tmp/$name"
        find "$out" -maxdepth 1 -name "$NAME-*-kernel$kver-*.dkms.tar.gz" -delete
        mv "$tmp/$name" "$out/$name"
        log "wrote $out/$name" ;;
    _tarball_inner)  # KVER VERSION FILE, inside the sandbox
        add_staged "$2"
        run dkms build -m "$NAME" -v "$2" -k "$1"
        run dkms mktarball -m "$NAME" -v "$2" -k "$1" --binaries-only --archive "$3" ;;
    remove)
        need_root; need_dkms
        remove "$(version)" ;;
    sandbox)
        [[ $# -ge 3 && "$2" == "--" ]] || { log "usage: $0 sandbox KVER -- CMD..."; exit 2; }
        kver="$1"
        shift 2
        sandbox "$kver" "$@" ;;
    _sandbox_inner)
        sandbox_inner "$@" ;;
    *)
        sed -n '2,30p' "$0" >&2
        exit 2 ;;
esac

#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for gpuslice development and CI (run as root).
# Idempotent: apt is skipped when every package is already installed, and the venv is
# only (re)created when missing. Quiet on success, loud on failure.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# Kernel + headers for the QEMU guest (6.1), the headers of Debian 12's other kernel (6.12,
# which tests/test_core_kbuild.py builds the module against), a compiler for modules, QEMU itself, bcc for
# tracing, and what virtme-ng needs at run time in the guest (busybox for its init,
# virtiofsd is optional: vng falls back to 9p), kmod for insmod/rmmod; PyYAML and
# prometheus_client for `gpuctl cdi` and `gpuctl exporter`, systemd for systemd-analyze;
# dkms for dkms.conf (tests/guest/test_dkms.py), rootful podman with crun for the CDI and
# run-args tests (tests/guest/test_podman.py: vfs storage, --network none; conmon and
# containers-common come with podman).
PKGS=(
    linux-image-amd64 linux-headers-amd64 linux-headers-6.12-amd64 build-essential qemu-system-x86
    python3-bpfcc bpfcc-tools python3-venv python3-pip python3-dev kmod
    busybox-static udev iproute2 util-linux ca-certificates
    python3-yaml python3-prometheus-client systemd
    dkms podman crun
)

log() { printf 'setup: %s\n' "$*" >&2; }

missing=()
for p in "${PKGS[@]}"; do
    st="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
    [[ "$st" == installed ]] || missing+=("$p")
done

if ((${#missing[@]})); then
    if [[ $EUID -ne 0 ]]; then
        log "need root to install: ${missing[*]}"
        exit 1
    fi
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/gpuslice-apt.log 2>&1 || {
        tail -n 40 /tmp/gpuslice-apt.log >&2
        log "apt-get install failed"
        exit 1
    }
fi

# The guest kernel must have a matching build tree for out-of-tree modules.
kver="$("$REPO/scripts/guest-kver.sh")"
[[ -d "/lib/modules/$kver/build" ]] || { log "no headers for guest kernel $kver"; exit 1; }

if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv"
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
# Re-install only when pyproject.toml, setup.py, constraints.txt or the vendored kubelet
# protos changed since the last successful install, or the modules generated from the
# protos are gone. The versions are constraints.txt's, the ones CI tests with; the dev
# extra is the test extra (pytest, hypothesis, mypy, the kube extra) and virtme-ng.
stamp=.venv/.gpuslice-installed
newer=$(find pyproject.toml setup.py constraints.txt pyctl/gpuslice/kube/proto -newer "$stamp" 2>/dev/null | head -1 || true)
if [[ ! -f "$stamp" ]] || [[ -n "$newer" ]] || [[ ! -f pyctl/gpuslice/kube/gen/__init__.py ]]; then
    log "pip install -c constraints.txt -e .[dev]"
    .venv/bin/pip install -q -c constraints.txt -e '.[dev]' >/tmp/gpuslice-pip.log 2>&1 || {
        tail -n 40 /tmp/gpuslice-pip.log >&2
        log "pip install failed"
        exit 1
    }
    touch "$stamp"
fi

# Sanity: the tools the test bed relies on.
.venv/bin/python -c 'import bcc' 2>/dev/null || log "warning: bcc not importable from .venv"
[[ -x .venv/bin/vng ]] || { log "vng missing from .venv"; exit 1; }
command -v qemu-system-x86_64 >/dev/null || { log "qemu-system-x86_64 missing"; exit 1; }
log "ok (guest kernel $kver)"

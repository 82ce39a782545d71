#!/usr/bin/env bash
# Print the version of the kernel scripts/vm.sh boots (not the host's uname -r):
# GPUSLICE_GUEST_KVER if set; else the one Debian's linux-image-amd64 installs (the kernel
# the tests are written against, also when a newer one was installed beside it, e.g. for
# tests/test_core_kbuild.py's build against other kernels); else the newest
# /boot/vmlinuz-* that has a /lib/modules/<ver> tree.
set -euo pipefail
usable() { [[ -e "/boot/vmlinuz-$1" && -d "/lib/modules/$1" ]]; }
if [[ -n "${GPUSLICE_GUEST_KVER:-}" ]]; then
    usable "$GPUSLICE_GUEST_KVER" || { echo "guest-kver: no /boot/vmlinuz-$GPUSLICE_GUEST_KVER with modules" >&2; exit 1; }
    echo "$GPUSLICE_GUEST_KVER"
    exit 0
fi
dflt="$(dpkg-query -W -f='${Depends}' linux-image-amd64 2>/dev/null | sed -n 's/^linux-image-\([^ ,|]*\).*/\1/p')"
if [[ -n "$dflt" ]] && usable "$dflt"; then
    echo "$dflt"
    exit 0
fi
best=""
for f in /boot/vmlinuz-*; do
    v="${f#/boot/vmlinuz-}"
    usable "$v" || continue
    best="$(printf '%s\n%s\n' "$best" "$v" | sed '/^$/d' | sort -V | tail -n1)"
done
[[ -n "$best" ]] || { echo "guest-kver: no /boot/vmlinuz-* with modules" >&2; exit 1; }
echo "$best"

#!/usr/bin/env bash
# Print the version of the kernel scripts/vm.sh boots: the newest /boot/vmlinuz-* that
# has a /lib/modules/<ver> tree (Debian's linux-image-amd64), not the host's uname -r.
set -euo pipefail
best=""
for f in /boot/vmlinuz-*; do
    [[ -e "$f" ]] || continue
    v="${f#/boot/vmlinuz-}"
    [[ -d "/lib/modules/$v" ]] || continue
    best="$(printf '%s\n%s\n' "$best" "$v" | sed '/^$/d' | sort -V | tail -n1)"
done
[[ -n "$best" ]] || { echo "guest-kver: no /boot/vmlinuz-* with modules" >&2; exit 1; }
echo "$best"

"""The installed NVIDIA driver: its version, its branch, and whether gpuslice has an ABI
table for it (gpuslice.nvrm_versions, generated from abi/ like kmod/core/nvrm_tables.c).

The module selects its table at load from the version the driver answers; the library at
its first call; both refuse a version without one. This is what `gpuctl doctor` and the
Kubernetes inventory read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice import nvrm_versions

PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"
SYS_DRIVER_VERSION = "/sys/module/nvidia/version"

# The release every figure of docs/h100-findings.md and the README's measurements was
# taken on (an untagged 580 release: 580.142's table serves it, abi/versions.tsv).
MEASURED_VERSION = "580.159.04"

_VERSION_RE = re.compile(r"(?<![\w.])(\d+\.\d+(?:\.\d+)?)(?![\w.])")


def parse_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version (``NVRM version: NVIDIA UNIX Open
    Kernel Module for x86_64  580.159.04  Release Build ...``) or in
    /sys/module/nvidia/version (``580.159.04``)."""
    for line in text.splitlines():
        if line.startswith("GCC"):
            continue
        m = _VERSION_RE.search(line.split(":", 1)[1] if line.startswith("NVRM") else line)
        if m:
            return m.group(1)
    return None


def installed_version() -> str | None:
    """The loaded driver's version from sysfs, else procfs; None without a driver."""
    for path in (SYS_DRIVER_VERSION, PROC_DRIVER_VERSION):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                v = parse_version(f.read())
        except OSError:
            continue
        if v:
            return v
    return None


@dataclass(frozen=True)
class Support:
    version: str
    branch: str
    table: bool           # gpuslice has an ABI table for this release
    branch_known: bool    # some release of the branch has one


def support(version: str) -> Support:
    branch = nvrm_versions.branch_of(version)
    return Support(version, branch, nvrm_versions.table(version) is not None,
                   any(nvrm_versions.branch_of(v) == branch for v in nvrm_versions.supported()))

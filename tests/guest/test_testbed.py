"""The test bed itself: these run in the guest only and check what every other guest test
relies on (the guest kernel, root, the repo mounted read-write)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_in_guest_kernel() -> None:
    kver = subprocess.run(
        [str(REPO / "scripts" / "guest-kver.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path("/proc/sys/kernel/osrelease").read_text().strip() == kver


def test_root_and_repo_writable(tmp_path: Path) -> None:
    assert os.geteuid() == 0
    probe = REPO / ".guest-write-probe"
    probe.write_text("x")
    try:
        assert probe.read_text() == "x"
    finally:
        probe.unlink()

"""The decision core under AddressSanitizer/UBSan and ThreadSanitizer (tests/core/stress.c):
random argument blocks with unreadable pointers, and 8 threads allocating and freeing
against one limit (the limit is never passed, used returns to 0)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "kmod" / "core"
CC = os.environ.get("CC") or shutil.which("cc") or "gcc"


def build(tmp: Path, san: str) -> Path | None:
    exe = tmp / f"stress-{san}"
    cmd = [CC, "-std=gnu11", "-O1", "-g", f"-fsanitize={san}", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=all", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
           f"-I{CORE}", *map(str, sorted(CORE.glob("*.c"))), str(REPO / "tests" / "core" / "stress.c"),
           "-o", str(exe), "-lpthread"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        if "cannot find" in p.stderr or "unrecognized" in p.stderr:
            return None  # no sanitizer runtime on this machine
        raise AssertionError(p.stderr[-3000:])
    return exe


@pytest.mark.parametrize("san,mode,n", [("address,undefined", "fuzz", "200000"),
                                        ("address,undefined", "threads", "20000"),
                                        ("thread", "threads", "20000")])
def test_core_under_sanitizers(tmp_path, san, mode, n):
    exe = build(tmp_path, san)
    if exe is None:
        pytest.skip(f"-fsanitize={san} not available")
    p = subprocess.run([str(exe), mode, n], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1", "ASAN_OPTIONS": "detect_leaks=1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert p.stdout.startswith("ok "), p.stdout

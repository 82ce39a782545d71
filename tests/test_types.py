"""The controller is typed: mypy over pyctl/gpuslice (configuration in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_mypy_clean() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy not installed (pip install -e .[test])")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr

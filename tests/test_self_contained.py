"""A clone of the repository is the whole product: nothing it ships, tests or documents
may read or cite files outside it (the recorded H100 traces are in tests/traces/, what was
measured on the H100 about RM is in docs/h100-findings.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Raw output of GPU runs (docs/runs/) is kept as the machines printed it.
RAW = ("docs/runs/",)
OUTSIDE = re.compile(r"\.\./shared|/work/shared|\bFINDINGS(\.md)?\b")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if not f.startswith(RAW) and (REPO / f).is_file()]


def test_nothing_cites_files_outside_the_repository() -> None:
    bad = []
    for f in _tracked():
        try:
            text = (REPO / f).read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line) and f != "tests/test_self_contained.py":
                bad.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_the_replayed_traces_are_in_the_repository() -> None:
    traces = REPO / "tests" / "traces"
    used = set()
    for f in _tracked():
        if f.endswith((".py", ".sh")):
            used |= set(re.findall(r"([\w.-]+\.log\.gz)", (REPO / f).read_text()))
    assert {"torch-matmul.log.gz", "cuda-driver-alloc.log.gz"} <= used
    for name in used:
        assert (traces / name).is_file(), name
    assert (traces / "README.md").is_file()
    assert (REPO / "docs" / "h100-findings.md").is_file()

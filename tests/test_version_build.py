"""`gpuctl --version` names gpuctl's release, the netlink ABI it speaks and its build
(the checkout it was built from); the module states its release and build in
/sys/module/gpuslice/version (kmod/version.h), from the same `git describe`, and `gpuctl
doctor` compares them (tests/test_doctor.py, check_build)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslice import netlink as N
from gpuslice import version as V
from gpuslice.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_version_names_release_abi_and_build() -> None:
    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0
    assert res.output == f"gpuctl {V.RELEASE} (netlink ABI {N.VERSION}, build {V.build()})\n"
    assert V.build() != ""


def test_release_and_abi_are_the_projects_and_the_modules() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        release = tomllib.load(f)["project"]["version"]
    assert V.RELEASE == release
    vh = (REPO / "kmod/version.h").read_text()
    assert re.search(rf'#define GPUSLICE_RELEASE "{re.escape(release)}"', vh)  # the module's own release
    assert 'MODULE_VERSION(GPUSLICE_RELEASE " " GPUSLICE_BUILD)' in vh
    assert '#include "version.h"' in (REPO / "kmod/main.c").read_text()
    uapi = (REPO / "kmod/uapi/gpuslice.h").read_text()
    assert int(re.search(r"#define GPUSLICE_GENL_VERSION\s+(\d+)", uapi).group(1)) == V.ABI == N.VERSION


def test_build_from_a_checkout_is_gits() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert V.build() == V.git_describe(str(REPO)) and V.build() != V.UNKNOWN


def test_the_recorded_build_wins_and_outside_git_it_is_unknown(tmp_path, monkeypatch) -> None:
    rec = types.ModuleType("gpuslice._build")
    rec.BUILD = "v1.2.3-4-g0123456789ab"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuslice._build", rec)
    assert V.build() == "v1.2.3-4-g0123456789ab"
    assert V.git_describe(str(tmp_path)) is None  # no checkout: setup.py records "unknown"


def test_the_module_is_told_the_same_build(tmp_path) -> None:
    """scripts/dkms.sh build-h (what scripts/build-modules.sh and the DKMS staging run)
    writes the build gpuctl names, for kmod/version.h."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = tmp_path / "gpuslice_build.h"
    subprocess.run(["bash", str(REPO / "scripts/dkms.sh"), "build-h", str(out)], check=True, timeout=60)
    assert out.read_text() == f'#define GPUSLICE_BUILD "{V.git_describe(str(REPO))}"\n'
    mtime = os.stat(out).st_mtime_ns
    subprocess.run(["bash", str(REPO / "scripts/dkms.sh"), "build-h", str(out)], check=True, timeout=60)
    assert os.stat(out).st_mtime_ns == mtime  # unchanged: main.o is not rebuilt


@pytest.mark.parametrize("text,expected", [("0.1.0 0123456789ab-dirty\n", ("0.1.0", "0123456789ab-dirty")),
                                           ("0.1.0\n", ("0.1.0", "unknown")),
                                           ("0.1.0 unknown", ("0.1.0", "unknown"))])
def test_parse_module_version(text: str, expected: tuple[str, str]) -> None:
    assert V.parse_module_version(text) == expected

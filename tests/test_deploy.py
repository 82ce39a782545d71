"""deploy/: the systemd units checked by `systemd-analyze verify`, their gpuctl command
lines by gpuctl's own parser, and the modules-load.d / modprobe.d files."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from gpuslice.cli import main

REPO = os.path.join(os.path.dirname(__file__), "..")
DEPLOY = os.path.join(REPO, "deploy")
UNITS = sorted(glob.glob(os.path.join(DEPLOY, "systemd", "*.service")))
GPUCTL = "/usr/local/bin/gpuctl"  # where `pip install .` as root puts it
ANALYZE = shutil.which("systemd-analyze")


def exec_lines(path: str) -> list[list[str]]:
    out = []
    for line in open(path):
        m = re.match(r"(ExecStart|ExecStartPre|ExecStop|ExecReload)=(.*)", line.strip())
        if m:
            out.append(shlex.split(m.group(2).lstrip("-+!@:")))
    return out


def staged(tmp_path, units: list[str]) -> list[str]:
    """The units with gpuctl at a stub in tmp_path (verify wants every ExecStart binary
    to exist; gpuctl need not be installed on the machine running the tests)."""
    stub = tmp_path / "gpuctl"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    out = []
    for u in units:
        dst = tmp_path / os.path.basename(u)
        dst.write_text(open(u).read().replace(GPUCTL, str(stub)))
        out.append(str(dst))
    return out


def verify(paths: list[str]) -> subprocess.CompletedProcess[str]:
    assert ANALYZE
    return subprocess.run([ANALYZE, "verify", "--man=no", *paths], capture_output=True, text=True, timeout=60)


def test_the_units_are_there() -> None:
    assert [os.path.basename(u) for u in UNITS] == ["gpuslice-daemon.service", "gpuslice-exporter.service"]


@pytest.mark.skipif(ANALYZE is None, reason="no systemd-analyze")
def test_systemd_analyze_verify(tmp_path) -> None:
    r = verify(staged(tmp_path, UNITS))
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", r.stderr + r.stdout


@pytest.mark.skipif(ANALYZE is None, reason="no systemd-analyze")
def test_verify_would_catch_a_broken_unit(tmp_path) -> None:
    """The check above is not vacuous: a bad key value and a missing binary fail it."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (path,) = staged(bad, UNITS[:1])
    text = open(path).read().replace("Restart=on-failure", "Restart=sometimes")
    open(path, "w").write(text.replace("ExecStartPre=+/usr/sbin/modprobe", "ExecStartPre=+/nonexistent/modprobe"))
    r = verify([path])
    assert r.returncode != 0 and "/nonexistent/modprobe" in r.stderr and "sometimes" in r.stderr


def test_daemon_unit_semantics() -> None:
    text = open(os.path.join(DEPLOY, "systemd", "gpuslice-daemon.service")).read()
    assert "Restart=on-failure" in text
    assert re.search(r"^After=.*systemd-modules-load\.service", text, re.M)
    # no module, no daemon; "+": the bounding set (no CAP_SYS_MODULE) would stop a load
    assert re.search(r"^ExecStartPre=\+/usr/sbin/modprobe gpuslice$", text, re.M)
    assert "CAP_SYS_MODULE" not in re.search(r"^CapabilityBoundingSet=(.*)$", text, re.M).group(1)
    assert "/dev/nvidia" not in text.replace("/dev/nvidiactl", "")


@pytest.mark.parametrize("unit", UNITS, ids=os.path.basename)
def test_gpuctl_command_lines_parse(unit: str) -> None:
    """Each ExecStart's gpuctl arguments are accepted by gpuctl itself (with --help
    added, so nothing runs)."""
    lines = [a for a in exec_lines(unit) if a[0] == GPUCTL]
    assert lines
    for argv in lines:
        res = CliRunner().invoke(main, [*argv[1:], "--help"])
        assert res.exit_code == 0, (argv, res.output)


def test_modules_load_and_modprobe_conf() -> None:
    names = [ln.strip() for ln in open(os.path.join(DEPLOY, "modules-load.d", "gpuslice.conf"))
             if ln.strip() and not ln.lstrip().startswith(("#", ";"))]
    kbuild = open(os.path.join(REPO, "kmod", "Kbuild")).read()
    assert names == ["gpuslice"] and re.search(r"obj-m\s*[+:]?=\s*.*gpuslice\.o", kbuild)
    for ln in open(os.path.join(DEPLOY, "modprobe.d", "gpuslice.conf")):
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        words = ln.split()
        assert words[0] in ("options", "softdep", "alias", "blacklist", "install", "remove"), ln
        assert words[1] == "gpuslice", ln
        if words[0] == "options":
            assert all(re.fullmatch(r"[a-z_]+=\S+", w) for w in words[2:]), ln

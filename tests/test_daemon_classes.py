"""`gpuctl daemon --source MODULE:CLASS` / `--probe MODULE:CLASS`: a class imported from
the daemon's Python path and constructed with no arguments, before the GPU is opened;
every bad value is a one-line error and a non-zero exit, never a traceback."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslice.cli import main

REPO = Path(__file__).resolve().parents[1]
MOD = "gs_daemon_class_helper"
HELPER = '''
import os

def _log(what):
    with open(os.environ["GS_CLASS_LOG"], "a") as f:
        f.write(what + "\\n")

class Src:
    def __init__(self):
        _log("Src()")
    def refresh(self):
        pass
    def channels(self):
        return {}
    def close(self):
        _log("Src.close")

class Prb:
    def __init__(self):
        _log("Prb()")
    def active(self, chans):
        return set(chans)

class Broken:
    def __init__(self):
        raise RuntimeError("no engine here\\nsecond line")
    def refresh(self): pass
    def channels(self): return {}
    def close(self): pass
    def active(self, chans): return set()

class Outer:
    class Inner(Prb):
        pass

not_a_class = 42
'''


@pytest.fixture()
def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module of test classes on a temporary Python path; returns the log path."""
    d = tmp_path / "py"
    d.mkdir()
    (d / f"{MOD}.py").write_text(HELPER)
    (d / "gs_daemon_class_boom.py").write_text("raise ZeroDivisionError('at import')\n")
    monkeypatch.syspath_prepend(str(d))
    importlib.invalidate_caches()
    log = tmp_path / "log"
    monkeypatch.setenv("GS_CLASS_LOG", str(log))
    yield d, log
    for m in (MOD, "gs_daemon_class_boom"):
        sys.modules.pop(m, None)


def daemon_args(tmp_path: Path, *opts: str) -> list[str]:
    return ["--state", str(tmp_path / "state.json"), "--kernel", "no", "daemon", "--ctl",
            str(tmp_path / "nvidiactl"), "--no-watchdog", "--rt-priority", "0",
            "--status-file", str(tmp_path / "status.json"), *opts]


def one_line_error(res, *needles: str) -> str:
    assert res.exit_code != 0
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("gpuctl: "), err
    assert "Traceback" not in res.output
    for n in needles:
        assert n in err, err
    return err


def test_classes_are_constructed_before_the_gpu_and_closed(helper, tmp_path: Path) -> None:
    _d, log = helper
    res = CliRunner().invoke(main, daemon_args(tmp_path, "--source", f"{MOD}:Src", "--probe", f"{MOD}:Prb"))
    one_line_error(res, "nvidiactl")  # got as far as opening the RM node
    assert log.read_text().split() == ["Src()", "Prb()", "Src.close"]


def test_nested_class(helper, tmp_path: Path) -> None:
    _d, log = helper
    res = CliRunner().invoke(main, daemon_args(tmp_path, "--probe", f"{MOD}:Outer.Inner", "--source", "preload",
                                               "--preload-sock", str(tmp_path / "p.sock")))
    one_line_error(res, "nvidiactl")
    assert log.read_text().split() == ["Prb()"]


def test_from_pythonpath_in_a_real_process(helper, tmp_path: Path) -> None:
    d, log = helper
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "pyctl"), str(d)]), GS_CLASS_LOG=str(log))
    p = subprocess.run([sys.executable, "-m", "gpuslice", *daemon_args(
        tmp_path, "--source", f"{MOD}:Src", "--probe", f"{MOD}:Prb")], env=env, capture_output=True, text=True,
        timeout=60)
    assert p.returncode != 0
    err = p.stderr.strip()
    assert err.startswith("gpuctl: ") and "\n" not in err and "nvidiactl" in err, p.stderr
    assert log.read_text().split() == ["Src()", "Prb()", "Src.close"]


@pytest.mark.parametrize("opt,value,needle", [
    ("--source", "gs_no_such_module_here:Src", "cannot import gs_no_such_module_here: ModuleNotFoundError"),
    ("--source", "gs_daemon_class_boom:Src", "cannot import gs_daemon_class_boom: ZeroDivisionError: at import"),
    ("--source", f"{MOD}:Missing", f"module {MOD} has no Missing"),
    ("--probe", f"{MOD}:Outer.Missing", f"module {MOD} has no Outer.Missing"),
    ("--source", f"{MOD}:not_a_class", "not a class but a int"),
    ("--source", f"{MOD}:Prb", "not a source (no refresh(), channels(), close())"),
    ("--probe", f"{MOD}:Src", "not a probe (no active())"),
    ("--source", "nvstub", "'nvstub' is none of auto, netlink, preload and not MODULE:CLASS"),
    ("--probe", "nvstub", "'nvstub' is none of auto, cpu, nvml, submit, all and not MODULE:CLASS"),
    ("--source", f"{MOD}:", "not MODULE:CLASS"),
    ("--probe", ":Prb", "not MODULE:CLASS"),
])
def test_bad_values(helper, tmp_path: Path, opt: str, value: str, needle: str) -> None:
    _d, log = helper
    res = CliRunner().invoke(main, daemon_args(tmp_path, opt, value))
    err = one_line_error(res, needle, opt)
    assert res.exit_code == 2, err  # a usage error, as click's own
    assert not log.exists()  # nothing was constructed


@pytest.mark.parametrize("opt", ["--source", "--probe"])
def test_construction_failure(helper, tmp_path: Path, opt: str) -> None:
    _d, log = helper
    other = {"--source": ["--probe", "all"], "--probe": ["--source", "preload", "--preload-sock",
                                                      str(tmp_path / "p.sock")]}[opt]
    res = CliRunner().invoke(main, daemon_args(tmp_path, opt, f"{MOD}:Broken", *other))
    one_line_error(res, opt, f"{MOD}:Broken(): RuntimeError: no engine here second line")
    assert "nvidiactl" not in res.stderr  # it failed before the GPU was opened


def test_help_names_the_form() -> None:
    res = CliRunner().invoke(main, ["daemon", "--help"])
    assert res.exit_code == 0
    assert "[auto|netlink|preload|MODULE:CLASS]" in res.output
    assert "[auto|cpu|nvml|submit|all|MODULE:CLASS]" in res.output
    assert "nvstub" not in res.output

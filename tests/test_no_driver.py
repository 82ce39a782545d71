"""`gpuctl daemon` and `gpuctl guard` on a host without the NVIDIA driver (no
/dev/nvidiactl, no module): one line on stderr saying what is missing and what to do,
a non-zero exit, and nothing else: no traceback, no second error from the watchdog or
guard child or from a cleanup."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from gpuslice.sched import rm

REPO = os.path.join(os.path.dirname(__file__), "..")


def gpuctl(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "pyctl")}
    env.pop("GPUSLICE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "gpuslice", "--state", str(tmp_path / "s.json"), *args],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kernel", [["--kernel", "no"], []])  # [] = auto: this host has no module
@pytest.mark.parametrize("command", [["daemon", "--duration", "1s", "--preload-sock", "{run}/preload.sock"],
                                     ["guard", "--duration", "1s"]])
def test_one_line_without_the_driver(tmp_path, kernel: list[str], command: list[str]) -> None:
    """... and nothing made first: no preload socket (whose directory a user other than
    root could not make, which would then be the error instead)."""
    ctl = str(tmp_path / "nvidiactl")
    run = tmp_path / "run"
    command = [a.format(run=run) for a in command]
    r = gpuctl(tmp_path, *kernel, *command, "--ctl", ctl, "--status-file", str(tmp_path / "status.json"))
    assert r.returncode == 1
    assert r.stderr == f"gpuctl: no NVIDIA driver: {ctl} not found (load nvidia.ko)\n"
    assert r.stdout == ""
    assert not (tmp_path / "status.json").exists() and not run.exists()


def test_driver_missing_says_what_and_what_to_do(tmp_path, monkeypatch) -> None:
    ok = tmp_path / "ctl"
    ok.write_text("")
    assert rm.driver_missing(str(ok)) is None
    assert rm.driver_missing("/nonexistent/nvidiactl") == \
        "no NVIDIA driver: /nonexistent/nvidiactl not found (load nvidia.ko)"

    def refuse(err: int):  # type: ignore[no-untyped-def]
        def open_(path: str, flags: int, mode: int = 0o777) -> int:
            raise OSError(err, os.strerror(err), path)
        return open_

    monkeypatch.setattr(os, "open", refuse(errno.ENXIO))  # a node left behind, no driver behind it
    assert rm.driver_missing("/dev/nvidiactl") == \
        "no NVIDIA driver: /dev/nvidiactl has no driver behind it (load nvidia.ko)"
    monkeypatch.setattr(os, "open", refuse(errno.EACCES))
    assert rm.driver_missing("/dev/nvidiactl") == "cannot open /dev/nvidiactl: Permission denied (run as root)"

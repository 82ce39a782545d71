"""One `gpuctl daemon` at a time: a second one refuses, naming the first's PID; the lock
goes with a `kill -9` of its holder; `--replace` stops the first and takes over; and no
daemon removes a socket it no longer owns.

The daemons are real processes of `gpuctl daemon --source preload` on temporary paths.
The host has no GPU: RUNNER replaces the driver check and the RM client by test doubles
(test code only) before gpuctl's main; the scheduler runs with no instances, so no RM
call is made. Deadlines here are liveness bounds (generous), not speed asserts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from gpuslice.sched.sources import PreloadSource

REPO = Path(__file__).resolve().parents[1]
RUNNER = """
import sys
from gpuslice.sched import rm
rm.driver_missing = lambda ctl: None
class FakeRm:
    calls = 0
    def __init__(self, *a, **k): pass
    def open(self): return self
    def close(self): pass
    def disable_channels(self, minor, pairs, disable): return 0
    def disable_channels_each(self, minor, pairs, disable): return []
rm.RmClient = FakeRm
from gpuslice.cli import main
sys.argv[0] = "gpuctl"
main()
"""
DEADLINE = 30.0


class Daemon:
    def __init__(self, tmp: Path, *extra: str) -> None:
        run = tmp / "run"
        self.sock = run / "preload.sock"
        self.status = run / "status.json"
        self.lock = run / "daemon.lock"
        self.args = [sys.executable, "-c", RUNNER, "--state", str(tmp / "state.json"), "--kernel", "no", "daemon",
                     "--ctl", str(tmp / "nvidiactl"), "--no-watchdog", "--rt-priority", "0", "--guard-interval", "0",
                     "--source", "preload", "--preload-sock", str(self.sock), "--preload-dir", str(run / "instances"),
                     "--probe", "all", "--status-file", str(self.status), "--lock-file", str(self.lock), *extra]
        self.p = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})

    def report_pid(self) -> int | None:
        try:
            return int(json.loads(self.status.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def wait_running(self) -> None:
        """Until its own report is written (it has the lock, its socket and a scheduler)."""
        end = time.monotonic() + DEADLINE
        while self.report_pid() != self.p.pid:
            if self.p.poll() is not None:
                raise AssertionError(f"exited {self.p.returncode}: {self.p.communicate()[1]}")
            assert time.monotonic() < end, "no report within the deadline"
            time.sleep(0.05)

    def finish(self, sig: int | None = signal.SIGTERM) -> tuple[int, str]:
        if sig is not None and self.p.poll() is None:
            self.p.send_signal(sig)
        _out, err = self.p.communicate(timeout=DEADLINE)
        return self.p.returncode, err


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    ds: list[Daemon] = []
    yield ds
    for d in ds:
        if d.p.poll() is None:
            d.p.kill()
            d.p.wait()


def start(tmp: Path, ds: list[Daemon], *extra: str) -> Daemon:
    d = Daemon(tmp, *extra)
    ds.append(d)
    return d


def ino(path: Path) -> int:
    return os.lstat(path).st_ino


def can_connect(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def test_a_second_daemon_refuses_naming_the_first(tmp_path: Path, daemons: list[Daemon]) -> None:
    first = start(tmp_path, daemons)
    first.wait_running()
    sock_ino = ino(first.sock)
    second = start(tmp_path, daemons)
    rc, err = second.finish(None)
    assert rc == 1
    assert err == (f"gpuctl: another gpuctl daemon is running (PID {first.p.pid}, holding {first.lock}): "
                   "stop it first, or start this one with --replace\n")
    # the first goes on untouched: its socket, its report
    assert first.p.poll() is None
    assert ino(first.sock) == sock_ino and can_connect(first.sock)
    assert first.report_pid() == first.p.pid
    rc, err = first.finish()
    assert rc == 0, err
    assert not first.sock.exists() and not first.status.exists()
    assert first.lock.exists()  # the lock file stays; its lock went with the process


def test_kill_9_of_the_first_lets_a_new_one_start(tmp_path: Path, daemons: list[Daemon]) -> None:
    first = start(tmp_path, daemons)
    first.wait_running()
    rc, _err = first.finish(signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert first.sock.exists()  # left by the killed daemon
    second = start(tmp_path, daemons)
    second.wait_running()
    assert can_connect(second.sock)
    assert second.lock.read_text().strip() == str(second.p.pid)
    rc, err = second.finish()
    assert rc == 0, err
    assert not second.sock.exists()


def test_replace_stops_the_first_and_keeps_the_new_socket(tmp_path: Path, daemons: list[Daemon]) -> None:
    first = start(tmp_path, daemons, "-v")
    first.wait_running()
    second = start(tmp_path, daemons, "--replace", "-v")
    second.wait_running()
    # the first was stopped (SIGTERM: a clean exit, channels re-enabled) before the second went on
    rc, err = first.finish(None)
    assert rc == 0 and "stopped by signal 15" in err, err
    assert second.p.poll() is None
    sock_ino = ino(second.sock)
    time.sleep(1.0)  # nothing of the first's exit comes later to remove it
    assert ino(second.sock) == sock_ino and can_connect(second.sock)
    assert second.report_pid() == second.p.pid
    rc, err = second.finish()
    assert rc == 0, err
    assert f"replaced the running daemon (PID {first.p.pid})" in err
    assert not second.sock.exists()


def test_replace_without_a_running_daemon_just_starts(tmp_path: Path, daemons: list[Daemon]) -> None:
    d = start(tmp_path, daemons, "--replace")
    d.wait_running()
    rc, err = d.finish()
    assert rc == 0, err


def test_a_source_leaves_a_socket_that_is_no_longer_its_own(tmp_path: Path) -> None:
    """A daemon that exits removes its preload sockets only where they are still the ones
    it bound: another's at the same path (bound since) stays, host and instance socket."""
    path = tmp_path / "preload.sock"
    old = PreloadSource(str(path), str(tmp_path / "instances"))
    old.set_instances(["web"])
    new = PreloadSource(str(path), str(tmp_path / "instances"))
    new.set_instances(["web"])
    web = tmp_path / "instances" / "web" / "preload.sock"
    mine = (ino(path), ino(web))
    old.set_instances([])
    assert ino(web) == mine[1]
    old.close()
    assert (ino(path), ino(web)) == mine and can_connect(path) and can_connect(web)
    new.close()
    assert not path.exists() and not web.exists()

"""A watchdog for the guest suite: a test that runs past HANG_S seconds is taken as
hung. The watchdog prints what it needs to be found (every Python thread's stack, each
process in uninterruptible sleep with its kernel stack and wait channel, the kernel
log's tail), then kills the test's child processes; if the test still has not ended
GRACE_S seconds later, it ends pytest with status 3 (and the run ends with 3 in any case), so that one hang costs minutes,
not the whole run's time limit.

No guest test takes more than about 140 s under TCG (--durations in scripts/test.sh),
so HANG_S is far above any honest test. GPUSLICE_HANG_S overrides it (0: off).

Registered from conftest.py as a plugin (guest only)."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HANG_S = float(os.environ.get("GPUSLICE_HANG_S", "900"))
GRACE_S = 60.0


# pytest captures file descriptors 1 and 2 while a test runs: the report is written with
# the capture suspended (the test's thread is stuck meanwhile).
_capman = None
_hung: list[str] = []  # the tests reported: the run fails even if the kills let them pass


def _out(text: str) -> None:
    if _capman is None:
        sys.stderr.write(text + "\n")
        return
    with _capman.global_and_fixture_disabled():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def pytest_configure(config: pytest.Config) -> None:
    global _capman
    _capman = config.pluginmanager.get_plugin("capturemanager")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _blocked() -> None:
    """Every process in D state (or traced/stopped), with its command line, wait channel
    and kernel stack."""
    for d in sorted(Path("/proc").iterdir(), key=lambda p: p.name):
        if not d.name.isdigit():
            continue
        try:
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("D", "T", "t"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            wchan = (d / "wchan").read_text()
            stack = (d / "stack").read_text() if (d / "stack").exists() else "?"
        except OSError:
            continue
        _out(f"hangwatch: pid {d.name} state {state} wchan {wchan} cmd {cmd}\n{stack}")


def _report(nodeid: str) -> None:
    _hung.append(nodeid)
    _out(f"\nhangwatch: {nodeid} still running after {HANG_S:.0f}s: stacks, blocked tasks, kernel log")
    if _capman is None:
        faulthandler.dump_traceback(all_threads=True)
    else:
        with _capman.global_and_fixture_disabled():
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _blocked()
    try:
        mem = {k: v.strip() for k, v in (ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines())}
        _out("hangwatch: memory: " + ", ".join(f"{k} {mem.get(k)}" for k in ("MemTotal", "MemAvailable", "Shmem",
                                                                             "Dirty", "Writeback")))
        _out(subprocess.run(["df", "-h", "/tmp", "/dev/shm"], capture_output=True, text=True, timeout=30).stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    try:
        Path("/proc/sysrq-trigger").write_text("w")  # blocked tasks' stacks into the log
    except OSError:
        pass
    log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
    _out("hangwatch: kernel log tail:\n" + "\n".join(log.splitlines()[-120:]))
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
            _out(f"hangwatch: killed child {pid}")
        except OSError:
            pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if HANG_S <= 0:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        if done.wait(HANG_S):
            return
        _report(item.nodeid)
        if not done.wait(GRACE_S):
            _out(f"hangwatch: {item.nodeid} did not end {GRACE_S:.0f}s after its children were killed: ending the run")
            os._exit(3)

    t = threading.Thread(target=watch, name="hangwatch", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _hung:
        _out(f"hangwatch: hung (their children killed): {', '.join(_hung)}")
        session.exitstatus = 3

"""The guest tests' source and probe on the stand-in's engine (tests/guest/nvstub_sched.py),
on the host: parsing /proc/nvstub/engine, channels per GPUSLICE_INSTANCE, activity; and
how workload.Daemon hands them to `gpuctl daemon` by import path. The product package
itself knows nothing of the stand-in's engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUEST = REPO / "tests" / "guest"
if str(GUEST) not in sys.path:
    sys.path.append(str(GUEST))  # appended: tests/guest must not shadow tests/ (test_scheduler.py)

import nvstub_sched  # noqa: E402

from gpuslice.sched.sources import Channel  # noqa: E402

ROWS = ("client=0xc1d00001 channel=0x5c000010 tsg=0x5c000015 pid={a} executed_ns={ea} pending_ns={pa} disabled=1 "
        "timeslice_us=1000\nclient=0xc1d00002 channel=0x5c000011 tsg=0x5c000016 pid={b} executed_ns={eb} "
        "pending_ns={pb} disabled=0 timeslice_us=2000\ngarbage line\n")


def engine_text(a: int = 12, b: int = 13, ea: int = 5000, eb: int = 7, pa: int = 0, pb: int = 9) -> str:
    return ROWS.format(a=a, b=b, ea=ea, eb=eb, pa=pa, pb=pb)


def test_parse_engine() -> None:
    rows = nvstub_sched.parse_engine(engine_text())
    assert [(r["client"], r["channel"], r["pid"], r["disabled"]) for r in rows] == [
        (0xC1D00001, 0x5C000010, 12, 1), (0xC1D00002, 0x5C000011, 13, 0)]


def test_source_assigns_channels_by_process(tmp_path: Path) -> None:
    eng = tmp_path / "engine"
    eng.write_text(engine_text())
    asked: list[int] = []

    def assign(row: dict[str, int]) -> str | None:
        asked.append(row["pid"])
        return {12: "web"}.get(row["pid"])

    src = nvstub_sched.NvstubSource(str(eng), assign=assign)
    src.refresh()
    assert src.channels() == {"web": {Channel(0, 0xC1D00001, 0x5C000010, 12)}}
    src.refresh()
    assert asked == [12, 13]  # once per live process
    eng.write_text(engine_text(a=14))  # pid 12 gone, 14 new
    src.refresh()
    assert src.channels() == {} and asked == [12, 13, 14]
    src.close()


def test_instance_from_environ() -> None:
    env = dict(os.environ, GPUSLICE_INSTANCE="batch")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                         env={k: v for k, v in os.environ.items() if k != "GPUSLICE_INSTANCE"})
    try:
        for x in (p, q):  # /proc/PID/environ is the parent's until the child has exec'd
            end = time.monotonic() + 10
            while b"sleep(30)" not in open(f"/proc/{x.pid}/cmdline", "rb").read() and time.monotonic() < end:
                time.sleep(0.01)
        assert nvstub_sched.instance_from_environ(p.pid) == "batch"
        assert nvstub_sched.instance_from_environ(q.pid) is None
    finally:
        for x in (p, q):
            x.kill()
            x.wait()
    assert nvstub_sched.instance_from_environ(p.pid) is None  # gone


def test_probe_pending_or_progress(tmp_path: Path) -> None:
    eng = tmp_path / "engine"
    chans = {"a": {Channel(0, 0xC1D00001, 0x5C000010, 12)}, "b": {Channel(0, 0xC1D00002, 0x5C000011, 13)},
             "none": set()}
    probe = nvstub_sched.NvstubProbe(str(eng))
    eng.write_text(engine_text(pa=0, pb=9))
    assert probe.active(chans) == {"b"}  # pending work; a's executed_ns has no previous sample
    eng.write_text(engine_text(ea=6000, pb=0))
    assert probe.active(chans) == {"a"}  # a executed since; b drained and did not
    eng.write_text(engine_text(ea=6000, pb=0))
    assert probe.active(chans) == set()


def test_the_product_knows_nothing_of_the_stand_ins_engine() -> None:
    pkg = REPO / "pyctl" / "gpuslice"
    files = sorted((pkg / "sched").glob("*.py")) + sorted(pkg.glob("cli*.py")) + sorted(pkg.glob("cli/*.py"))
    assert any(f.name == "scheduler.py" for f in files)
    for f in files:
        assert "nvstub" not in f.read_text().lower(), f


def test_workload_daemon_loads_them_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """workload.Daemon's command line, as the guest runs it: the classes import and
    construct from its PYTHONPATH; here the daemon then stops at the missing RM node."""
    monkeypatch.syspath_prepend(str(GUEST))  # workload's own sys.path inserts are undone too
    from workload import Daemon

    d = Daemon(str(tmp_path / "state.json"), str(tmp_path / "status.json"),
               "--ctl", str(tmp_path / "nvidiactl"), "--no-watchdog", "--rt-priority", "0")
    try:
        rc = d.proc.wait(timeout=60)
    finally:
        d.stop()
    log = Path(d.log_path).read_text().strip()
    assert rc != 0
    assert log.startswith("gpuctl: ") and "\n" not in log and "nvidiactl" in log, log

"""Helpers for the real-GPU tests and benchmark: run a workload with or without
libgpuslice.so, collect its JSON, stats and the events it reports, log everything raw."""

from __future__ import annotations

import ctypes.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SO = REPO / "preload" / "libgpuslice.so"
GiB = 1 << 30
MiB = 1 << 20
RAW = Path(os.environ.get("GPUSLICE_RAW", tempfile.gettempdir()))


def have_gpu() -> bool:
    return os.path.exists("/dev/nvidiactl") and ctypes.util.find_library("cuda") is not None


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(REPO / "preload")], check=True)


def raw(title: str, text: str) -> None:
    with open(RAW / "raw.txt", "a") as f:
        f.write(f"==== {time.strftime('%H:%M:%S')} {title}\n{text.rstrip()}\n")


class Listener:
    """The controller's end of GPUSLICE_SOCKET: collects JSON event lines."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gs-")
        self.path = os.path.join(self.dir, "preload.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.events: list[dict] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        buf = b""
        while True:
            b = conn.recv(65536)
            if not b:
                return
            buf += b
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                with self.lock:
                    self.events.append(json.loads(line))

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)


def env_for(limit: str | None, name: str = "gputest", sock: str | None = None, extra: dict | None = None,
            stats: Path | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if limit is not None:
        env["LD_PRELOAD"] = str(SO)
        env["GPUSLICE_MEM_LIMIT"] = limit
        env["GPUSLICE_INSTANCE"] = name
        env["GPUSLICE_DEBUG"] = "1"
        env["GPUSLICE_SOCKET"] = sock or "/nonexistent/preload.sock"
        if stats:
            env["GPUSLICE_STATS"] = str(stats)
    env.update(extra or {})
    return env


def run(args: list[str], limit: str | None, title: str, timeout: float = 240, **kw) -> tuple[dict, str, dict]:
    """Run a workload; returns (its JSON, stderr, preload stats or {})."""
    stats = Path(tempfile.mktemp(prefix="gs-stats-"))
    env = env_for(limit, stats=stats, **kw)
    cmd = [sys.executable, *args] if args[0].endswith(".py") else args
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        def text(b: bytes | str | None) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        p = subprocess.CompletedProcess(cmd, 124, text(e.stdout), text(e.stderr) + f"\n(timed out after {timeout}s)")
    wall = time.perf_counter() - t0
    pre = f"LD_PRELOAD={env.get('LD_PRELOAD', '')} GPUSLICE_MEM_LIMIT={env.get('GPUSLICE_MEM_LIMIT', '')} "
    extra = " ".join(f"{k}={v}" for k, v in (kw.get("extra") or {}).items())
    # the preload's event lines are many; keep refusals, stats and the workload's own output
    err_keep = "\n".join(x for x in p.stderr.splitlines() if '"event":' not in x)[-6000:]
    raw(title, f"$ {extra} {pre}{' '.join(map(str, cmd))}\nrc={p.returncode} wall={wall:.2f}s\n"
        f"--- stdout\n{p.stdout[-6000:]}\n--- stderr (event lines dropped)\n{err_keep}")
    out = {}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            out = json.loads(line)
            break
    out["_rc"] = p.returncode
    out["_wall"] = wall
    st = {}
    if stats.exists():
        lines = stats.read_text().splitlines()
        if lines:
            st = json.loads(lines[-1])
        stats.unlink()
    return out, p.stderr, st

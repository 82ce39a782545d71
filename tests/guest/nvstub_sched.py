"""The scheduler's source and probe on the nvstub stand-in's simulated engine (a test double).

`gpuctl daemon` knows nothing of the stand-in; the guest tests and the guest benchmark
hand these classes to it by import path, with tests/guest on the daemon's PYTHONPATH
(workload.Daemon does):

    gpuctl daemon --source nvstub_sched:NvstubSource --probe nvstub_sched:NvstubProbe

Both read /proc/nvstub/engine, one line per channel of ``key=value`` pairs (client,
channel, tsg, pid, executed_ns, pending_ns, disabled, timeslice_us):

* NvstubSource - a channel belongs to the instance named by its process's
  GPUSLICE_INSTANCE environment variable (what workload.Workload sets);
* NvstubProbe  - an instance is active when one of its channels has pending_ns > 0, or
  its executed_ns grew since the previous sample.

Importable on the host too (only gpuslice.sched.sources is needed): tests/test_nvstub_sched.py.
"""

from __future__ import annotations

from typing import Callable, Mapping

from gpuslice.sched.sources import Channel

ENGINE = "/proc/nvstub/engine"


def parse_engine(text: str) -> list[dict[str, int]]:
    """/proc/nvstub/engine lines (``key=value ...``) as dicts of ints."""
    rows = []
    for line in text.splitlines():
        row: dict[str, int] = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                try:
                    row[k] = int(v, 0)
                except ValueError:
                    continue
        if "client" in row and "channel" in row:
            rows.append(row)
    return rows


def instance_from_environ(pid: int, var: str = "GPUSLICE_INSTANCE") -> str | None:
    """The value of ``var`` in process ``pid``'s environment (None: unset, empty or gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    prefix = var.encode() + b"="
    for e in env:
        if e.startswith(prefix):
            return e[len(prefix):].decode(errors="replace") or None
    return None


class NvstubSource:
    """Channels of the stand-in's simulated engine, assigned to instances by ``assign``
    (default: the process's GPUSLICE_INSTANCE)."""

    def __init__(self, path: str = ENGINE,
                 assign: Callable[[dict[str, int]], str | None] | None = None) -> None:
        self.path = path
        self.assign = assign or (lambda row: instance_from_environ(row.get("pid", 0)))
        self._by_pid: dict[int, str | None] = {}
        self._chans: dict[str, set[Channel]] = {}
        self.rows: list[dict[str, int]] = []

    def refresh(self) -> None:
        with open(self.path) as f:
            self.rows = parse_engine(f.read())
        out: dict[str, set[Channel]] = {}
        for row in self.rows:
            pid = row.get("pid", 0)
            if pid not in self._by_pid:
                self._by_pid[pid] = self.assign(row)
            name = self._by_pid[pid]
            if name:
                out.setdefault(name, set()).add(Channel(row.get("gpu", 0), row["client"], row["channel"], pid))
        live = {r.get("pid", 0) for r in self.rows}
        self._by_pid = {p: n for p, n in self._by_pid.items() if p in live}
        self._chans = out

    def channels(self) -> dict[str, set[Channel]]:
        return {k: set(v) for k, v in self._chans.items()}

    def close(self) -> None:
        pass


class NvstubProbe:
    """Busy = pending work, or work executed since the previous sample."""

    def __init__(self, path: str = ENGINE) -> None:
        self.path = path
        self._executed: dict[tuple[int, int], int] = {}

    def active(self, chans: Mapping[str, set[Channel]]) -> set[str]:
        with open(self.path) as f:
            rows = parse_engine(f.read())
        busy: set[tuple[int, int]] = set()
        executed: dict[tuple[int, int], int] = {}
        for r in rows:
            key = (r["client"], r["channel"])
            executed[key] = r.get("executed_ns", 0)
            if r.get("pending_ns", 0) > 0 or executed[key] > self._executed.get(key, executed[key]):
                busy.add(key)
        self._executed = executed
        return {n for n, cs in chans.items() if any(c.pair in busy for c in cs)}

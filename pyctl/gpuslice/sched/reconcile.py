"""The memory limit held against RM's own count: the bounding half of the quota.

The interposer decides on an allocation from its parameters, which RM reads again from
the caller's memory afterwards (kmod/core/quota.c): a thread of the caller can rewrite
them in between and get more than it was charged for. Nothing a container can write
decides what happens here: the numbers come from RM itself, through the daemon's own RM
client (GPU_GET_PIDS and GPU_GET_PID_INFO, ``RmClient.pid_vidmem``), and the processes
from the module (each instance's pids with a live RM client).

An honest instance never holds more in RM's count than its limit: the interposer
reserves an allocation's largest possible size before RM sees it and charges what RM
reports. So an instance whose processes hold more than its limit in RM's count, and
more than the interposer charged (a limit lowered below what is in use stays legal),
got past the check. Its largest process (in RM's count) is killed with SIGKILL, as the
memory cgroup's OOM killer does; RM frees its memory when its files go. Each kill is
logged and counted. The bound: a breach lives at most one polling interval plus the
time to kill (docs/isolation.md has the measured figures).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slice:
    """What the interposer knows of one instance."""

    name: str
    limit: int
    used: int  # bytes the interposer charged
    pids: frozenset[int]
    gpus: frozenset[int] = frozenset({0})


@dataclass(frozen=True)
class Breach:
    name: str
    rm_bytes: int  # what RM counts for the instance's processes
    used: int
    limit: int
    pid: int  # the process to stop: the largest in RM's count
    pid_bytes: int


def breaches(slices: Iterable[Slice], usage: Mapping[int, int]) -> list[Breach]:
    """Instances past their limit in RM's count (``usage``: bytes per pid, all GPUs).

    A pid in several instances (a host process that opened two) is left out of all of
    them: its bytes cannot be split between them."""
    slices = list(slices)
    seen: dict[int, int] = {}
    for s in slices:
        for p in s.pids:
            seen[p] = seen.get(p, 0) + 1
    out = []
    for s in slices:
        held = {p: usage[p] for p in s.pids if seen[p] == 1 and usage.get(p, 0) > 0}
        rm = sum(held.values())
        if held and rm > s.limit and rm > s.used:
            pid = max(held, key=lambda p: (held[p], p))
            out.append(Breach(s.name, rm, s.used, s.limit, pid, held[pid]))
    return out


class Usage(Protocol):
    def pid_vidmem(self, minor: int) -> dict[int, int]: ...


def rm_usage(rm: Usage, gpus: Iterable[int]) -> dict[int, int]:
    """Bytes per pid summed over ``gpus``."""
    total: dict[int, int] = {}
    for g in sorted(set(gpus)):
        for pid, b in rm.pid_vidmem(g).items():
            total[pid] = total.get(pid, 0) + b
    return total


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[19])


def _boot_ticks_now() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")


def kill_process(pid: int, seen_since_ticks: float) -> bool:
    """SIGKILL ``pid`` through a pidfd, unless the pid now names a process that started
    after the module first listed it (the one we meant is gone and its number reused)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if _start_ticks(pid) > seen_since_ticks:
            log.warning("pid %d was reused since it was listed; not killed", pid)
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclass
class Kill:
    at: float  # time.time()
    breach: Breach
    killed: bool


@dataclass
class Reconciler:
    """Polls RM's per-process count against the slices and stops breaches."""

    usage: Usage
    slices: Callable[[], list[Slice]]
    kill: Callable[[int, float], bool] = kill_process
    kills: list[Kill] = field(default_factory=list)
    polls: int = 0
    _first_seen: dict[int, float] = field(default_factory=dict)

    def poll(self) -> list[Kill]:
        sl = self.slices()
        now = _boot_ticks_now()
        pids = {p for s in sl for p in s.pids}
        self._first_seen = {p: self._first_seen.get(p, now) for p in pids}
        gpus = {g for s in sl for g in s.gpus}
        found = breaches(sl, rm_usage(self.usage, gpus)) if pids else []
        self.polls += 1
        done = []
        for b in found:
            ok = self.kill(b.pid, self._first_seen.get(b.pid, now))
            k = Kill(time.time(), b, ok)
            done.append(k)
            self.kills.append(k)
            log.warning("instance %s holds %d bytes in RM's count (limit %d, charged %d): "
                        "%s pid %d (%d bytes)", b.name, b.rm_bytes, b.limit, b.used,
                        "killed" if ok else "could not kill", b.pid, b.pid_bytes)
        return done

    def summary(self) -> dict[str, Any]:
        last = self.kills[-1] if self.kills else None
        return {
            "polls": self.polls,
            "kills": sum(1 for k in self.kills if k.killed),
            "breaches": len(self.kills),
            "last": None if last is None else {"at": last.at, "instance": last.breach.name,
                                               "pid": last.breach.pid, "rm_bytes": last.breach.rm_bytes,
                                               "limit": last.breach.limit, "killed": last.killed},
        }


def netlink_slices(nl: Any) -> Callable[[], list[Slice]]:
    """Instances as the module reports them (INSTANCE_GET dump)."""

    from gpuslice.netlink import gpu_mem, gpus_of

    def get() -> list[Slice]:
        out = []
        for d in nl.instances():
            # video memory is limited per GPU: the instance may hold the sum of its GPUs'
            limit = sum(g["limit"] for g in gpu_mem(d).values()) or int(d["mem_limit"])
            out.append(Slice(str(d["name"]), limit, int(d.get("mem_used", 0)),
                             frozenset(int(p) for p in d.get("pids", [])),
                             frozenset(gpus_of(int(d.get("gpu_mask", 1))))))
        return out

    return get


def environ_slices(gpus: Iterable[int] = (0,)) -> Callable[[], list[Slice]]:
    """The user-space build: every process with libgpuslice.so preloaded is a slice of
    its own, with the limit of its GPUSLICE_MEM_LIMIT (the library enforces it per
    process). Read from /proc/PID/environ, which the process itself can rewrite: the
    user-space build is a test bed of the core against the real driver, not a boundary."""
    from gpuslice.units import parse_env_memory

    gset = frozenset(gpus)

    def get() -> list[Slice]:
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if b"libgpuslice" not in env.get(b"LD_PRELOAD", b"") or b"GPUSLICE_MEM_LIMIT" not in env:
                continue
            try:
                size, per = parse_env_memory(env[b"GPUSLICE_MEM_LIMIT"].decode())
            except (ValueError, UnicodeDecodeError):
                continue
            # the library limits each GPU: the process may hold that on each GPU looked at
            if per and not gset <= per.keys():
                continue  # a GPU without a limit: nothing to hold
            limit = sum(per[g] for g in gset) if per else size * len(gset)
            name = env.get(b"GPUSLICE_INSTANCE", b"default").decode(errors="replace")
            # used is not reported live: 0 makes "more than charged" follow from the limit
            out.append(Slice(f"{name}/{d}", limit, 0, frozenset({int(d)}), gset))
        return out

    return get

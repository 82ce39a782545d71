"""Load (issue 11): 64 processes across 8 instances allocate, free and issue controls for
GPUSLICE_LOAD_SECONDS (60 by default; set it lower while developing), through the
instances' nodes, against the stand-in.

Each worker loops over random steps: allocate video memory of random sizes (some larger
than what is left, some larger than the limit), free or duplicate what it holds, issue
allowed controls (FB_GET_INFO_V2, whose virtualized total must stay the limit, and
MC_GET_ARCH_INFO) and now and then a call the module must refuse: a control, a free or
an allocation naming another instance's client (FOREIGN), an unlisted control
(UNLISTED), FIFO_DISABLE_CHANNELS (GLOBAL), RM_ACCESS_REGISTRY (ESCAPE). Now and then it
exits or kills itself with SIGKILL, holding memory; the test also SIGKILLs a random
worker every KILL_EVERY seconds, possibly mid-call. Every dead worker is replaced.

Asserted: the stand-in's bytes for an instance (its processes' clients in
/proc/nvstub/clients) never pass the limit, nor does the module's used or peak; every
refusal a worker saw is one the module traced (gpuslice_refusal, with its reason) for
that pid, and every traced refusal is one a worker saw, but for at most the last call
of a worker the test killed (it may die before it writes down the answer); the
module's per-instance quota and filter counters equal the traced refusals; with the
workers quiet, the module's used equals the stand-in's bytes per instance, and both
are 0 once they are gone; the kernel logged no bug. Printed (never asserted): calls,
refusals, and each instance's core-lock figures (acquisitions, hold and wait p99 and
max, from the LOCK_* attributes of INSTANCE_GET).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import mmap
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import pytest
from click.testing import CliRunner

from gpuslice import abi, netlink
from gpuslice.trace import fmt as tracefmt
from gpuslice.cli import main as gpuctl_main
from gpuslice.netlink import GpusliceNetlink

import gsinst
import nvstub
from gsinst import Instance, needs_modules, wait_for

MIB = 1 << 20
N_INST = 8
PER_INST = int(os.environ.get("GPUSLICE_LOAD_PER_INSTANCE", "8"))  # fewer: to see the lock without the crowd
LIMIT = 96 * MIB
SECONDS = float(os.environ.get("GPUSLICE_LOAD_SECONDS", "60"))
KILL_EVERY = 1.0  # the test SIGKILLs a random worker this often (s)
POLL_EVERY = 0.05  # stand-in bytes (s)
MODULE_EVERY = 0.5  # module's used (s)
MAX_HELD = 12  # handles a worker holds before it only frees
P_EXIT = 1 / 3000  # per step: a worker exits, holding what it has
P_SELF_KILL = 1 / 3000  # per step: a worker SIGKILLs itself
TRACEFS = Path("/sys/kernel/tracing")
BAD = re.compile(r"BUG:|Oops|WARNING:|general protection|KASAN|list_del corruption|list_add corruption|"
                 r"usercopy:|Poison overwritten|double free|use-after-free|soft lockup|hung_task|"
                 r"INFO: task .* blocked")

# shared page: the phase, then one u32 per worker slot (the client it runs)
READY, RUN, QUIET, EXIT = 0, 1, 2, 3
SLOT_OFF = 64

REASON = {v: k for k, v in tracefmt.REFUSAL_NAMES.items()}  # "QUOTA" -> 1
ESC_ALLOC, ESC_CONTROL, ESC_FREE = abi.NV_ESC_RM_ALLOC, abi.NV_ESC_RM_CONTROL, abi.NV_ESC_RM_FREE
ESC_REFUSED = abi.NV_ESC_RM_ACCESS_REGISTRY  # an escape no container may make
DEVICE, SUBDEVICE = 0x5C000002, 0x5C000003  # gsinst.InstSession's handles
FIRST_HANDLE = 0x5C000011

if not (TRACEFS / "events").is_dir():  # the guest may boot without tracefs mounted
    subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, check=False)

pytestmark = [needs_modules,
              pytest.mark.skipif(not (TRACEFS / "events" / "gpuslice").is_dir(),
                                 reason="needs tracefs and gpuslice.ko's tracepoints")]

Key = tuple[str, int, int]  # reason, escape, what: one refusal as the trace names it


# ---------------------------------------------------------------- the worker (a forked child)

@dataclass
class Spec:
    slot: int
    inst: int
    dev: str  # /dev/gpuslice/<name>
    log_dir: str
    seed: int


def _foreign(shm: mmap.mmap, me: Spec, rng: random.Random) -> int:
    """A client of another instance (0 if none is known yet)."""
    for _ in range(4):
        j = rng.randrange(N_INST * PER_INST)
        if j // PER_INST != me.inst:
            c = struct.unpack_from("<I", shm, SLOT_OFF + 4 * j)[0]
            if c:
                return int(c)
    return 0


def _size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.6:
        return rng.randrange(1, 64) * 64 * 1024  # 64 KiB .. 4 MiB
    if r < 0.9:
        return rng.randrange(4, 16) * MIB
    return rng.randrange(16, 128) * MIB  # sometimes more than the whole limit


def _work(me: Spec, shm: mmap.mmap) -> int:
    rng = random.Random(me.seed)
    log = os.open(f"{me.log_dir}/{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def rec(line: str) -> None:
        os.write(log, (line + "\n").encode())

    def refused(reason: str, esc: int, what: int, st: int, want: int = abi.NV_ERR_INSUFFICIENT_PERMISSIONS) -> None:
        if st == want:
            rec(f"R {reason} {esc:x} {what:x}")
        else:
            rec(f"E {reason} {esc:#x} {what:#x}: status {st:#x}, not {want:#x}")

    s = gsinst.InstSession(f"{me.dev}/nvidiactl", f"{me.dev}/nvidia0")
    struct.pack_into("<I", shm, SLOT_OFF + 4 * me.slot, s.client)
    rec(f"S {s.client:x}")
    while shm[0] == READY:  # until every worker is up
        time.sleep(0.05)
    held: list[int] = []
    fb = [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE, abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE]
    while shm[0] == RUN:
        r = rng.random()
        if r < P_EXIT:
            rec("X")
            return 0  # the files close with the process, and RM frees what it held
        if r < P_EXIT + P_SELF_KILL:
            rec("K")
            os.kill(os.getpid(), signal.SIGKILL)
        r = rng.random()
        if r < 0.30 and len(held) < MAX_HELD:
            st, h, _ = s.alloc_vidmem(_size(rng))
            if st == abi.NV_OK:
                held.append(h)
            else:
                refused("QUOTA", ESC_ALLOC, abi.NV01_MEMORY_LOCAL_USER, st, abi.NV_ERR_NO_MEMORY)
        elif r < 0.55 and held:
            h = held.pop(rng.randrange(len(held)))
            st = s.free(h)
            if st != abi.NV_OK:
                rec(f"E free {h:#x}: status {st:#x}")
        elif r < 0.60 and held:
            st, h = s.dup(rng.choice(held))
            if st == abi.NV_OK:
                held.append(h)
            else:
                rec(f"E dup: status {st:#x}")
        elif r < 0.75:
            st, info = nvstub.fb_info(s.ctl, s.client, s.subdevice, fb)
            if st != abi.NV_OK or info[fb[0]] != LIMIT // 1024 or info[fb[1]] > LIMIT // 1024:
                rec(f"E FB_GET_INFO_V2: status {st:#x} {info}")
        elif r < 0.85:
            p = ctypes.create_string_buffer(abi.MC_ARCH_INFO.size)
            st = nvstub.rm_control(s.ctl, s.client, s.subdevice, abi.NV2080_CTRL_CMD_MC_GET_ARCH_INFO, p)
            if st != abi.NV_OK:
                rec(f"E MC_GET_ARCH_INFO: status {st:#x}")
        else:
            k = rng.randrange(6)
            other = _foreign(shm, me, rng)
            if k == 0 and other:
                p = ctypes.create_string_buffer(abi.FB_GET_INFO_V2_SIZE)
                st = nvstub.rm_control(s.ctl, other, SUBDEVICE, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, p)
                refused("FOREIGN", ESC_CONTROL, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, st)
            elif k == 1 and other:
                st = nvstub.rm_free(s.ctl, other, DEVICE, FIRST_HANDLE + rng.randrange(32))
                refused("FOREIGN", ESC_FREE, 0, st)
            elif k == 2 and other:
                st, _ = nvstub.rm_alloc(s.ctl, other, DEVICE, s.handle(), abi.NV01_MEMORY_LOCAL_USER,
                                        nvstub.mem_params(2 * MIB))
                refused("FOREIGN", ESC_ALLOC, abi.NV01_MEMORY_LOCAL_USER, st)
            elif k == 3:
                st = nvstub.get_timeslice(s.ctl, s.client, SUBDEVICE)[0]
                refused("UNLISTED", ESC_CONTROL, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, st, abi.NV_ERR_NOT_SUPPORTED)
            elif k == 4:
                st = nvstub.disable_channels(s.ctl, s.client, s.subdevice, [], True)
                refused("GLOBAL", ESC_CONTROL, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, st)
            elif k == 5:
                ret = nvstub.ioctl(s.ctl, abi.iowr(ESC_REFUSED, 16), bytearray(16))
                refused("ESCAPE", ESC_REFUSED, 0, -ret, errno.EPERM)
    rec("Q")
    while shm[0] != EXIT:
        time.sleep(0.05)
    s.close()
    return 0


def _worker(me: Spec, shm: mmap.mmap) -> NoReturn:
    code = 3
    try:
        os.closerange(3, 4096)  # the parent's sockets, trace pipe and capture files
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        os.nice(19)  # the parent's polls and kills keep their pace; the workers take the rest
        code = _work(me, shm)
    except BaseException as e:  # noqa: BLE001 - anything is a failure the parent reports
        try:
            fd = os.open(f"{me.log_dir}/{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, f"E exception {e!r}\n".encode())
        except OSError:
            pass
    os._exit(code)


# ---------------------------------------------------------------- the parent's instruments

class RefusalTrace:
    """gpuslice_refusal in a tracefs instance of its own, drained as it runs."""

    LINE = re.compile(r"gpuslice_refusal: inst=\d+/(\S+) pid=(\d+) kind=\d+ escape=0x([0-9a-f]+) "
                      r"what=0x([0-9a-f]+) refusal=(\d+)")

    def __init__(self) -> None:
        self.dir = TRACEFS / "instances" / gsinst.unique("gsload")
        self.dir.mkdir()
        (self.dir / "buffer_size_kb").write_text("8192\n")
        (self.dir / "events/gpuslice/gpuslice_refusal/enable").write_text("1\n")
        self.fd = os.open(self.dir / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        self.partial = b""
        self.by_pid: dict[int, Counter[Key]] = {}
        self.by_inst: dict[str, Counter[str]] = {}

    def drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            lines = (self.partial + chunk).split(b"\n")
            self.partial = lines.pop()
            for ln in lines:
                m = self.LINE.search(ln.decode(errors="replace"))
                if m:
                    name, pid, esc, what, refusal = m.groups()
                    reason = tracefmt.REFUSAL_NAMES.get(int(refusal), refusal)
                    self.by_pid.setdefault(int(pid), Counter())[(reason, int(esc, 16), int(what, 16))] += 1
                    self.by_inst.setdefault(name, Counter())[reason] += 1

    def close(self) -> list[str]:
        """Stops it, reads the rest; returns what the buffer lost (empty when nothing).
        The counts stay."""
        if self.fd < 0:
            return []
        (self.dir / "events/gpuslice/gpuslice_refusal/enable").write_text("0\n")
        self.drain()
        lost = []
        for stats in sorted(self.dir.glob("per_cpu/cpu*/stats")):
            kv = dict(ln.split(":", 1) for ln in stats.read_text().splitlines() if ":" in ln)
            for k in ("overrun", "dropped events"):
                if int(kv.get(k, "0").strip() or 0):
                    lost.append(f"{stats.parent.name} {k}={kv[k].strip()}")
        os.close(self.fd)
        self.fd = -1
        self.dir.rmdir()
        return lost


@dataclass
class Worker:
    pid: int
    slot: int
    inst: int
    killed: bool = False  # SIGKILLed by the test
    status: int | None = None  # waitpid status once reaped


@dataclass
class Load:
    names: list[str]
    log_dir: Path
    shm: mmap.mmap
    rng: random.Random
    workers: dict[int, Worker] = field(default_factory=dict)
    pid_inst: dict[int, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    standin_max: list[int] = field(default_factory=lambda: [0] * N_INST)
    phases: dict[str, float] = field(default_factory=dict)  # seconds each phase took
    kills: int = 0  # SIGKILLs sent by the test

    def spawn(self, slot: int) -> None:
        inst = slot // PER_INST
        spec = Spec(slot, inst, str(gsinst.DEV_DIR / self.names[inst]), str(self.log_dir),
                    self.rng.getrandbits(64))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _worker(spec, self.shm)
        assert pid not in self.workers, f"pid {pid} reused within the run: its records would mix"
        self.workers[pid] = Worker(pid, slot, inst)
        self.pid_inst[pid] = inst

    def live(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.status is None]

    def reap(self, respawn: bool) -> None:
        for w in self.live():
            pid, status = os.waitpid(w.pid, os.WNOHANG)
            if pid:
                w.status = status
                if respawn:
                    self.spawn(w.slot)

    def standin_bytes(self) -> list[int]:
        """The stand-in's video memory per instance: its workers' clients."""
        out = [0] * N_INST
        for c in nvstub.clients():
            i = self.pid_inst.get(c["pid"])
            if i is not None:
                out[i] += c["vidmem"]
        return out

    def check_standin(self) -> None:
        for i, b in enumerate(self.standin_bytes()):
            self.standin_max[i] = max(self.standin_max[i], b)
            if b > LIMIT and len(self.violations) < 20:
                self.violations.append(f"stand-in holds {b} for {self.names[i]} (limit {LIMIT})")

    def kill_all(self) -> None:
        for w in self.live():
            try:
                os.kill(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for w in self.live():
            _, w.status = os.waitpid(w.pid, 0)


def module_stats(nl: GpusliceNetlink, names: list[str]) -> list[dict[str, Any]]:
    by_name = {d["name"]: d for d in nl.instances() if "name" in d}
    return [by_name[n] for n in names]


def read_logs(log_dir: Path) -> dict[int, list[str]]:
    out = {}
    for f in log_dir.iterdir():
        text = f.read_text()
        lines = text.split("\n")
        out[int(f.name)] = lines[:-1]  # a worker killed mid-write leaves no newline: not a record
    return out


def us(ns: int) -> str:
    return f"{ns / 1000:.1f}us"


def gpuctl(state: Path, *args: str) -> tuple[int, str]:
    """gpuctl ARGS in this process (a new interpreter takes half a minute under TCG):
    exit code, and stdout (everything it wrote when it failed)."""
    r = CliRunner().invoke(gpuctl_main, ["--state", str(state), "--kernel", "yes", *args])
    return r.exit_code, r.stdout if r.exit_code == 0 else f"{r.output} {r.exception!r}"


@pytest.fixture
def say(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., None]]:
    """Prints to the terminal even when pytest captures output."""
    def _say(*lines: str) -> None:
        with capsys.disabled():
            for ln in lines:
                sys.stdout.write(ln + "\n")
            sys.stdout.flush()
    yield _say


# ---------------------------------------------------------------- the test

def test_load_64_processes_8_instances(nl: GpusliceNetlink, tmp_path: Path, say: Callable[..., None]) -> None:
    dmesg_before = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.count("\n")
    state = tmp_path / "state.json"
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    # the first instance through gpuctl (its figures are read back through it below), the rest by netlink
    first = gsinst.unique("ld")
    rc, out = gpuctl(state, "instance", "create", first, "--memory", f"{LIMIT // MIB}MiB", "--mode", "660")
    assert rc == 0, out
    with contextlib.ExitStack() as stack:
        stack.callback(nl.instance_del, first)
        names = [first] + [stack.enter_context(Instance(nl, LIMIT)).name for _ in range(N_INST - 1)]
        shm = mmap.mmap(-1, 4096)
        seed = int.from_bytes(os.urandom(4), "little")
        load = Load(names, log_dir, shm, random.Random(seed))
        trace = RefusalTrace()
        stack.callback(trace.close)
        stack.callback(load.kill_all)  # first out: no worker outlives a failure
        stack.callback(shm.__setitem__, 0, EXIT)
        ran, quiet_used, lost, final = run_load(nl, load, trace)
        report(state, first, load, trace, final, ran, quiet_used, lost, seed, say)
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()[dmesg_before:]
    bad = [i for i, ln in enumerate(log) if BAD.search(ln)]
    assert not bad, "the kernel logged a bug during the load:\n" + "\n".join(log[bad[0]:bad[0] + 40])


def run_load(nl: GpusliceNetlink, load: Load, trace: RefusalTrace
             ) -> tuple[float, list[int], list[str], list[dict[str, Any]]]:
    """Runs the workers for SECONDS, quiets them, checks the accounting, lets them exit.
    Returns the time it ran, the stand-in's bytes per instance while quiet, what the
    trace lost, and the module's last INSTANCE_GET of each instance."""
    names = load.names
    t = time.monotonic()
    for slot in range(N_INST * PER_INST):
        load.spawn(slot)

    def all_up() -> bool:
        load.reap(respawn=False)
        logs = read_logs(load.log_dir)
        return all(any(ln.startswith(("S ", "E")) for ln in logs.get(w.pid, [])) for w in load.workers.values())

    assert wait_for(all_up, 120), "workers did not start"
    load.phases["start"] = time.monotonic() - t
    load.shm[0] = RUN
    t0 = time.monotonic()
    next_kill = t0 + KILL_EVERY
    next_module = 0.0
    while time.monotonic() - t0 < SECONDS:
        load.reap(respawn=True)
        load.check_standin()
        trace.drain()
        now = time.monotonic()
        if now >= next_module:
            next_module = now + MODULE_EVERY
            for i, d in enumerate(module_stats(nl, names)):
                if d["mem_used"] > LIMIT:
                    load.violations.append(f"module used {d['mem_used']} for {names[i]}")
        if now >= next_kill:
            next_kill = now + KILL_EVERY
            victims = load.live()
            if victims:
                w = load.rng.choice(victims)
                w.killed = True
                load.kills += 1
                os.kill(w.pid, signal.SIGKILL)
        time.sleep(POLL_EVERY)
    ran = time.monotonic() - t0

    # quiet: every worker finishes its step and waits, holding what it has
    t = time.monotonic()
    load.shm[0] = QUIET

    def all_quiet() -> bool:
        load.reap(respawn=False)
        trace.drain()
        logs = read_logs(load.log_dir)
        return all("Q" in logs.get(w.pid, []) for w in load.live())

    assert wait_for(all_quiet, 120), "workers did not go quiet"
    load.check_standin()

    # the accounting of killed workers ends when the reaper has their files: wait for it
    def used() -> list[int]:
        return [d["mem_used"] for d in module_stats(nl, names)]

    assert wait_for(lambda: used() == load.standin_bytes(), 30), \
        f"module used {used()} != stand-in {load.standin_bytes()} with the workers quiet"
    quiet_used = load.standin_bytes()
    load.phases["quiet"] = time.monotonic() - t

    t = time.monotonic()
    load.shm[0] = EXIT

    def all_gone() -> bool:
        load.reap(respawn=False)
        return not load.live()

    assert wait_for(all_gone, 120), "workers did not exit"
    assert wait_for(lambda: not any(used()) and not any(load.standin_bytes()), 60), \
        f"after exit: module {used()}, stand-in {load.standin_bytes()}"
    assert not [c for c in nvstub.clients() if c["pid"] in load.pid_inst], "clients outlived their workers"
    lost = trace.close()
    load.phases["exit"] = time.monotonic() - t
    return ran, quiet_used, lost, module_stats(nl, names)


def report(state: Path, first: str, load: Load, trace: RefusalTrace, final: list[dict[str, Any]], ran: float,
           quiet_used: list[int], lost: list[str], seed: int, say: Callable[..., None]) -> None:
    """The checks on what the workers saw against what the module traced and counted,
    then the figures."""
    names = load.names
    logs = read_logs(load.log_dir)
    errors = [f"{pid}: {ln}" for pid, lines in logs.items() for ln in lines if ln.startswith("E")]
    assert not errors, "\n".join(errors[:20])
    ends = Counter[str]()
    for w in load.workers.values():
        assert w.status is not None
        lines = logs.get(w.pid, [])
        if os.WIFEXITED(w.status):
            assert os.WEXITSTATUS(w.status) == 0, f"worker {w.pid} exited {os.WEXITSTATUS(w.status)}: {lines[-3:]}"
            ends["exited" if "X" in lines else "ran to the end"] += 1
        else:
            assert os.WIFSIGNALED(w.status) and os.WTERMSIG(w.status) == signal.SIGKILL, (w.pid, w.status)
            assert w.killed or (lines and lines[-1] == "K"), f"worker {w.pid} killed by nobody: {lines[-3:]}"
            ends["killed by the test" if w.killed else "killed itself"] += 1
    assert not load.violations, "\n".join(load.violations)

    # ---- every refusal explained: the workers' records against the module's trace
    assert not lost, f"the trace buffer lost events: {lost}"
    seen_total = Counter[str]()
    mismatches = []
    unrecorded = 0
    for pid, w in load.workers.items():
        saw = Counter[Key]()
        for ln in logs.get(pid, []):
            if ln.startswith("R "):
                reason, esc, what = ln.split()[1:]
                saw[(reason, int(esc, 16), int(what, 16))] += 1
                seen_total[reason] += 1
        traced = trace.by_pid.get(pid, Counter[Key]())
        extra, missing = traced - saw, saw - traced
        if missing or sum(extra.values()) > (1 if w.killed else 0):
            mismatches.append(f"pid {pid} ({'killed' if w.killed else 'not killed'} by the test): traced, not "
                              f"seen {dict(extra)}; seen, not traced {dict(missing)}")
        unrecorded += sum(extra.values())
    assert not mismatches, "\n".join(mismatches[:20])
    assert not set(trace.by_pid) - set(load.workers), "refusals traced for pids that are not workers"
    for name, d in zip(names, final):
        by_reason = trace.by_inst.get(name, Counter[str]())
        quota = by_reason["QUOTA"]
        assert d["nr_refused_quota"] == quota, (name, d["nr_refused_quota"], dict(by_reason))
        assert d["nr_refused_filter"] == sum(by_reason.values()) - quota, (name, d["nr_refused_filter"],
                                                                          dict(by_reason))
        assert d["mem_peak"] <= LIMIT, (name, d["mem_peak"])
    assert {"QUOTA", "FOREIGN", "UNLISTED", "GLOBAL", "ESCAPE"} <= set(seen_total), seen_total

    # ---- the lock's figures through gpuctl too
    t = time.monotonic()
    rc, shown = gpuctl(state, "instance", "show", first, "--json")
    assert rc == 0, shown
    assert json.loads(shown)["lock"]["acquired"] >= final[0]["lock_acquired"] > 0
    rc, shown = gpuctl(state, "instance", "show", first)
    assert rc == 0 and "lock hold" in shown, shown
    load.phases["gpuctl"] = time.monotonic() - t

    # ---- the figures (printed, never asserted)
    calls = sum(d["nr_ioctls"] for d in final)
    refusals = sum(d["nr_refused_quota"] + d["nr_refused_filter"] for d in final)
    hold = [sum(h) for h in zip(*(d["lock_hold_hist"] for d in final))]
    wait = [sum(h) for h in zip(*(d["lock_wait_hist"] for d in final))]
    hold_max = max(d["lock_hold_max_ns"] for d in final)
    wait_max = max(d["lock_wait_max_ns"] for d in final)
    mib = [round(b / MIB, 1) for b in load.standin_max]
    out = [
        f"load: {ran:.0f}s, {N_INST} instances x {PER_INST} processes, limit {LIMIT // MIB} MiB each, "
        f"seed {seed}; {len(load.workers)} processes in all: "
        + ", ".join(f"{n} {k}" for k, n in sorted(ends.items())),
        f"load: calls={calls} ({calls / ran:.0f}/s) refusals={refusals} ("
        + " ".join(f"{k.lower()}={n}" for k, n in sorted(seen_total.items()))
        + f", {unrecorded} unrecorded by workers killed mid-call) "
        f"events_suppressed={sum(d['nr_events_suppressed'] for d in final)}",
        "load: phases (s): " + " ".join(f"{k}={v:.1f}" for k, v in {**load.phases, "run": ran}.items()),
        f"load: MiB per instance: stand-in peak {mib}, module peak {[round(d['mem_peak'] / MIB, 1) for d in final]}, "
        f"quiet {[round(b / MIB, 1) for b in quiet_used]}",
        f"load: lock hold p99<={us(netlink.hist_quantile_ns(hold, 0.99, hold_max))} max={us(hold_max)} "
        f"wait p99<={us(netlink.hist_quantile_ns(wait, 0.99, wait_max))} max={us(wait_max)} "
        f"acquired={sum(d['lock_acquired'] for d in final)} contended={sum(d['lock_contended'] for d in final)} "
        f"(all instances)",
    ]
    for name, d in zip(names, final):
        s = netlink.lock_summary(d)
        out.append(f"load:   {name}: calls={d['nr_ioctls']} refused quota={d['nr_refused_quota']} "
                   f"filter={d['nr_refused_filter']} lock acquired={s['acquired']} contended={s['contended']} "
                   f"hold mean={us(s['hold_mean_ns'])} p99<={us(s['hold_p99_ns'])} max={us(s['hold_max_ns'])} "
                   f"wait p99<={us(s['wait_p99_ns'])} max={us(s['wait_max_ns'])}")
    out.append("load: lock hold histogram, all instances, [ns from, to): count: " + " ".join(
        f"[{netlink.hist_bucket_ns(i)[0]},{netlink.hist_bucket_ns(i)[1] or 'inf'}):{n}"
        for i, n in enumerate(hold) if n))
    out.append("load: lock wait histogram, all instances, [ns from, to): count: " + " ".join(
        f"[{netlink.hist_bucket_ns(i)[0]},{netlink.hist_bucket_ns(i)[1] or 'inf'}):{n}"
        for i, n in enumerate(wait) if n))
    say(*out)
    summary = os.environ.get("GPUSLICE_LOAD_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(json.dumps({"lines": out, "instances": final}, default=str) + "\n")

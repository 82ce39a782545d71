"""Faults (issue 11): allocation failures inside the module (its fail_alloc_every
parameter), the driver failing open/ioctl/mmap (the stand-in's fail_*_every), and SIGKILL
in the middle of RM_ALLOC, RM_FREE, RM_CONTROL, REGISTER_FD and mmap (the stand-in's
race_delay_entry_us holds the call in the driver). After each: clean errors, the stand-in's
bytes equal the module's charge, everything comes back, the instance can be deleted."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import subprocess
import sys
import time

import pytest

from gpuslice import abi

import nvstub
from gsinst import Instance, needs_modules, session
from test_quota_hostile import MIB, Pool, check_drained, check_invariant, wait_for

pytestmark = needs_modules

MOD = "/sys/module/gpuslice/parameters/"
STUB = "/sys/module/nvstub/parameters/"


def _set(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


@pytest.fixture
def pool():
    p = Pool()
    yield p
    p.close()


@pytest.fixture
def inject():
    for p in (MOD + "fail_alloc_every", STUB + "fail_open_every", STUB + "race_delay_entry_us"):
        if not os.path.exists(p):
            pytest.skip(f"no {p}")
    params = [MOD + "fail_alloc_every", STUB + "fail_open_every", STUB + "fail_ioctl_every",
              STUB + "fail_mmap_every", STUB + "race_delay_entry_us", STUB + "race_delay_us"]
    yield _set
    for p in params:
        _set(p, 0)


def _workload_round(inst: Instance, counts: dict[str, int], arm=None) -> list:
    """One process's worth of work through the instance; returns what it leaves open.
    Every failure must be a clean one: an errno from the syscall or an RM status.
    ``arm``, when given, is called once the session is made (faults start there)."""
    kept = []
    try:
        s = session(inst)
    except OSError as e:
        counts[f"session:{errno.errorcode.get(e.errno, e.errno)}"] = counts.get(
            f"session:{errno.errorcode.get(e.errno, e.errno)}", 0) + 1
        return kept
    kept.append(s)
    if arm is not None:
        arm()
    for step in ("alloc", "alloc", "tsg", "info", "free", "map"):
        try:
            if step == "alloc":
                st, h, size = s.alloc_vidmem(2 * MIB)
                key = f"alloc:{st:#x}"
            elif step == "tsg":
                s.tsg_channel()
                key = "tsg:ok"
            elif step == "info":
                s.fb_free_kib()
                key = "info:ok"
            elif step == "free":
                st, h, size = s.alloc_vidmem(2 * MIB)
                key = f"free:{s.free(h):#x}" if st == abi.NV_OK else f"alloc:{st:#x}"
            else:
                st, h, size = s.alloc_vidmem(2 * MIB)
                if st != abi.NV_OK:
                    key = f"alloc:{st:#x}"
                else:
                    buf = bytearray(abi.NVOS33_WITH_FD.pack(s.client, s.device, h, 0, size, 0, 0, 0, s.dev_fd))
                    ret = nvstub.ioctl(s.ctl, abi.iowr(abi.NV_ESC_RM_MAP_MEMORY, abi.NVOS33_WITH_FD.size), buf)
                    if ret == 0 and abi.NVOS33_WITH_FD.unpack(buf)[6] == abi.NV_OK:
                        m = mmap.mmap(s.dev_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                        m[0:4] = b"abcd"
                        kept.append(m)
                        key = "map:ok"
                    else:
                        key = f"map:{ret}/{abi.NVOS33_WITH_FD.unpack(buf)[6]:#x}"
        except OSError as e:
            key = f"{step}:{errno.errorcode.get(e.errno, e.errno)}"
        counts[key] = counts.get(key, 0) + 1
    return kept


def _close_all(kept: list) -> None:
    for k in kept:
        try:
            k.close()
        except (OSError, BufferError):
            pass


@pytest.mark.parametrize("every", [11, 23, 47])
def test_module_allocation_failures_unwind_cleanly(nl, pool, inject, every):
    """Every Nth allocation the module or its core makes fails (inject.c): each failure
    is an error to the caller, never a charge lost or an object leaked. Making a session
    takes more allocations than the smallest N, so every other round arms the faults only
    once the session is made: those rounds' failures land in the calls themselves."""
    limit = 256 * MIB
    counts: dict[str, int] = {}
    with Instance(nl, limit) as inst:
        kept = []
        for i in range(12):
            if i % 2:
                kept += _workload_round(inst, counts,
                                        arm=lambda: inject(MOD + "fail_alloc_every", every))
            else:
                inject(MOD + "fail_alloc_every", every)
                kept += _workload_round(inst, counts)
            inject(MOD + "fail_alloc_every", 0)
            check_invariant(inst, pool, limit)
        print(f"fail_alloc_every={every}: {sorted(counts.items())}")
        assert any(k.endswith("ENOMEM") or "0x51" in k for k in counts), counts  # something failed
        assert any(k.endswith(":ok") or k.endswith(":0x0") for k in counts), counts  # something worked
        _close_all(kept)
        check_drained(inst, pool)


def test_driver_failures_pass_through_cleanly(nl, pool, inject):
    """The real driver failing open (every 3rd), ioctl (every 5th) and mmap (every 2nd):
    the caller gets the driver's error, the accounting stays exact."""
    limit = 256 * MIB
    counts: dict[str, int] = {}
    with Instance(nl, limit) as inst:
        kept = []
        for _ in range(12):
            inject(STUB + "fail_open_every", 3)
            inject(STUB + "fail_ioctl_every", 5)
            inject(STUB + "fail_mmap_every", 2)
            kept += _workload_round(inst, counts)
            for p in ("fail_open_every", "fail_ioctl_every", "fail_mmap_every"):
                inject(STUB + p, 0)
            check_invariant(inst, pool, limit)
        print(f"driver failures: {sorted(counts.items())}")
        assert any("ENOMEM" in k for k in counts), counts
        _close_all(kept)
        check_drained(inst, pool)
        assert wait_for(lambda: not inst.get().get("pids"))


KILLME = r'''
import mmap, os, sys
sys.path[:0] = sys.argv[3].split(":")
from gpuslice import abi
import nvstub
from gsinst import InstSession
s = InstSession(sys.argv[1], sys.argv[2])
what = sys.argv[4]
st, h, size = s.alloc_vidmem(2 << 20)
buf = bytearray(abi.NVOS33_WITH_FD.pack(s.client, s.device, h, 0, size, 0, 0, 0, s.dev_fd))
assert nvstub.ioctl(s.ctl, abi.iowr(abi.NV_ESC_RM_MAP_MEMORY, abi.NVOS33_WITH_FD.size), buf) == 0
print("ready", flush=True)
sys.stdin.readline()
print("go", flush=True)
if what == "alloc":
    s.alloc_vidmem(4 << 20)
elif what == "free":
    s.free(h)
elif what == "control":
    s.fb_free_kib()
elif what == "register":
    nvstub.register_fd(nvstub.open_node(sys.argv[2]), s.ctl)
elif what == "mmap":
    mmap.mmap(s.dev_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print("done", flush=True)
'''


@pytest.mark.parametrize("what,window", [("alloc", "race_delay_us"), ("alloc", "race_delay_entry_us"),
                                         ("free", "race_delay_entry_us"), ("control", "race_delay_us"),
                                         ("register", "race_delay_entry_us"), ("mmap", "race_delay_entry_us")])
def test_sigkill_in_the_middle_of_a_call(nl, pool, inject, what, window):
    """SIGKILL while the call is inside the driver (held there by the stand-in's window):
    the call finishes or not, the process dies, and RM's memory, the module's charge and
    the instance's process list all come back to nothing."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = ":".join([here, os.path.join(here, "..", "..", "pyctl")])
    limit = 64 * MIB
    with Instance(nl, limit) as inst:
        p = subprocess.Popen([sys.executable, "-c", KILLME, inst.path("nvidiactl"), inst.path("nvidia0"), path, what],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
            inject(STUB + window, 400000)
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "go"
            time.sleep(0.15)  # inside the 400 ms window
            p.kill()
            p.wait(30)
        finally:
            inject(STUB + window, 0)
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == -signal.SIGKILL
        check_drained(inst, pool)
        assert wait_for(lambda: not inst.get().get("pids"))

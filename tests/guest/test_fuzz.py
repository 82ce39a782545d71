"""Fuzzing gpuslice.ko in the guest (issue 11): the ioctl fuzzer of fuzz_ioctl.py on the
fake nodes, the netlink fuzzer of fuzz_netlink.py, and reproducers of what they found.

Budget: about 100 s of guest time by default (the guest suite shares 50 minutes).
`GPUSLICE_FUZZ_SECONDS=N` gives the fuzz tests N seconds in all (scripts/fuzz.sh),
`GPUSLICE_FUZZ_SEED` fixes the seed (printed either way), `GPUSLICE_FUZZ_SUMMARY=file`
appends each run's report as a JSON line. The chaos run also rewrites other threads'
blocks mid-call (the TOCTOU of issues 10 and 11, closed by kmod/shadow.c);
`GPUSLICE_FUZZ_RACES=0` turns that off. Each test prints its seed and the calls it made,
also when it passes.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from gpuslice import abi
from gpuslice.netlink import GpusliceNetlink

import fuzz_ioctl as fi
import fuzz_netlink as fn
import nvstub
from gsinst import Instance, real_session, session

MIB = 1 << 20

pytestmark = pytest.mark.skipif(not (nvstub.present() and os.path.exists("/sys/module/gpuslice")),
                                reason="needs nvstub.ko and gpuslice.ko loaded")

TOTAL = float(os.environ.get("GPUSLICE_FUZZ_SECONDS", "0") or 0)
# share of the budget per test, and the defaults for the in-CI run (seconds)
SHARES = {"accounting": (0.35, 28), "chaos": (0.40, 32), "netlink": (0.12, 12), "churn": (0.10, 10),
          "unpriv": (0.03, 4)}
SEED = int(os.environ.get("GPUSLICE_FUZZ_SEED") or int.from_bytes(os.urandom(4), "little"))
BAD = re.compile(r"BUG:|kernel BUG|Oops|WARNING:|general protection|KASAN|list_del corruption|list_add corruption|"
                 r"usercopy:|Poison overwritten|"
                 r"Redzone|Object padding|Freepointer corrupt|double free|use-after-free|slab_out_of_bounds|"
                 r"INFO: task .* blocked|soft lockup|rcu_sched self-detected|hung_task")


def budget(name: str) -> float:
    share, default = SHARES[name]
    return max(2.0, TOTAL * share) if TOTAL else default


def seed_for(name: str) -> int:
    return (SEED * 1000003 + sum(map(ord, name))) & 0xFFFFFFFF


@pytest.fixture
def nl():
    with GpusliceNetlink() as s:
        yield s


@pytest.fixture
def say(capsys):
    """Prints to the terminal even when pytest captures output."""
    def _say(*lines: str) -> None:
        with capsys.disabled():
            for ln in lines:
                sys.stdout.write(ln + "\n")
            sys.stdout.flush()
    return _say


@pytest.fixture
def kernel_log():
    """Fails the test if the kernel logged a bug while it ran (guest-tests.sh checks the
    whole suite at the end; this says which test)."""
    before = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.count("\n")
    yield
    lines = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()[before:]
    hits = [i for i, ln in enumerate(lines) if BAD.search(ln)]
    if hits:
        pytest.fail("the kernel logged a bug during the test:\n" + "\n".join(lines[hits[0]:hits[0] + 40]))


def record(rep: dict) -> None:
    path = os.environ.get("GPUSLICE_FUZZ_SUMMARY")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rep, default=str) + "\n")


# ---- reproducers of what the fuzzers found (each failed before its fix) --------------------


# Fixed: core.c gs_post_alloc() charges an allocation RM made but could not copy out
# (NV_ERR_INVALID_ADDRESS with the object alive, rs_server.c serverAllocApiCopyOut).
def test_repro_ro_alloc_params_escape_quota(nl, kernel_log):
    limit = 8 * MIB
    with Instance(nl, limit) as inst:
        real = real_session()
        s = session(inst)
        arena = fi.Arena()
        try:
            pool0 = real.fb_free_kib()
            params = arena.write_ro(0, bytes(nvstub.mem_params(4 * MIB)))
            statuses = []
            for i in range(8):  # 32 MiB asked for, 4 times the limit
                buf = bytearray(abi.NVOS64.pack(s.client, s.device, 0x5E000001 + i, abi.NV01_MEMORY_LOCAL_USER,
                                                params, 0, 0, 0, 0))
                assert nvstub.ioctl(s.ctl, abi.IOCTL_RM_ALLOC, buf) == 0
                statuses.append(abi.NVOS64.unpack(buf)[8])
            held = (pool0 - real.fb_free_kib()) << 10
            used = inst.get()["mem_used"]
            # the handles name live memory: freeing one gives its 4 MiB back to the pool
            freed = s.free(0x5E000001) == abi.NV_OK and (pool0 - real.fb_free_kib()) << 10 == held - 4 * MIB
        finally:
            s.close()
            real.close()
            arena.close()
        assert inst.get()["mem_used"] == 0
        assert held <= limit and held == used, \
            f"the stand-in holds {held >> 20} MiB for an instance limited to {limit >> 20} MiB " \
            f"(used {used}); statuses {[hex(x) for x in statuses]}; a handle frees 4 MiB: {freed}"


# Fixed: driver.c gs_driver_seen_version() prints only digits and dots from the reply,
# which is read back from the caller's memory.
def test_repro_version_reply_log_injection(nl, kernel_log):
    marker = f"gsfuzz-{uuid.uuid4().hex[:12]}"
    with Instance(nl, 8 * MIB) as inst:
        fd = os.open(inst.path("nvidiactl"), os.O_RDWR)
        try:
            seen = False
            for _attempt in range(3):  # the printk is rate-limited: wait out a burst of the fuzzers
                branch = nvstub.standin_version().split(".")[0]
                buf = bytearray(abi.RM_API_VERSION.pack(abi.NV_RM_API_VERSION_CMD_RELAXED, 0,
                                                        f"{branch}.  {marker}".encode()))
                assert nvstub.ioctl(fd, abi.IOCTL_CHECK_VERSION_STR, buf) == 0
                if marker in subprocess.run(["dmesg"], capture_output=True, text=True).stdout:
                    seen = True
                    break
                time.sleep(5.5)
        finally:
            os.close(fd)
    assert not seen, f"the kernel log holds text chosen by the caller: {marker}"


# ---- the ioctl fuzzer ------------------------------------------------------------------------


def _ioctl_run(nl, say, mode: str) -> None:
    seed = seed_for(mode)
    secs = budget(mode)
    cfg = fi.FuzzConfig(seed=seed, seconds=secs, mode=mode, procs=2, threads=3,
                        races=mode == "chaos" and os.environ.get("GPUSLICE_FUZZ_RACES", "1") == "1",
                        log=lambda m: say("  " + m))
    rep = fi.run(cfg, nl)
    say("", fi.format_report(rep))
    record({"test": f"ioctl_{mode}", **rep})
    assert not rep["problems"], "\n".join(rep["problems"])
    assert rep["calls"] > 0 and rep["victim"]["calls"] > 0


def test_ioctl_fuzz_accounting(nl, say, kernel_log):
    """Random, trace-derived, wrong-size, bad-pointer, foreign-handle, UVM, mmap and fork
    calls from 2 processes x 3 threads in instance A; B's process keeps working. Every 2000
    calls and at the end, with every thread parked between calls: the stand-in's bytes for A
    never above A.used, equal to it once the sessions that made one-sided calls are closed,
    B's equal to B.used; A.used never above A's limit; 0 once the processes are gone."""
    _ioctl_run(nl, say, "accounting")


def test_ioctl_fuzz_chaos(nl, say, kernel_log):
    """The same with fds closed and dup2'ed over mid-call, blocks made read-only or
    PROT_NONE mid-call, REGISTER_FD across sessions, mappings kept past close, SIGKILL and
    exec during calls: no hang, B untouched, used 0 and the pool whole at the end."""
    _ioctl_run(nl, say, "chaos")


# ---- the netlink fuzzer ------------------------------------------------------------------------


def test_netlink_fuzz(say, kernel_log):
    seed = seed_for("netlink")
    try:
        rep = fn.fuzz(seed, budget("netlink"))
    finally:
        left = fn.cleanup()
    say("", f"netlink fuzz seed={seed} sent={rep['sent']} answered={rep['answered']} "
            f"unanswered(allowed)={rep['unanswered_allowed']} probes={rep['probes']} resyncs={rep['resyncs']}",
        f"  per cmd: {rep['per_cmd']}", f"  results: {rep['results']}")
    record({"test": "netlink_fuzz", **rep})
    assert not rep["problems"], "\n".join(rep["problems"])
    assert not left, f"fuzzer instances left after cleanup: {left}"
    assert rep["answered"] > 0


def test_netlink_fuzz_unprivileged(say, kernel_log):
    """Without CAP_SYS_ADMIN (uid 65534, no capabilities) no mutation passes."""
    import shutil
    import tempfile

    seed = seed_for("unpriv")
    # uid 65534 cannot read a checkout root cloned into a 0700 directory (issue 13): the
    # fuzzer and the package it imports (standard library only) go to a readable copy,
    # run by the system interpreter
    here = os.path.dirname(os.path.abspath(__file__))
    tmp = tempfile.mkdtemp(prefix="gs-unpriv-")
    os.chmod(tmp, 0o755)
    shutil.copy(os.path.join(here, "fuzz_netlink.py"), tmp)
    shutil.copytree(os.path.join(here, "..", "..", "pyctl", "gpuslice"), os.path.join(tmp, "gpuslice"))
    for root, dirs, files in os.walk(tmp):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    py = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    try:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                            "--", py, "-B", os.path.join(tmp, "fuzz_netlink.py"),
                            "--seed", str(seed), "--seconds", str(budget("unpriv")), "--unpriv"],
                           capture_output=True, text=True, cwd="/",
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": tmp},
                           timeout=budget("unpriv") + 120)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, r.stderr[-2000:]
    rep = json.loads(lines[-1][len("RESULT "):])
    say("", f"netlink fuzz (unprivileged) seed={seed} sent={rep['sent']} results={rep['results']}")
    record({"test": "netlink_fuzz_unpriv", **rep})
    fn.cleanup()
    assert r.returncode == 0 and not rep["problems"], rep["problems"]


def test_netlink_churn_one_name(say, kernel_log):
    """NEW / DEL / SET / GET of one name from 4 processes at once, two of them also
    opening its nodes: clear answers in time, and a consistent end state."""
    seed = seed_for("churn")
    name = f"nlfc{seed % 10000}"
    try:
        rep = fn.churn(name, procs=4, seconds=budget("churn"), opens=True, seed=seed)
    finally:
        fn.cleanup(name)
    say("", f"netlink churn seed={seed} name={name} calls={rep['calls']}: {rep['counts']}")
    record({"test": "netlink_churn", "seed": seed, **rep})
    assert not rep["problems"], "\n".join(rep["problems"])
    assert rep["counts"].get("new:ok", 0) > 0 and rep["counts"].get("del:ok", 0) > 0

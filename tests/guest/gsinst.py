"""Helpers for the interposer's guest tests: gpuslice instances and RM sessions
opened through an instance's nodes (/dev/gpuslice/<name>/...)."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import time
import uuid
from typing import Any
from pathlib import Path

import pytest

from gpuslice import abi
from gpuslice.netlink import GpusliceNetlink

import nvstub

DEV_DIR = Path("/dev/gpuslice")
MODULE = "gpuslice"


def loaded(mod: str = MODULE) -> bool:
    return Path(f"/sys/module/{mod}").exists()


# for the tests of the interposer: pytestmark = needs_modules
needs_modules = pytest.mark.skipif(not (nvstub.present() and loaded()),
                                   reason="needs nvstub.ko and gpuslice.ko loaded")


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def node(name: str, leaf: str) -> str:
    return str(DEV_DIR / name / leaf)


class Instance:
    """Creates an instance on enter, deletes it on exit (after its files are closed)."""

    def __init__(self, nl: GpusliceNetlink, mem_limit: int, gpu_mask: int = 1, **attrs: Any) -> None:
        self.nl = nl
        self.name = unique()
        self.mem_limit = mem_limit
        self.gpu_mask = gpu_mask
        self.attrs = {"mode": 0o666, **attrs}

    def __enter__(self) -> "Instance":
        self.nl.instance_new(self.name, self.gpu_mask, self.mem_limit, **self.attrs)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.nl.instance_del(self.name)
        except OSError as e:
            # a failing test leaves files open (EBUSY): report its failure, not this
            if e.errno != errno.ENOENT and exc_type is None:
                raise

    def get(self) -> dict:
        (d,) = self.nl.instances(self.name)
        return d

    def path(self, leaf: str) -> str:
        return node(self.name, leaf)


class InstSession(nvstub.Session):
    """nvstub.Session, but opening nvidiactl and nvidia<gpu> from a directory."""

    def __init__(self, ctl_path: str, gpu_path: str, gpu: int = 0) -> None:  # noqa: D107
        self.gpu = gpu
        self.gpu_node = gpu_path
        self.ctl = nvstub.open_node(ctl_path)
        try:
            self.dev_fd = nvstub.open_node(gpu_path)
        except OSError:
            os.close(self.ctl)
            raise
        try:
            self._setup(gpu)
        except OSError:  # a half-made session must not keep the instance's files open
            os.close(self.dev_fd)
            os.close(self.ctl)
            raise

    def _setup(self, gpu: int) -> None:
        if nvstub.register_fd(self.dev_fd, self.ctl) != 0:
            raise nvstub.IoctlError(errno.EINVAL, "REGISTER_FD")
        st, self.client = nvstub.rm_alloc(self.ctl, 0, 0, 0, abi.NV01_ROOT_CLIENT)
        self._check(st, "client")
        self.device = 0x5C000002
        self.subdevice = 0x5C000003
        dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.pack(gpu, 0, 0, 0, 0, 0, 0, 0, 0),
                                         abi.DEVICE_ALLOC_PARAMS.size)
        self._check(nvstub.rm_alloc(self.ctl, self.client, self.client, self.device,
                                    abi.NV01_DEVICE_0, dp)[0], "device")
        sp = ctypes.create_string_buffer(abi.SUBDEVICE_ALLOC_PARAMS.pack(0), abi.SUBDEVICE_ALLOC_PARAMS.size)
        self._check(nvstub.rm_alloc(self.ctl, self.client, self.device, self.subdevice,
                                    abi.NV20_SUBDEVICE_0, sp)[0], "subdevice")
        self._next = 0x5C000010


def session(inst: Instance, gpu: int = 0) -> InstSession:
    return InstSession(inst.path("nvidiactl"), inst.path(f"nvidia{gpu}"), gpu)


def wait_for(pred, timeout: float = 10.0, step: float = 0.02) -> bool:
    """Polls pred until it is true or timeout seconds have passed; returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def drop_shadow() -> None:
    """Unmaps this process's gpuslice parameter pages (kmod/shadow.c), which pin the module
    while mapped: rmmod from a process that has called through an instance needs this."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    for line in open("/proc/self/maps").read().splitlines():
        if "gpuslice-params" in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            libc.munmap(lo, hi - lo)


def shadow_holders() -> dict[int, str]:
    """Other live processes that map gpuslice's parameter pages (each pins the module):
    pid -> command line."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if "gpuslice-params" in Path(f"/proc/{pid}/maps").read_text():
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            pass
    return out


def release_module() -> None:
    """Before rmmod gpuslice: unmap this process's parameter pages and end the processes
    earlier tests left mapping theirs (they pin the module by design), saying which."""
    drop_shadow()
    left = shadow_holders()
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    if left:
        print(f"ended processes left by earlier tests: {left}")
        time.sleep(1)


REPO = Path(__file__).resolve().parents[2]
NVSTUB_KO = REPO / "tests/standin/nvstub.ko"
# The test build (scripts/build-modules.sh): the shipped module plus its test parameters
# (kmod/inject.h), as scripts/guest-tests.sh loads it.
GPUSLICE_KO = REPO / "build/test-kmod/gpuslice.ko"
# The shipped module, as DKMS builds it: none of the test parameters.
GPUSLICE_SHIPPED_KO = REPO / "kmod/gpuslice.ko"
TEST_PARAMS = ("fail_alloc_every", "race_delay_fd_us", "allow_test_escapes", "handover_corrupt")


def sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True)


def insmod(ko: Path, *params: str) -> subprocess.CompletedProcess:
    return sh("insmod", str(ko), *params)


def unload_all() -> None:
    """rmmod gpuslice and the stand-in (after release_module())."""
    release_module()
    for m in ("gpuslice", "nvstub"):
        if os.path.exists(f"/sys/module/{m}"):
            r = sh("rmmod", m)
            assert r.returncode == 0, f"{r.stderr} (shadow holders: {shadow_holders()})"


def load_both(nvstub_args: list[str], gpuslice_args: list[str]) -> None:
    r = insmod(NVSTUB_KO, *nvstub_args)
    assert r.returncode == 0, r.stderr
    sh("udevadm", "settle")
    r = insmod(GPUSLICE_KO, *gpuslice_args)
    assert r.returncode == 0, r.stderr


def load_as_the_suite() -> None:
    """Both modules back as scripts/guest-tests.sh loaded them (NVSTUB_ARGS, GPUSLICE_ARGS)."""
    unload_all()
    load_both(os.environ.get("NVSTUB_ARGS", "").split(), os.environ.get("GPUSLICE_ARGS", "").split())


def real_session(gpu: int = 0) -> nvstub.Session:
    return nvstub.Session(gpu)


def rdev_major(path: str) -> int:
    return os.major(os.stat(path).st_rdev)


def dmesg_tail(n: int = 40) -> str:
    return subprocess.run(["dmesg"], capture_output=True, text=True).stdout[-n * 200:]

"""The node's GPUs as the DRA driver publishes them: one :class:`GpuInfo` per GPU.

Two sources:

* :func:`from_nvml` - NVML (pynvml), what a node with the NVIDIA user-space libraries has;
* :func:`from_rm` - the project's own RM client (:mod:`gpuslice.sched.rm`) on ``/dev/nvidiactl``,
  for nodes (and the stand-in driver, tests/standin) without NVML.

:func:`discover` picks NVML when it initialises, else RM, and raises
:class:`InventoryError` (one line) when neither works. GPUs are listed in minor order;
the minor (``/dev/nvidiaN``) is gpuslice's GPU index everywhere.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
from dataclasses import dataclass

import pynvml

from gpuslice import abi
from gpuslice.sched import rm as rm_mod
from gpuslice.sched.rm import RmClient, RmError

__all__ = [
    "GpuInfo",
    "InventoryError",
    "compute_capability_from_arch",
    "discover",
    "from_nvml",
    "from_rm",
    "normalize_pci_bus_id",
]


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the ResourceSlice describes it."""

    minor: int  # /dev/nvidiaN; gpuslice's GPU index
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    name: str | None  # product name ("NVIDIA H100 80GB HBM3")
    compute_capability: str | None  # "9.0"
    driver_version: str | None  # "580.95.05"
    pci_bus_id: str | None  # canonical "0000:18:00.0"
    memory: int  # total video memory, bytes


class InventoryError(Exception):
    """No GPU inventory could be read (one-line message)."""


# ---- pure helpers -------------------------------------------------------------------

_PCI_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_pci_bus_id(bus_id: str | bytes | None) -> str | None:
    """``00000000:18:00.0`` (NVML's 8-digit domain) or ``18:00.0`` -> ``0000:18:00.0``
    (lowercase, 4-digit domain: the sysfs form, and the extended BDF notation the
    standard ``resource.kubernetes.io/pciBusID`` attribute carries). None when it does not
    parse."""
    if bus_id is None:
        return None
    if isinstance(bus_id, bytes):
        bus_id = bus_id.split(b"\0", 1)[0].decode(errors="replace")
    m = _PCI_RE.match(bus_id.strip())
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn)}"


# NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_* (open-gpu-kernel-modules
# src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080mc.h; AD100 0x190 and GH100 0x180 as the
# 5xx drivers report them) -> CUDA compute capability. Architectures whose capability
# depends on the implementation map implementation -> capability; None = any.
_ARCH_TU100 = 0x160
_ARCH_GA100 = 0x170
_ARCH_AD100 = 0x190
_CC_BY_ARCH: dict[int, dict[int | None, str]] = {
    _ARCH_TU100: {None: "7.5"},
    _ARCH_GA100: {0x0: "8.0", 0x2: "8.6", 0x3: "8.6", 0x4: "8.6", 0x6: "8.6", 0x7: "8.6", 0xB: "8.7"},
    abi.NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_GH100: {abi.NV2080_CTRL_MC_ARCH_INFO_IMPLEMENTATION_GH100: "9.0"},
    _ARCH_AD100: {None: "8.9"},
}


def compute_capability_from_arch(architecture: int, implementation: int) -> str | None:
    """CUDA compute capability of an RM (architecture, implementation) pair where it is
    known (GH100 -> "9.0"), else None."""
    impls = _CC_BY_ARCH.get(architecture)
    if impls is None:
        return None
    return impls.get(implementation, impls.get(None))


# ---- NVML ---------------------------------------------------------------------------

def _text(v: str | bytes) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def from_nvml() -> list[GpuInfo]:
    """Every GPU NVML sees. Raises :class:`InventoryError` when NVML does not initialise
    (no library, no driver) or a required query (minor, UUID, memory) fails."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as e:
        raise InventoryError(f"NVML did not initialise: {e}") from None
    try:
        try:
            driver: str | None = _text(pynvml.nvmlSystemGetDriverVersion()) or None
        except pynvml.NVMLError:
            driver = None
        out: list[GpuInfo] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            minor = int(pynvml.nvmlDeviceGetMinorNumber(h))
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            try:
                name: str | None = _text(pynvml.nvmlDeviceGetName(h)) or None
            except pynvml.NVMLError:
                name = None
            try:
                major, minor_cc = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc: str | None = f"{int(major)}.{int(minor_cc)}"
            except pynvml.NVMLError:
                cc = None
            try:
                pci = normalize_pci_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)
            except pynvml.NVMLError:
                pci = None
            out.append(GpuInfo(minor, uuid, name, cc, driver, pci, memory))
    except pynvml.NVMLError as e:
        raise InventoryError(f"NVML query failed: {e}") from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return sorted(out, key=lambda g: g.minor)


# ---- RM -----------------------------------------------------------------------------

# ctrl2080gpu.h NV2080_CTRL_CMD_GPU_GET_GID_INFO (0x2080014a): index, flags, length,
# data[NV2080_GPU_MAX_GID_LENGTH = 0x100], 268 bytes. flags 0 = FORMAT_ASCII | TYPE_SHA1:
# the "GPU-..." string with its NUL (gpu_uuid.c transformGidToUserFriendlyString).
# Not in abi.py (tests/standin/nvstub.h and tests/guest/nvstub.py carry the same values).
NV2080_CTRL_CMD_GPU_GET_GID_INFO = 0x2080014A
GID_INFO = struct.Struct("<III256s")
GID_FLAGS_FORMAT_ASCII = 0x0
NAME_STRING_FLAGS_TYPE_ASCII = 0  # NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII

_GPU_NODE_RE = re.compile(r"^nvidia(\d+)$")


def gpu_minors(dev_dir: str) -> list[int]:
    """Minors of the ``nvidiaN`` nodes in ``dev_dir`` (not nvidiactl, nvidia-uvm, ...)."""
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _GPU_NODE_RE.match(n)))


def card_info(fd: int) -> dict[int, str]:
    """NV_ESC_CARD_INFO on an open nvidiactl: minor -> PCI bus id of each GPU
    (nv_ioctl_card_info_t, abi.CARD_INFO); {} when the driver does not answer."""
    buf = bytearray(abi.CARD_INFO.size * abi.NV_MAX_DEVICES)
    try:
        fcntl.ioctl(fd, abi.IOCTL_CARD_INFO, buf, True)
    except OSError:
        return {}
    out: dict[int, str] = {}
    for i in range(abi.NV_MAX_DEVICES):
        f = abi.CARD_INFO.unpack_from(buf, i * abi.CARD_INFO.size)
        if f[0]:  # valid; pci_info domain, bus, slot, function; ...; minor_number
            out[int(f[13])] = f"{f[1]:04x}:{f[2]:02x}:{f[3]:02x}.{f[4]:x}"
    return out


def _rm_name(client: RmClient, sub: int) -> str | None:
    params = bytearray(abi.NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS_SIZE)
    struct.pack_into("<I", params, 0, NAME_STRING_FLAGS_TYPE_ASCII)
    try:
        out = client.control(sub, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING, bytes(params))
    except RmError:
        return None
    return out[4:].split(b"\0", 1)[0].decode(errors="replace").strip() or None


def _rm_compute_capability(client: RmClient, sub: int) -> str | None:
    try:
        out = client.control(sub, abi.NV2080_CTRL_CMD_MC_GET_ARCH_INFO, bytes(abi.MC_ARCH_INFO.size))
    except RmError:
        return None
    arch, impl, _rev, _sub = abi.MC_ARCH_INFO.unpack_from(out)
    return compute_capability_from_arch(arch, impl)


def _rm_uuid(client: RmClient, sub: int) -> str:
    out = client.control(sub, NV2080_CTRL_CMD_GPU_GET_GID_INFO, GID_INFO.pack(0, GID_FLAGS_FORMAT_ASCII, 0, b""))
    _index, _flags, length, data = GID_INFO.unpack_from(out)
    text = data[: min(length, len(data))].split(b"\0", 1)[0].decode(errors="replace")
    if not text.startswith("GPU-"):
        raise RmError(f"GET_GID_INFO: not a GPU UUID: {text!r}", err=errno.EPROTO)
    return text


def from_rm(ctl: str = "/dev/nvidiactl") -> list[GpuInfo]:
    """Every ``nvidiaN`` node beside ``ctl``, asked through :class:`gpuslice.sched.rm.RmClient`:
    total video memory (FB_GET_INFO_V2), UUID (GET_GID_INFO), product name
    (GET_NAME_STRING), compute capability from MC_GET_ARCH_INFO where the architecture is
    known, PCI bus id from CARD_INFO, driver version from sysfs/procfs (or the version the
    handshake agreed). Raises :class:`InventoryError`."""
    minors = gpu_minors(os.path.dirname(ctl) or ".")
    if not minors:
        raise InventoryError(f"no GPU device nodes (nvidiaN) beside {ctl}")
    try:
        with RmClient(ctl) as client:
            driver = rm_mod.driver_version() or client.version or None
            pci = card_info(client.fd)
            out: list[GpuInfo] = []
            for minor in minors:
                memory = client.fb_info(minor)["total"]
                sub = client.attach(minor).subdevice
                out.append(GpuInfo(
                    minor=minor,
                    uuid=_rm_uuid(client, sub),
                    name=_rm_name(client, sub),
                    compute_capability=_rm_compute_capability(client, sub),
                    driver_version=driver,
                    pci_bus_id=pci.get(minor),
                    memory=memory,
                ))
    except OSError as e:  # RmError is an OSError
        raise InventoryError(f"RM on {ctl}: {e}") from None
    return out


# ---- both ---------------------------------------------------------------------------

def discover(source: str = "auto", *, ctl: str = "/dev/nvidiactl") -> list[GpuInfo]:
    """The node's GPUs from ``source``: ``"nvml"``, ``"rm"`` or ``"auto"`` (NVML when it
    initialises, else RM). Raises :class:`InventoryError` (one line) when none works."""
    if source == "nvml":
        return from_nvml()
    if source == "rm":
        return from_rm(ctl)
    if source != "auto":
        raise InventoryError(f"unknown inventory source {source!r} (auto, nvml or rm)")
    try:
        return from_nvml()
    except InventoryError as nvml_err:
        try:
            return from_rm(ctl)
        except InventoryError as rm_err:
            raise InventoryError(f"no GPU inventory: {nvml_err}; {rm_err}") from None


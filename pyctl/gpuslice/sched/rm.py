"""The controller's own RM client: a small user-space speaker of NVIDIA's RM ioctls.

Opens the control node (``/dev/nvidiactl`` by default, configurable so tests can point
it at a stand-in or an instance's node), performs the CHECK_VERSION_STR handshake,
allocates a root client, and per GPU a device (0x80) and subdevice (0x2080) so that it
can issue subdevice controls:

* :meth:`RmClient.disable_channels` - FIFO_DISABLE_CHANNELS on (hClient, hChannel)
  pairs of ANY process (docs/h100-findings.md: works across processes), 64 per call;
* :meth:`RmClient.set_timeslice` - SET_TIMESLICE on a TSG of THIS client only
  (RM refuses foreign clients; the kernel module applies per-instance timeslices);
* :meth:`RmClient.fb_info` - FB_GET_INFO_V2.

Layouts and constants come from :mod:`gpuslice.abi` only. The ``pack_*`` functions
are pure and are checked byte for byte against recorded H100 traces in
tests/test_rm.py. ``close()`` frees the client (RM frees its children with it).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from gpuslice import abi
from gpuslice.sched.stale import bisect

Pair = tuple[int, int]  # (hClient, hChannel)

# handles this client chooses for its own objects ("gs" + kind + gpu)
_HANDLE_BASE = 0x67730000


def device_handle(gpu: int) -> int:
    return _HANDLE_BASE | 0x1000 | gpu


def subdevice_handle(gpu: int) -> int:
    return _HANDLE_BASE | 0x2000 | gpu


class RmError(OSError):
    """An RM call failed: ``status`` is the NV status (0 when the ioctl itself failed)."""

    def __init__(self, what: str, status: int = 0, err: int = 0) -> None:
        self.status = status
        self.what = what
        if status:
            name = abi.STATUS_NAMES.get(status, "")
            msg = f"{what}: RM status 0x{status:x} {name}".rstrip()
        else:
            msg = f"{what}: {os.strerror(err) if err else 'failed'}"
        super().__init__(err or errno.EIO, msg)

    def __str__(self) -> str:
        return str(self.args[1])


# ---- pure packing -------------------------------------------------------------------

def pack_version_check(version: str, cmd: int = abi.NV_RM_API_VERSION_CMD_STRICT) -> bytes:
    raw = version.encode()
    if len(raw) >= abi.NV_RM_API_VERSION_STRING_LENGTH:
        raise ValueError(f"version string too long: {version!r}")
    return abi.RM_API_VERSION.pack(cmd, 0, raw)


def unpack_version_check(buf: bytes | bytearray) -> tuple[int, str]:
    _cmd, reply, raw = abi.RM_API_VERSION.unpack(bytes(buf[: abi.RM_API_VERSION.size]))
    return reply, raw.split(b"\0", 1)[0].decode(errors="replace")


def pack_alloc(h_root: int, h_parent: int, h_new: int, h_class: int, p_params: int = 0, params_size: int = 0) -> bytes:
    """NVOS64_PARAMETERS for NV_ESC_RM_ALLOC (48 bytes)."""
    return abi.NVOS64.pack(h_root, h_parent, h_new, h_class, p_params, 0, params_size, 0, 0)


def pack_free(h_root: int, h_parent: int, h_object: int) -> bytes:
    return abi.NVOS00.pack(h_root, h_parent, h_object, 0)


def pack_control(h_client: int, h_object: int, cmd: int, p_params: int, params_size: int, flags: int = 0) -> bytes:
    """NVOS54_PARAMETERS for NV_ESC_RM_CONTROL (32 bytes)."""
    return abi.NVOS54.pack(h_client, h_object, cmd, flags, p_params, params_size, 0)


def pack_device_params(device_id: int, h_client_share: int = 0, va_mode: int = 0) -> bytes:
    """NV0080_ALLOC_PARAMETERS: deviceId, hClientShare, hTargetClient, hTargetDevice,
    flags, vaSpaceSize, vaStartInternal, vaLimitInternal, vaMode (56 bytes). nvidia-smi
    sends all zeros (what we do: no VA space needed); CUDA shares with its client and
    asks for vaMode 2 (multiple VA spaces)."""
    return abi.DEVICE_ALLOC_PARAMS.pack(device_id, h_client_share, 0, 0, 0, 0, 0, 0, va_mode)


def pack_subdevice_params(subdevice_id: int = 0) -> bytes:
    return abi.SUBDEVICE_ALLOC_PARAMS.pack(subdevice_id)


def pack_fb_info_request(indices: Sequence[int]) -> bytes:
    """NV2080_CTRL_FB_GET_INFO_V2_PARAMS asking for ``indices`` (1028 bytes)."""
    if len(indices) > abi.NV2080_CTRL_FB_INFO_MAX_LIST_SIZE:
        raise ValueError("too many FB info indices")
    buf = bytearray(abi.FB_GET_INFO_V2_SIZE)
    buf[0:4] = len(indices).to_bytes(4, "little")
    for i, idx in enumerate(indices):
        abi.FB_INFO.pack_into(buf, 4 + 8 * i, idx, 0)
    return bytes(buf)


def unpack_fb_info(buf: bytes) -> dict[int, int]:
    n = int.from_bytes(buf[0:4], "little")
    return dict(abi.FB_INFO.unpack_from(buf, 4 + 8 * i) for i in range(min(n, abi.NV2080_CTRL_FB_INFO_MAX_LIST_SIZE)))


def pack_disable_channels(pairs: Sequence[Pair], disable: bool, only_disable_scheduling: bool = False) -> bytes:
    """NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS for at most 64 (hClient, hChannel) pairs."""
    n = len(pairs)
    if n > abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES:
        raise ValueError(f"{n} channels > {abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES} per call")
    buf = bytearray(abi.DISABLE_CHANNELS_SIZE)
    abi.DISABLE_CHANNELS_HEAD.pack_into(buf, 0, int(disable), n, int(only_disable_scheduling), 0, 0)
    base = abi.DISABLE_CHANNELS_HEAD.size
    chan_base = base + 4 * abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES
    for i, (client, channel) in enumerate(pairs):
        buf[base + 4 * i : base + 4 * i + 4] = client.to_bytes(4, "little")
        buf[chan_base + 4 * i : chan_base + 4 * i + 4] = channel.to_bytes(4, "little")
    return bytes(buf)


def pack_timeslice(us: int) -> bytes:
    return abi.TIMESLICE.pack(us)


def pack_gpfifo_schedule(enable: bool, skip_submit: bool = False, skip_enable: bool = False) -> bytes:
    return abi.GPFIFO_SCHEDULE.pack(int(enable), int(skip_submit), int(skip_enable))


def batches(pairs: Iterable[Pair], size: int = abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES) -> list[list[Pair]]:
    """Split into lists of at most ``size`` (sorted, deduplicated: stable call contents)."""
    uniq = sorted(set(pairs))
    return [uniq[i : i + size] for i in range(0, len(uniq), size)]


def driver_version() -> str | None:
    """The loaded driver's version from sysfs/procfs, or None (gpuslice.nvdriver)."""
    from gpuslice import nvdriver

    return nvdriver.installed_version()


def driver_missing(ctl: str) -> str | None:
    """None when the control node opens read-write (closed again at once); else the one
    line a command that needs RM prints before it starts anything (a watchdog, a guard, a
    source): what is missing and what to do."""
    try:
        fd = os.open(ctl, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"no NVIDIA driver: {ctl} not found (load nvidia.ko)"
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENODEV):  # a node left behind with no driver behind it
            return f"no NVIDIA driver: {ctl} has no driver behind it (load nvidia.ko)"
        if e.errno in (errno.EACCES, errno.EPERM):
            return f"cannot open {ctl}: {e.strerror} (run as root)"
        return f"cannot open {ctl}: {e.strerror or e}"
    os.close(fd)
    return None


# ---- the client ---------------------------------------------------------------------

@dataclass
class GpuHandles:
    minor: int
    fd: int
    device: int
    subdevice: int


class RmClient:
    """One RM client on one control node. Not thread-safe; use one per thread."""

    def __init__(self, ctl_path: str = "/dev/nvidiactl", gpu_path_fmt: str | None = None, version: str | None = None):
        self.ctl_path = ctl_path
        # /dev/nvidiactl -> /dev/nvidia{}, /dev/gpuslice/x/nvidiactl -> /dev/gpuslice/x/nvidia{}
        self.gpu_path_fmt = gpu_path_fmt or os.path.join(os.path.dirname(ctl_path), "nvidia{}")
        self.fd = -1
        self.client = 0
        self.version = ""
        self.gpus: dict[int, GpuHandles] = {}
        self.calls = 0  # RM_CONTROL calls issued (for benchmarks)
        self._want_version = version

    # lifecycle
    def open(self) -> "RmClient":
        self.fd = os.open(self.ctl_path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._handshake()
            arg = bytearray(pack_alloc(0, 0, 0, abi.NV01_ROOT))
            self._ioctl(abi.IOCTL_RM_ALLOC, arg, "RM_ALLOC root client")
            vals = abi.NVOS64.unpack(arg)
            self._check(vals[8], "RM_ALLOC root client")
            self.client = vals[2]
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise
        return self

    def __enter__(self) -> "RmClient":
        return self.open() if self.fd < 0 else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            if self.client:
                arg = bytearray(pack_free(self.client, self.client, self.client))
                try:
                    self._ioctl(abi.IOCTL_RM_FREE, arg, "RM_FREE client")
                except OSError:
                    pass  # closing the fd frees it anyway
        finally:
            for g in self.gpus.values():
                try:
                    os.close(g.fd)
                except OSError:
                    pass
            self.gpus.clear()
            os.close(self.fd)
            self.fd = -1
            self.client = 0

    def _handshake(self) -> None:
        # ask the driver for its version, then do the strict check with it
        # (what nvidia-smi does with its compiled-in version)
        want = self._want_version
        if want is None:
            arg = bytearray(pack_version_check("", abi.NV_RM_API_VERSION_CMD_QUERY))
            try:
                self._ioctl(abi.IOCTL_CHECK_VERSION_STR, arg, "CHECK_VERSION_STR query")
                reply, ver = unpack_version_check(arg)
                want = ver if reply == abi.NV_RM_API_VERSION_REPLY_RECOGNIZED and ver else None
            except OSError:
                want = None
            want = want or driver_version()
            if want is None:
                raise RmError("CHECK_VERSION_STR: driver version unknown", err=errno.ENOTSUP)
        arg = bytearray(pack_version_check(want))
        self._ioctl(abi.IOCTL_CHECK_VERSION_STR, arg, f"CHECK_VERSION_STR {want}")
        reply, ver = unpack_version_check(arg)
        if reply != abi.NV_RM_API_VERSION_REPLY_RECOGNIZED:
            raise RmError(f"CHECK_VERSION_STR: driver did not recognise {want!r} (it is {ver!r})", err=errno.EPROTO)
        self.version = want

    # raw calls
    def _ioctl(self, req: int, arg: bytearray, what: str) -> None:
        if self.fd < 0:
            raise RmError(what, err=errno.EBADF)
        try:
            fcntl.ioctl(self.fd, req, arg, True)
        except OSError as e:
            raise RmError(what, err=e.errno or errno.EIO) from None

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != abi.NV_OK:
            raise RmError(what, status)

    def alloc(self, h_parent: int, h_new: int, h_class: int, params: bytes | None = None) -> int:
        buf = ctypes.create_string_buffer(params or b"\0", max(1, len(params or b"")))
        ptr = ctypes.addressof(buf) if params else 0
        arg = bytearray(pack_alloc(self.client, h_parent, h_new, h_class, ptr, 0))
        what = f"RM_ALLOC class 0x{h_class:x}"
        self._ioctl(abi.IOCTL_RM_ALLOC, arg, what)
        vals = abi.NVOS64.unpack(arg)
        self._check(vals[8], what)
        return int(vals[2])

    def control(self, h_object: int, cmd: int, params: bytes, h_client: int | None = None) -> bytes:
        """RM_CONTROL ``cmd`` on ``h_object`` with ``params``; returns the params after."""
        buf = ctypes.create_string_buffer(params, len(params))
        arg = bytearray(pack_control(self.client if h_client is None else h_client, h_object, cmd,
                                     ctypes.addressof(buf), len(params)))
        name = abi.CONTROL_NAMES.get(cmd, f"0x{cmd:08x}")
        self._ioctl(abi.IOCTL_RM_CONTROL, arg, f"RM_CONTROL {name}")
        self.calls += 1
        self._check(abi.NVOS54.unpack(arg)[6], f"RM_CONTROL {name}")
        return buf.raw

    # GPUs
    def attach(self, minor: int, device_id: int | None = None) -> GpuHandles:
        """Open /dev/nvidia<minor> (RM checks the caller holds it) and allocate a device
        and subdevice for it. ``device_id`` is the RM device instance (default: minor)."""
        if minor in self.gpus:
            return self.gpus[minor]
        fd = os.open(self.gpu_path_fmt.format(minor), os.O_RDWR | os.O_CLOEXEC)
        try:
            dev = self.alloc(self.client, device_handle(minor), abi.NV01_DEVICE_0,
                             pack_device_params(minor if device_id is None else device_id))
            sub = self.alloc(dev, subdevice_handle(minor), abi.NV20_SUBDEVICE_0, pack_subdevice_params(0))
        except BaseException:
            os.close(fd)
            raise
        self.gpus[minor] = GpuHandles(minor, fd, dev, sub)
        return self.gpus[minor]

    def pid_vidmem(self, minor: int) -> dict[int, int]:
        """Video memory per process on GPU ``minor`` as RM counts it: every pid with a device
        on the GPU (GPU_GET_PIDS), and its private plus owned-shared bytes
        (GPU_GET_PID_INFO, VIDEO_MEMORY_USAGE), pids as the caller's pid namespace sees them."""
        g = self.attach(minor)
        req = bytearray(abi.GET_PIDS_SIZE)
        abi.GET_PIDS_HEAD.pack_into(req, 0, abi.NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS, abi.NV20_SUBDEVICE_0, 0)
        out = self.control(g.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_PIDS, bytes(req))
        n = min(abi.GET_PIDS_HEAD.unpack_from(out)[2], abi.NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT)
        pids = sorted(set(struct.unpack_from(f"<{n}I", out, abi.GET_PIDS_HEAD.size)))
        usage: dict[int, int] = {}
        step = abi.NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT
        base = abi.GET_PID_INFO_LIST_OFFSET
        for i in range(0, len(pids), step):
            chunk = pids[i:i + step]
            buf = bytearray(abi.GET_PID_INFO_SIZE)
            struct.pack_into("<I", buf, 0, len(chunk))
            for j, pid in enumerate(chunk):
                abi.PID_INFO.pack_into(buf, base + j * abi.PID_INFO.size, pid,
                                       abi.NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE,
                                       0, 0, 0, 0, 0, 0, 0, 0, 0)
            out = self.control(g.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_PID_INFO, bytes(buf))
            for j in range(len(chunk)):
                e = abi.PID_INFO.unpack_from(out, base + j * abi.PID_INFO.size)
                if e[2] == abi.NV_OK:  # per-entry status: the process may be gone
                    usage[e[0]] = e[3] + e[4]
        return usage

    def disable_channels(self, minor: int, pairs: Iterable[Pair], disable: bool) -> int:
        """Disable (or re-enable) every (hClient, hChannel) in ``pairs`` on GPU ``minor``,
        64 per RM call. Returns the number of calls. Raises RmError on the first failure
        (callers that must not stop, like the re-enable on exit, use
        :meth:`disable_channels_each`)."""
        g = self.attach(minor)
        n = 0
        for chunk in batches(pairs):
            self.control(g.subdevice, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, pack_disable_channels(chunk, disable))
            n += 1
        return n

    def disable_channels_each(self, minor: int, pairs: Iterable[Pair], disable: bool) -> list[tuple[Pair, RmError]]:
        """Like disable_channels but never raises for RM status: a batch that fails is
        bisected (one stale channel fails the whole batch: sched/stale.py) down to the
        channels that fail alone. Returns those, each with its error."""
        failed: list[tuple[Pair, RmError]] = []
        g = self.attach(minor)

        def call(part: Sequence[Pair]) -> None:
            self.control(g.subdevice, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, pack_disable_channels(part, disable))

        def status_of(e: Exception) -> int | None:
            return e.status if isinstance(e, RmError) else None

        for chunk in batches(pairs):
            for p, e in bisect(chunk, call, status_of):
                assert isinstance(e, RmError)
                failed.append((p, e))
        return failed

    def set_timeslice(self, h_tsg: int, us: int) -> None:
        """SET_TIMESLICE on one of THIS client's TSGs (RM refuses other clients')."""
        self.control(h_tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, pack_timeslice(us))

    def fb_info(self, minor: int) -> dict[str, int]:
        """Framebuffer sizes of GPU ``minor`` in bytes: total, heap, free."""
        g = self.attach(minor)
        idx = {
            "total": abi.NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE,
            "heap": abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE,
            "free": abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE,
        }
        out = unpack_fb_info(self.control(g.subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2,
                                          pack_fb_info_request(list(idx.values()))))
        return {k: out.get(v, 0) * 1024 for k, v in idx.items()}  # RM reports KiB


# --- proof that a process owns a channel (the user-space build's preload socket) ---

_AT_EMPTY_PATH = 0x1000
_AT_STATX_DONT_SYNC = 0x4000  # FUSE and NFS answer from their cache: never a request to a server
_STATX_TYPE = 0x1
_S_IFMT, _S_IFCHR = 0o170000, 0o020000
_libc = ctypes.CDLL(None, use_errno=True)
_SYS_STATX = {"x86_64": 332, "aarch64": 291}.get(os.uname().machine)


def _statx(fd: int, buf: ctypes.Array) -> int:
    flags = _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC
    if hasattr(_libc, "statx"):
        return int(_libc.statx(fd, b"", flags, _STATX_TYPE, buf))
    if _SYS_STATX is None:  # glibc before 2.28 on another architecture: nothing is an NVIDIA file
        raise OSError(errno.ENOSYS, "statx")
    return int(_libc.syscall(_SYS_STATX, fd, b"", flags, _STATX_TYPE, buf))


def nvidia_file(fd: int) -> bool:
    """Is ``fd`` an NVIDIA character device (major 195, nvidiactl or a GPU node)? Asked
    with statx(AT_STATX_DONT_SYNC), so that a file a container passed us from its own
    FUSE mount cannot make us wait on its server."""
    buf = ctypes.create_string_buffer(256)  # struct statx
    if _statx(fd, buf) != 0:
        return False
    mode = struct.unpack_from("<H", buf, 28)[0]
    major, minor = struct.unpack_from("<II", buf, 128)
    return (mode & _S_IFMT) == _S_IFCHR and major == abi.NV_MAJOR_DEVICE_NUMBER and (minor == 255 or minor < 254)


def owns_channel(fd: int, h_client: int, h_channel: int) -> bool:
    """Does the open file ``fd`` hold client ``h_client``, and is ``h_channel`` a channel
    of it? RM answers a control on a client only through the file that made the client
    (src/nvidia/src/kernel/rmapi/client.c rmclientValidate_IMPL, strict by default:
    NV_ERR_INVALID_CLIENT; docs/h100-findings.md: status 35 for another process's client), and
    GPFIFO_GET_WORK_SUBMIT_TOKEN (ctrlc36f.h, read-only, what CUDA asks of each of its
    channels) only of a channel. So a process that passes the file proves the channel is
    its own, or was handed to it by its owner."""
    if not nvidia_file(fd):
        return False
    buf = ctypes.create_string_buffer(4)
    arg = bytearray(pack_control(h_client, h_channel, abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
                                 ctypes.addressof(buf), 4))
    try:
        fcntl.ioctl(fd, abi.IOCTL_RM_CONTROL, arg, True)
    except OSError:
        return False
    return abi.NVOS54.unpack(arg)[6] == abi.NV_OK

"""Tiny user-space side of the nvstub stand-in driver, for guest tests.

Opens the fake NVIDIA nodes and issues RM ioctls with the layouts of gpuslice.abi.
Also mirrors tests/standin/nvstub_uapi.h (the simulated engine's test-only escape)
and parses /proc/nvstub. Other engineers' guest tests use this module: keep it stable.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gpuslice import abi, nvrm_versions

# ---- mirror of tests/standin/nvstub_uapi.h ----
NVSTUB_ESC_SUBMIT = 0xF0
NVSTUB_SUBMIT = struct.Struct("<IIQII")  # hClient, hChannel, work_ns, status, pad
NVSTUB_IOCTL_SUBMIT = abi.iowr(NVSTUB_ESC_SUBMIT, NVSTUB_SUBMIT.size)  # _IOWR('F', 0xF0, 24)

CTL_PATH = "/dev/nvidiactl"
UVM_PATH = "/dev/nvidia-uvm"
PROC = Path("/proc/nvstub")
PARAMS = Path("/sys/module/nvstub/parameters")
# NV_MEMORY_ALLOCATION_PARAMS.owner used by mem_params(): RM refuses 0, ~0 and its own
# scratch owners with NV_ERR_INVALID_OWNER (standard_mem.c stdmemValidateParams)
DEFAULT_OWNER = 0x5C000002


def gpu_path(n: int) -> str:
    return f"/dev/nvidia{n}"


def present() -> bool:
    """True when the stand-in's nodes exist (i.e. nvstub.ko is loaded)."""
    return os.path.exists(CTL_PATH) and (PROC / "engine").exists()


def open_node(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)


class IoctlError(OSError):
    pass


def ioctl(fd: int, req: int, buf: bytearray) -> int:
    """Issue an ioctl whose argument block is buf (mutated in place). Returns 0 or -errno."""
    try:
        return fcntl.ioctl(fd, req, buf, True)
    except OSError as e:
        return -(e.errno or errno.EIO)


def uvm_ioctl(fd: int, cmd: int, params: ctypes.Array) -> int:
    """nvidia-uvm ioctl: the argument is a pointer to params (a ctypes buffer, updated in place)."""
    try:
        return fcntl.ioctl(fd, cmd, params, True)
    except OSError as e:
        return -(e.errno or errno.EIO)


def rm_alloc(ctl: int, h_root: int, h_parent: int, h_new: int, h_class: int,
             params: ctypes.Array | None = None) -> tuple[int, int]:
    """NV_ESC_RM_ALLOC; returns (status, hObjectNew). params is updated in place."""
    ptr = ctypes.addressof(params) if params is not None else 0
    buf = bytearray(abi.NVOS64.pack(h_root, h_parent, h_new, h_class, ptr, 0, 0, 0, 0))
    ret = ioctl(ctl, abi.IOCTL_RM_ALLOC, buf)
    if ret < 0:
        raise IoctlError(-ret, f"RM_ALLOC class {h_class:#x}")
    fields = abi.NVOS64.unpack(buf)
    return fields[8], fields[2]


def rm_free(ctl: int, h_root: int, h_parent: int, h_object: int) -> int:
    buf = bytearray(abi.NVOS00.pack(h_root, h_parent, h_object, 0))
    ret = ioctl(ctl, abi.IOCTL_RM_FREE, buf)
    if ret < 0:
        raise IoctlError(-ret, "RM_FREE")
    return abi.NVOS00.unpack(buf)[3]


def rm_control(ctl: int, h_client: int, h_object: int, cmd: int, params: ctypes.Array) -> int:
    """NV_ESC_RM_CONTROL with params (a ctypes buffer, updated in place); returns status."""
    buf = bytearray(abi.NVOS54.pack(h_client, h_object, cmd, 0, ctypes.addressof(params),
                                    ctypes.sizeof(params), 0))
    ret = ioctl(ctl, abi.IOCTL_RM_CONTROL, buf)
    if ret < 0:
        raise IoctlError(-ret, f"RM_CONTROL {cmd:#x}")
    return abi.NVOS54.unpack(buf)[6]


def gpu_ids(ctl: int) -> dict[int, int]:
    """NV_ESC_CARD_INFO on a nvidiactl: minor -> RM gpuId of each GPU."""
    buf = bytearray(abi.CARD_INFO.size * abi.NV_MAX_DEVICES)
    if ioctl(ctl, abi.IOCTL_CARD_INFO, buf) < 0:
        raise IoctlError(errno.EIO, "CARD_INFO")
    out = {}
    for i in range(abi.NV_MAX_DEVICES):
        f = abi.CARD_INFO.unpack_from(buf, i * abi.CARD_INFO.size)
        if f[0]:
            out[f[13]] = f[7]
    return out


def attach_gpus(ctl: int, ids: list[int]) -> int:
    """NV_ESC_ATTACH_GPUS_TO_FD of gpuIds on a nvidiactl; 0 or -errno."""
    return ioctl(ctl, abi.iowr(abi.NV_ESC_ATTACH_GPUS_TO_FD, 4 * len(ids)),
                 bytearray(struct.pack(f"<{len(ids)}I", *ids)))


def register_fd(fd: int, ctl_fd: int) -> int:
    """NV_ESC_REGISTER_FD on fd; returns 0 or -errno (the driver answers -EINVAL)."""
    return ioctl(fd, abi.IOCTL_REGISTER_FD, bytearray(abi.REGISTER_FD.pack(ctl_fd)))


def submit(ctl: int, h_client: int, h_channel: int, work_ns: int) -> int:
    """NVSTUB_ESC_SUBMIT: queue simulated work on a channel; returns status."""
    buf = bytearray(NVSTUB_SUBMIT.pack(h_client, h_channel, work_ns, 0, 0))
    ret = ioctl(ctl, NVSTUB_IOCTL_SUBMIT, buf)
    if ret < 0:
        raise IoctlError(-ret, "NVSTUB_SUBMIT")
    return NVSTUB_SUBMIT.unpack(buf)[3]


# ---- the legacy escapes (NVOS32 vid-heap, NVOS02 RM_ALLOC_MEMORY): nvos.h layouts ----
NVOS32_SIZE = 184  # NVOS32_PARAMETERS; the union starts at 40
NVOS32_FUNCTION_ALLOC_SIZE = 2
NVOS32_FUNCTION_FREE = 3
NVOS32_FUNCTION_INFO = 5
NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT = 6
NVOS32_FUNCTION_ALLOC_SIZE_RANGE = 14
NVOS32_FUNCTION_GET_MEM_ALIGNMENT = 18
NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED = 0x4000
NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED = 0x1
NVOS02_FLAGS_ALLOC_NONE = 1 << 16  # NVOS02_FLAGS_ALLOC 17:16 = NONE
IOCTL_VID_HEAP_CONTROL = abi.iowr(abi.NV_ESC_RM_VID_HEAP_CONTROL, NVOS32_SIZE)


def vid_heap(ctl: int, a: bytearray) -> int:
    """NV_ESC_RM_VID_HEAP_CONTROL with the NVOS32 block a (updated in place); returns the status
    at offset 20. Raises IoctlError when the ioctl itself fails (e.g. EPERM from a filter)."""
    ret = ioctl(ctl, IOCTL_VID_HEAP_CONTROL, a)
    if ret < 0:
        raise IoctlError(-ret, "RM_VID_HEAP_CONTROL")
    return struct.unpack_from("<I", a, 20)[0]


def vid_heap_alloc(ctl: int, h_client: int, h_parent: int, size: int, *, h_memory: int = 0,
                   function: int = NVOS32_FUNCTION_ALLOC_SIZE, owner: int = DEFAULT_OWNER,
                   attr: int = 0, attr2: int = 0, flags: int = 0) -> tuple[int, int, int]:
    """A vid-heap allocation (ALLOC_SIZE, ALLOC_SIZE_RANGE or ALLOC_TILED_PITCH_HEIGHT with
    height = size / 4096, pitch = 4096); h_memory given: MEMORY_HANDLE_PROVIDED. Returns
    (status, hMemory, size written back)."""
    a = bytearray(NVOS32_SIZE)
    if h_memory:
        flags |= NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED
    struct.pack_into("<III", a, 0, h_client, h_parent, function)
    struct.pack_into("<IIII", a, 40, owner, h_memory, 0, flags)
    if function == NVOS32_FUNCTION_ALLOC_SIZE_RANGE:
        struct.pack_into("<I", a, 56, attr)
        struct.pack_into("<Q", a, 80, size)
        struct.pack_into("<I", a, 136, attr2)
        size_off = 80
    elif function == NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT:
        assert size % 4096 == 0
        struct.pack_into("<III", a, 56, size // 4096, 4096, attr)
        struct.pack_into("<I", a, 144, attr2)
        size_off = 88
    else:
        struct.pack_into("<I", a, 56, attr)
        struct.pack_into("<Q", a, 88, size)
        struct.pack_into("<I", a, 144, attr2)
        size_off = 88
    st = vid_heap(ctl, a)
    return st, struct.unpack_from("<I", a, 44)[0], struct.unpack_from("<Q", a, size_off)[0]


def vid_heap_free(ctl: int, h_client: int, h_parent: int, h_memory: int) -> int:
    a = bytearray(NVOS32_SIZE)
    struct.pack_into("<III", a, 0, h_client, h_parent, NVOS32_FUNCTION_FREE)
    struct.pack_into("<III", a, 40, 0, h_memory, NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED)
    return vid_heap(ctl, a)


def vid_heap_info(ctl: int, h_client: int, h_parent: int) -> tuple[int, int, int, int]:
    """INFO: (status, total, free, size of the largest free region)."""
    a = bytearray(NVOS32_SIZE)
    struct.pack_into("<III", a, 0, h_client, h_parent, NVOS32_FUNCTION_INFO)
    st = vid_heap(ctl, a)
    total, free = struct.unpack_from("<QQ", a, 24)
    return st, total, free, struct.unpack_from("<Q", a, 56)[0]


def alloc_memory(fd: int, h_client: int, h_parent: int, h_new: int, h_class: int,
                 flags: int = 0, limit: int = 0) -> tuple[int, int]:
    """NV_ESC_RM_ALLOC_MEMORY (NVOS02 with fd) on a GPU node; returns (status, limit)."""
    buf = bytearray(abi.NVOS02_WITH_FD.pack(h_client, h_parent, h_new, h_class, flags, 0, limit, 0, -1))
    ret = ioctl(fd, abi.IOCTL_RM_ALLOC_MEMORY, buf)
    if ret < 0:
        raise IoctlError(-ret, f"RM_ALLOC_MEMORY class {h_class:#x}")
    f = abi.NVOS02_WITH_FD.unpack(buf)
    return f[7], f[6]


def map_memory(ctl: int, h_client: int, h_device: int, h_memory: int, length: int, fd: int) -> int:
    """NV_ESC_RM_MAP_MEMORY of h_memory for fd; returns the status."""
    buf = bytearray(abi.NVOS33_WITH_FD.pack(h_client, h_device, h_memory, 0, length, 0, 0, 0, fd))
    ret = ioctl(ctl, abi.IOCTL_RM_MAP_MEMORY, buf)
    if ret < 0:
        raise IoctlError(-ret, "RM_MAP_MEMORY")
    return abi.NVOS33_WITH_FD.unpack(buf)[6]


def mem_params(size: int, *, owner: int = DEFAULT_OWNER, attr: int = 0, attr2: int = 0,
               flags: int = 0, alignment: int = 0) -> ctypes.Array:
    """NV_MEMORY_ALLOCATION_PARAMS (128 bytes): owner @0, flags @8, attr @24, attr2 @28,
    size @64, alignment @72."""
    p = ctypes.create_string_buffer(abi.MEMORY_ALLOCATION_PARAMS_SIZE)
    struct.pack_into("<I", p, 0, owner)
    struct.pack_into("<I", p, 8, flags)
    struct.pack_into("<II", p, 24, attr, attr2)
    struct.pack_into("<QQ", p, abi.MEMORY_ALLOCATION_SIZE_OFFSET, size, alignment)
    return p


def page_attrs(page_size: int, huge: int = 0) -> tuple[int, int]:
    """(attr, attr2) asking for NVOS32_ATTR_PAGE_SIZE page_size (and, for HUGE,
    NVOS32_ATTR2_PAGE_SIZE_HUGE huge)."""
    return page_size << abi.NVOS32_ATTR_PAGE_SIZE_SHIFT, huge << abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT


def mem_fields(p: ctypes.Array) -> dict[str, int]:
    """The fields RM writes back into NV_MEMORY_ALLOCATION_PARAMS that the stand-in models."""
    attr, attr2 = struct.unpack_from("<II", p, 24)
    size, alignment, _offset, limit = struct.unpack_from("<QQQQ", p, abi.MEMORY_ALLOCATION_SIZE_OFFSET)
    return {"attr": attr, "attr2": attr2, "size": size, "alignment": alignment, "limit": limit}


def mem_size(p: ctypes.Array) -> int:
    return struct.unpack_from("<Q", p, abi.MEMORY_ALLOCATION_SIZE_OFFSET)[0]


def fb_info(ctl: int, h_client: int, h_subdevice: int, indexes: list[int]) -> tuple[int, dict[int, int]]:
    """FB_GET_INFO_V2; returns (status, {index: KiB})."""
    p = ctypes.create_string_buffer(abi.FB_GET_INFO_V2_SIZE)
    struct.pack_into("<I", p, 0, len(indexes))
    for i, idx in enumerate(indexes):
        abi.FB_INFO.pack_into(p, 4 + 8 * i, idx, 0)
    st = rm_control(ctl, h_client, h_subdevice, abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, p)
    return st, {abi.FB_INFO.unpack_from(p, 4 + 8 * i)[0]: abi.FB_INFO.unpack_from(p, 4 + 8 * i)[1]
                for i in range(len(indexes))}


def disable_params(pairs: list[tuple[int, int]], disable: bool = True) -> ctypes.Array:
    """NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS naming (hClient, hChannel) pairs."""
    p = ctypes.create_string_buffer(abi.DISABLE_CHANNELS_SIZE)
    abi.DISABLE_CHANNELS_HEAD.pack_into(p, 0, int(disable), len(pairs), 0, 0, 0)
    base = abi.DISABLE_CHANNELS_HEAD.size
    n = abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES
    for i, (hc, hch) in enumerate(pairs):
        struct.pack_into("<I", p, base + 4 * i, hc)
        struct.pack_into("<I", p, base + 4 * n + 4 * i, hch)
    return p


def disable_channels(ctl: int, h_client: int, h_subdevice: int, pairs: list[tuple[int, int]],
                     disable: bool) -> int:
    return rm_control(ctl, h_client, h_subdevice, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                      disable_params(pairs, disable))


def set_timeslice(ctl: int, h_client: int, h_tsg: int, us: int) -> int:
    p = ctypes.create_string_buffer(abi.TIMESLICE.pack(us), abi.TIMESLICE.size)
    return rm_control(ctl, h_client, h_tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, p)


def get_timeslice(ctl: int, h_client: int, h_tsg: int) -> tuple[int, int]:
    p = ctypes.create_string_buffer(abi.TIMESLICE.size)
    st = rm_control(ctl, h_client, h_tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, p)
    return st, abi.TIMESLICE.unpack(p.raw)[0]


def schedule(ctl: int, h_client: int, h_tsg: int, enable: bool = True) -> int:
    p = ctypes.create_string_buffer(abi.GPFIFO_SCHEDULE.pack(int(enable), 0, 0),
                                    abi.GPFIFO_SCHEDULE.size)
    return rm_control(ctl, h_client, h_tsg, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, p)


@dataclass
class EngineChannel:
    client: int
    channel: int
    tsg: int
    pid: int
    executed_ns: int
    pending_ns: int
    disabled: bool
    timeslice_us: int
    engine: int = 0  # NVA06F_CTRL_CMD_BIND's NV2080_ENGINE_TYPE, 0: not bound


def read_engine() -> list[EngineChannel]:
    """Parse /proc/nvstub/engine."""
    out = []
    for line in (PROC / "engine").read_text().splitlines():
        kv = dict(item.split("=", 1) for item in line.split())
        out.append(EngineChannel(
            client=int(kv["client"], 16), channel=int(kv["channel"], 16), tsg=int(kv["tsg"], 16),
            pid=int(kv["pid"]), executed_ns=int(kv["executed_ns"]), pending_ns=int(kv["pending_ns"]),
            disabled=kv["disabled"] == "1", timeslice_us=int(kv["timeslice_us"]),
            engine=int(kv.get("engine", "0"), 16)))
    return out


def clients() -> list[dict[str, int]]:
    """Parse /proc/nvstub/clients: [{"client", "pid", "vidmem"}] (vidmem: pool bytes of the
    memory the client owns, in PMA pages as the pool is charged)."""
    out = []
    for line in (PROC / "clients").read_text().splitlines():
        kv = dict(item.split("=", 1) for item in line.split())
        out.append({"client": int(kv["client"], 16), "pid": int(kv["pid"]), "vidmem": int(kv["vidmem"])})
    return out


def pool(gpu: int = 0) -> dict[str, int]:
    """One line of /proc/nvstub/pool: {"gpu", "total", "used"} in bytes."""
    for line in (PROC / "pool").read_text().splitlines():
        kv = {k: int(v) for k, v in (item.split("=", 1) for item in line.split())}
        if kv["gpu"] == gpu:
            return kv
    raise KeyError(f"no GPU {gpu} in {PROC / 'pool'}")


def pool_used(gpu: int = 0) -> int:
    """Bytes of GPU gpu's video memory pool in use (what RM's PMA has handed out)."""
    return pool(gpu)["used"]


def set_race_delay_us(us: int) -> None:
    """TEST ONLY: the stand-in sleeps us between an RM_ALLOC/RM_CONTROL's top-level copy and
    its nested params copy (module parameter race_delay_us; root)."""
    (PARAMS / "race_delay_us").write_text(f"{us}\n")


def get_pids(ctl: int, h_client: int, h_subdevice: int, id_: int = abi.NV20_SUBDEVICE_0,
             id_type: int = abi.NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS) -> tuple[int, list[int]]:
    """NV2080_CTRL_CMD_GPU_GET_PIDS; returns (status, pids)."""
    p = ctypes.create_string_buffer(abi.GET_PIDS_SIZE)
    abi.GET_PIDS_HEAD.pack_into(p, 0, id_type, id_, 0)
    st = rm_control(ctl, h_client, h_subdevice, abi.NV2080_CTRL_CMD_GPU_GET_PIDS, p)
    n = abi.GET_PIDS_HEAD.unpack_from(p, 0)[2]
    return st, list(struct.unpack_from(f"<{n}I", p, abi.GET_PIDS_HEAD.size)) if st == abi.NV_OK else []


@dataclass
class PidInfo:
    pid: int
    index: int
    result: int
    private: int
    shared_owned: int
    shared_duped: int
    protected: tuple[int, int, int]
    compute_instance_id: int
    gpu_instance_id: int


def pid_info_params(pids: list[int], index: int = abi.NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE,
                    count: int | None = None) -> ctypes.Array:
    p = ctypes.create_string_buffer(abi.GET_PID_INFO_SIZE)
    struct.pack_into("<I", p, 0, len(pids) if count is None else count)
    for i, pid in enumerate(pids):
        abi.PID_INFO.pack_into(p, abi.GET_PID_INFO_LIST_OFFSET + i * abi.PID_INFO.size,
                               pid, index, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return p


def parse_pid_info(p: ctypes.Array, n: int) -> list[PidInfo]:
    out = []
    for i in range(n):
        f = abi.PID_INFO.unpack_from(p, abi.GET_PID_INFO_LIST_OFFSET + i * abi.PID_INFO.size)
        out.append(PidInfo(f[0], f[1], f[2], f[3], f[4], f[5], (f[6], f[7], f[8]), f[9], f[10]))
    return out


def get_pid_info(ctl: int, h_client: int, h_subdevice: int, pids: list[int],
                 index: int = abi.NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE) -> tuple[int, list[PidInfo]]:
    """NV2080_CTRL_CMD_GPU_GET_PID_INFO for up to 200 pids; returns (status, one PidInfo per pid)."""
    p = pid_info_params(pids, index)
    st = rm_control(ctl, h_client, h_subdevice, abi.NV2080_CTRL_CMD_GPU_GET_PID_INFO, p)
    return st, parse_pid_info(p, len(pids))


def read_implemented() -> set[tuple[str, int]]:
    """Parse /proc/nvstub/implemented into {(kind, number)}."""
    out = set()
    for line in (PROC / "implemented").read_text().splitlines():
        kind, num = line.split()
        out.add((kind, int(num, 16)))
    return out


class Session:
    """One process's RM session: nvidiactl + nvidiaN (registered), client, device, subdevice."""

    def __init__(self, gpu: int = 0) -> None:
        self.gpu = gpu
        self.gpu_node = gpu_path(gpu)
        self.ctl = open_node(CTL_PATH)
        self.dev_fd = open_node(self.gpu_node)
        if register_fd(self.dev_fd, self.ctl) != 0:
            raise IoctlError(errno.EINVAL, "REGISTER_FD")
        st, self.client = rm_alloc(self.ctl, 0, 0, 0, abi.NV01_ROOT_CLIENT)
        self._check(st, "client")
        self.device = 0x5C000002
        self.subdevice = 0x5C000003
        dp = ctypes.create_string_buffer(abi.DEVICE_ALLOC_PARAMS.pack(gpu, 0, 0, 0, 0, 0, 0, 0, 0),
                                         abi.DEVICE_ALLOC_PARAMS.size)
        self._check(rm_alloc(self.ctl, self.client, self.client, self.device, abi.NV01_DEVICE_0, dp)[0],
                    "device")
        sp = ctypes.create_string_buffer(abi.SUBDEVICE_ALLOC_PARAMS.pack(0), abi.SUBDEVICE_ALLOC_PARAMS.size)
        self._check(rm_alloc(self.ctl, self.client, self.device, self.subdevice, abi.NV20_SUBDEVICE_0, sp)[0],
                    "subdevice")
        self._next = 0x5C000010

    @staticmethod
    def _check(st: int, what: str) -> None:
        if st != abi.NV_OK:
            raise IoctlError(errno.EIO, f"{what}: status {st:#x}")

    def handle(self) -> int:
        self._next += 1
        return self._next

    def alloc_vidmem(self, size: int, **fields: int) -> tuple[int, int, int]:
        """Returns (status, handle, allocated size); fields go to mem_params (attr, attr2, ...)."""
        p = mem_params(size, **fields)
        h = self.handle()
        st, _ = rm_alloc(self.ctl, self.client, self.device, h, abi.NV01_MEMORY_LOCAL_USER, p)
        return st, h, mem_size(p)

    def dup(self, h_src: int, src_client: int | None = None, parent: int | None = None) -> tuple[int, int]:
        """NV_ESC_RM_DUP_OBJECT of (src_client or this client, h_src) under parent (the device);
        returns (status, new handle)."""
        h = self.handle()
        buf = bytearray(abi.NVOS55.pack(self.client, self.device if parent is None else parent, h,
                                        self.client if src_client is None else src_client, h_src, 0, 0))
        ret = ioctl(self.ctl, abi.IOCTL_RM_DUP_OBJECT, buf)
        if ret < 0:
            raise IoctlError(-ret, "RM_DUP_OBJECT")
        return abi.NVOS55.unpack(buf)[6], h

    def free(self, h: int, parent: int | None = None) -> int:
        return rm_free(self.ctl, self.client, self.device if parent is None else parent, h)

    def export_fd(self, h: int, fd: int) -> int:
        """NV0000 OS_UNIX EXPORT_OBJECT_TO_FD of h into the nvidiactl file fd; returns status."""
        p = ctypes.create_string_buffer(abi.EXPORT_OBJECT_TO_FD.pack(
            abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM, self.device, self.device, h, fd, 0),
            abi.EXPORT_OBJECT_TO_FD.size)
        return rm_control(self.ctl, self.client, self.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, p)

    def import_fd(self, fd: int, h: int | None = None) -> tuple[int, int]:
        """IMPORT_OBJECT_FROM_FD: slot 0 of fd under the device as h; returns (status, h)."""
        h = self.handle() if h is None else h
        p = ctypes.create_string_buffer(abi.IMPORT_OBJECT_FROM_FD.pack(
            fd, abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM, 0, self.device, h), abi.IMPORT_OBJECT_FROM_FD.size)
        st = rm_control(self.ctl, self.client, self.client, abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD, p)
        return st, abi.IMPORT_OBJECT_FROM_FD.unpack(p.raw)[4]

    def export_many(self, handles: list[int], fd: int, index: int = 0, max_objects: int = 16) -> int:
        """EXPORT_OBJECTS_TO_FD: handles into slots index.. of fd; returns status."""
        objs = handles + [0] * (abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS - len(handles))
        p = ctypes.create_string_buffer(abi.EXPORT_OBJECTS_TO_FD.pack(
            fd, self.device, max_objects, b"", *objs, len(handles), index), abi.EXPORT_OBJECTS_TO_FD.size)
        return rm_control(self.ctl, self.client, self.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD, p)

    def import_many(self, fd: int, n: int, index: int = 0,
                    empty: tuple[int, ...] = ()) -> tuple[int, list[int], list[int]]:
        """IMPORT_OBJECTS_FROM_FD of slots index..index+n-1 under the device, with handles of ours
        (0 for the slots in empty, counted from index); returns (status, handles, object types)."""
        hs = [0 if k in empty else self.handle() for k in range(n)]
        objs = hs + [0] * (abi.NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS - n)
        p = ctypes.create_string_buffer(abi.IMPORT_OBJECTS_FROM_FD.pack(fd, self.device, *objs, b"", n, index),
                                        abi.IMPORT_OBJECTS_FROM_FD.size)
        st = rm_control(self.ctl, self.client, self.client, abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD, p)
        f = abi.IMPORT_OBJECTS_FROM_FD.unpack(p.raw)
        return st, hs, list(f[130][:n])

    def export_info(self, fd: int) -> tuple[int, int, int]:
        """GET_EXPORT_OBJECT_INFO of fd; returns (status, deviceInstance, maxObjects)."""
        raw = export_info_params(fd)
        p = ctypes.create_string_buffer(raw, len(raw))
        st = rm_control(self.ctl, self.client, self.client, abi.NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO, p)
        if len(raw) == EXPORT_INFO_535.size:
            f = EXPORT_INFO_535.unpack(p.raw)
            return st, f[1], f[2]
        f = abi.GET_EXPORT_OBJECT_INFO.unpack(p.raw)
        return st, f[1], f[3]

    def fb_free_kib(self) -> int:
        st, info = fb_info(self.ctl, self.client, self.subdevice, [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE])
        self._check(st, "FB_GET_INFO_V2")
        return info[abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE]

    def tsg_channel(self, timeslice_us: int | None = None, schedule_it: bool = True) -> tuple[int, int]:
        """A TSG with one channel (and its compute object); returns (hTsg, hChannel)."""
        tsg, ch, gr = self.handle(), self.handle(), self.handle()
        self._check(rm_alloc(self.ctl, self.client, self.device, tsg, abi.KEPLER_CHANNEL_GROUP_A)[0], "tsg")
        self._check(rm_alloc(self.ctl, self.client, tsg, ch, abi.HOPPER_CHANNEL_GPFIFO_A)[0], "channel")
        self._check(rm_alloc(self.ctl, self.client, ch, gr, abi.HOPPER_COMPUTE_A)[0], "compute")
        if timeslice_us is not None:
            self._check(set_timeslice(self.ctl, self.client, tsg, timeslice_us), "SET_TIMESLICE")
        if schedule_it:
            self._check(schedule(self.ctl, self.client, tsg), "GPFIFO_SCHEDULE")
        return tsg, ch

    def userd_channel(self, entries: int = 1024) -> tuple[int, int, "Userd"]:
        """A TSG (scheduled) with one channel whose USERD is RM's own (NV_CHANNEL_ALLOC_PARAMS
        with gpFifoEntries and hUserdMemory[0] = 0), mapped through the channel's handle on a
        fresh GPU node file, as kchannelMap_IMPL allows: (hTsg, hChannel, Userd)."""
        tsg, ch, gr = self.handle(), self.handle(), self.handle()
        self._check(rm_alloc(self.ctl, self.client, self.device, tsg, abi.KEPLER_CHANNEL_GROUP_A)[0], "tsg")
        cp = ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE)
        struct.pack_into("<I", cp, abi.CHANNEL_ALLOC_GPFIFO_ENTRIES_OFFSET, entries)
        self._check(rm_alloc(self.ctl, self.client, tsg, ch, abi.HOPPER_CHANNEL_GPFIFO_A, cp)[0], "channel")
        self._check(rm_alloc(self.ctl, self.client, ch, gr, abi.HOPPER_COMPUTE_A)[0], "compute")
        self._check(schedule(self.ctl, self.client, tsg), "GPFIFO_SCHEDULE")
        return tsg, ch, Userd.map(self, ch, entries)

    def close(self) -> None:
        os.close(self.dev_fd)
        os.close(self.ctl)


class Userd:
    """A channel's USERD as its process maps it: GPPut written per submission (the
    stand-in's engine moves GPGet up to it as it fetches, nvstub_engine.c)."""

    GPGET, GPPUT = 0x88, 0x8C

    def __init__(self, fd: int, m: mmap.mmap, entries: int, base: int = 0) -> None:
        self.fd, self.m, self.entries = fd, m, entries
        self.base = base  # where the USERD starts in the mapping (RM packs them 512 bytes apart)

    @classmethod
    def map(cls, s: "Session", h_channel: int, entries: int) -> "Userd":
        fd = open_node(s.gpu_node)
        try:
            buf = bytearray(abi.NVOS33_WITH_FD.pack(s.client, s.subdevice, h_channel, 0, 512, 0, 0, 0, fd))
            ret = ioctl(s.ctl, abi.IOCTL_RM_MAP_MEMORY, buf)
            f = abi.NVOS33_WITH_FD.unpack(buf)
            if ret != 0 or f[6] != abi.NV_OK:
                raise IoctlError(errno.EIO, f"RM_MAP_MEMORY of the USERD: {ret} status {f[6]:#x}")
            m = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        # the returned address's in-page part is where the USERD starts in the mapping
        return cls(fd, m, entries, f[5] & (mmap.PAGESIZE - 1))

    def words(self) -> tuple[int, int]:
        """(GPGet, GPPut)"""
        return struct.unpack_from("<II", self.m, self.base + self.GPGET)

    def set_get(self, value: int) -> None:
        struct.pack_into("<I", self.m, self.base + self.GPGET, value)

    def put(self, n: int = 1) -> None:
        """n more GPFIFO entries written: GPPut moves on."""
        struct.pack_into("<I", self.m, self.base + self.GPPUT, (self.words()[1] + n) % self.entries)

    def close(self) -> None:
        self.m.close()
        os.close(self.fd)


# ---- GPU UUIDs and nvidia-uvm external mappings (tests/standin/nvstub_uvm.c) ----
NV2080_CTRL_CMD_GPU_GET_GID_INFO = 0x2080014A
GID_INFO = struct.Struct("<III256s")  # index, flags, length, data (ctrl2080gpu.h, 268 bytes)
GID_FLAGS_FORMAT_BINARY = 0x2  # NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY, TYPE_SHA1 (0)
UVM_UNMAP_EXTERNAL = getattr(abi, "UVM_UNMAP_EXTERNAL", 66)
# (size, rmStatus offset, fd offset) of commands gpuslice.abi may not list yet
UVM_LAYOUTS = {UVM_UNMAP_EXTERNAL: (40, 32, None)}  # base, length, gpuUuid, rmStatus


def standin_version() -> str:
    """The release the loaded stand-in answers as (its version parameter; scripts/
    guest-tests.sh passes NVSTUB_ARGS, e.g. version=535.288.01)."""
    try:
        return Path("/sys/module/nvstub/parameters/version").read_text().strip()
    except OSError:
        return "580.159.04"


# The layouts of that release where they differ between branches (gpuslice.nvrm_versions,
# generated from abi/ like the module's kmod/core/nvrm_tables.c)
ABI_ROW = nvrm_versions.table(standin_version()) or nvrm_versions.table("580.159.04") or {}
MAP_EXTERNAL_SIZE = ABI_ROW["uvm_map_external_size"]
MAP_EXTERNAL_COUNT_OFFSET = ABI_ROW["uvm_map_external_tail"]  # gpuAttributesCount, rmCtrlFd, hClient, hMemory, rmStatus
UVM_LAYOUTS[abi.UVM_MAP_EXTERNAL_ALLOCATION] = (MAP_EXTERNAL_SIZE, MAP_EXTERNAL_COUNT_OFFSET + 20,
                                                MAP_EXTERNAL_COUNT_OFFSET + 8)
UVM_LAYOUTS[abi.UVM_ALLOC_SEMAPHORE_POOL] = (ABI_ROW["uvm_semaphore_pool_size"],
                                             ABI_ROW["uvm_semaphore_pool_tail"] + 8, None)
# The release the recorded traces (tests/traces) were taken on. Replayed against the
# stand-in answering as another release, two kinds of call get that release's answer, not
# the recording's: the version check (the trace's user space is 580.159.04's, which another
# driver refuses) and the escapes the release lacks (WAIT_OPEN_COMPLETE before 550).
TRACE_RELEASE = "580.159.04"


def release_differences() -> set[str]:
    """The names of a trace's calls the stand-in's release answers otherwise than the recording."""
    if standin_version() == TRACE_RELEASE:
        return set()
    names = {"CHECK_VERSION_STR"}
    if not ABI_ROW["wait_open_complete"]:
        names.add("WAIT_OPEN_COMPLETE")
    return names


# 535's GET_EXPORT_OBJECT_INFO has no gpuInstanceId: fd, deviceInstance, maxObjects, metadata
EXPORT_INFO_535 = struct.Struct("<iIH64s2x")


def uvm_params(cmd: int) -> tuple[int, int, int | None]:
    """(size, rmStatus offset, rmCtrlFd offset) of an nvidia-uvm command on the stand-in's release."""
    return UVM_LAYOUTS.get(cmd) or abi.UVM_PARAMS[cmd]


def export_info_params(fd: int) -> bytes:
    """GET_EXPORT_OBJECT_INFO's parameters for fd, as the stand-in's release lays them out."""
    if ABI_ROW["export_object_info_size"] == EXPORT_INFO_535.size:
        return EXPORT_INFO_535.pack(fd, 0, 0, b"")
    return abi.GET_EXPORT_OBJECT_INFO.pack(fd, 0, 0, 0, b"")
UVM_GPU_ATTRS = struct.Struct("<16sIIIII")  # UvmGpuMappingAttributes, 36 bytes


def standin_uuid(gpu: int) -> bytes:
    """The stand-in's UUID of GPU gpu (nvstub_gpu_uuid): "nvstub", zeros, gpu in the last byte."""
    return b"nvstub" + bytes(9) + bytes([gpu])


def gpu_uuid(ctl: int, h_client: int, h_subdevice: int, flags: int = GID_FLAGS_FORMAT_BINARY) -> tuple[int, bytes]:
    """NV2080_CTRL_CMD_GPU_GET_GID_INFO: (status, the GID: 16 bytes in binary format, the
    "GPU-..." string with its NUL otherwise)."""
    p = ctypes.create_string_buffer(GID_INFO.pack(0, flags, 0, b""), GID_INFO.size)
    st = rm_control(ctl, h_client, h_subdevice, NV2080_CTRL_CMD_GPU_GET_GID_INFO, p)
    _, _, length, data = GID_INFO.unpack(p.raw)
    return st, data[:length]


class Uvm:
    """An nvidia-uvm file: UVM_INITIALIZE, GPU and GPU VA space registration, external ranges
    and mappings, each call returning its rmStatus."""

    def __init__(self, path: str = UVM_PATH, flags: int = 0) -> None:
        self.fd = open_node(path)
        st = self.call(abi.UVM_INITIALIZE, struct.pack("<Q", flags))
        if st != abi.NV_OK:
            os.close(self.fd)
            raise IoctlError(errno.EIO, f"UVM_INITIALIZE: status {st:#x}")

    def call(self, cmd: int, head: bytes) -> int:
        """cmd with its params block (head, zero-padded to the command's size); returns rmStatus."""
        size, status_off, _ = uvm_params(cmd)
        buf = ctypes.create_string_buffer(head.ljust(size, b"\0"), size)
        ret = uvm_ioctl(self.fd, cmd, buf)
        if ret != 0:
            raise IoctlError(-ret, f"nvidia-uvm {cmd}")
        return struct.unpack_from("<I", buf, status_off)[0]

    def register_gpu(self, s: "Session", uuid: bytes | None = None) -> int:
        """UVM_REGISTER_GPU of s's GPU (rmCtrlFd s.ctl, hClient s.client)."""
        uuid = standin_uuid(s.gpu) if uuid is None else uuid
        return self.call(abi.UVM_REGISTER_GPU, uuid + struct.pack("<BxxxiiII", 0, 0, s.ctl, s.client, 0))

    def register_gpu_va_space(self, s: "Session", uuid: bytes | None = None) -> int:
        """A FERMI_VASPACE_A under s's device, registered as the GPU's VA space."""
        uuid = standin_uuid(s.gpu) if uuid is None else uuid
        h = s.handle()
        st, _ = rm_alloc(s.ctl, s.client, s.device, h, abi.FERMI_VASPACE_A)
        if st != abi.NV_OK:
            return st
        return self.call(abi.UVM_REGISTER_GPU_VASPACE, uuid + struct.pack("<iII", s.ctl, s.client, h))

    def register(self, s: "Session") -> None:
        """Both registrations of s's GPU, as CUDA makes them before mapping anything."""
        for st in (self.register_gpu(s), self.register_gpu_va_space(s)):
            if st != abi.NV_OK:
                raise IoctlError(errno.EIO, f"nvidia-uvm registration: status {st:#x}")

    def create_range(self, base: int, length: int) -> int:
        return self.call(abi.UVM_CREATE_EXTERNAL_RANGE, struct.pack("<QQ", base, length))

    def map(self, base: int, length: int, h_client: int, h_memory: int, uuids: list[bytes],
            offset: int = 0, rm_ctrl_fd: int = -1, attrs: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0),
            count: int | None = None) -> int:
        """UVM_MAP_EXTERNAL_ALLOCATION of (h_client, h_memory) at [base, base + length) on the
        GPUs of uuids (in order, each with attrs: mapping, caching, format, element bits,
        compression)."""
        head = bytearray(MAP_EXTERNAL_SIZE)
        struct.pack_into("<QQQ", head, 0, base, length, offset)
        for i, u in enumerate(uuids):
            UVM_GPU_ATTRS.pack_into(head, 24 + i * UVM_GPU_ATTRS.size, u, *attrs)
        struct.pack_into("<QiII", head, MAP_EXTERNAL_COUNT_OFFSET, len(uuids) if count is None else count,
                         rm_ctrl_fd, h_client, h_memory)
        return self.call(abi.UVM_MAP_EXTERNAL_ALLOCATION, bytes(head))

    def unmap(self, base: int, length: int, uuid: bytes) -> int:
        return self.call(UVM_UNMAP_EXTERNAL, struct.pack("<QQ", base, length) + uuid)

    def free(self, base: int, length: int) -> int:
        return self.call(abi.UVM_FREE, struct.pack("<QQ", base, length))

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "Uvm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

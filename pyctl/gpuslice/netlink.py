"""Generic-netlink client for the gpuslice kernel module (kmod/uapi/gpuslice.h).

This is the ONE Python place that lists the family's commands and attributes; the values
mirror the header's enums and tests/test_uapi.py parses the header to check that they do.
Attributes travel as their Python names without prefix, lower case (``mem_limit``,
``weight``...); :func:`to_dict` turns a reply into such a dict.
"""

from __future__ import annotations

import errno
import os
import functools
import select
import socket
from typing import Any, Iterable, Mapping

SYS_MODULE = "/sys/module/gpuslice"  # there while the module is loaded


def module_loaded(sys_module: str = SYS_MODULE) -> bool:
    """Is gpuslice.ko loaded, as far as sysfs says? (Checked before pyroute2 is imported
    and the family looked up, which cost a daemon in `--kernel auto` a few hundred ms of
    its start.) Where sysfs shows no modules at all (masked in a container), maybe: the
    caller asks netlink."""
    return os.path.isdir(sys_module) or not os.path.isdir(os.path.dirname(sys_module))


# pyroute2 is imported lazily (msg_class()): it is a large package, and the constants
# below are needed by processes that never open a netlink socket (sources, workloads).

FAMILY = "gpuslice"
VERSION = 5  # GPUSLICE_GENL_VERSION: the handshake, see check_version()
MCGRP_EVENTS = "events"
EVENTS_RCVBUF = 8 << 20  # bytes: about 60 s of one instance's CHANNEL_WORK at its most
NAME_MAX = 32
SHARE_FULL = 10000
WEIGHT_MAX = 10000
DEV_DIR = "gpuslice"
LOCK_HIST_BUCKETS = 32
MAX_GPUS = 32  # GPUSLICE_MAX_GPUS: bits of GPU_MASK, entries of GPU_MEM_*
SAMPLE_US_MIN, SAMPLE_US_MAX = 50, 1000000  # GPUSLICE_SAMPLE_US_*: an instance's sampler period
REPEAT_US_MIN, REPEAT_US_MAX = 500, 10000  # GPUSLICE_REPEAT_US_*: its CHANNEL_WORK at most this often
# GPUSLICE_CAP_*: an instance's capability set (CAPS), NVIDIA_DRIVER_CAPABILITIES' names, in that order
CAPS = {"compute": 0x1, "utility": 0x2, "graphics": 0x4, "video": 0x8}
CAPS_ALL = 0xF  # GPUSLICE_CAPS_ALL: an instance created without CAPS has all

# enum gpuslice_cmd
CMD_UNSPEC = 0
CMD_INSTANCE_NEW = 1
CMD_INSTANCE_DEL = 2
CMD_INSTANCE_SET = 3
CMD_INSTANCE_GET = 4
CMD_OBJECT_GET = 5
CMD_EVENT = 6
CMD_INSTANCE_HANDOVER = 7
CMDS = {
    "GPUSLICE_CMD_UNSPEC": CMD_UNSPEC,
    "GPUSLICE_CMD_INSTANCE_NEW": CMD_INSTANCE_NEW,
    "GPUSLICE_CMD_INSTANCE_DEL": CMD_INSTANCE_DEL,
    "GPUSLICE_CMD_INSTANCE_SET": CMD_INSTANCE_SET,
    "GPUSLICE_CMD_INSTANCE_GET": CMD_INSTANCE_GET,
    "GPUSLICE_CMD_OBJECT_GET": CMD_OBJECT_GET,
    "GPUSLICE_CMD_EVENT": CMD_EVENT,
    "GPUSLICE_CMD_INSTANCE_HANDOVER": CMD_INSTANCE_HANDOVER,
}

# enum gpuslice_attr, in order (value = index), with the pyroute2 type of each
ATTRS: tuple[tuple[str, str], ...] = (
    ("GPUSLICE_A_UNSPEC", "none"),
    ("GPUSLICE_A_NAME", "asciiz"),
    ("GPUSLICE_A_ID", "uint32"),
    ("GPUSLICE_A_GPU_MASK", "uint32"),
    ("GPUSLICE_A_MEM_LIMIT", "uint64"),
    ("GPUSLICE_A_MEM_USED", "uint64"),
    ("GPUSLICE_A_MEM_PEAK", "uint64"),
    ("GPUSLICE_A_WEIGHT", "uint32"),
    ("GPUSLICE_A_SHARE", "uint32"),
    ("GPUSLICE_A_TIMESLICE_US", "uint64"),
    ("GPUSLICE_A_UID", "uint32"),
    ("GPUSLICE_A_GID", "uint32"),
    ("GPUSLICE_A_MODE", "uint32"),
    ("GPUSLICE_A_NR_IOCTLS", "uint64"),
    ("GPUSLICE_A_NR_REFUSED_QUOTA", "uint64"),
    ("GPUSLICE_A_NR_REFUSED_FILTER", "uint64"),
    ("GPUSLICE_A_PIDS", "pids"),
    ("GPUSLICE_A_PID", "uint32"),
    ("GPUSLICE_A_OBJ_KIND", "uint32"),
    ("GPUSLICE_A_CLIENT", "uint32"),
    ("GPUSLICE_A_HANDLE", "uint32"),
    ("GPUSLICE_A_PARENT", "uint32"),
    ("GPUSLICE_A_CLASS", "uint32"),
    ("GPUSLICE_A_ENGINE", "uint32"),
    ("GPUSLICE_A_GPU", "uint32"),
    ("GPUSLICE_A_EVENT", "uint32"),
    ("GPUSLICE_A_SIZE", "uint64"),
    ("GPUSLICE_A_STATUS", "uint32"),
    ("GPUSLICE_A_CMD", "uint32"),
    ("GPUSLICE_A_PAD", "none"),
    ("GPUSLICE_A_NR_EVENTS_SUPPRESSED", "uint64"),
    ("GPUSLICE_A_LOCK_ACQUIRED", "uint64"),
    ("GPUSLICE_A_LOCK_CONTENDED", "uint64"),
    ("GPUSLICE_A_LOCK_HOLD_NS", "uint64"),
    ("GPUSLICE_A_LOCK_HOLD_MAX_NS", "uint64"),
    ("GPUSLICE_A_LOCK_HOLD_HIST", "array(uint64)"),
    ("GPUSLICE_A_LOCK_WAIT_NS", "uint64"),
    ("GPUSLICE_A_LOCK_WAIT_MAX_NS", "uint64"),
    ("GPUSLICE_A_LOCK_WAIT_HIST", "array(uint64)"),
    ("GPUSLICE_A_GPU_MEM_LIMIT", "array(uint64)"),
    ("GPUSLICE_A_GPU_MEM_USED", "array(uint64)"),
    ("GPUSLICE_A_GPU_MEM_PEAK", "array(uint64)"),
    ("GPUSLICE_A_SAMPLE_US", "uint32"),
    ("GPUSLICE_A_REPEAT_US", "uint32"),
    ("GPUSLICE_A_CAPS", "uint32"),
    ("GPUSLICE_A_HANDOVER_NS", "uint64"),
    ("GPUSLICE_A_HANDOVER_DRAIN_NS", "uint64"),
    ("GPUSLICE_A_SNAPSHOT_BYTES", "uint64"),
)
ATTR_IDS = {name: i for i, (name, _t) in enumerate(ATTRS)}

# enum gpuslice_obj_kind
OBJ_KINDS = {"GPUSLICE_OBJ_CLIENT": 0, "GPUSLICE_OBJ_TSG": 1, "GPUSLICE_OBJ_CHANNEL": 2,
             "GPUSLICE_OBJ_MEMORY": 3, "GPUSLICE_OBJ_OTHER": 4}
OBJ_TSG = OBJ_KINDS["GPUSLICE_OBJ_TSG"]
OBJ_CHANNEL = OBJ_KINDS["GPUSLICE_OBJ_CHANNEL"]
# enum gpuslice_event
EVENTS = {
    "GPUSLICE_EV_TSG_NEW": 1, "GPUSLICE_EV_TSG_DEL": 2, "GPUSLICE_EV_CHANNEL_NEW": 3, "GPUSLICE_EV_CHANNEL_DEL": 4,
    "GPUSLICE_EV_PROC_ATTACH": 5, "GPUSLICE_EV_PROC_DETACH": 6, "GPUSLICE_EV_ALLOC_REFUSED": 7,
    "GPUSLICE_EV_FILTER_REFUSED": 8, "GPUSLICE_EV_CHANNEL_WORK": 9,
}
EVENT_NAMES = {v: k[len("GPUSLICE_EV_"):].lower() for k, v in EVENTS.items()}
OBJ_KIND_NAMES = {v: k[len("GPUSLICE_OBJ_"):].lower() for k, v in OBJ_KINDS.items()}


@functools.cache
def msg_class() -> Any:
    """The pyroute2 message class of the family (genlmsghdr + attributes)."""
    from pyroute2.netlink import genlmsg, nla

    class GsMsg(genlmsg):  # type: ignore[misc]
        prefix = "GPUSLICE_A_"
        nla_map = tuple((name, typ) for name, typ in ATTRS)

        class pids(nla):  # type: ignore[misc]
            prefix = "GPUSLICE_A_"
            nla_map = tuple((name, typ if typ != "pids" else "none") for name, typ in ATTRS)

    return GsMsg


def __getattr__(name: str) -> Any:  # gpuslice.netlink.GsMsg, created on first use
    if name == "GsMsg":
        return msg_class()
    raise AttributeError(name)


def attr_name(key: str) -> str:
    """``mem_limit`` -> ``GPUSLICE_A_MEM_LIMIT`` (raises KeyError for unknown ones)."""
    full = "GPUSLICE_A_" + key.upper()
    if full not in ATTR_IDS:
        raise KeyError(f"unknown gpuslice attribute {key!r}")
    return full


def parse_caps(text: str) -> int:
    """``compute,utility`` (NVIDIA_DRIVER_CAPABILITIES' form; ``all``: the four) -> the CAPS
    mask; ValueError for an unknown name or an empty set."""
    mask = 0
    for word in (w.strip().lower() for w in text.split(",")):
        if not word:
            continue
        if word == "all":
            mask |= CAPS_ALL
        elif word in CAPS:
            mask |= CAPS[word]
        else:
            raise ValueError(f"unknown capability {word!r} (one of: all, {', '.join(CAPS)})")
    if not mask:
        raise ValueError("an empty capability set (name one or more of: all, " + ", ".join(CAPS) + ")")
    return mask


def caps_names(mask: int) -> list[str]:
    """The CAPS mask as names, in NVIDIA_DRIVER_CAPABILITIES' order."""
    return [n for n, bit in CAPS.items() if mask & bit]


def caps_text(mask: int) -> str:
    """``all`` for the four, else ``compute,utility`` (as NVIDIA_DRIVER_CAPABILITIES)."""
    return "all" if mask & CAPS_ALL == CAPS_ALL else ",".join(caps_names(mask))


def build(cmd: int, attrs: dict[str, Any]) -> Any:
    """A message for ``cmd`` with ``attrs`` (short names); None values are left out."""
    msg = msg_class()()
    msg["cmd"] = cmd
    msg["version"] = VERSION
    msg["attrs"] = [[attr_name(k), v] for k, v in attrs.items() if v is not None]
    return msg


def to_dict(msg: Any) -> dict[str, Any]:
    """Attributes of a reply as {short name: value}; PIDS becomes a list of ints (the
    PIDS nests of a message, one per 4096 pids, joined in order), arrays lists."""
    out: dict[str, Any] = {}
    for name, value in msg.get("attrs", []):
        if not name.startswith("GPUSLICE_A_") or name in ("GPUSLICE_A_PAD", "GPUSLICE_A_UNSPEC"):
            continue
        key = name[len("GPUSLICE_A_"):].lower()
        if key == "pids":
            out.setdefault(key, []).extend(v for n, v in value.get("attrs", []) if n == "GPUSLICE_A_PID")
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def hist_bucket_ns(i: int) -> tuple[int, int | None]:
    """[low, high) ns of bucket i of a LOCK_*_HIST (high None: the open last bucket)."""
    if i == 0:
        return 0, 1
    if i == LOCK_HIST_BUCKETS - 1:
        return 1 << (i - 1), None
    return 1 << (i - 1), 1 << i


def hist_quantile_ns(hist: list[int], q: float, max_ns: int | None = None) -> int:
    """An upper bound of the q-quantile (0 < q <= 1) of a LOCK_*_HIST: the (exclusive)
    high end of the bucket that holds it, at most twice the true value; max_ns (the
    longest one measured) when that is lower, and for the open last bucket. 0 for an
    empty histogram."""
    total = sum(hist)
    if total == 0:
        return 0
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if n and seen >= q * total:
            high = hist_bucket_ns(i)[1]
            if high is None:
                return max_ns if max_ns is not None else hist_bucket_ns(i)[0]
            return min(high, max_ns) if max_ns is not None else high
    return max_ns or 0


def lock_summary(d: dict[str, Any]) -> dict[str, int]:
    """An instance's core-lock figures from INSTANCE_GET (to_dict): acquisitions,
    contended ones, hold and wait mean, p99 (upper bound, see hist_quantile_ns) and
    max, in ns. Empty when the module does not report them."""
    if "lock_acquired" not in d:
        return {}
    n = d["lock_acquired"]
    out = {"acquired": n, "contended": d.get("lock_contended", 0)}
    for what in ("hold", "wait"):
        mx = d.get(f"lock_{what}_max_ns", 0)
        out[f"{what}_mean_ns"] = d.get(f"lock_{what}_ns", 0) // n if n else 0
        out[f"{what}_p99_ns"] = hist_quantile_ns(d.get(f"lock_{what}_hist", []), 0.99, mx)
        out[f"{what}_max_ns"] = mx
    return out


def merge_instances(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """INSTANCE_GET replies, one dict per instance: a dump splits an instance whose
    pids do not fit one message into that message and continuations (NAME, ID and
    more PIDS), folded here into the first by ID."""
    out: dict[Any, dict[str, Any]] = {}
    for d in replies:
        key = d.get("id", d.get("name"))
        if key in out:
            out[key].setdefault("pids", []).extend(d.get("pids", []))
        else:
            out[key] = d
    return list(out.values())


class NetlinkError(OSError):
    pass


class VersionMismatch(NetlinkError):
    """The loaded module speaks another version of uapi/gpuslice.h than this gpuctl."""

    def __str__(self) -> str:  # the message alone, one line (no "[Errno 71]")
        return str(self.strerror)


def check_version(module_version: int | None, ours: int = VERSION) -> None:
    """The handshake: the family version the module registered (CTRL_ATTR_VERSION)
    must be ours. Raises VersionMismatch with a one-line message naming both."""
    if module_version != ours:
        raise VersionMismatch(errno.EPROTO, f"gpuslice.ko speaks netlink ABI version {module_version}, this gpuctl "
                              f"speaks version {ours}: load the module built from the same gpuslice release")


class GpusliceNetlink:
    """Talks to the loaded module. Raises NetlinkError (errno set) when the family is
    missing or a command is refused."""

    def __init__(self, sock: Any = None) -> None:
        """Binds to the family and checks its version (check_version) before any
        request. ``sock``: a pyroute2 GenericNetlinkSocket or a test's stand-in."""
        if sock is None:
            from pyroute2.netlink.generic import GenericNetlinkSocket

            sock = GenericNetlinkSocket()
        self.sock = sock
        try:
            self.sock.bind(FAMILY, msg_class())
            version = self.sock.discovery(FAMILY).get_attr("CTRL_ATTR_VERSION")
        except Exception as e:  # pyroute2 raises NetlinkError / OSError subclasses
            self.sock.close()
            code = getattr(e, "code", 0) or getattr(e, "errno", 0) or errno.ENOENT
            raise NetlinkError(code, f"generic netlink family {FAMILY!r} not available (is gpuslice.ko loaded?)") from None
        try:
            check_version(version)
        except VersionMismatch:
            self.sock.close()
            raise
        self.module_version = version
        self._subscribed = False

    def close(self) -> None:
        """Close the socket and pyroute2's event loop with it, once. A socket left open
        until the interpreter exits is collected in any order: the loop's finalizer can
        run after its own sockets were closed and print "Exception ignored in:
        BaseEventLoop.__del__ ... Invalid file descriptor: -1"."""
        if not getattr(self, "_closed", False):
            self._closed = True
            self.sock.close()

    def __enter__(self) -> "GpusliceNetlink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, cmd: int, attrs: dict[str, Any], dump: bool = False) -> list[dict[str, Any]]:
        from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST

        msg = build(cmd, attrs)
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        try:
            replies = self.sock.nlm_request(msg, msg_type=self.sock.prid, msg_flags=flags)
            return [to_dict(r) for r in replies if r.get("cmd") == cmd or r.get("attrs")]
        except Exception as e:
            code = getattr(e, "code", 0) or getattr(e, "errno", 0) or errno.EIO
            raise NetlinkError(code, f"gpuslice netlink cmd {cmd}: {errno.errorcode.get(code, code)}") from None

    def instance_new(self, name: str, gpu_mask: int, mem_limit: int, **attrs: Any) -> None:
        self._request(CMD_INSTANCE_NEW, {"name": name, "gpu_mask": gpu_mask, "mem_limit": mem_limit, **attrs})

    def instance_del(self, name: str) -> None:
        self._request(CMD_INSTANCE_DEL, {"name": name})

    def instance_set(self, name: str, **attrs: Any) -> None:
        self._request(CMD_INSTANCE_SET, {"name": name, **attrs})

    def instance_handover(self, name: str) -> dict[str, int]:
        """Hand the instance's decision state to a fresh core (INSTANCE_HANDOVER) and return
        what it took: {"handover_ns": new calls held, "handover_drain_ns": of which
        waiting for the calls in flight, "snapshot_bytes": the state's size}. Raises
        NetlinkError (EBUSY: calls in flight did not finish within 100 ms) with the old
        core left in place."""
        for r in self._request(CMD_INSTANCE_HANDOVER, {"name": name}):
            if "handover_ns" in r:
                return {k: int(r.get(k, 0)) for k in ("handover_ns", "handover_drain_ns", "snapshot_bytes")}
        raise NetlinkError(errno.EIO, "gpuslice netlink INSTANCE_HANDOVER: no reply")

    def instances(self, name: str | None = None) -> list[dict[str, Any]]:
        if name is not None:
            return merge_instances(self._request(CMD_INSTANCE_GET, {"name": name}))
        return merge_instances(self._request(CMD_INSTANCE_GET, {}, dump=True))

    def objects(self, name: str | None = None) -> list[dict[str, Any]]:
        return self._request(CMD_OBJECT_GET, {"name": name}, dump=True)

    def subscribe(self, rcvbuf: int = EVENTS_RCVBUF) -> None:
        """Join the events group, with a receive buffer of ``rcvbuf`` bytes (forced past
        net.core.rmem_max where CAP_NET_ADMIN allows): the module sends CHANNEL_WORK up
        to 100 times a second per instance."""
        if not self._subscribed:
            try:
                s = socket.fromfd(self.sock.fileno(), socket.AF_NETLINK, socket.SOCK_RAW)
            except (OSError, AttributeError, TypeError, ValueError):
                s = None  # a test's stand-in socket
            if s is not None:
                with s:  # a duplicate of the fd: the options land on the same socket
                    for opt in (33, socket.SO_RCVBUF):  # SO_RCVBUFFORCE, then the capped one
                        try:
                            s.setsockopt(socket.SOL_SOCKET, opt, rcvbuf)
                            break
                        except OSError:
                            continue
            self.sock.add_membership(MCGRP_EVENTS)
            self._subscribed = True

    def fileno(self) -> int:
        return int(self.sock.fileno())

    def _queued(self) -> int:
        """Multicast messages pyroute2 already read off the socket (e.g. while it waited
        for a dump's reply) and holds in its own queue, where select() cannot see them."""
        try:
            q = self.sock.asyncore.msg_queue.queues.get(0)
            return int(q.qsize()) if q is not None else 0
        except AttributeError:
            return 0

    def poll_events(self, timeout: float = 0.0, limit: int = 4096) -> list[dict[str, Any]]:
        """Events received so far (waits up to ``timeout`` s for the first); about
        ``limit`` at most, so a caller gets control back under a steady stream."""
        self.subscribe()
        out: list[dict[str, Any]] = []
        while len(out) < limit and (self._queued() or select.select([self.fileno()], [], [], timeout)[0]):
            for m in self.sock.get():
                if m.get("cmd") == CMD_EVENT:
                    out.append(to_dict(m))
            timeout = 0.0
        return out


def gpu_mem_limits(per_gpu: dict[int, int] | None) -> list[int] | None:
    """GPU_MEM_LIMIT's array (0: the instance's MEM_LIMIT) from {gpu: bytes}."""
    if not per_gpu:
        return None
    out = [0] * MAX_GPUS
    for g, v in per_gpu.items():
        out[g] = v
    return out


def gpu_mem(d: Mapping[str, Any]) -> dict[int, dict[str, int]]:
    """{gpu: {limit, used, peak}} of an INSTANCE_GET reply, for the GPUs of its mask."""
    if "gpu_mem_limit" not in d:
        return {}
    lim, used, peak = (d.get(k) or [0] * MAX_GPUS for k in ("gpu_mem_limit", "gpu_mem_used", "gpu_mem_peak"))
    return {g: {"limit": int(lim[g]), "used": int(used[g]), "peak": int(peak[g])}
            for g in gpus_of(int(d.get("gpu_mask", 0))) if g < len(lim)}


def gpus_of(mask: int) -> list[int]:
    """The GPUs of a GPU_MASK, in order (the inverse of mask_of)."""
    return [g for g in range(MAX_GPUS) if mask >> g & 1]


def mask_of(gpus: Iterable[int]) -> int:
    m = 0
    for g in gpus:
        m |= 1 << g
    return m

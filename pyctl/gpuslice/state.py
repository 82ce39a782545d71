"""gpuctl's configuration: instances and per-GPU policies, kept in a JSON state file.

Default path /var/lib/gpuslice/state.json (``GPUSLICE_STATE`` or ``--state`` override).
Writes are atomic (temp file in the same directory, fsync, rename) and serialised with
an flock on ``<path>.lock``. A file that cannot be read or does not validate raises
StateError and is left untouched: it is never silently replaced by an empty state.

Layout (version 1)::

    {"version": 1,
     "gpus": {"0": {"policy": "burst", "period_ns": 50000000}},
     "instances": {"web": {"gpus": [0], "memory": 8589934592, "weight": 1,
                            "share": null, "ceiling": null,
                            "uid": 1000, "gid": 44, "mode": "0660"}}}

uid, gid and mode (the device nodes', octal) are there only when given; a file without
them reads as before. So is caps, the capability set as NVIDIA_DRIVER_CAPABILITIES writes
it ("compute,utility"); without it an instance has all four.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from gpuslice.netlink import CAPS_ALL, MAX_GPUS, caps_text, parse_caps
from gpuslice.policy import POLICIES, PRIORITIES, WEIGHT_MAX, WEIGHT_MIN, Claim, validate

DEFAULT_PATH = "/var/lib/gpuslice/state.json"
STATUS_PATH = "/run/gpuslice/status.json"  # where `gpuctl daemon` reports (status, exporter, trace read it)
VERSION = 1
DEFAULT_POLICY = "burst"
DEFAULT_PERIOD_NS = 50_000_000
PERIOD_MIN_NS = 1_000_000
PERIOD_MAX_NS = 10_000_000_000
NAME_RE = re.compile(r"[a-zA-Z0-9_.-]{1,31}")
NAME_RULE = "1-31 of a-z A-Z 0-9 _ . -, not . or .."
# A new instance's name: a CDI device name (it is one in the CDI spec: letters and digits,
# with _ . - inside only; CDI's colon is not in the module's rule) the module takes
# (NAME_RE), unique whatever its case. Names of the first rule alone still load.
NEW_NAME_RE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,29}[a-zA-Z0-9])?")
NEW_NAME_RULE = ("1-31 of a-z A-Z 0-9 _ . -, starting and ending with a letter or digit (a CDI device name); "
                 "unique whatever the case")
# Owners of instances not made by hand: each writes its own CDI spec (gpuslice.kube),
# so `gpuctl cdi generate` leaves their instances out of the shared one.
OWNERS = ("kubelet-plugin", "device-plugin")
# Mode of their nodes: NVIDIA's own nodes are 0666, so a container need not run as root.
# Who may open them is decided by the pod's device cgroup (the runtime allows the CDI
# device's nodes only) and, in the module, by require_device_cgroup (a process that may
# open the real nodes gets no instance node).
OWNED_NODE_MODE = 0o666
ID_MAX = 2**32 - 2  # a node's uid/gid: the kernel's u32, (u32)-1 is no id


def valid_name(name: str) -> bool:
    """An instance name, by the module's rule (kmod/instance.c gs_instance_name_valid):
    the name is a directory of /dev/gpuslice (and of the daemon's sockets), so "." and
    ".." are refused too; `gpuctl run-args ..` once gave /dev/gpuslice/../nvidia0, the
    host's own node."""
    return NAME_RE.fullmatch(name) is not None and name not in (".", "..")


def valid_new_name(name: str) -> bool:
    """A name :func:`gpuslice.instances.add` takes (NEW_NAME_RE): a CDI device name too."""
    return NEW_NAME_RE.fullmatch(name) is not None


def same_name(st: "State", name: str) -> str | None:
    """The instance of ``st`` named ``name`` whatever the case, or None."""
    low = name.lower()
    return next((n for n in sorted(st.instances) if n.lower() == low), None)


class StateError(Exception):
    """The state file is unreadable or invalid, or a change would make it invalid."""


@dataclass
class Instance:
    name: str
    gpus: list[int]
    memory: int  # bytes
    weight: int = 1
    share: float | None = None  # fixed share, fraction of one GPU
    ceiling: float | None = None  # burst/equal ceiling, fraction
    priority: str = "online"  # online | offline (policy.PRIORITIES)
    min_share: float | None = None  # offline: floor while online work runs, fraction
    gpu_memory: dict[int, int] | None = None  # per-GPU limits, one per GPU; None: memory on each
    owner: str | None = None  # who manages it (OWNERS); None: made by hand (`gpuctl instance create`)
    # its device nodes' owner, group and mode (None: the module's default), applied again by
    # `gpuctl instance restore` and the daemon's re-create after a reboot or a module reload
    uid: int | None = None
    gid: int | None = None
    mode: int | None = None  # in the file as an octal string, "0660"
    # the capability set (netlink.CAPS bits; None: all), in the file as "compute,utility"
    caps: int | None = None

    def memory_of(self, gpu: int) -> int:
        """The video memory limit on ``gpu`` (bytes)."""
        return (self.gpu_memory or {}).get(gpu, self.memory)

    def claim(self) -> Claim:
        return Claim(self.name, self.weight, self.share, self.ceiling, self.priority, self.min_share)


@dataclass
class GpuPolicy:
    policy: str = DEFAULT_POLICY
    period_ns: int = DEFAULT_PERIOD_NS


@dataclass
class State:
    instances: dict[str, Instance] = field(default_factory=dict)
    gpus: dict[int, GpuPolicy] = field(default_factory=dict)

    def policy_of(self, gpu: int) -> GpuPolicy:
        return self.gpus.get(gpu, GpuPolicy())

    def instances_on(self, gpu: int) -> list[Instance]:
        return [i for i in sorted(self.instances.values(), key=lambda i: i.name) if gpu in i.gpus]

    def claims(self, gpu: int) -> list[Claim]:
        return [i.claim() for i in self.instances_on(gpu)]

    def used_gpus(self) -> list[int]:
        return sorted({g for i in self.instances.values() for g in i.gpus} | set(self.gpus))

    def check(self) -> None:
        """Raise StateError unless every instance and policy is valid."""
        for name, inst in self.instances.items():
            _check_instance(name, inst)
        for gpu, gp in self.gpus.items():
            if not 0 <= gpu < MAX_GPUS:
                raise StateError(f"gpu {gpu} outside 0..{MAX_GPUS - 1}")
            if gp.policy not in POLICIES:
                raise StateError(f"gpu {gpu}: unknown policy {gp.policy!r}")
            if not PERIOD_MIN_NS <= gp.period_ns <= PERIOD_MAX_NS:
                raise StateError(f"gpu {gpu}: period {gp.period_ns} ns outside {PERIOD_MIN_NS}..{PERIOD_MAX_NS}")
        for gpu in self.used_gpus():
            errs = validate(self.policy_of(gpu).policy, self.claims(gpu))
            if errs:
                raise StateError(f"gpu {gpu}: {errs[0]}")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "gpus": {str(g): asdict(p) for g, p in sorted(self.gpus.items())},
            "instances": {n: _inst_json(i) for n, i in sorted(self.instances.items())},
        }

    @classmethod
    def from_json(cls, doc: Any) -> "State":
        if not isinstance(doc, dict):
            raise StateError("top level is not an object")
        if doc.get("version") != VERSION:
            raise StateError(f"unsupported version {doc.get('version')!r} (want {VERSION})")
        st = cls()
        gpus = doc.get("gpus", {})
        insts = doc.get("instances", {})
        if not isinstance(gpus, dict) or not isinstance(insts, dict):
            raise StateError("'gpus' and 'instances' must be objects")
        for key, val in gpus.items():
            if not isinstance(key, str) or not key.isdigit():
                raise StateError(f"gpu key {key!r} is not a number")
            try:
                gp = GpuPolicy(**val)
            except TypeError as e:
                raise StateError(f"gpu {key}: {e}") from None
            if not isinstance(gp.policy, str) or type(gp.period_ns) is not int:
                raise StateError(f"gpu {key}: bad policy or period type")
            st.gpus[int(key)] = gp
        for name, val in insts.items():
            if not isinstance(val, dict):
                raise StateError(f"instance {name!r} is not an object")
            gm = val.get("gpu_memory")
            if isinstance(gm, dict):
                if not all(isinstance(k, str) and k.isdigit() for k in gm):
                    raise StateError(f"instance {name!r}: gpu_memory keys must be GPU numbers")
                val = {**val, "gpu_memory": {int(k): v for k, v in gm.items()}}
            if "mode" in val:
                m = val["mode"]
                if not isinstance(m, str) or not re.fullmatch(r"[0-7]{1,4}", m):
                    raise StateError(f"instance {name!r}: mode must be an octal string such as \"0660\"")
                val = {**val, "mode": int(m, 8)}
            if "caps" in val:
                c = val["caps"]
                try:
                    val = {**val, "caps": parse_caps(c) if isinstance(c, str) else None}
                except ValueError as e:
                    raise StateError(f"instance {name!r}: caps: {e}") from None
                if val["caps"] is None:
                    raise StateError(f"instance {name!r}: caps must be a string such as \"compute,utility\"")
            try:
                inst = Instance(name=name, **val)
            except TypeError as e:
                raise StateError(f"instance {name!r}: {e}") from None
            _check_types(inst)
            st.instances[name] = inst
        st.check()
        return st


def _inst_json(i: Instance) -> dict[str, Any]:
    d = {k: v for k, v in asdict(i).items() if k != "name"}
    if i.owner is None:
        del d["owner"]  # instances made by hand read as before
    for k in ("uid", "gid", "mode"):
        if d[k] is None:
            del d[k]  # files written before node attributes were kept read the same
    if i.mode is not None:
        d["mode"] = f"{i.mode:04o}"
    if i.caps is None:
        del d["caps"]  # files written before capability sets read the same
    else:
        d["caps"] = caps_text(i.caps)
    if i.gpu_memory is None:
        del d["gpu_memory"]  # files written before per-GPU limits read the same
    else:
        d["gpu_memory"] = {str(g): v for g, v in sorted(i.gpu_memory.items())}
    return d


def _check_types(inst: Instance) -> None:
    ok = (
        isinstance(inst.gpus, list)
        and all(type(g) is int for g in inst.gpus)
        and type(inst.memory) is int
        and type(inst.weight) is int
        and (inst.share is None or isinstance(inst.share, (int, float)))
        and (inst.ceiling is None or isinstance(inst.ceiling, (int, float)))
        and isinstance(inst.priority, str)
        and (inst.min_share is None or isinstance(inst.min_share, (int, float)))
        and (inst.owner is None or inst.owner in OWNERS)
        and all(v is None or type(v) is int for v in (inst.uid, inst.gid, inst.mode, inst.caps))
        and (inst.gpu_memory is None or (isinstance(inst.gpu_memory, dict)
                                         and all(type(g) is int and type(v) is int
                                                 for g, v in inst.gpu_memory.items())))
    )
    if not ok:
        raise StateError(f"instance {inst.name!r}: field of the wrong type")


def _check_instance(name: str, inst: Instance) -> None:
    if not valid_name(name) or name != inst.name:
        raise StateError(f"bad instance name {name!r} ({NAME_RULE})")
    _check_types(inst)
    if not inst.gpus or len(set(inst.gpus)) != len(inst.gpus) or not all(0 <= g < MAX_GPUS for g in inst.gpus):
        raise StateError(f"instance {name}: gpus must be distinct numbers 0..{MAX_GPUS - 1}")
    if inst.memory <= 0:
        raise StateError(f"instance {name}: memory must be positive")
    if inst.gpu_memory is not None:
        if sorted(inst.gpu_memory) != sorted(inst.gpus):
            raise StateError(f"instance {name}: per-GPU memory must name each of its GPUs "
                             f"({','.join(map(str, sorted(inst.gpus)))}) and no other")
        if not all(v > 0 for v in inst.gpu_memory.values()):
            raise StateError(f"instance {name}: memory must be positive")
    if not WEIGHT_MIN <= inst.weight <= WEIGHT_MAX:
        raise StateError(f"instance {name}: weight {inst.weight} outside {WEIGHT_MIN}..{WEIGHT_MAX}")
    for what, v in (("share", inst.share), ("ceiling", inst.ceiling), ("min_share", inst.min_share)):
        if v is not None and not 0 < v <= 1:
            raise StateError(f"instance {name}: {what} {v} outside (0, 1]")
    if inst.priority not in PRIORITIES:
        raise StateError(f"instance {name}: priority {inst.priority!r} is not one of {', '.join(PRIORITIES)}")
    if inst.min_share is not None and inst.priority != "offline":
        raise StateError(f"instance {name}: a min_share is for offline instances only")
    for what, v in (("uid", inst.uid), ("gid", inst.gid)):
        if v is not None and not 0 <= v <= ID_MAX:
            raise StateError(f"instance {name}: {what} {v} outside 0..{ID_MAX}")
    if inst.mode is not None and not 0 <= inst.mode <= 0o777:
        raise StateError(f"instance {name}: mode {inst.mode:o} outside 0..0777")
    if inst.caps is not None and not (0 < inst.caps and not inst.caps & ~CAPS_ALL):
        raise StateError(f"instance {name}: capability set {inst.caps:#x} outside 1..{CAPS_ALL:#x}")


def state_path(path: str | None = None) -> str:
    return path or os.environ.get("GPUSLICE_STATE") or DEFAULT_PATH


def load(path: str | None = None) -> State:
    """The state in ``path``; an empty state if the file does not exist."""
    p = state_path(path)
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return State()
    except OSError as e:
        raise StateError(f"cannot read state file {p}: {e.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise StateError(f"invalid state file {p}: {e.msg} at line {e.lineno}") from None
    try:
        return State.from_json(doc)
    except StateError as e:
        raise StateError(f"invalid state file {p}: {e}") from None


def save(state: State, path: str | None = None) -> None:
    """Validate and atomically replace ``path`` with ``state``."""
    state.check()
    write_json(state_path(path), state.to_json(), indent=2, prefix=".state.")


def write_json(path: str, doc: Any, indent: int, prefix: str) -> None:
    """Replace ``path`` with ``doc`` as JSON atomically: a temporary file (``prefix``) in
    the same directory, fsync, rename, fsync of the directory. A crash leaves the old
    file or the new one, never half of one."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=indent, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextlib.contextmanager
def locked(path: str | None = None) -> Iterator[State]:
    """Read-modify-write under an exclusive lock: the state yielded is saved on success."""
    p = state_path(path)
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    with open(p + ".lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        st = load(p)
        yield st
        save(st, p)


@contextlib.contextmanager
def shared_lock(path: str | None = None) -> Iterator[None]:
    """Hold the state lock shared: no :func:`locked` block of another process runs
    meanwhile, so what is read under it stays true until it is released."""
    p = state_path(path)
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    with open(p + ".lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_SH)
        yield


def file_stamp(path: str | None = None) -> tuple[int, int, int] | None:
    """(inode, mtime_ns, size) of the state file, to notice changes; None if absent."""
    try:
        s = os.stat(state_path(path))
    except FileNotFoundError:
        return None
    return (s.st_ino, s.st_mtime_ns, s.st_size)

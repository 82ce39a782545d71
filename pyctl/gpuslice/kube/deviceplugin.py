"""The kubelet device plugin (API v1beta1) of gpuslice, for clusters without DRA:
``gpuctl device-plugin --config PATH``.

Configuration (YAML)::

    profiles:
      - name: gpu-8gi       # resource gpuslice.dev/gpu-8gi
        memory: 8Gi         # video memory of each slot (8Gi, 8GiB or bytes)
        compute: 12%        # optional: a fixed share of the GPU for each slot
        gpus: [0, 1]        # optional: default, every GPU no other profile names
        slots: 4            # optional: at most this many slots per GPU
        capabilities: compute,utility   # optional: the slots' capability set (default: all)

A GPU belongs to at most one profile (and at most one profile may leave ``gpus`` out).
GPUs in no profile are advertised whole, one device each, as ``gpuslice.dev/gpu``.

Slots (:func:`plan_slots`): a profile's GPU has floor(GPU memory / memory) slots,
capped by floor(100% / compute) when ``compute`` is set, by ``slots`` when given and
by :data:`MAX_SLOTS_PER_GPU`. Device IDs are ``gpu<minor>-slot<n>`` (whole GPUs:
``gpu<minor>``), instance names ``dp-<profile>-<minor>-<n>`` (whole GPUs:
``dp-gpu-<minor>``; a profile name too long for the 31 characters of an instance name
is cut and given a hash of the full name), so both are the same after a restart.

Instances are static. At start, and again when the state file changed under us (or
every ``resync`` seconds, for a module that lost them) and they drifted, or while
something is pending, every slot's instance is made to exist (owner
``device-plugin``; memory = the profile's; a ``compute`` profile gets that fixed
share and its GPUs the ``fixed`` policy, otherwise weight 1 under the GPU's policy as
it is; a whole GPU gets all of its memory and weight 1). Reconciling keeps an
instance whose settings match its slot, and deletes (and re-makes) the others: ours
of slots that no longer exist or changed. The module refuses to delete an instance
whose nodes are open (a running container): such an instance is left as it is (and
stays in the CDI spec, as a restarted container of its pod still needs it), its slot,
if any, is advertised Unhealthy, and the deletion is tried again every ``retry``
seconds. An instance of a slot's name that is not ours is never touched (the slot is
Unhealthy); neither is a slot whose fixed share does not fit yet beside old instances
still in use. A reconcile that changes nothing does not rewrite the state file.
Stopping the plugin leaves the instances: pods keep running on them and
the next start reuses them.

One CDI spec, ``<cdi-dir>/gpuslice.dev-device-plugin.yaml`` (kind
``gpuslice.dev/gpu``), lists every instance the device plugin owns; it is removed
when there is none (CDI refuses a spec without devices).

The kubelet side, per resource: a gRPC server on
``<device-plugin-dir>/gpuslice-<name>.sock`` (``gpuslice-gpu.sock`` for whole GPUs),
registered by calling ``v1beta1.Registration/Register`` on ``kubelet.sock``
(GetPreferredAllocation and PreStartContainer not needed). ListAndWatch sends every
slot, Healthy or Unhealthy, and again after each change. The plugin polls
``kubelet.sock`` every second (NVIDIA's plugin uses fsnotify on it): when it is a new
socket (the kubelet restarted, and wiped the directory) or one of ours disappeared,
that server is restarted on a fresh socket and registered again. SIGTERM and SIGINT
stop the servers and remove their sockets.

Allocate: each container gets exactly one device of a resource, answered with the
CDI device ``gpuslice.dev/gpu=<instance>`` alone (no ``devices``, mounts or envs: the
CDI spec carries the nodes, the driver files and ``GPUSLICE_INSTANCE``); this needs
a kubelet that passes CDI devices to the runtime (DevicePluginCDIDevices, GA in 1.31)
and a runtime with CDI on (containerd 2, CRI-O; containerd 1.7 with
``enable_cdi``). A container asking for two or more devices of one resource is
refused (INVALID_ARGUMENT, "gpuslice.dev/gpu-8gi: one per container"): static slots
are separate instances and one container cannot be given one instance spanning them,
nor several instances (each puts its own nodes at /dev/nvidiactl and
/dev/nvidia-uvm; for the same reason a container should not ask for two gpuslice
resources either, which a device plugin cannot refuse: each is a separate Allocate).
That holds for whole GPUs too: a container needing several GPUs, or a size no profile has, uses
the DRA driver (``gpuctl kubelet-plugin``). An unknown device ID is INVALID_ARGUMENT,
an Unhealthy one FAILED_PRECONDITION; Allocate never creates or deletes anything.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from gpuslice.ops import cdi
from gpuslice import instances
from gpuslice import state as S
from gpuslice import units
from . import DRIVER, NODE_MODE
from gpuslice.netlink import CAPS_ALL, MAX_GPUS, parse_caps

log = logging.getLogger("gpuslice.kube.deviceplugin")

API_VERSION = "v1beta1"
DOMAIN = DRIVER
WHOLE = "gpu"  # the resource of whole GPUs: gpuslice.dev/gpu (a profile may not be called so)
WHOLE_RESOURCE = f"{DOMAIN}/{WHOLE}"
OWNER = "device-plugin"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
CDI_DIR = "/var/run/cdi"
KUBELET_SOCKET = "kubelet.sock"
SPEC_FILE = f"{DOMAIN}-device-plugin.yaml"
CDI_KIND = cdi.KIND
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # k8s.io/kubelet pkg/apis/deviceplugin/v1beta1 constants.go
MAX_SLOTS_PER_GPU = 64
INSTANCE_PREFIX = "dp-"
SPEC_HEAD = "# generated by `gpuctl device-plugin`; rewritten when it starts and reconciles\n"


class ConfigError(ValueError):
    """The configuration (or its fit to this node's GPUs) is wrong: one line."""


class GpuLike(Protocol):
    """What the plugin needs of an inventory.GpuInfo."""

    @property
    def minor(self) -> int: ...

    @property
    def memory(self) -> int: ...

    @property
    def pci_bus_id(self) -> str | None: ...


# ---- configuration ---------------------------------------------------------------------

# k8s.io/apimachinery validation IsQualifiedName, name part: at most 63 characters
_RESOURCE_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_TOP_KEYS = {"profiles"}
_PROFILE_KEYS = {"name", "memory", "compute", "gpus", "slots", "capabilities"}


@dataclass(frozen=True)
class Profile:
    name: str
    memory: int  # bytes per slot
    compute: float | None = None  # fixed share of each slot, a fraction; None: the GPU's policy decides
    gpus: tuple[int, ...] | None = None  # None: every GPU no other profile names
    slots: int | None = None  # at most this many slots per GPU
    caps: int | None = None  # the slots' capability set (netlink.CAPS bits); None: all

    @property
    def resource(self) -> str:
        return f"{DOMAIN}/{self.name}"


@dataclass(frozen=True)
class Config:
    profiles: tuple[Profile, ...] = ()


def parse_memory(v: Any) -> int:
    """A slot's memory: a Kubernetes quantity (``8Gi``), a gpuctl size (``8GiB``) or
    bytes (an integer)."""
    from .capacity import parse_quantity

    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ValueError(f"not a size: {v!r} (use e.g. 8Gi)")
    try:
        n = parse_quantity(v)
    except ValueError:
        if not isinstance(v, str):
            raise
        try:
            n = units.parse_size(v)
        except ValueError:
            raise ValueError(f"not a size: {v!r} (use e.g. 8Gi, 512Mi or bytes)") from None
    if n <= 0:
        raise ValueError(f"size must be positive: {v!r}")
    return n


def _compute(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise ValueError(f"not a share: {v!r} (use e.g. 12%)")
    share = units.parse_share(str(v))
    if units.share_to_ppt(share) < 1:
        raise ValueError(f"share too small: {v!r} (at least 0.01%)")
    return share


def load_config(text: str) -> Config:
    """Parse and check a configuration (YAML). Raises ConfigError (one line). What
    depends on the GPUs (memory above a GPU's, a GPU that is not there) is checked by
    :func:`plan_slots`."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config is not YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("config: the top level must be a mapping with 'profiles'")
    unknown = sorted(map(str, set(doc) - _TOP_KEYS))
    if unknown:
        raise ConfigError(f"config: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    raw = doc.get("profiles") or []
    if not isinstance(raw, list):
        raise ConfigError("config: 'profiles' must be a list")
    profiles: list[Profile] = []
    for i, p in enumerate(raw):
        profiles.append(_profile(i, p))
    names = [p.name for p in profiles]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"profile {n}: the name is used twice")
    owner: dict[int, str] = {}
    for p in profiles:
        for g in p.gpus or ():
            if g in owner:
                raise ConfigError(f"GPU {g} is in two profiles: {owner[g]} and {p.name}")
            owner[g] = p.name
    rest = [p.name for p in profiles if p.gpus is None]
    if len(rest) > 1:
        raise ConfigError(f"profiles {rest[0]} and {rest[1]} both take every other GPU "
                          "(give 'gpus' to all of them but one)")
    return Config(tuple(profiles))


def _profile(i: int, p: Any) -> Profile:
    if not isinstance(p, dict):
        raise ConfigError(f"profiles[{i}]: must be a mapping (name, memory, ...)")
    name = p.get("name")
    where = f"profile {name}" if isinstance(name, str) and name else f"profiles[{i}]"
    unknown = sorted(map(str, set(p) - _PROFILE_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_PROFILE_KEYS))})")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: 'name' is missing")
    if len(name) > 63 or not _RESOURCE_NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: {DOMAIN}/{name} is not a valid extended resource name (at most 63 of "
                          "A-Z a-z 0-9 - _ ., starting and ending with a letter or digit)")
    if name == WHOLE:
        raise ConfigError(f"{where}: {WHOLE_RESOURCE} is the resource of whole GPUs (choose another name)")
    if "memory" not in p:
        raise ConfigError(f"{where}: 'memory' is missing")
    try:
        memory = parse_memory(p["memory"])
    except ValueError as e:
        raise ConfigError(f"{where}: memory: {e}") from None
    compute = None
    if p.get("compute") is not None:
        try:
            compute = _compute(p["compute"])
        except ValueError as e:
            raise ConfigError(f"{where}: compute: {e}") from None
    gpus = None
    if "gpus" in p:
        g = p["gpus"]
        if isinstance(g, int) and not isinstance(g, bool):
            g = [g]
        if (not isinstance(g, list) or not g or not all(isinstance(x, int) and not isinstance(x, bool) for x in g)
                or len(set(g)) != len(g) or not all(0 <= x < MAX_GPUS for x in g)):
            raise ConfigError(f"{where}: gpus must be a list of distinct GPU numbers 0..{MAX_GPUS - 1}")
        gpus = tuple(sorted(g))
    slots = None
    if p.get("slots") is not None:
        s = p["slots"]
        if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= MAX_SLOTS_PER_GPU:
            raise ConfigError(f"{where}: slots must be a number 1..{MAX_SLOTS_PER_GPU}")
        slots = s
        if compute is not None and s * units.share_to_ppt(compute) > 10000:
            raise ConfigError(f"{where}: {s} slots of {units.format_share(compute)} sum to "
                              f"{units.format_share(s * units.share_to_ppt(compute) / 10000)} of a GPU (> 100%)")
    caps = None
    if p.get("capabilities") is not None:
        c = p["capabilities"]
        if not isinstance(c, str):
            raise ConfigError(f"{where}: capabilities must be a string such as \"compute,utility\"")
        try:
            caps = parse_caps(c)
        except ValueError as e:
            raise ConfigError(f"{where}: capabilities: {e}") from None
    return Profile(name, memory, compute, gpus, slots, None if caps == CAPS_ALL else caps)


def read_config(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the config {path}: {e.strerror or e}") from None
    try:
        return load_config(text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# ---- slots -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """One advertised device: an instance on one GPU."""
    resource: str  # gpuslice.dev/<profile>, or gpuslice.dev/gpu
    device_id: str  # gpu0-slot3, or gpu0
    instance: str  # dp-gpu-8gi-0-3, or dp-gpu-0
    gpu: int
    memory: int  # bytes
    share: float | None  # fixed share; None: the GPU's policy (weight 1)
    numa_node: int | None = None
    caps: int | None = None  # capability set; None: all

    def wanted(self) -> S.Instance:
        return S.Instance(self.instance, [self.gpu], self.memory, weight=1, share=self.share, owner=OWNER,
                          caps=self.caps)


def instance_name(profile: str, gpu: int, slot: int) -> str:
    """``dp-<profile>-<gpu>-<slot>``, at most 31 characters: a long profile name is
    cut and followed by 6 hex digits of its SHA-256 (deterministic)."""
    tail = f"-{gpu}-{slot}"
    room = 31 - len(INSTANCE_PREFIX) - len(tail)
    if len(profile) <= room:
        return f"{INSTANCE_PREFIX}{profile}{tail}"
    digest = hashlib.sha256(profile.encode()).hexdigest()[:6]
    return f"{INSTANCE_PREFIX}{profile[:room - 7]}-{digest}{tail}"


def slot_count(profile: Profile, gpu_memory: int) -> int:
    n = min(gpu_memory // profile.memory, MAX_SLOTS_PER_GPU)
    if profile.compute is not None:
        n = min(n, 10000 // units.share_to_ppt(profile.compute))
    if profile.slots is not None:
        n = min(n, profile.slots)
    return n


def plan_slots(config: Config, gpus: Sequence[GpuLike],
               numa: Callable[[str | None], int | None] = lambda _b: None) -> dict[str, list[Slot]]:
    """Every slot, by resource name (sorted; resources without a slot left out).
    Raises ConfigError when a profile names a GPU that is not there or asks for more
    memory than its GPU has."""
    by_minor = {g.minor: g for g in gpus}
    taken = {m for p in config.profiles for m in (p.gpus or ())}
    out: dict[str, list[Slot]] = {}
    for p in config.profiles:
        minors = p.gpus if p.gpus is not None else tuple(sorted(set(by_minor) - taken))
        slots: list[Slot] = []
        for m in minors:
            g = by_minor.get(m)
            if g is None:
                raise ConfigError(f"profile {p.name}: GPU {m} is not on this node "
                                  f"(GPUs: {', '.join(map(str, sorted(by_minor))) or 'none'})")
            if p.memory > g.memory:
                raise ConfigError(f"profile {p.name}: memory {units.format_size(p.memory)} is more than GPU {m} "
                                  f"has ({units.format_size(g.memory)})")
            node = numa(g.pci_bus_id)
            slots += [Slot(p.resource, f"gpu{m}-slot{i}", instance_name(p.name, m, i), m, p.memory, p.compute, node,
                           p.caps) for i in range(slot_count(p, g.memory))]
        if slots:
            out[p.resource] = slots
    profiled = taken | {m for p in config.profiles if p.gpus is None for m in by_minor}
    whole = [Slot(WHOLE_RESOURCE, f"gpu{m}", f"{INSTANCE_PREFIX}{WHOLE}-{m}", m, by_minor[m].memory, None,
                  numa(by_minor[m].pci_bus_id))
             for m in sorted(set(by_minor) - profiled)]
    if whole:
        out[WHOLE_RESOURCE] = whole
    names = [s.instance for ss in out.values() for s in ss]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"two slots would be instance {dup}: rename a profile")
    return dict(sorted(out.items()))


def sysfs_numa_node(pci_bus_id: str | None, root: str = "/sys/bus/pci/devices") -> int | None:
    """The GPU's NUMA node from sysfs (None: unknown, or a machine with one node)."""
    if not pci_bus_id:
        return None
    try:
        with open(os.path.join(root, pci_bus_id.lower(), "numa_node")) as f:
            n = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return n if n >= 0 else None


def socket_name(resource: str) -> str:
    return f"gpuslice-{resource.split('/', 1)[1]}.sock"


# ---- reconciling instances -------------------------------------------------------------

@dataclass
class Outcome:
    """What a reconcile left: healthy instance names, and why the others are not."""
    healthy: set[str] = field(default_factory=set)
    problems: dict[str, str] = field(default_factory=dict)  # instance -> reason
    lingering: list[str] = field(default_factory=list)  # ours, of no slot, not deletable yet

    @property
    def pending(self) -> bool:
        return bool(self.problems or self.lingering)


def _caps(caps: int | None) -> int:
    return CAPS_ALL if caps is None else caps


def _matches(have: S.Instance, want: S.Instance) -> bool:
    return (have.owner == OWNER and have.gpus == want.gpus and have.memory == want.memory
            and have.weight == want.weight and have.gpu_memory is None and have.ceiling is None
            and have.priority == want.priority and have.min_share is None
            and _caps(have.caps) == _caps(want.caps)
            and (have.share is None) == (want.share is None)
            and (have.share is None or want.share is None
                 or units.share_to_ppt(have.share) == units.share_to_ppt(want.share)))


def reconcile(st: S.State, slots: Sequence[Slot], nl: Any) -> Outcome:
    """Make ``st`` (and the module, with ``nl``) hold one instance per slot: see the
    module's docstring. The caller holds the state lock and saves ``st``."""
    out = Outcome()
    want = {s.instance: s for s in slots}
    in_kernel: set[str] | None = None
    if nl is not None:
        in_kernel = {d["name"] for d in nl.instances() if "name" in d}
    for name, inst in sorted(st.instances.items()):
        if inst.owner != OWNER:
            continue
        s = want.get(name)
        if s is not None and _matches(inst, s.wanted()) and (in_kernel is None or name in in_kernel):
            continue
        try:
            instances.remove(st, name, nl)
            log.info("deleted instance %s (%s)", name, "changed" if s is not None else "no slot any more")
        except instances.InstanceError as e:
            if s is not None:
                out.problems[name] = f"the old instance is still in use: {e}"
            else:
                out.lingering.append(name)
            log.warning("instance %s left as it is, retried later: %s", name, e)
    for name, s in sorted(want.items()):
        have = st.instances.get(name)
        if have is not None:
            if have.owner != OWNER:
                out.problems[name] = f"instance {name} exists and is not the device plugin's"
            elif name not in out.problems:
                if s.share is not None and st.policy_of(s.gpu).policy != "fixed":
                    old = st.gpus.get(s.gpu)
                    st.gpus[s.gpu] = S.GpuPolicy("fixed", st.policy_of(s.gpu).period_ns)
                    try:
                        st.check()
                    except S.StateError as e:
                        _restore_policy(st, s.gpu, old)
                        out.problems[name] = f"GPU {s.gpu} cannot take the fixed policy: {e}"
                        continue
                out.healthy.add(name)
            continue
        try:
            if in_kernel is not None and name in in_kernel:  # in the module, not in the state file
                try:
                    nl.instance_del(name)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise instances.InstanceError(f"a module instance {name} is in use: {e}") from None
            instances.add(st, s.wanted(), nl, policy="fixed" if s.share is not None else None, mode=NODE_MODE)
            out.healthy.add(name)
            log.info("created instance %s: GPU %d, %s%s", name, s.gpu, units.format_size(s.memory),
                     f", fixed {units.format_share(s.share)}" if s.share is not None else "")
        except (instances.InstanceError, S.StateError, OSError) as e:
            out.problems[name] = str(e)
            log.warning("instance %s not created: %s", name, e)
    return out


def drifted(st: S.State, slots: Sequence[Slot], in_kernel: set[str] | None) -> bool:
    """Would :func:`reconcile` change anything (read only: a state file changed by
    someone else is rewritten only when it touched the plugin's instances)?"""
    want = {s.instance: s for s in slots}
    for name, inst in st.instances.items():
        if inst.owner == OWNER and name not in want:
            return True
    for name, s in want.items():
        have = st.instances.get(name)
        if have is None or not _matches(have, s.wanted()):
            return True
        if in_kernel is not None and name not in in_kernel:
            return True
        if s.share is not None and st.policy_of(s.gpu).policy != "fixed":
            return True
    return False


def _restore_policy(st: S.State, gpu: int, old: S.GpuPolicy | None) -> None:
    if old is None:
        st.gpus.pop(gpu, None)
    else:
        st.gpus[gpu] = old


def build_cdi_spec(st: S.State, files: Sequence[str], nvidia_ctk: str | None) -> dict[str, Any]:
    """The plugin's CDI spec: every instance it owns in ``st``."""
    insts = [cdi.Instance(i.name, tuple(i.gpus), i.caps) for i in sorted(st.instances.values(), key=lambda i: i.name)
             if i.owner == OWNER]
    spec = cdi.build_spec(insts, files, nvidia_ctk, kind=CDI_KIND)
    errs = cdi.check_spec(spec)
    if errs:
        raise ConfigError(f"CDI spec not written: {errs[0]}")
    return spec


def write_cdi_spec(path: str, spec: Mapping[str, Any]) -> None:
    if not cdi.is_ours(path):
        raise ConfigError(f"{path} is not a CDI spec of kind {CDI_KIND}: left as it is")
    if not spec["devices"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    text = cdi.render(spec)
    first, _nl, rest = text.partition("\n")
    if first.startswith("#"):
        text = SPEC_HEAD + rest
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return  # as it is: runtimes watching the directory need not reload it
    cdi.write_spec(path, text)


# ---- gRPC: one server per resource -----------------------------------------------------

def _grpc() -> tuple[Any, Any, Any]:
    import grpc

    from .gen import deviceplugin_v1beta1_pb2 as pb
    from .gen import deviceplugin_v1beta1_pb2_grpc as pbg
    return grpc, pb, pbg


class Resource:
    """One resource: its slots, their health, its gRPC server and registration."""

    def __init__(self, name: str, slots: Sequence[Slot], plugin_dir: str) -> None:
        self.name = name
        self.slots = {s.device_id: s for s in slots}
        self.socket = os.path.join(plugin_dir, socket_name(name))
        self.health = {s.device_id: False for s in slots}
        self.version = 0
        self.cond = threading.Condition()
        self.stopping = False
        self.server: Any = None
        self.socket_id: tuple[int, int] | None = None
        self.registered_with: tuple[int, int, int] | None = None  # kubelet.sock identity

    def set_health(self, healthy: Mapping[str, bool]) -> bool:
        with self.cond:
            new = {d: bool(healthy.get(d, False)) for d in self.slots}
            if new == self.health:
                return False
            self.health = new
            self.version += 1
            self.cond.notify_all()
            return True

    def devices(self, pb: Any) -> list[Any]:
        out = []
        for d, s in sorted(self.slots.items(), key=lambda kv: (kv[1].gpu, len(kv[0]), kv[0])):
            dev = pb.Device(ID=d, health=HEALTHY if self.health[d] else UNHEALTHY)
            if s.numa_node is not None:
                dev.topology.nodes.add(ID=s.numa_node)
            out.append(dev)
        return out

    def allocate(self, ids: Sequence[str]) -> tuple[str | None, str, Slot | None]:
        """(error code name, message, slot) for one container's device IDs."""
        for d in ids:
            if d not in self.slots:
                return "INVALID_ARGUMENT", f"{self.name}: unknown device ID {d!r}", None
        if len(ids) != 1:
            return ("INVALID_ARGUMENT", f"{self.name}: one per container (asked for {len(ids)}; a container needing "
                    "several uses the DRA driver)", None)
        with self.cond:
            ok = self.health[ids[0]]
        if not ok:
            return "FAILED_PRECONDITION", f"{self.name}: device {ids[0]} is unhealthy", None
        return None, "", self.slots[ids[0]]


def _servicer(res: Resource) -> Any:
    grpc, pb, pbg = _grpc()

    class Servicer(pbg.DevicePluginServicer):  # type: ignore[misc, name-defined]
        def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
            return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

        def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
            seen = -1
            while True:
                with res.cond:
                    while res.version == seen and not res.stopping and context.is_active():
                        res.cond.wait(0.5)
                    if res.stopping or not context.is_active():
                        return
                    seen = res.version
                    devs = res.devices(pb)
                yield pb.ListAndWatchResponse(devices=devs)

        def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
            # not announced (get_preferred_allocation_available false); answer the
            # must-include devices topped up in ID order, which is what the kubelet does
            resp = pb.PreferredAllocationResponse()
            for c in request.container_requests:
                pick = list(c.must_include_deviceIDs)
                for d in sorted(c.available_deviceIDs):
                    if len(pick) >= c.allocation_size:
                        break
                    if d not in pick:
                        pick.append(d)
                resp.container_responses.add(deviceIDs=pick)
            return resp

        def Allocate(self, request: Any, context: Any) -> Any:
            resp = pb.AllocateResponse()
            for c in request.container_requests:
                code, msg, slot = res.allocate(list(c.devices_ids))
                if code is not None or slot is None:
                    log.warning("allocate %s: %s", list(c.devices_ids), msg)
                    context.abort(getattr(grpc.StatusCode, code or "INTERNAL"), msg)
                    raise AssertionError("unreachable")  # abort raises
                resp.container_responses.add(cdi_devices=[pb.CDIDevice(name=f"{CDI_KIND}={slot.instance}")])
            log.info("allocate %s", ", ".join(cr.cdi_devices[0].name for cr in resp.container_responses))
            return resp

        def PreStartContainer(self, request: Any, context: Any) -> Any:
            return pb.PreStartContainerResponse()

    return Servicer()


def _ident(path: str) -> tuple[int, int, int] | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return (s.st_dev, s.st_ino, s.st_ctime_ns)


class _Unchanged(Exception):
    """Leaves S.locked without saving."""


class DevicePlugin:
    """The whole plugin: reconciled instances, CDI spec, one server per resource,
    registration with the kubelet. ``nl`` is the module's netlink client or None
    (state file only). :meth:`run` until ``stop`` is set; or :meth:`start`,
    :meth:`tick` and :meth:`stop`."""

    def __init__(self, slots: Mapping[str, Sequence[Slot]], state_path: str, nl: Any,
                 plugin_dir: str = DEVICE_PLUGIN_DIR, cdi_dir: str = CDI_DIR,
                 driver_files: Sequence[str] = (), nvidia_ctk: str | None = None,
                 poll: float = 1.0, retry: float = 10.0, resync: float = 60.0) -> None:
        self.state_path = state_path
        self.nl = nl
        self.plugin_dir = plugin_dir
        self.cdi_path = os.path.join(cdi_dir, SPEC_FILE)
        self.kubelet_socket = os.path.join(plugin_dir, KUBELET_SOCKET)
        self.driver_files = list(driver_files)
        self.nvidia_ctk = nvidia_ctk
        self.poll = poll
        self.retry = retry
        self.resync = resync
        self.resources = {name: Resource(name, ss, plugin_dir) for name, ss in sorted(slots.items())}
        self.all_slots = [s for ss in slots.values() for s in ss]
        self.outcome = Outcome()
        self.lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._last_reconcile = 0.0
        self._last_check = 0.0
        self._clock: Callable[[], float] = time.monotonic

    # ---- instances --------------------------------------------------------------------

    def reconcile(self) -> Outcome:
        """Reconcile the instances, rewrite the CDI spec, update health."""
        with self.lock:
            try:
                with S.locked(self.state_path) as st:
                    before = st.to_json()
                    out = reconcile(st, self.all_slots, self.nl)
                    if st.to_json() == before:
                        raise _Unchanged  # not saved: a rewrite would wake every reader of the file
            except _Unchanged:
                pass
            spec = build_cdi_spec(st, self.driver_files, self.nvidia_ctk)
            self._stamp = S.file_stamp(self.state_path)
            self._last_reconcile = self._clock()
            try:
                write_cdi_spec(self.cdi_path, spec)
            except (OSError, ConfigError) as e:
                err = str(e) if isinstance(e, ConfigError) else f"CDI spec {self.cdi_path}: {e.strerror or e}"
                log.error("%s", err)
                out.problems.update({n: err for n in out.healthy})
                out.healthy = set()
            self.outcome = out
            for res in self.resources.values():
                if res.set_health({d: s.instance in out.healthy for d, s in res.slots.items()}):
                    log.info("%s: %d of %d healthy", res.name, sum(res.health.values()), len(res.slots))
            return out

    def _reconcile_due(self) -> bool:
        """Pending work whose retry is due; or the state file changed (or ``resync``
        passed: the module may have lost instances) and the instances drifted."""
        now = self._clock()
        if self.outcome.pending and now - self._last_reconcile >= self.retry:
            return True
        stamp = S.file_stamp(self.state_path)
        if stamp == self._stamp and now - self._last_check < self.resync:
            return False
        self._last_check = now
        in_kernel = None
        if self.nl is not None:
            in_kernel = {d["name"] for d in self.nl.instances() if "name" in d}
        if drifted(S.load(self.state_path), self.all_slots, in_kernel):
            return True
        self._stamp = stamp
        return False

    # ---- servers ----------------------------------------------------------------------

    def _serve(self, res: Resource) -> None:
        grpc, _pb, pbg = _grpc()
        self._stop_server(res)
        os.makedirs(self.plugin_dir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(res.socket)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="dp"))
        pbg.add_DevicePluginServicer_to_server(_servicer(res), server)
        server.add_insecure_port("unix:" + res.socket)
        server.start()
        st = os.stat(res.socket)
        res.server, res.socket_id = server, (st.st_dev, st.st_ino)
        res.registered_with = None
        log.info("%s: serving on %s", res.name, res.socket)

    def _stop_server(self, res: Resource) -> None:
        if res.server is None:
            return
        res.server.stop(grace=None)
        res.server = None
        try:
            st = os.stat(res.socket)
            if (st.st_dev, st.st_ino) == res.socket_id:
                os.unlink(res.socket)
        except FileNotFoundError:
            pass
        res.socket_id = None

    def _socket_gone(self, res: Resource) -> bool:
        try:
            st = os.stat(res.socket)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != res.socket_id

    def _register(self, res: Resource, kubelet: tuple[int, int, int]) -> None:
        grpc, pb, pbg = _grpc()
        req = pb.RegisterRequest(version=API_VERSION, endpoint=os.path.basename(res.socket), resource_name=res.name,
                                 options=pb.DevicePluginOptions(pre_start_required=False,
                                                                get_preferred_allocation_available=False))
        with grpc.insecure_channel("unix:" + self.kubelet_socket) as ch:
            pbg.RegistrationStub(ch).Register(req, timeout=5)
        res.registered_with = kubelet
        log.info("%s: registered with the kubelet", res.name)

    def start(self) -> None:
        """Reconcile, serve every resource and register (a kubelet that is not there
        yet is registered with by :meth:`tick`)."""
        self.reconcile()
        for res in self.resources.values():
            self._serve(res)
        self.tick()

    def tick(self) -> None:
        """One poll: reconcile when due; restart a server whose socket went or whose
        kubelet restarted; register where not registered with the current kubelet."""
        grpc, _pb, _pbg = _grpc()
        try:
            if self._reconcile_due():
                self.reconcile()
        except (S.StateError, OSError, ConfigError) as e:
            log.error("reconcile failed (retrying): %s", e)
            self._last_reconcile = self._clock()
            self.outcome.problems.setdefault("", str(e))  # pending: retried after ``retry``
        kubelet = _ident(self.kubelet_socket)
        for res in self.resources.values():
            if res.stopping:
                continue
            restarted = res.registered_with is not None and kubelet is not None and res.registered_with != kubelet
            if self._socket_gone(res) or restarted:
                log.info("%s: %s; restarting the server", res.name,
                         "the kubelet restarted" if restarted else "socket removed")
                self._serve(res)
            if kubelet is not None and res.registered_with != kubelet:
                try:
                    self._register(res, kubelet)
                except grpc.RpcError as e:
                    log.warning("%s: registration failed (retrying): %s", res.name,
                                getattr(e, "details", lambda: str(e))() or e)

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            while not stop.wait(self.poll):
                self.tick()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop every server and remove its socket; the instances stay."""
        for res in self.resources.values():
            with res.cond:
                res.stopping = True
                res.cond.notify_all()
            self._stop_server(res)
        log.info("stopped")


def discover_gpus(source: str) -> list[Any]:
    """The node's GPUs (inventory.discover); a separate function so that tests can
    replace it."""
    from .inventory import discover

    return list(discover(source))

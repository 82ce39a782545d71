"""ResourceSlices of the gpuslice.dev DRA driver: building them (pure) and publishing them.

One pool per node, named after the node, with one device per GPU (``gpu-<minor>``).
A GPU is advertised either whole (``shared=False``) or shareable: with
``allowMultipleAllocations: true`` and a ``requestPolicy`` on its ``memory`` (bytes) and
``compute`` (percent) capacities, so that the scheduler hands out parts of it
(consumable capacity, KEP-5075, feature gate DRAConsumableCapacity).

API shapes follow Kubernetes upstream:

* types: kubernetes/api ``resource/v1/types.go`` and ``resource/v1beta1/types.go`` at tag
  v0.36.3 (= Kubernetes v1.36.3): ResourceSliceMaxDevices = 128 (64 with taints,
  counters or list attributes, none of which we use),
  ResourceSliceMaxAttributesAndCapacitiesPerDevice = 32, DeviceAttributeMaxValueLength =
  64, version attributes semver 2.0.0; v1beta1 nests a device's fields under ``basic``
  (BasicDevice), v1beta2 has the v1 layout;
* the standard attribute ``resource.kubernetes.io/pciBusID`` (extended BDF string):
  kubernetes/dynamic-resource-allocation ``deviceattribute/attribute.go`` at v0.36.2
  (StandardDeviceAttributePCIBusID);
* what the API server drops when DRAConsumableCapacity is off: kubernetes/kubernetes
  ``pkg/registry/resource/resourceslice/strategy.go`` dropDisabledDRAConsumableCapacityFields
  (every device's ``allowMultipleAllocations`` and every capacity's ``requestPolicy``,
  unless the stored slice already used them); request-policy validation:
  ``pkg/apis/resource/validation/validation.go`` validateRequestPolicyRange (the default
  must lie on the ``min + n*step`` grid, ``min + step`` within the capacity).

Pool generation: whenever anything in the pool changes, the generation goes up and every
slice of the pool is rewritten with it (the scheduler only trusts the slices of the
newest generation, resource/v1 ResourcePool.Generation). Unchanged slices are
recognised by a hash of what we wrote (annotation ``gpuslice.dev/spec-hash``), which is
immune to the server rewriting quantities in canonical form.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from . import DRIVER
from . import capacity as C
from .inventory import GpuInfo

if TYPE_CHECKING:  # apiclient imports this module for the version conversion
    from .apiclient import ApiClient

__all__ = [
    "API_GROUP",
    "ATTR_PCI_BUS_ID",
    "COMPUTE_FULL",
    "COMPUTE_POLICY",
    "DRIVER",
    "LABEL_DRIVER",
    "LABEL_NODE",
    "ANNOTATION_HASH",
    "MAX_DEVICES_PER_SLICE",
    "PublishResult",
    "SliceError",
    "SlicePublisher",
    "build_slices",
    "consumable_fields_present",
    "device_name",
    "effective_memory_policy",
    "from_version",
    "semver",
    "spec_hash",
    "to_version",
]

log = logging.getLogger(__name__)

API_GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first

MAX_DEVICES_PER_SLICE = 128  # resource/v1 ResourceSliceMaxDevices
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ATTRIBUTE_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

LABEL_DRIVER = "gpuslice.dev/driver"
LABEL_NODE = "gpuslice.dev/node"
ANNOTATION_HASH = "gpuslice.dev/spec-hash"

COMPUTE_FULL = 100  # the compute capacity of one GPU, in percent
COMPUTE_POLICY = C.RequestPolicy(default=COMPUTE_FULL, valid_range=C.ValidRange(min=1, step=1))
DEFAULT_MEMORY_POLICY = C.RequestPolicy(valid_range=C.ValidRange(min=1 << 20, step=1 << 20))

_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SEMVER_LOOSE_RE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


class SliceError(ValueError):
    """The slices cannot be built as asked (one-line message)."""


# ---- pure building ------------------------------------------------------------------

def device_name(minor: int) -> str:
    """The device of GPU ``minor`` in our pool: ``gpu-<minor>`` (a DNS label)."""
    return f"gpu-{minor}"


def semver(version: str | None) -> str | None:
    """``"9.0"`` -> ``"9.0.0"``, ``"580.95.05"`` -> ``"580.95.5"``: a version attribute
    value (semver 2.0.0 forbids leading zeros; NVIDIA's own DRA driver normalises the
    same way), or None when it is not one to two dots of numbers."""
    if not version:
        return None
    m = _SEMVER_LOOSE_RE.match(version.strip())
    if not m:
        return None
    return ".".join(str(int(p or "0")) for p in m.groups())


def _version_or_string(value: str) -> dict[str, str]:
    v = semver(value)
    return {"version": v} if v is not None else {"string": value[:MAX_ATTRIBUTE_VALUE_LENGTH]}


def effective_memory_policy(memory: int, policy: C.RequestPolicy | None = None) -> C.RequestPolicy:
    """The memory request policy a shared GPU of ``memory`` bytes is published with.

    ``policy`` (default: 1 MiB steps from 1 MiB) with ``default`` None means "the whole
    GPU": the largest amount the policy allows within ``memory`` (on the ``min + n*step``
    grid, the API server refuses a default off it). Raises :class:`SliceError` when the
    API server would refuse the policy (capacity.validate_policy)."""
    policy = policy or DEFAULT_MEMORY_POLICY
    default = policy.default
    if default is None:
        rng, values = policy.valid_range, policy.valid_values
        if rng is not None:
            if rng.min > memory:
                raise SliceError(f"memory policy min {C.format_quantity(rng.min)} exceeds the GPU's "
                                 f"{C.format_quantity(memory)}")
            top = memory if rng.max is None else min(memory, rng.max)
            default = top if not rng.step else rng.min + (top - rng.min) // rng.step * rng.step
        elif values is not None:
            fitting = [v for v in values if v <= memory]
            if not fitting:
                raise SliceError(f"no memory policy value fits the GPU's {C.format_quantity(memory)}")
            default = max(fitting)
        else:
            default = memory
        policy = C.RequestPolicy(default=default, valid_values=policy.valid_values, valid_range=policy.valid_range)
    errs = C.validate_policy(policy, memory)
    if errs:
        raise SliceError(f"memory request policy refused for a GPU of {C.format_quantity(memory)}: {errs[0]}")
    return policy


def _device(gpu: GpuInfo, shared: bool, memory_policy: C.RequestPolicy | None) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.minor},
    }
    if gpu.name:
        attrs["productName"] = {"string": gpu.name[:MAX_ATTRIBUTE_VALUE_LENGTH]}
    if gpu.compute_capability:
        attrs["computeCapability"] = _version_or_string(gpu.compute_capability)
    if gpu.driver_version:
        attrs["driverVersion"] = _version_or_string(gpu.driver_version)
    if gpu.pci_bus_id:
        attrs[ATTR_PCI_BUS_ID] = {"string": gpu.pci_bus_id}
    mem: dict[str, Any] = {"value": C.format_quantity(gpu.memory)}
    comp: dict[str, Any] = {"value": C.format_quantity(COMPUTE_FULL)}
    dev: dict[str, Any] = {"name": device_name(gpu.minor), "attributes": attrs,
                           "capacity": {"memory": mem, "compute": comp}}
    if shared:
        dev["allowMultipleAllocations"] = True
        mem["requestPolicy"] = effective_memory_policy(gpu.memory, memory_policy).to_api()
        comp["requestPolicy"] = COMPUTE_POLICY.to_api()
    return dev


def spec_hash(obj: Mapping[str, Any]) -> str:
    """What identifies a slice's content, except its pool generation: the spec, labels and
    owners, hashed (16 hex digits)."""
    spec = copy.deepcopy(dict(obj.get("spec") or {}))
    spec.get("pool", {}).pop("generation", None)
    meta = obj.get("metadata") or {}
    what = {"spec": spec, "labels": meta.get("labels") or {}, "owners": meta.get("ownerReferences") or []}
    return hashlib.sha256(json.dumps(what, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def build_slices(node: str, gpus: Iterable[GpuInfo], generation: int, *, shared: bool,
                 memory_policy: C.RequestPolicy | None = None,
                 max_devices_per_slice: int = MAX_DEVICES_PER_SLICE,
                 driver: str = DRIVER, node_uid: str | None = None) -> list[dict[str, Any]]:
    """The ResourceSlices (resource.k8s.io/v1 layout, plain dicts) of ``node``'s pool.

    One device per GPU (minor order), at most ``max_devices_per_slice`` (<= 128) per
    slice; the pool is named after the node and every slice carries ``generation`` and
    the slice count. ``shared``: consumable capacity (see the module docstring) with
    ``memory_policy`` (None: 1 MiB steps) whose ``default`` None means the whole GPU.
    ``node_uid``: an owner reference to the Node, so that the slices go with it.
    No GPUs: no slices. Raises :class:`SliceError`."""
    if not 1 <= max_devices_per_slice <= MAX_DEVICES_PER_SLICE:
        raise SliceError(f"max_devices_per_slice must be 1..{MAX_DEVICES_PER_SLICE}, not {max_devices_per_slice}")
    if generation < 0:
        raise SliceError(f"pool generation must not be negative: {generation}")
    if not node:
        raise SliceError("node name is empty")
    ordered = sorted(gpus, key=lambda g: g.minor)
    minors = [g.minor for g in ordered]
    if len(set(minors)) != len(minors):
        raise SliceError(f"duplicate GPU minors: {minors}")
    devices = [_device(g, shared, memory_policy) for g in ordered]
    chunks = [devices[i:i + max_devices_per_slice] for i in range(0, len(devices), max_devices_per_slice)]
    labels = {LABEL_DRIVER: driver}
    if _LABEL_VALUE_RE.match(node) and len(node) <= 63:
        labels[LABEL_NODE] = node
    out = []
    for chunk in chunks:
        meta: dict[str, Any] = {"generateName": f"{node}-{driver}-", "labels": dict(labels)}
        if node_uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                        "controller": True}]
        obj: dict[str, Any] = {
            "apiVersion": f"{API_GROUP}/v1",
            "kind": "ResourceSlice",
            "metadata": meta,
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        }
        meta["annotations"] = {ANNOTATION_HASH: spec_hash(obj)}
        out.append(obj)
    return out


# ---- versions -----------------------------------------------------------------------

_V1BETA1_DEVICE_TOP = ("name",)  # v1beta1 Device: name, and basic (BasicDevice) for the rest


def to_version(slice_: Mapping[str, Any], api_version: str) -> dict[str, Any]:
    """A v1-layout slice in the layout of ``api_version`` (``v1``, ``v1beta2``,
    ``v1beta1``; ``resource.k8s.io/`` optional): v1 and v1beta2 are the same layout;
    v1beta1 nests each device's fields but its name under ``basic``."""
    version = api_version.rsplit("/", 1)[-1]
    if version not in VERSIONS:
        raise SliceError(f"unsupported resource.k8s.io version {api_version!r}")
    out = copy.deepcopy(dict(slice_))
    out["apiVersion"] = f"{API_GROUP}/{version}"
    if version == "v1beta1":
        spec = out.get("spec") or {}
        if "devices" in spec:
            spec["devices"] = [
                {**{k: d[k] for k in _V1BETA1_DEVICE_TOP if k in d},
                 "basic": {k: v for k, v in d.items() if k not in _V1BETA1_DEVICE_TOP}}
                for d in spec["devices"]
            ]
    return out


def from_version(slice_: Mapping[str, Any]) -> dict[str, Any]:
    """A slice as the server sent it (any of our versions) in the v1 layout."""
    out = copy.deepcopy(dict(slice_))
    version = str(out.get("apiVersion", "")).rsplit("/", 1)[-1]
    if version == "v1beta1":
        spec = out.get("spec") or {}
        devs = []
        for d in spec.get("devices") or []:
            flat = {k: v for k, v in d.items() if k != "basic"}
            flat.update(d.get("basic") or {})
            devs.append(flat)
        if "devices" in spec:
            spec["devices"] = devs
    out["apiVersion"] = f"{API_GROUP}/v1"
    return out


def consumable_fields_present(slice_: Mapping[str, Any]) -> bool:
    """Does every device of this (v1-layout) slice keep ``allowMultipleAllocations`` and
    every capacity its ``requestPolicy``? False when the API server dropped them."""
    for d in (slice_.get("spec") or {}).get("devices") or []:
        if d.get("allowMultipleAllocations") is not True:
            return False
        for cap in (d.get("capacity") or {}).values():
            if not isinstance(cap, Mapping) or cap.get("requestPolicy") is None:
                return False
    return True


# ---- publishing ---------------------------------------------------------------------

@dataclass
class PublishResult:
    """What :meth:`SlicePublisher.publish` left in the API server."""

    shared: bool  # the GPUs are advertised shareable
    fallback_reason: str | None  # why not, when sharing was wanted (one line)
    slices: list[str]  # names of the pool's slices
    generation: int  # the pool generation they carry
    changed: bool = False  # this call wrote something
    writes: list[str] = field(default_factory=list)  # "create NAME", "update NAME", "delete NAME"


class SlicePublisher:
    """Keeps ``node``'s pool of ``driver`` in the API server equal to the GPUs it is given.

    Not thread-safe: one publisher per node, called from one thread (the plugin's loop).
    Sharing is asked for with ``publish(gpus, shared_wanted=True)``; when the API server
    drops the consumable-capacity fields (DRAConsumableCapacity off, or a server that
    does not know them), the GPUs are republished whole and the result says why
    (``fallback_reason``), which the publisher remembers until it is recreated."""

    def __init__(self, api: "ApiClient", node: str, *, driver: str = DRIVER,
                 node_uid: str | None = None, owner_from_api: bool = True,
                 memory_policy: C.RequestPolicy | None = None,
                 max_devices_per_slice: int = MAX_DEVICES_PER_SLICE,
                 log_fn: Callable[[str], None] | None = None) -> None:
        self.api = api
        self.node = node
        self.driver = driver
        self.node_uid = node_uid
        self.memory_policy = memory_policy
        self.max_devices_per_slice = max_devices_per_slice
        self.fallback_reason: str | None = None
        self._written: list[dict[str, Any]] = []  # the slices as the server returned them, last reconcile
        self._owner_from_api = owner_from_api and node_uid is None
        self._log = log_fn or log.info

    def _owner_uid(self) -> str | None:
        if self._owner_from_api:
            self._owner_from_api = False
            try:
                self.node_uid = str((self.api.get_node(self.node).get("metadata") or {}).get("uid") or "") or None
            except Exception as e:  # noqa: BLE001 - an owner is a nicety, never a reason to fail
                self._log(f"node {self.node}: no owner reference on its ResourceSlices ({e})")
        return self.node_uid

    def _build(self, gpus: list[GpuInfo], generation: int, shared: bool) -> list[dict[str, Any]]:
        return build_slices(self.node, gpus, generation, shared=shared, memory_policy=self.memory_policy,
                            max_devices_per_slice=self.max_devices_per_slice, driver=self.driver,
                            node_uid=self._owner_uid())

    def publish(self, gpus: Iterable[GpuInfo], shared_wanted: bool) -> PublishResult:
        """Reconcile the node's slices with ``gpus``: nothing is written when they already
        say the same; else the pool generation goes up and every slice is written
        (updated in place, created, or deleted when the pool got smaller)."""
        gpus = list(gpus)
        shared = shared_wanted and self.fallback_reason is None
        result = self._reconcile(gpus, shared)
        if shared and result.slices and not all(consumable_fields_present(s) for s in self._written):
            self.fallback_reason = (
                "the API server dropped allowMultipleAllocations/requestPolicy from the ResourceSlices "
                "(feature gate DRAConsumableCapacity off?): publishing whole GPUs")
            self._log(f"node {self.node}: {self.fallback_reason}")
            again = self._reconcile(gpus, False)
            again.writes = result.writes + again.writes
            again.changed = True
            result = again
        result.fallback_reason = self.fallback_reason if shared_wanted else None
        return result

    def _reconcile(self, gpus: list[GpuInfo], shared: bool) -> PublishResult:
        self._written = []
        existing = sorted(self.api.list_slices(self.node, self.driver),
                          key=lambda s: str((s.get("metadata") or {}).get("name", "")))
        gens = [int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0) or 0) for s in existing]
        current = max(gens, default=0)
        desired = self._build(gpus, current, shared)
        want = sorted(str(d["metadata"]["annotations"][ANNOTATION_HASH]) for d in desired)
        have = sorted(str(((s.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH, ""))
                      for s in existing)
        uniform = len(set(gens)) <= 1 and all(
            ((s.get("spec") or {}).get("pool") or {}).get("name") == self.node for s in existing)
        names = [str(s["metadata"]["name"]) for s in existing]
        if want == have and uniform:
            self._written = existing
            return PublishResult(shared=shared, fallback_reason=None, slices=names, generation=current)
        generation = current + 1
        desired = self._build(gpus, generation, shared)
        writes: list[str] = []
        kept: list[str] = []
        for i, obj in enumerate(desired):
            if i < len(existing):
                old = existing[i]
                obj["metadata"]["name"] = old["metadata"]["name"]
                obj["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                obj["metadata"].pop("generateName", None)
                got = self.api.replace_slice(obj)
                writes.append(f"update {got['metadata']['name']}")
            else:
                got = self.api.create_slice(obj)
                writes.append(f"create {got['metadata']['name']}")
            kept.append(str(got["metadata"]["name"]))
            self._written.append(got)
        from .apiclient import ApiError  # the publisher works with any ApiClient-like object
        for old in existing[len(desired):]:
            name = str(old["metadata"]["name"])
            try:
                self.api.delete_slice(name)
            except ApiError as e:
                if e.status != 404:
                    raise
            writes.append(f"delete {name}")
        return PublishResult(shared=shared, fallback_reason=None, slices=kept, generation=generation,
                             changed=True, writes=writes)

"""From an allocated ResourceClaim to the instance that enforces it (pure).

The scheduler writes, in ``status.allocation.devices``, which devices of which pool each
request of the claim got and, for devices with ``allowMultipleAllocations``, how much of
each capacity it consumed (``consumedCapacity``, KEP-5075). :func:`plan` turns the
results of our driver on this node into one instance:

- one instance per claim and node: a container has one ``/dev/nvidiactl``, so every
  request of the claim (and every container that names any of them) gets the same
  instance, holding all of the claim's GPUs on the node;
- per GPU, the memory limit is the sum of the claim's ``consumedCapacity.memory`` on
  that GPU (the whole GPU for a whole-device allocation), exactly, in bytes;
- ``compute`` (percent of the GPU) is the fixed share under the ``fixed`` policy, the
  weight under ``weight`` and ``burst``, a ceiling under ``equal``; an instance has one
  share for all its GPUs, so a claim with different amounts on its GPUs gets the
  smallest (never more than granted anywhere);
- the policy, priority (online/offline) and an offline ``minShare`` (at most the
  granted compute) come only from a config whose source is the DeviceClass, which the
  administrator owns, else the plugin's default policy: a claim that sets them is
  refused, since each would give it more than it was granted (equal and burst give idle
  time away, a floor is taken before online work). A claim may lower its ``ceiling``;
- ``capabilities`` (NVIDIA_DRIVER_CAPABILITIES' form, e.g. ``"compute,utility"``; default
  all) is the instance's capability set, which the module enforces: a DeviceClass's is
  the most its claims get, a claim's may only narrow it.

A claim status is written by the scheduler, but also by anyone allowed to update
``resourceclaims/status``: every amount is checked against what the node's slices
advertise (a valid amount under the request policy, within the GPU) and against the
claims already prepared on the GPU, so what the driver creates never exceeds the GPU.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from gpuslice import state as S
from gpuslice.netlink import CAPS_ALL, caps_text, parse_caps
from gpuslice.policy import POLICIES, PRIORITIES
from gpuslice import units
from . import DRIVER
from . import capacity as C

CONFIG_API_VERSION = "gpuslice.dev/v1alpha1"
CONFIG_KIND = "GpuConfig"
COMPUTE_FULL = 100  # the `compute` capacity of one GPU, percent
OWNER = "kubelet-plugin"  # state.OWNERS
_CONFIG_KEYS = {"apiVersion", "kind", "policy", "priority", "minShare", "ceiling", "capabilities"}
_CLASS_ONLY = ("policy", "priority", "minShare")  # what would give a claim more than it was granted
_DEVICE_RE = re.compile(r"gpu-(0|[1-9][0-9]{0,2})")


class ClaimError(ValueError):
    """Why a claim cannot be prepared on this node: one line, returned to the kubelet
    (and shown in the pod's events)."""


@dataclass(frozen=True)
class Gpu:
    """What the node's ResourceSlices advertise for one GPU."""
    minor: int
    memory: int  # bytes
    memory_policy: C.RequestPolicy | None  # None: whole devices only (no consumable capacity)
    compute_policy: C.RequestPolicy | None
    uuid: str = ""  # the GPU's identity: a minor may name another GPU after a reboot


@dataclass(frozen=True)
class Share:
    """One allocation result of our driver on this node."""
    request: str
    device: str
    gpu: int
    memory: int
    compute: int
    share_id: str | None = None


@dataclass(frozen=True)
class GpuConfig:
    policy: str | None = None
    priority: str | None = None
    min_share: float | None = None
    ceiling: float | None = None  # the DeviceClass's
    claim_ceiling: float | None = None  # the claim's: it may only lower the ceiling
    caps: int | None = None  # the DeviceClass's capability set (netlink.CAPS bits; None: all)
    claim_caps: int | None = None  # the claim's: it may only narrow the set


@dataclass(frozen=True)
class Plan:
    """The instance for one claim, and the results it came from."""
    uid: str
    namespace: str
    name: str
    instance: S.Instance
    policy: str
    shares: tuple[Share, ...] = field(default_factory=tuple)

    def per_gpu(self) -> dict[int, tuple[int, int]]:
        """GPU -> (memory bytes, compute percent) the claim holds there."""
        out: dict[int, tuple[int, int]] = {}
        for s in self.shares:
            m, c = out.get(s.gpu, (0, 0))
            out[s.gpu] = (m + s.memory, c + s.compute)
        return out


def instance_name(uid: str) -> str:
    """The instance of claim ``uid``: ``dra-`` and 26 hex digits of the UID (the API
    server's random UUID; 30 characters, within the module's 31). A UID that is not a
    UUID is hashed."""
    hexd = uid.replace("-", "").lower()
    if not re.fullmatch(r"[0-9a-f]{32}", hexd):
        hexd = hashlib.sha256(uid.encode()).hexdigest()
    return "dra-" + hexd[:26]


def gpu_of_device(device: str) -> int:
    """``gpu-<minor>`` (slices.build_slices' device names) -> minor."""
    m = _DEVICE_RE.fullmatch(device)
    if not m:
        raise ClaimError(f"device {device!r} is not one of {DRIVER}'s")
    return int(m.group(1))


def parse_config(params: Any, from_class: bool) -> GpuConfig:
    """A GpuConfig from an opaque config's ``parameters``."""
    if not isinstance(params, Mapping):
        raise ClaimError("opaque config parameters must be an object")
    if params.get("apiVersion") != CONFIG_API_VERSION or params.get("kind") != CONFIG_KIND:
        raise ClaimError(f"opaque config must be apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND} "
                         f"(got {params.get('apiVersion')!r}, {params.get('kind')!r})")
    unknown = sorted(set(params) - _CONFIG_KEYS)
    if unknown:
        raise ClaimError(f"unknown field {unknown[0]!r} in {CONFIG_KIND} (known: "
                         f"{', '.join(sorted(_CONFIG_KEYS - {'apiVersion', 'kind'}))})")
    if not from_class:
        for k in _CLASS_ONLY:
            if k in params:
                raise ClaimError(f"{k} is set by the DeviceClass (the administrator's), not by a claim")
    policy = params.get("policy")
    if policy is not None and policy not in POLICIES:
        raise ClaimError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
    priority = params.get("priority")
    if priority is not None and priority not in PRIORITIES:
        raise ClaimError(f"priority {priority!r} is not one of {', '.join(PRIORITIES)}")
    caps = params.get("capabilities")
    if caps is not None:
        if not isinstance(caps, str):
            raise ClaimError("capabilities must be a string such as \"compute,utility\"")
        try:
            caps = parse_caps(caps)
        except ValueError as e:
            raise ClaimError(f"capabilities: {e}") from None
    return GpuConfig(policy=policy, priority=priority, min_share=_share(params, "minShare"),
                     ceiling=_share(params, "ceiling"), caps=caps)


def _share(params: Mapping[str, Any], key: str) -> float | None:
    v = params.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise ClaimError(f"{key} must be a string such as \"30%\"")
    try:
        return units.parse_share(v)
    except ValueError as e:
        raise ClaimError(f"{key}: {e}") from None


def merged_config(allocation: Mapping[str, Any], requests: Iterable[str]) -> GpuConfig:
    """Our configs that apply to any of ``requests``, in the allocation's order (class
    configs first, as the allocator copies them), later fields overriding earlier ones."""
    reqs = set(requests)
    out: dict[str, Any] = {}
    for cfg in _list(allocation.get("devices", {}).get("config")):
        opaque = cfg.get("opaque") if isinstance(cfg, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER:
            continue
        applies = _list(cfg.get("requests"))
        # "req/sub" results match a config naming "req"
        if applies and not any(r in applies or r.split("/")[0] in applies for r in reqs):
            continue
        source = cfg.get("source")
        if source not in ("FromClass", "FromClaim"):
            raise ClaimError(f"config source {source!r} is neither FromClass nor FromClaim")
        parsed = parse_config(opaque.get("parameters"), from_class=source == "FromClass")
        fields = {k: v for k, v in parsed.__dict__.items() if v is not None}
        if source == "FromClaim" and "ceiling" in fields:
            fields["claim_ceiling"] = fields.pop("ceiling")
        if source == "FromClaim" and "caps" in fields:
            fields["claim_caps"] = fields.pop("caps")
        out.update(fields)
    return GpuConfig(**out)


def _list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else []


def shares(claim: Mapping[str, Any], pool: str, gpus: Mapping[int, Gpu]) -> list[Share]:
    """Our results on this node (``pool`` is the node's name), each checked against what
    the node advertises."""
    alloc = (claim.get("status") or {}).get("allocation")
    if not isinstance(alloc, Mapping):
        raise ClaimError("the claim is not allocated")
    out = []
    for r in _list((alloc.get("devices") or {}).get("results")):
        if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
            continue
        if r.get("pool") != pool:
            continue  # another node's share of a network-attached... not ours to prepare
        if r.get("adminAccess"):
            raise ClaimError("adminAccess is not supported: gpuslice gives no access beside the instances")
        device = str(r.get("device", ""))
        gpu = gpu_of_device(device)
        if gpu not in gpus:
            raise ClaimError(f"device {device} is not on this node")
        g = gpus[gpu]
        consumed = r.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping):
            raise ClaimError(f"{device}: consumedCapacity is not an object")
        memory = _amount(consumed, "memory", g.memory, g.memory_policy, device)
        compute = _amount(consumed, "compute", COMPUTE_FULL, g.compute_policy, device)
        if memory < 1 or compute < 1:
            raise ClaimError(f"{device}: a share needs memory and compute (got {memory} bytes, {compute}%)")
        sid = r.get("shareID")
        out.append(Share(str(r.get("request", "")), device, gpu, memory, compute,
                         str(sid) if sid is not None else None))
    if not out:
        raise ClaimError(f"the claim has no device of {DRIVER} on node {pool}")
    return out


def _amount(consumed: Mapping[str, Any], key: str, whole: int, policy: C.RequestPolicy | None, device: str) -> int:
    """The amount of ``key`` a result consumed: the whole device when it names none (a
    device without consumable capacity); else a valid amount under ``policy``."""
    if key not in consumed:
        return whole
    if policy is None:
        raise ClaimError(f"{device}: consumedCapacity.{key} on a device that is not shared")
    try:
        v = C.parse_quantity(consumed[key])
    except ValueError as e:
        raise ClaimError(f"{device}: consumedCapacity.{key}: {e}") from None
    try:  # the allocator writes whole amounts on the grid (Quantity.Value()): a fraction is off it
        C.parse_quantity(consumed[key], whole=True)
    except ValueError:
        v = -1
    if not C.valid_amount(v, policy, whole):
        raise ClaimError(f"{device}: consumedCapacity.{key} {consumed[key]} is not an amount the node "
                         f"advertises (a whole number on its request policy's grid, at most {whole})")
    return v


def plan(claim: Mapping[str, Any], pool: str, gpus: Mapping[int, Gpu], default_policy: str,
         held: Mapping[int, tuple[int, int]] | None = None) -> Plan:
    """The instance for ``claim`` on node ``pool``. ``held``: GPU -> (memory, compute)
    already held by the other claims prepared there; the sum must stay within the GPU."""
    meta = claim.get("metadata") or {}
    uid, ns, name = str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))
    if not uid:
        raise ClaimError("the claim has no UID")
    got = shares(claim, pool, gpus)
    cfg = merged_config(claim["status"]["allocation"], {s.request for s in got})
    policy = cfg.policy or default_policy
    per_gpu: dict[int, tuple[int, int]] = {}
    for s in got:
        m, c = per_gpu.get(s.gpu, (0, 0))
        per_gpu[s.gpu] = (m + s.memory, c + s.compute)
    _fits(per_gpu, gpus, held or {})
    compute = min(c for _m, c in per_gpu.values())
    gpu_list = sorted(per_gpu)
    mems = {g: m for g, (m, _c) in per_gpu.items()}
    weight, share, ceiling = 1, None, cfg.ceiling
    granted = compute / COMPUTE_FULL
    if cfg.claim_ceiling is not None:
        if cfg.claim_ceiling > granted:
            raise ClaimError(f"ceiling {units.format_share(cfg.claim_ceiling)} is above the compute the claim was "
                             f"granted ({compute}%): a claim may only lower its ceiling")
        ceiling = cfg.claim_ceiling if ceiling is None else min(ceiling, cfg.claim_ceiling)
    if policy == "fixed":
        share = granted
    elif policy in ("weight", "burst"):
        weight = compute
    elif compute < COMPUTE_FULL and ceiling is None:  # equal
        ceiling = granted
    priority = cfg.priority or "online"
    # an offline floor is what the instance keeps beside online work: never more than granted
    min_share = min(cfg.min_share, granted) if priority == "offline" and cfg.min_share is not None else None
    caps = CAPS_ALL if cfg.caps is None else cfg.caps
    if cfg.claim_caps is not None:
        if cfg.claim_caps & ~caps:
            raise ClaimError(f"capabilities {caps_text(cfg.claim_caps)} are more than the DeviceClass gives "
                             f"({caps_text(caps)}): a claim may only narrow them")
        caps = cfg.claim_caps
    inst = S.Instance(instance_name(uid), gpu_list, max(mems.values()), weight=weight, share=share,
                      ceiling=ceiling, priority=priority, min_share=min_share,
                      gpu_memory=mems if len(set(mems.values())) > 1 else None, owner=OWNER,
                      caps=None if caps == CAPS_ALL else caps)
    return Plan(uid, ns, name, inst, policy, tuple(got))


def _fits(per_gpu: Mapping[int, tuple[int, int]], gpus: Mapping[int, Gpu],
          held: Mapping[int, tuple[int, int]]) -> None:
    for g, (m, c) in sorted(per_gpu.items()):
        hm, hc = held.get(g, (0, 0))
        if m + hm > gpus[g].memory or c + hc > COMPUTE_FULL:
            raise ClaimError(f"gpu-{g} would hold more than it has: {m + hm} of {gpus[g].memory} bytes, "
                             f"{c + hc}% of {COMPUTE_FULL}% compute with what is prepared there")


def check_fits(p: Plan, gpus: Mapping[int, Gpu], held: Mapping[int, tuple[int, int]]) -> None:
    """Raise ClaimError unless claim ``p`` fits its GPUs beside ``held``."""
    _fits(p.per_gpu(), gpus, held)

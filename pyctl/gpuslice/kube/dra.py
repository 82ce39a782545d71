"""The DRA kubelet plugin of driver ``gpuslice.dev``: NodePrepareResources makes the
instance of a claim (kube/claims.py), NodeUnprepareResources deletes it.

The kubelet finds the plugin through its registration socket in the plugin watcher's
directory (``<registry-dir>/gpuslice.dev-reg.sock``, service
``pluginregistration.Registration``), which names the DRA socket
(``<plugin-dir>/dra.sock``) and the versions served there: ``v1.DRAPlugin`` (kubelet
1.34+) and ``v1beta1.DRAPlugin`` (1.32 and 1.33); both run the same code.

Prepare, per claim, one at a time (a lock: the kubelet calls concurrently):

1. a claim already prepared is answered from the checkpoint (retries, restarts);
2. else the claim is read from the API server, its UID checked, and planned against
   what this node advertises and what the other prepared claims hold;
3. the checkpoint records it as ``preparing``; the instance is created (state file and
   module); its CDI spec is written to ``<cdi-dir>/gpuslice.dev-claim_<instance>.yaml``
   (kind ``gpuslice.dev/claim``); the checkpoint records it as ``prepared``.

A crash between 3's steps leaves a ``preparing`` entry: the next prepare of that claim
removes what was made and starts again, and a plugin start undoes every such entry
(the kubelet retries). Unprepare deletes the instance (refused by the module while its
nodes are open: the kubelet retries), the spec and the entry; an unknown claim is
already unprepared.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from gpuslice.ops import cdi
from gpuslice import instances
from gpuslice import state as S
from . import NODE_MODE
from . import checkpoint as CP
from .claims import COMPUTE_FULL, DRIVER, OWNER, ClaimError, Gpu, Plan, check_fits, instance_name, plan

log = logging.getLogger("gpuslice.kube.dra")

CDI_KIND = "gpuslice.dev/claim"
PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_DIR = "/var/run/cdi"
DRA_SOCKET = "dra.sock"
REG_SOCKET = f"{DRIVER}-reg.sock"
CHECKPOINT = "checkpoint.json"
# what GetInfo lists: the DRA services the kubelet may call (k8s.io/kubelet
# pkg/apis/dra/v1/types.go DRAPluginService, v1beta1 likewise)
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet pkg/apis/pluginregistration/v1 constants.go


@dataclass(frozen=True)
class Prepared:
    """One entry of a NodePrepareResourceResponse."""
    requests: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    cdi_ids: tuple[str, ...]


def cdi_spec_path(cdi_dir: str, uid: str) -> str:
    """The claim's spec file, named by its instance (never by the UID as given: a file
    name made of hex digits only)."""
    return os.path.join(cdi_dir, f"{DRIVER}-claim_{instance_name(uid)}.yaml")


def cdi_id(instance: str) -> str:
    return f"{CDI_KIND}={instance}"


def devices_of(p: Plan, pool: str) -> list[Prepared]:
    """The answer for a planned claim: every result, and the CDI device once (on the
    first result, listing every request), so that a container naming any request of
    the claim gets the instance exactly once."""
    out = []
    reqs = tuple(sorted({s.request for s in p.shares}))
    for i, s in enumerate(p.shares):
        out.append(Prepared(reqs if i == 0 else (s.request,), pool, s.device, s.share_id,
                            (cdi_id(p.instance.name),) if i == 0 else ()))
    return out


class Driver:
    """Prepare and unprepare, with the checkpoint, the state file and the module.

    ``get_claim(namespace, name)`` returns the ResourceClaim as a dict (v1 shape);
    ``nl`` is the module's netlink client or None (state file only)."""

    def __init__(self, node: str, gpus: Mapping[int, Gpu], get_claim: Callable[[str, str], Mapping[str, Any]],
                 state_path: str, nl: Any, cdi_dir: str = CDI_DIR, plugin_dir: str = PLUGIN_DIR,
                 default_policy: str = "fixed", driver_files: Sequence[str] = (),
                 nvidia_ctk: str | None = None) -> None:
        self.node = node
        self.gpus = dict(gpus)
        self.get_claim = get_claim
        self.state_path = state_path
        self.nl = nl
        self.cdi_dir = cdi_dir
        self.checkpoint_path = os.path.join(plugin_dir, CHECKPOINT)
        self.default_policy = default_policy
        self.driver_files = list(driver_files)
        self.nvidia_ctk = nvidia_ctk
        self.lock = threading.Lock()
        self.claims = CP.load(self.checkpoint_path)

    # ---- start ---------------------------------------------------------------------

    def recover(self) -> dict[str, list[str]]:
        """At start: undo every ``preparing`` entry (a crash mid-prepare; the kubelet
        retries), and make sure every prepared claim's instance exists in the state
        file, the module and its CDI spec. One entry that fails is logged and left for
        the kubelet's next call: the others, and the plugin, go on. What was done, by kind."""
        done: dict[str, list[str]] = {"undone": [], "restored": [], "kept": [], "lost": [], "failed": []}
        with self.lock:
            for uid, c in sorted(self.claims.items()):
                try:
                    done[self._recover_one(uid, c)].append(uid)
                except Exception as e:
                    log.error("at start, claim %s/%s (%s): %s", c.get("namespace"), c.get("name"), uid,
                              error_text(e))
                    done["failed"].append(uid)
            self._save()
        return done

    def _recover_one(self, uid: str, c: Mapping[str, Any]) -> str:
        if c["state"] == CP.PREPARING:
            self._undo(uid, c)
            return "undone"
        for g, uuid in (c.get("uuids") or {}).items():
            now = self.gpus[int(g)].uuid if int(g) in self.gpus else None
            if uuid and now != uuid:  # renumbered, replaced or gone: its instance is not restored
                raise ClaimError(f"gpu-{g} was {uuid} when the claim was prepared, now {now or 'absent'}")
        inst = S.load(self.state_path).instances.get(c["instance"])
        if inst is None:
            return "lost"  # deleted by hand: made again on the next prepare
        restored = False
        if self.nl is not None and not any(d.get("name") == inst.name for d in self.nl.instances()):
            instances.create_in_module(self.nl, inst, mode=NODE_MODE)
            restored = True
        self._write_spec(uid, inst)
        return "restored" if restored else "kept"

    # ---- prepare / unprepare ---------------------------------------------------------

    def prepare(self, uid: str, namespace: str, name: str) -> list[Prepared]:
        """The claim's devices. The API server is asked outside the lock (a slow one
        holds no other claim up); what was prepared meanwhile is answered as it is."""
        if not uid or not name:
            raise ClaimError("a claim needs a UID and a name")
        with self.lock:
            done = self._prepared(uid)
            if done is not None:
                return done
        claim = self.get_claim(namespace, name)
        got_uid = (claim.get("metadata") or {}).get("uid")
        if got_uid != uid:
            raise ClaimError(f"claim {namespace}/{name} has UID {got_uid}, not {uid} (deleted and made again?)")
        with self.lock:
            done = self._prepared(uid)
            if done is not None:
                return done
            c = self.claims.get(uid)
            if c is not None:
                self._undo(uid, c)
            p = plan(claim, self.node, self.gpus, self.default_policy,
                     self._held(uid, S.load(self.state_path)))
            return self._make(p)

    def _prepared(self, uid: str) -> list[Prepared] | None:
        c = self.claims.get(uid)
        if c is None or c["state"] != CP.PREPARED or c["instance"] not in S.load(self.state_path).instances:
            return None
        return [Prepared(tuple(d["requests"]), d["pool"], d["device"], d.get("share_id"), tuple(d["cdi"]))
                for d in c["devices"]]

    def unprepare(self, uid: str) -> None:
        with self.lock:
            c = self.claims.get(uid)
            if c is not None:
                self._undo(uid, c)

    def _held(self, exclude: str, st: S.State) -> dict[int, tuple[int, int]]:
        """GPU -> (memory, compute) held by everything but claim ``exclude``: the other
        prepared claims, and every instance the plugin does not own on the GPU (made by
        hand or by the device plugin): its memory limit, and its fixed share."""
        out: dict[int, tuple[int, int]] = {}

        def add(g: int, m: int, comp: int) -> None:
            hm, hc = out.get(g, (0, 0))
            out[g] = (hm + m, hc + comp)

        mine = {c["instance"] for c in self.claims.values()}
        for uid, c in self.claims.items():
            if uid != exclude:
                for g, (m, comp) in c.get("per_gpu", {}).items():
                    add(int(g), m, comp)
        for i in st.instances.values():
            if i.name not in mine and i.name != instance_name(exclude):
                for g in i.gpus:
                    add(g, i.memory_of(g), round((i.share or 0) * COMPUTE_FULL))
        return out

    def _make(self, p: Plan) -> list[Prepared]:
        inst = p.instance
        devs = devices_of(p, self.node)
        entry: dict[str, Any] = {
            "namespace": p.namespace, "name": p.name, "instance": inst.name, "state": CP.PREPARING,
            "per_gpu": {str(g): list(v) for g, v in sorted(p.per_gpu().items())},
            "uuids": {str(g): self.gpus[g].uuid for g in inst.gpus},
            "devices": [{"requests": list(d.requests), "pool": d.pool, "device": d.device, "share_id": d.share_id,
                         "cdi": list(d.cdi_ids)} for d in devs]}
        self.claims[p.uid] = entry
        self._save()
        try:
            with S.locked(self.state_path) as st:
                old = st.instances.get(inst.name)
                if old is not None and old.owner == OWNER:  # made before a checkpoint was lost
                    instances.remove(st, inst.name, self.nl)
                check_fits(p, self.gpus, self._held(p.uid, st))  # what changed since the plan
                for g in inst.gpus:
                    others = [i for i in st.instances_on(g) if i.name != inst.name]
                    if others and st.policy_of(g).policy != p.policy:
                        raise ClaimError(f"gpu-{g} runs the {st.policy_of(g).policy} policy; the claim asks "
                                         f"for {p.policy}")
                try:
                    instances.add(st, inst, self.nl, policy=p.policy, mode=NODE_MODE)
                except (instances.InstanceError, S.StateError, OSError) as e:
                    raise ClaimError(f"instance {inst.name}: {e}") from None
            self._write_spec(p.uid, inst)
        except BaseException:
            self._undo(p.uid, entry)
            raise
        entry["state"] = CP.PREPARED
        self._save()
        log.info("prepared claim %s/%s (%s): instance %s on %s", p.namespace, p.name, p.uid, inst.name,
                 ",".join(f"gpu-{g}" for g in inst.gpus))
        return devs

    def _undo(self, uid: str, c: Mapping[str, Any]) -> None:
        """Delete what claim ``uid`` made (instance, spec, entry); a busy instance
        stops here (ClaimError) with the entry kept, for the kubelet's retry."""
        name = c["instance"]
        with S.locked(self.state_path) as st:
            inst = st.instances.get(name)
            if inst is not None:
                if inst.owner != OWNER:
                    raise ClaimError(f"instance {name} is not the plugin's: left as it is")
                try:
                    instances.remove(st, name, self.nl)
                except instances.InstanceError as e:
                    raise ClaimError(str(e)) from None
            elif self.nl is not None:
                # made in the module by a plugin killed before it saved the state file
                try:
                    self.nl.instance_del(name)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise ClaimError(f"cannot delete {name} in the kernel: {e}") from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cdi_spec_path(self.cdi_dir, uid))
        self.claims.pop(uid, None)
        self._save()
        log.info("unprepared claim %s/%s (%s): instance %s deleted", c.get("namespace"), c.get("name"), uid, name)

    def _write_spec(self, uid: str, inst: S.Instance) -> None:
        spec = cdi.build_spec([cdi.Instance(inst.name, tuple(inst.gpus), inst.caps)], self.driver_files, self.nvidia_ctk,
                              kind=CDI_KIND)
        errs = cdi.check_spec(spec)
        if errs:
            raise ClaimError(f"CDI spec not written: {errs[0]}")
        cdi.write_spec(cdi_spec_path(self.cdi_dir, uid), cdi.render(spec))

    def _save(self) -> None:
        CP.save(self.checkpoint_path, self.claims)


# ---- gRPC ----------------------------------------------------------------------------

def _dra_servicer(pb: Any, pbg: Any, driver: Driver, errors: Callable[[BaseException], str]) -> Any:
    has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    class Servicer(pbg.DRAPluginServicer):  # type: ignore[misc, name-defined]
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            resp = pb.NodePrepareResourcesResponse()
            for c in unique_claims(request.claims):
                r = resp.claims[c.uid]
                try:
                    for d in driver.prepare(c.uid, c.namespace, c.name):
                        dev = r.devices.add(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                                            cdi_device_ids=list(d.cdi_ids))
                        if has_share_id and d.share_id is not None:
                            dev.share_id = d.share_id
                except Exception as e:
                    del r.devices[:]
                    r.error = errors(e)
                    log.warning("prepare %s/%s (%s): %s", c.namespace, c.name, c.uid, r.error)
            return resp

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            resp = pb.NodeUnprepareResourcesResponse()
            for c in unique_claims(request.claims):
                r = resp.claims[c.uid]
                try:
                    driver.unprepare(c.uid)
                except Exception as e:
                    r.error = errors(e)
                    log.warning("unprepare %s/%s (%s): %s", c.namespace, c.name, c.uid, r.error)
            return resp

    return Servicer()


def unique_claims(claims: Sequence[Any]) -> list[Any]:
    """Each claim UID of a request once, at its first place. The kubelet lists a claim
    once per reference of its pods, so one claim may come twice in one call; the
    response is a map by UID, and a claim's devices must be listed in it once."""
    seen: set[str] = set()
    out = []
    for c in claims:
        if c.uid not in seen:
            seen.add(c.uid)
            out.append(c)
    return out


def error_text(e: BaseException) -> str:
    """The one line the kubelet gets for a failed claim."""
    if isinstance(e, (ClaimError, CP.CheckpointError, S.StateError, instances.InstanceError)):
        return str(e)
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    name = type(e).__name__
    if name == "ApiError":  # kube.apiclient: the API server's answer, one line
        return f"reading the claim: {e}"
    log.exception("internal error")
    return f"internal error: {name}: {e}"


class Servers:
    """The DRA service (both versions) and the registration service, on unix sockets."""

    def __init__(self, driver: Driver, plugin_dir: str = PLUGIN_DIR, registry_dir: str = REGISTRY_DIR) -> None:
        import grpc

        from .gen import (dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc,
                          pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc)

        self.dra_socket = os.path.join(plugin_dir, DRA_SOCKET)
        self.reg_socket = os.path.join(registry_dir, REG_SOCKET)
        self.registered = threading.Event()
        self.registration_error: str | None = None
        self.dra = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1_pb2, dra_v1_pb2_grpc, driver, error_text), self.dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, driver, error_text), self.dra)
        outer = self

        class Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):  # type: ignore[misc, name-defined]
            def GetInfo(self, request: Any, context: Any) -> Any:
                return pluginregistration_v1_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=outer.dra_socket,
                                                            supported_versions=list(SUPPORTED_VERSIONS))

            def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                if request.plugin_registered:
                    log.info("registered with the kubelet")
                    outer.registration_error = None
                    outer.registered.set()
                else:
                    outer.registration_error = request.error or "refused"
                    log.error("the kubelet refused the registration: %s", outer.registration_error)
                return pluginregistration_v1_pb2.RegistrationStatusResponse()

        self.reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(Registration(), self.reg)

    def start(self) -> None:
        """DRA socket first: once the registration socket exists the kubelet may call."""
        for server, path in ((self.dra, self.dra_socket), (self.reg, self.reg_socket)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a socket left by a killed plugin
            if server.add_insecure_port(f"unix://{path}") == 0:
                raise OSError(f"cannot listen on {path}")
            server.start()

    def stop(self, grace: float = 5.0) -> None:
        """Registration first (the kubelet drops the plugin), then the DRA service."""
        self.reg.stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.reg_socket)
        self.dra.stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.dra_socket)

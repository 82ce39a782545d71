"""A test kubelet for the DRA plugin: what the kubelet's plugin watcher and DRA manager
do over the plugin's unix sockets, with the vendored protos (gpuslice.kube.gen).

Covers: finding the registration socket in the registry directory, GetInfo (type,
name, endpoint, versions), NotifyRegistrationStatus, NodePrepareResources and
NodeUnprepareResources through the v1 or v1beta1 service. Not covered: the kubelet's
own claim cache and checkpoint, its retry timing, pod admission, the container runtime
(CDI injection), and the health service.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Iterable

import grpc

from gpuslice.kube.gen import (dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc,
                               pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc)

VERSIONS = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}


@dataclass
class Registered:
    type: str
    name: str
    endpoint: str
    versions: list[str]


class DraKubelet:
    def __init__(self, registry_dir: str, timeout: float = 30.0) -> None:
        self.registry_dir = registry_dir
        self.timeout = timeout
        self.info: Registered | None = None

    def register(self, accept: bool = True, error: str = "") -> Registered:
        """What the plugin watcher does when a socket appears in the registry dir."""
        socks = sorted(glob.glob(os.path.join(self.registry_dir, "*.sock")))
        assert len(socks) == 1, f"registry dir holds {socks}"
        with grpc.insecure_channel(f"unix://{socks[0]}") as ch:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
            info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=self.timeout, wait_for_ready=True)
            stub.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(
                plugin_registered=accept, error=error), timeout=self.timeout)
        self.info = Registered(info.type, info.name, info.endpoint, list(info.supported_versions))
        return self.info

    def _stub(self, version: str, ch: grpc.Channel) -> Any:
        return VERSIONS[version][1].DRAPluginStub(ch)

    def prepare(self, claims: Iterable[tuple[str, str, str]], version: str = "v1") -> dict[str, Any]:
        """claims: (namespace, uid, name). Returns uid -> NodePrepareResourceResponse."""
        assert self.info is not None, "register first"
        pb = VERSIONS[version][0]
        req = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace=n, uid=u, name=m) for n, u, m in claims])
        with grpc.insecure_channel(f"unix://{self.info.endpoint}") as ch:
            resp = self._stub(version, ch).NodePrepareResources(req, timeout=self.timeout)
        return dict(resp.claims)

    def unprepare(self, claims: Iterable[tuple[str, str, str]], version: str = "v1") -> dict[str, str]:
        """Returns uid -> error ("" on success)."""
        assert self.info is not None, "register first"
        pb = VERSIONS[version][0]
        req = pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace=n, uid=u, name=m) for n, u, m in claims])
        with grpc.insecure_channel(f"unix://{self.info.endpoint}") as ch:
            resp = self._stub(version, ch).NodeUnprepareResources(req, timeout=self.timeout)
        return {u: r.error for u, r in resp.claims.items()}

"""A test kubelet for the device plugin (API v1beta1): what the kubelet's device manager
does over unix sockets, with the vendored protos (gpuslice.kube.gen).

Covers: serving ``v1beta1.Registration`` on ``<dir>/kubelet.sock`` and recording each
RegisterRequest; connecting back to the plugin's endpoint (``<dir>/<endpoint>``),
GetDevicePluginOptions, reading the ListAndWatch stream in a thread (every list kept);
Allocate and PreStartContainer calls; a kubelet restart (kubelet.sock removed and made
anew, and, as the real kubelet does, every other socket in the directory removed).
Not covered: the kubelet's device checkpoint and allocation bookkeeping, pod admission,
topology manager, the container runtime (CDI injection), the API server (node
capacity).
"""

from __future__ import annotations

import glob
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from gpuslice.kube.gen import deviceplugin_v1beta1_pb2 as pb
from gpuslice.kube.gen import deviceplugin_v1beta1_pb2_grpc as pbg

KUBELET_SOCKET = "kubelet.sock"


@dataclass
class Plugin:
    """One registration and what the kubelet learnt from the plugin since."""
    request: Any  # RegisterRequest
    options: Any = None  # DevicePluginOptions from GetDevicePluginOptions
    lists: list[list[tuple[str, str]]] = field(default_factory=list)  # ListAndWatch: [(ID, health)] per message
    topology: dict[str, list[int]] = field(default_factory=dict)  # ID -> NUMA nodes (latest)
    error: str | None = None  # connecting back or the stream failed
    stream_ended: threading.Event = field(default_factory=threading.Event)
    channel: Any = None

    @property
    def resource(self) -> str:
        return str(self.request.resource_name)

    @property
    def devices(self) -> dict[str, str]:
        """The latest list: ID -> health."""
        return dict(self.lists[-1]) if self.lists else {}


class DpKubelet:
    """The kubelet side of the device plugin API, in ``plugin_dir``."""

    def __init__(self, plugin_dir: str, timeout: float = 10.0, accept: Callable[[Any], str | None] | None = None) -> None:
        self.dir = plugin_dir
        self.socket = os.path.join(plugin_dir, KUBELET_SOCKET)
        self.timeout = timeout
        self.accept = accept  # RegisterRequest -> error text to refuse it, or None
        self.registrations: list[Any] = []  # every RegisterRequest, in order
        self.plugins: dict[str, Plugin] = {}  # resource -> the latest registration
        self.cond = threading.Condition()
        self.server: Any = None

    # ---- the kubelet's life ---------------------------------------------------------------

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        outer = self

        class Registration(pbg.RegistrationServicer):  # type: ignore[misc]
            def Register(self, request: Any, context: Any) -> Any:
                if request.version != "v1beta1":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
                err = outer.accept(request) if outer.accept else None
                if err:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, err)
                copy = pb.RegisterRequest()
                copy.CopyFrom(request)
                with outer.cond:
                    outer.registrations.append(copy)
                # the real kubelet connects back after answering (devicemanager runs the client in a goroutine)
                threading.Thread(target=outer._connect, args=(copy,), daemon=True).start()
                return pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port("unix:" + self.socket)
        self.server.start()

    def stop(self) -> None:
        """The kubelet goes away: its server stops, the streams it reads are closed."""
        if self.server is not None:
            self.server.stop(grace=None)
            self.server = None
        with self.cond:
            plugins = list(self.plugins.values())
        for p in plugins:
            if p.channel is not None:
                p.channel.close()
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def restart(self, wipe: bool = True) -> None:
        """Stop, then start on a new kubelet.sock; ``wipe``: remove every socket in the
        directory first, as the kubelet's device manager does when it starts."""
        self.stop()
        with self.cond:
            self.plugins.clear()
        if wipe:
            for p in glob.glob(os.path.join(self.dir, "*")):
                if not os.path.isdir(p):
                    os.unlink(p)
        self.start()

    # ---- the device manager's client ------------------------------------------------------

    def _connect(self, request: Any) -> None:
        plugin = Plugin(request)
        with self.cond:
            old = self.plugins.get(plugin.resource)
            self.plugins[plugin.resource] = plugin
            self.cond.notify_all()
        if old is not None and old.channel is not None:
            old.channel.close()
        try:
            ch = grpc.insecure_channel("unix:" + os.path.join(self.dir, request.endpoint))
            plugin.channel = ch
            stub = pbg.DevicePluginStub(ch)
            opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=self.timeout, wait_for_ready=True)
            with self.cond:
                plugin.options = opts
                self.cond.notify_all()
            for resp in stub.ListAndWatch(pb.Empty()):
                with self.cond:
                    plugin.lists.append([(d.ID, d.health) for d in resp.devices])
                    plugin.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                    self.cond.notify_all()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                plugin.error = f"{e.code().name}: {e.details()}"
        except ValueError as e:  # the channel was closed under the stream
            plugin.error = str(e)
        finally:
            plugin.stream_ended.set()
            with self.cond:
                self.cond.notify_all()

    # ---- what the tests ask ---------------------------------------------------------------

    def wait_for(self, pred: Callable[[], Any], what: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.timeout)
        with self.cond:
            while True:
                v = pred()
                if v:
                    return v
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}; registrations: "
                                         f"{[r.resource_name for r in self.registrations]}")
                self.cond.wait(min(left, 0.1))

    def wait_registered(self, resources: list[str] | set[str], count: int = 1) -> dict[str, Plugin]:
        """Wait until each of ``resources`` registered ``count`` times in all and has a
        device list; the plugins."""
        def ready() -> bool:
            for r in resources:
                if sum(1 for x in self.registrations if x.resource_name == r) < count:
                    return False
                p = self.plugins.get(r)
                if p is None or not p.lists:
                    return False
            return True

        self.wait_for(ready, f"registration of {sorted(resources)} x{count}")
        with self.cond:
            return {r: self.plugins[r] for r in resources}

    def wait_devices(self, resource: str, pred: Callable[[dict[str, str]], bool], what: str = "a device list",
                     timeout: float | None = None) -> dict[str, str]:
        def check() -> dict[str, str] | None:
            p = self.plugins.get(resource)
            if p is None or not p.lists:
                return None
            d = p.devices
            return d if pred(d) else None

        return self.wait_for(check, f"{resource}: {what}", timeout)  # type: ignore[no-any-return]

    def stub(self, resource: str) -> Any:
        p = self.plugins[resource]
        return pbg.DevicePluginStub(p.channel)

    def allocate(self, resource: str, *containers: list[str]) -> Any:
        """Allocate for one pod: one list of device IDs per container."""
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers])
        return self.stub(resource).Allocate(req, timeout=self.timeout)

    def pre_start(self, resource: str, ids: list[str]) -> Any:
        return self.stub(resource).PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids),
                                                     timeout=self.timeout)

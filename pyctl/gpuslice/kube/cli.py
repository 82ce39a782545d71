"""gpuctl's Kubernetes commands: ``gpuctl kubelet-plugin`` (the DRA driver, kube/dra.py)
and ``gpuctl device-plugin`` (kube/deviceplugin.py).

:func:`register` adds them to gpuctl's main group (gpuslice/cli/__init__.py calls it). They use the main
group's options: ``--state`` (``ctx.obj["state"]``) and ``--kernel``.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from typing import Any

import click

from gpuslice.policy import POLICIES
from gpuslice.units import Duration
from . import DRIVER


class _SignalStop(threading.Event):
    """An event set at SIGTERM or SIGINT, whose wait() in the main thread wakes for them.

    The kernel hands a process's signal to any thread that does not block it, often
    one of gRPC's; Python then runs the handler in the main thread, but only once that
    thread runs Python code again, and a main thread asleep in Event.wait(600) would not.
    So the main thread waits in select() on the wakeup pipe that Python's C handler
    writes to from whichever thread took the signal (signal.set_wakeup_fd), and looks
    again at least every second."""

    SLICE = 1.0

    def __init__(self) -> None:
        super().__init__()
        self._rfd, wfd = os.pipe()
        for fd in (self._rfd, wfd):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)

    def wait(self, timeout: float | None = None) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return super().wait(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = self.SLICE if end is None else min(self.SLICE, end - time.monotonic())
            if left <= 0:
                break
            select.select([self._rfd], [], [], left)  # returns at a signal; its handler runs after
            try:
                while os.read(self._rfd, 512):
                    pass
            except BlockingIOError:
                pass
        return self.is_set()


def _stop_on_signals(log: logging.Logger) -> threading.Event:
    """An event set, with a log line, at SIGTERM or SIGINT, whichever thread the kernel
    gave the signal to: what the plugins run until (in the main thread)."""
    stop = _SignalStop()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return stop


def need_kube_extra(command: str, modules: tuple[str, ...]) -> None:
    """The plugins' dependencies are the ``kube`` extra (grpcio, protobuf, kubernetes),
    which a host that only uses the CLI does without: a missing one is one line saying
    what to install, not a traceback."""
    import importlib

    missing = []
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        from gpuslice.cli.common import GpuctlError

        raise GpuctlError(f"{command} needs the kube extra (no {', '.join(missing)} here): "
                          "pip install 'gpuslice[kube]'")


def register(main: click.Group) -> None:
    """Add the Kubernetes commands to ``main``."""
    main.add_command(device_plugin)
    main.add_command(kubelet_plugin)


@click.command("device-plugin")
@click.option("--config", "config_path", required=True, metavar="PATH",
              help="Profiles (YAML): name, memory, optional compute, gpus and slots.")
@click.option("--device-plugin-dir", default="/var/lib/kubelet/device-plugins", show_default=True, metavar="DIR",
              help="The kubelet's device plugin directory (kubelet.sock and the plugin sockets).")
@click.option("--cdi-dir", default="/var/run/cdi", show_default=True, metavar="DIR",
              help="Where the CDI spec gpuslice.dev-device-plugin.yaml is written.")
@click.option("--gpu-source", type=click.Choice(["auto", "nvml", "rm"]), default="auto", show_default=True,
              help="Where the GPUs are read from: NVML, the RM on /dev/nvidiactl, or NVML else RM.")
@click.option("--driver-root", default="/", show_default=True, metavar="DIR",
              help="Where the host's root is mounted (in a container, e.g. /host): the driver files the "
              "CDI spec mounts are looked up there.")
@click.option("--retry", type=Duration(100_000_000, 3600 * 10**9, seconds=True), default="10s", show_default=True,
              help="How often instances that could not be deleted or made are tried again, 100ms to 1h "
              "(a bare number is seconds).")
@click.option("-v", "--verbose", count=True, help="-vv: debug output.")
@click.pass_context
def device_plugin(ctx: click.Context, config_path: str, device_plugin_dir: str, cdi_dir: str, gpu_source: str,
                  driver_root: str, retry: float, verbose: int) -> None:
    """Kubelet device plugin (v1beta1): advertise static slots of each profile as
    gpuslice.dev/<profile>, and GPUs in no profile whole as gpuslice.dev/gpu; each
    container gets one device, as the CDI device of its instance. Runs until SIGTERM
    or SIGINT; the instances stay."""
    need_kube_extra("gpuctl device-plugin", ("grpc", "google.protobuf"))
    from gpuslice.ops import cdi
    from gpuslice.cli import GpuctlError, kernel
    from . import deviceplugin as DP

    logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO,
                        format="gpuctl device-plugin: %(message)s")
    try:
        config = DP.read_config(config_path)
    except DP.ConfigError as e:
        raise GpuctlError(str(e)) from None
    try:
        gpus = DP.discover_gpus(gpu_source)
    except Exception as e:  # inventory.InventoryError, one line
        raise GpuctlError(f"no GPUs: {e}") from None
    try:
        slots = DP.plan_slots(config, gpus, numa=DP.sysfs_numa_node)
    except DP.ConfigError as e:
        raise GpuctlError(f"{config_path}: {e}") from None
    if not slots:
        raise GpuctlError("nothing to advertise: no GPU on this node")
    plugin = DP.DevicePlugin(slots, ctx.obj["state"], kernel(ctx), plugin_dir=device_plugin_dir, cdi_dir=cdi_dir,
                             driver_files=cdi.driver_files(cdi.scan_host(root=driver_root)),
                             nvidia_ctk=cdi.find_nvidia_ctk(root=driver_root),
                             retry=retry)
    stop = _stop_on_signals(logging.getLogger())
    try:
        plugin.run(stop)
    except DP.ConfigError as e:
        raise GpuctlError(str(e)) from None


def _quantity(text: str) -> int:
    from .capacity import parse_quantity

    return parse_quantity(text)


QUANTITY = click.types.FuncParamType(_quantity)
QUANTITY.name = "quantity"


@click.command("kubelet-plugin")
@click.option("--node-name", envvar="NODE_NAME", required=True,
              help="This node's name: the pool of its ResourceSlices (env NODE_NAME).")
@click.option("--plugin-dir", default=f"/var/lib/kubelet/plugins/{DRIVER}", show_default=True, metavar="DIR",
              help="The DRA socket (dra.sock) and the checkpoint (checkpoint.json).")
@click.option("--registry-dir", default="/var/lib/kubelet/plugins_registry", show_default=True, metavar="DIR",
              help="The kubelet's plugin watcher directory (the registration socket).")
@click.option("--cdi-dir", default="/var/run/cdi", show_default=True, metavar="DIR",
              help="Where each claim's CDI spec gpuslice.dev-claim_<instance>.yaml is written.")
@click.option("--kubeconfig", metavar="PATH", envvar="KUBECONFIG",
              help="API server access (default: in-cluster, else ~/.kube/config).")
@click.option("--memory-min", type=QUANTITY, default="256Mi", show_default=True,
              help="The smallest memory share (a Kubernetes quantity, e.g. 256Mi).")
@click.option("--memory-step", type=QUANTITY, default="256Mi", show_default=True,
              help="Memory shares are the minimum plus a multiple of this step.")
@click.option("--policy", type=click.Choice(POLICIES), default="fixed", show_default=True,
              help="The policy of a GPU whose claims ask for none (compute is the share under fixed, the "
              "weight under weight and burst, a ceiling under equal).")
@click.option("--gpu-source", type=click.Choice(["auto", "nvml", "rm"]), default="auto", show_default=True,
              help="Where the GPUs are read from: NVML, the RM on /dev/nvidiactl, or NVML else RM.")
@click.option("--driver-root", default="/", show_default=True, metavar="DIR",
              help="Where the host's root is mounted (in a container, e.g. /host): the driver files the "
              "CDI specs mount are looked up there.")
@click.option("--no-share", is_flag=True, help="Publish whole GPUs only (no consumable capacity).")
@click.option("--republish", type=Duration(10**9, 86400 * 10**9, seconds=True), default="10m", show_default=True,
              help="How often the ResourceSlices are checked against the GPUs, 1s to 24h (a bare number is seconds).")
@click.option("-v", "--verbose", count=True, help="-vv: debug output.")
@click.pass_context
def kubelet_plugin(ctx: click.Context, node_name: str, plugin_dir: str, registry_dir: str, cdi_dir: str,
                   kubeconfig: str | None, memory_min: int, memory_step: int, policy: str, gpu_source: str,
                   driver_root: str, no_share: bool, republish: float, verbose: int) -> None:
    """DRA kubelet plugin of driver gpuslice.dev: publish this node's GPUs as
    ResourceSlices with consumable memory and compute, and make each prepared claim
    an instance with exactly the amounts the scheduler granted. Runs until SIGTERM or
    SIGINT; prepared claims and their instances stay (checkpointed)."""
    need_kube_extra("gpuctl kubelet-plugin", ("grpc", "google.protobuf", "kubernetes"))
    from gpuslice.ops import cdi
    from gpuslice.cli import GpuctlError, kernel
    from . import capacity as C
    from . import checkpoint as CP
    from . import dra, inventory, slices
    from .apiclient import ApiClient, ApiError
    from .claims import Gpu

    logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO,
                        format="gpuctl kubelet-plugin: %(message)s")
    if verbose < 2:
        logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries: the error that follows says it
    log = logging.getLogger("gpuslice.kube")
    if memory_step < 1 or memory_min < 1:
        raise click.BadParameter("must be at least 1 byte", param_hint="--memory-min/--memory-step")
    try:
        infos = inventory.discover(gpu_source)
    except inventory.InventoryError as e:
        raise GpuctlError(f"no GPUs: {e}") from None
    if not infos:
        raise GpuctlError("no GPU on this node")
    wanted = C.RequestPolicy(valid_range=C.ValidRange(min=memory_min, step=memory_step))
    try:
        mem_policies = {g.minor: slices.effective_memory_policy(g.memory, wanted) for g in infos}
    except slices.SliceError as e:
        raise GpuctlError(f"--memory-min/--memory-step: {e}") from None
    try:
        api = ApiClient.from_env(kubeconfig)
    except Exception as e:  # kubeconfig missing or malformed: one line
        raise GpuctlError(f"no API server access: {e}") from None
    publisher = slices.SlicePublisher(api, node_name, memory_policy=wanted, log_fn=log.warning)

    def publish() -> bool:
        """Publish; whether the GPUs are shared (consumable capacity kept by the API server)."""
        res = publisher.publish(infos, shared_wanted=not no_share)
        if res.fallback_reason:
            log.warning("%s", res.fallback_reason)
        elif res.changed:
            log.info("published %d GPUs in %s (generation %d, %s)", len(infos), ", ".join(res.slices),
                     res.generation, "shared" if res.shared else "whole")
        return res.shared

    try:
        shared = publish()
    except (ApiError, slices.SliceError) as e:
        raise GpuctlError(f"cannot publish the ResourceSlices: {e}") from None
    gpus = {g.minor: Gpu(g.minor, g.memory, mem_policies[g.minor] if shared else None,
                         slices.COMPUTE_POLICY if shared else None, g.uuid) for g in infos}
    try:
        driver = dra.Driver(node_name, gpus, api.get_claim, ctx.obj["state"], kernel(ctx), cdi_dir=cdi_dir,
                            plugin_dir=plugin_dir, default_policy=policy,
                            driver_files=cdi.driver_files(cdi.scan_host(root=driver_root)),
                            nvidia_ctk=cdi.find_nvidia_ctk(root=driver_root))
        done = driver.recover()
    except CP.CheckpointError as e:
        raise GpuctlError(str(e)) from None
    for what, uids in done.items():
        if uids:
            log.info("at start, %s: %s", what, ", ".join(uids))
    servers = dra.Servers(driver, plugin_dir, registry_dir)
    servers.start()
    log.info("serving %s on %s (registration %s)", DRIVER, servers.dra_socket, servers.reg_socket)
    stop = _stop_on_signals(log)
    try:
        while not stop.wait(republish):
            try:
                publish()
            except (ApiError, slices.SliceError) as e:
                log.warning("republishing the ResourceSlices: %s", e)
    finally:
        servers.stop()
        api.close()

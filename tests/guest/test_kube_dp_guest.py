"""The device plugin (`gpuctl device-plugin`, gpuslice.kube.deviceplugin) in the guest,
against gpuslice.ko and the stand-in driver (tests/standin): the real command, as a
subprocess, with the module.

Covered:
- start: with one profile (gpu-1gi: 1Gi and 10% on GPU 0) the plugin reads the stand-in's
  GPUs through the RM on /dev/nvidiactl (--gpu-source rm) and registers
  gpuslice.dev/gpu-1gi with a test kubelet (tests/kube/dpkubelet.py: real gRPC on
  kubelet.sock, v1beta1) that connects back and reads ListAndWatch: 10 Healthy slots
  (capped by 100% / 10%). The module holds the slot instances dp-gpu-1gi-0-0..9, each with
  a memory limit of exactly 1 GiB, a share of 10% (1000 parts per 10000, the uapi's SHARE
  unit) on GPU 0, nodes of mode 0666; the state file has them (owner device-plugin) and
  the CDI spec (kind gpuslice.dev/gpu) in the CDI directory lists them;
- Allocate of one slot answers the CDI device gpuslice.dev/gpu=<instance> alone; a real
  podman container (tests/guest/podmanlib.py, with require_device_cgroup=Y) started with
  that CDI device has the instance's nodes and no real one, sees 1 GiB of video memory
  (NV2080_CTRL_CMD_FB_GET_INFO_V2, virtualised by the module) and its allocations stop at
  exactly 1 GiB (NV_ERR_NO_MEMORY past it);
- SIGTERM: exit status 0, the plugin's socket removed (kubelet.sock kept), the instances
  stay in the module (the documented behaviour: pods keep running on them); the test
  then deletes them through netlink.

Not covered: a kubelet (its device manager checkpoint and allocation bookkeeping, pod
admission, topology manager, CDI injection: the test passes the CDI device to podman
itself), a kubelet restart, whole-GPU resources (the stand-in has one GPU), an instance
in use at reconcile (EBUSY: tests/test_kube_deviceplugin.py with a fake module), NVML
and CUDA.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice import abi
from gpuslice import state as S
from gpuslice.netlink import GpusliceNetlink

from gsinst import needs_modules, wait_for
from podmanlib import REPO, Podman, check_instance_container

sys.path.append(str(REPO / "tests"))  # the host tests' doubles (tests/kube), after tests/guest
from kube.dpkubelet import DpKubelet  # noqa: E402

pytestmark = needs_modules

GI, MI = 1 << 30, 1 << 20
PROFILE = "gpu-1gi"
RESOURCE = f"gpuslice.dev/{PROFILE}"
SLOTS = 10  # 100% / 10% (the stand-in's ~80 GiB would give 79 of 1 GiB)
INSTANCES = [f"dp-{PROFILE}-0-{n}" for n in range(SLOTS)]
CONFIG = f'profiles: [{{name: {PROFILE}, memory: 1Gi, compute: "10%", gpus: [0]}}]\n'
SPEC_FILE = "gpuslice.dev-device-plugin.yaml"
SOCKET = f"gpuslice-{PROFILE}.sock"
START_TIMEOUT = 120  # seconds: the plugin's start under TCG (imports, RM inventory, reconcile)


class Plugin:
    """`gpuctl device-plugin` as a subprocess, with everything under base, and the test
    kubelet it registers with (started first, as the kubelet is)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.state = base / "state.json"
        self.config = base / "dp.yaml"
        self.config.write_text(CONFIG)
        self.dp_dir = base / "dp"
        self.cdi = base / "cdi"
        self.cdi.mkdir()
        self.spec = self.cdi / SPEC_FILE
        self.log = base / "plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kubelet = DpKubelet(str(self.dp_dir), timeout=START_TIMEOUT)

    def start(self) -> None:
        t0 = time.monotonic()
        self.kubelet.start()
        argv = [sys.executable, "-c", "from gpuslice.cli import main; main()", "--state", str(self.state),
                "--kernel", "yes", "device-plugin", "--config", str(self.config), "--device-plugin-dir",
                str(self.dp_dir), "--cdi-dir", str(self.cdi), "--gpu-source", "rm"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
        try:
            self.kubelet.wait_registered([RESOURCE])
        except AssertionError as e:
            raise AssertionError(f"{e}\nexit status {self.proc.poll()}\n{self.logs()}") from None
        print(f"plugin registered in {time.monotonic() - t0:.1f}s")

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def allocate(self, *containers: list[str]) -> Any:
        return self.kubelet.allocate(RESOURCE, *containers)


def module_instances(nl: GpusliceNetlink) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in nl.instances()}


def delete_instances(nl: GpusliceNetlink, names: list[str]) -> None:
    for name in names:
        try:
            nl.instance_del(name)
        except OSError as e:
            if e.errno != errno.ENOENT:
                print(f"left instance {name}: {e}")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory):
    p = Plugin(tmp_path_factory.mktemp("kube-dp"))
    try:
        p.start()
        yield p
    finally:
        p.kill()
        p.kubelet.stop()
        # what the plugin made (it leaves its instances when it stops): out of the
        # module, so that later tests start clean
        try:
            names = sorted(set(S.load(str(p.state)).instances) | set(INSTANCES))
        except Exception:
            names = list(INSTANCES)
        with GpusliceNetlink() as nl:
            delete_instances(nl, names)


def test_registers_and_makes_the_slot_instances(plugin: Plugin, nl) -> None:
    reg = plugin.kubelet.registrations[0]
    assert (reg.version, reg.endpoint, reg.resource_name) == ("v1beta1", SOCKET, RESOURCE), reg
    devices = plugin.kubelet.wait_devices(RESOURCE, lambda d: len(d) == SLOTS and
                                          all(h == "Healthy" for h in d.values()), "10 healthy slots")
    assert sorted(devices) == sorted(f"gpu0-slot{n}" for n in range(SLOTS)), devices

    mine = {n: d for n, d in module_instances(nl).items() if n.startswith("dp-")}
    assert sorted(mine) == sorted(INSTANCES), mine
    for name, d in mine.items():
        assert d["mem_limit"] == GI and d["share"] == 1000 and d["gpu_mask"] == 1, d
        leaves = sorted(os.listdir(f"/dev/gpuslice/{name}"))
        assert {"nvidiactl", "nvidia0"} <= set(leaves), leaves
        for leaf in leaves:
            assert os.stat(f"/dev/gpuslice/{name}/{leaf}").st_mode & 0o777 == 0o666, (name, leaf)
    st = S.load(str(plugin.state))
    assert sorted(st.instances) == sorted(INSTANCES)
    assert all((i.gpus, i.memory, i.share, i.owner) == ([0], GI, 0.1, "device-plugin")
               for i in st.instances.values()), st.instances
    spec = yaml.safe_load(plugin.spec.read_text())
    assert spec["kind"] == "gpuslice.dev/gpu", spec
    assert sorted(x["name"] for x in spec["devices"]) == sorted(INSTANCES), spec


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup.sh installs it)")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the static test client")
def test_allocated_slot_in_a_container(plugin: Plugin, nl, podman: Podman, devcg_required) -> None:
    resp = plugin.allocate(["gpu0-slot3"])
    (cr,) = resp.container_responses
    inst = INSTANCES[3]
    cdi_id = f"gpuslice.dev/gpu={inst}"
    assert [c.name for c in cr.cdi_devices] == [cdi_id], resp
    assert not cr.devices and not cr.mounts and not cr.envs, resp

    # 768 MiB fit, 512 more do not, the last 256 do, then nothing
    sizes = {768: abi.NV_OK, 512: abi.NV_ERR_NO_MEMORY, 256: abi.NV_OK, 2: abi.NV_ERR_NO_MEMORY}
    check_instance_container(podman, cdi_id, plugin.cdi, inst, GI, sizes)
    assert wait_for(lambda: module_instances(nl)[inst]["mem_used"] == 0), module_instances(nl)[inst]
    d = module_instances(nl)[inst]
    assert d["mem_peak"] == GI and d["nr_refused_quota"] >= 2, d


def test_sigterm_stops_and_leaves_the_instances(plugin: Plugin, nl) -> None:
    assert plugin.proc is not None and plugin.proc.poll() is None, plugin.logs()
    plugin.proc.send_signal(signal.SIGTERM)
    assert plugin.proc.wait(60) == 0, plugin.logs()
    assert sorted(os.listdir(plugin.dp_dir)) == ["kubelet.sock"]  # ours removed, the kubelet's kept
    left = {n: d["mem_limit"] for n, d in module_instances(nl).items() if n in INSTANCES}
    assert left == {n: GI for n in INSTANCES}, left

    delete_instances(nl, INSTANCES)
    assert not set(INSTANCES) & set(module_instances(nl))

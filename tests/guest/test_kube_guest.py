"""The DRA kubelet plugin (`gpuctl kubelet-plugin`) in the guest, against gpuslice.ko and
the stand-in driver (tests/standin): the real command, as a subprocess, with the module.

Covered:
- start: the plugin reads the stand-in's GPUs through the RM on /dev/nvidiactl
  (--gpu-source rm), publishes them to an API server stand-in (tests/kube/apiserver.py,
  real HTTP, reached through a kubeconfig file) as a ResourceSlice with one device per
  stand-in GPU, its memory capacity the GPU's total, allowMultipleAllocations and the
  256Mi memory grid; the registration socket appears and a test kubelet
  (tests/kube/drakubelet.py, real gRPC) registers it;
- a claim allocated 4Gi and 30 compute on gpu-0, prepared through NodePrepareResources
  (v1): the module's instance has a memory limit of exactly 4 GiB and a share of 30%
  (3000 parts per 10000, the uapi's SHARE unit); the state file holds it; the CDI spec
  (kind gpuslice.dev/claim) is in the CDI directory. A real podman container
  (tests/guest/podmanlib.py, with require_device_cgroup=Y) started with the returned CDI
  device ID has the instance's nodes and no real one, sees 4 GiB of video memory
  (NV2080_CTRL_CMD_FB_GET_INFO_V2, virtualised by the module) and its allocations stop at
  exactly 4 GiB (NV_ERR_NO_MEMORY past it). NodeUnprepareResources deletes the instance
  from the module and the state file and removes the spec and the checkpoint entry;
- 64 claims of 256Mi and 1 compute on one GPU, prepared by one call of 32 claims and 4
  calls of 8 at the same time: 64 instances in the module with their limits and shares;
  one unprepare call of all 64 leaves none;
- kill -9 between prepare and unprepare: the instances stay; the restarted plugin
  answers a repeated prepare with the same CDI IDs from its checkpoint (without reading
  the claims again), and unprepare works;
- SIGTERM: exit status 0, both sockets removed.

Not covered: a kubelet (its plugin watcher, claim cache, retries, pod admission and CDI
handling: the test calls the gRPC services and passes the CDI ID to podman itself), an
API server (the stand-in answers what the plugin asks; no authentication, watches or
admission), a scheduler (the allocation results are written by the test, on the grid the
slice publishes), NVML (the stand-in has none), several GPUs in one claim, and CUDA.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice import abi
from gpuslice import state as S
from gpuslice.kube.capacity import parse_quantity
from gpuslice.kube.claims import instance_name
from gpuslice.kube.dra import cdi_spec_path
from gpuslice.netlink import GpusliceNetlink

from gsinst import needs_modules, wait_for
from podmanlib import REPO, Podman, check_instance_container

sys.path.append(str(REPO / "tests"))  # the host tests' doubles (tests/kube), after tests/guest
from kube.apiserver import FakeApiServer  # noqa: E402
from kube.drakubelet import DraKubelet  # noqa: E402

pytestmark = needs_modules

GI, MI = 1 << 30, 1 << 20
NODE = "node-a"
DRIVER = "gpuslice.dev"
NVSTUB = Path("/sys/module/nvstub/parameters")
START_TIMEOUT = 120  # seconds: the plugin's start under TCG (imports, RM inventory, publish)


def claim(uid: str, name: str, memory: str, compute: str, device: str = "gpu-0") -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated on this node's pool, with the
    consumed capacity (tests/test_kube_dra.py's claim() and result())."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"config": [], "results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device, "shareID": str(uuid.uuid4()),
                 "consumedCapacity": {"memory": memory, "compute": compute}}]}}}}


class Plugin:
    """`gpuctl kubelet-plugin` as a subprocess, with everything under base, and the test
    kubelet that talks to it."""

    def __init__(self, base: Path, api: FakeApiServer) -> None:
        self.base = base
        self.api = api
        self.state = base / "state.json"
        self.plugin_dir = base / "plugin"
        self.registry = base / "registry"
        self.cdi = base / "cdi"
        self.cdi.mkdir()
        self.reg_socket = self.registry / f"{DRIVER}-reg.sock"
        self.dra_socket = self.plugin_dir / "dra.sock"
        self.checkpoint = self.plugin_dir / "checkpoint.json"
        self.kubeconfig = api.kubeconfig(base / "kubeconfig")
        self.log = base / "plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kubelet = DraKubelet(str(self.registry), timeout=120)

    def start(self) -> None:
        t0 = time.monotonic()
        argv = [sys.executable, "-c", "from gpuslice.cli import main; main()", "--state", str(self.state),
                "--kernel", "yes", "kubelet-plugin", "--node-name", NODE, "--plugin-dir", str(self.plugin_dir),
                "--registry-dir", str(self.registry), "--cdi-dir", str(self.cdi), "--kubeconfig",
                str(self.kubeconfig), "--gpu-source", "rm"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
        # a killed plugin leaves its socket: ready is when a connect gets through
        assert wait_for(lambda: self.proc.poll() is not None or self.listening(), timeout=START_TIMEOUT,
                        step=0.05), f"no registration socket\n{self.logs()}"
        assert self.proc.poll() is None, f"the plugin exited {self.proc.returncode}\n{self.logs()}"
        print(f"plugin started in {time.monotonic() - t0:.1f}s")

    def listening(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(self.reg_socket))
                return True
            except OSError:
                return False

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def prepare(self, claims: list[tuple[str, str, str]]) -> dict[str, Any]:
        return self.kubelet.prepare(claims)

    def unprepare(self, claims: list[tuple[str, str, str]]) -> dict[str, str]:
        return self.kubelet.unprepare(claims)

    def checkpoint_claims(self) -> dict[str, Any]:
        return json.loads(self.checkpoint.read_text())["claims"]

    def spec(self, uid: str) -> Path:
        return Path(cdi_spec_path(str(self.cdi), uid))

    def cleanup(self, refs: list[tuple[str, str, str]]) -> None:
        """After a failed test: unprepare what it left (errors ignored), so that the next
        test starts with no claim prepared."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.unprepare(refs)
            except Exception as e:  # noqa: BLE001 - the test's own failure is what matters
                print(f"cleanup: {e}")


def module_instances(nl: GpusliceNetlink) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in nl.instances()}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("kube")
    with FakeApiServer() as api:
        api.add_node(NODE)
        p = Plugin(base, api)
        try:
            p.start()
            p.kubelet.register()
            yield p
        finally:
            p.kill()
            # what a failed test left: out of the module, so that later tests start clean
            try:
                names = list(S.load(str(p.state)).instances)
            except Exception:
                names = []
            if names:
                with GpusliceNetlink() as nl:
                    for name in names:
                        try:
                            nl.instance_del(name)
                        except OSError as e:
                            if e.errno != errno.ENOENT:
                                print(f"left instance {name}: {e}")


@pytest.fixture
def refs(plugin: Plugin):
    """The claims a test prepares, as (namespace, uid, name): unprepared after it (again:
    the test unprepares them itself; this is for a test that failed half-way)."""
    out: list[tuple[str, str, str]] = []
    yield out
    if out:
        plugin.cleanup(out)


def test_registers_and_publishes_the_stand_in_gpus(plugin: Plugin) -> None:
    info = plugin.kubelet.info
    assert info is not None
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(plugin.dra_socket))
    assert "v1.DRAPlugin" in info.versions
    num_gpus = int((NVSTUB / "num_gpus").read_text())
    fb = int((NVSTUB / "fb_mib").read_text()) * MI
    slices = [s for s in plugin.api.slices() if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE]
    devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    assert sorted(devices) == sorted(f"gpu-{i}" for i in range(num_gpus)), devices
    for i in range(num_gpus):
        d = devices[f"gpu-{i}"]
        assert d["allowMultipleAllocations"] is True, d
        mem, comp = d["capacity"]["memory"], d["capacity"]["compute"]
        assert parse_quantity(mem["value"]) == fb, mem
        rng = mem["requestPolicy"]["validRange"]
        assert parse_quantity(rng["min"]) == 256 * MI and parse_quantity(rng["step"]) == 256 * MI, mem
        assert parse_quantity(comp["value"]) == 100, comp
        assert d["attributes"]["index"] == {"int": i} and d["attributes"]["uuid"]["string"].startswith("GPU-"), d


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup.sh installs it)")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the static test client")
def test_claim_becomes_an_instance_a_container_uses(plugin: Plugin, nl, podman: Podman, devcg_required,
                                                    refs: list[tuple[str, str, str]]) -> None:
    uid = str(uuid.uuid4())
    c = plugin.api.add_claim(claim(uid, "big", "4Gi", "30"))
    inst = instance_name(uid)
    ref = ("default", uid, "big")
    refs.append(ref)
    resp = plugin.prepare([ref])
    r = resp[uid]
    assert r.error == ""
    cdi_id = f"gpuslice.dev/claim={inst}"
    (dev,) = r.devices
    share_id = c["status"]["allocation"]["devices"]["results"][0]["shareID"]
    assert (list(dev.request_names), dev.pool_name, dev.device_name, list(dev.cdi_device_ids), dev.share_id) == \
        (["gpu"], NODE, "gpu-0", [cdi_id], share_id)

    d = module_instances(nl)[inst]
    assert d["mem_limit"] == 4 * GI and d["share"] == 3000 and d["gpu_mask"] == 1, d
    si = S.load(str(plugin.state)).instances[inst]
    assert (si.gpus, si.memory, si.share, si.owner) == ([0], 4 * GI, 0.3, "kubelet-plugin"), si
    spec = yaml.safe_load(plugin.spec(uid).read_text())
    assert spec["kind"] == "gpuslice.dev/claim" and [x["name"] for x in spec["devices"]] == [inst], spec
    assert plugin.checkpoint_claims()[uid]["state"] == "prepared"

    # the container: 3 GiB fit, 2 GiB more do not, the last 1 GiB does, then nothing
    sizes = {3072: abi.NV_OK, 2048: abi.NV_ERR_NO_MEMORY, 1024: abi.NV_OK, 2: abi.NV_ERR_NO_MEMORY}
    check_instance_container(podman, cdi_id, plugin.cdi, inst, 4 * GI, sizes)
    assert wait_for(lambda: module_instances(nl)[inst]["mem_used"] == 0), module_instances(nl)[inst]
    d = module_instances(nl)[inst]
    assert d["mem_peak"] == 4 * GI and d["nr_refused_quota"] >= 2, d

    # its nodes are 0666 (a container need not run as root), also when `gpuctl instance
    # restore` makes it again after the module lost it (a reboot)
    node = Path(f"/dev/gpuslice/{inst}/nvidiactl")
    assert node.stat().st_mode & 0o777 == 0o666
    nl.instance_del(inst)
    r = subprocess.run([sys.executable, "-c", "from gpuslice.cli import main; main()", "--state", str(plugin.state),
                        "--kernel", "yes", "instance", "restore"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
    assert r.returncode == 0 and inst in r.stdout, r.stderr
    assert wait_for(node.exists) and node.stat().st_mode & 0o777 == 0o666

    assert plugin.unprepare([ref]) == {uid: ""}
    assert inst not in module_instances(nl)
    assert inst not in S.load(str(plugin.state)).instances
    assert not plugin.spec(uid).exists()
    assert uid not in plugin.checkpoint_claims()


def test_64_claims_on_one_gpu(plugin: Plugin, nl, refs: list[tuple[str, str, str]]) -> None:
    for i in range(64):
        uid = str(uuid.uuid4())
        plugin.api.add_claim(claim(uid, f"small-{i}", "256Mi", "1"))
        refs.append(("default", uid, f"small-{i}"))
    batches = [refs[:32]] + [refs[32 + 8 * k:40 + 8 * k] for k in range(4)]
    with ThreadPoolExecutor(len(batches)) as ex:
        answers = list(ex.map(plugin.prepare, batches))
    got = {uid: r for a in answers for uid, r in a.items()}
    assert sorted(got) == sorted(u for _n, u, _m in refs)
    bad = {uid: r.error for uid, r in got.items() if r.error}
    assert not bad, bad
    for _ns, uid, _name in refs:
        assert [list(d.cdi_device_ids) for d in got[uid].devices] == [[f"gpuslice.dev/claim={instance_name(uid)}"]]

    names = {instance_name(u) for _n, u, _m in refs}
    mine = {n: d for n, d in module_instances(nl).items() if n in names}
    assert len(mine) == 64
    assert all(d["mem_limit"] == 256 * MI and d["share"] == 100 and d["gpu_mask"] == 1 for d in mine.values()), mine
    assert set(S.load(str(plugin.state)).instances) == names
    assert len(list(plugin.cdi.glob(f"{DRIVER}-claim_*.yaml"))) == 64

    assert plugin.unprepare(refs) == {u: "" for _n, u, _m in refs}
    assert not names & set(module_instances(nl))
    assert not S.load(str(plugin.state)).instances
    assert not list(plugin.cdi.glob("*.yaml"))
    assert plugin.checkpoint_claims() == {}


def test_kill_9_then_restart_answers_from_the_checkpoint(plugin: Plugin, nl,
                                                         refs: list[tuple[str, str, str]]) -> None:
    for i, (mem, comp) in enumerate((("512Mi", "5"), ("1Gi", "10"))):
        uid = str(uuid.uuid4())
        plugin.api.add_claim(claim(uid, f"kept-{i}", mem, comp))
        refs.append(("default", uid, f"kept-{i}"))
    first = plugin.prepare(refs)
    assert all(r.error == "" for r in first.values()), first
    ids = {uid: [list(d.cdi_device_ids) for d in r.devices] for uid, r in first.items()}
    names = {instance_name(u): lim for (_n, u, _m), lim in zip(refs, (512 * MI, GI))}

    plugin.kill()
    assert plugin.proc is not None and plugin.proc.returncode == -signal.SIGKILL
    assert {n: d["mem_limit"] for n, d in module_instances(nl).items() if n in names} == names

    plugin.start()
    plugin.kubelet.register()
    plugin.api.clear_log()
    again = plugin.prepare(refs)
    assert {uid: [list(d.cdi_device_ids) for d in r.devices] for uid, r in again.items()} == ids
    assert all(r.error == "" for r in again.values()), again
    assert not [p for m, p in plugin.api.log if "/resourceclaims/" in p], plugin.api.log
    assert {n: d["mem_limit"] for n, d in module_instances(nl).items() if n in names} == names

    assert plugin.unprepare(refs) == {u: "" for _n, u, _m in refs}
    assert not set(names) & set(module_instances(nl))
    assert not S.load(str(plugin.state)).instances and plugin.checkpoint_claims() == {}


def test_sigterm_stops_the_plugin(plugin: Plugin) -> None:
    assert plugin.proc is not None and plugin.proc.poll() is None, plugin.logs()
    plugin.proc.send_signal(signal.SIGTERM)
    assert plugin.proc.wait(60) == 0, plugin.logs()
    assert not plugin.reg_socket.exists() and not plugin.dra_socket.exists()

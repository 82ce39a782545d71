"""The device plugin (gpuslice.kube.deviceplugin, `gpuctl device-plugin`): its config,
slot planning, and contract tests with a test kubelet (tests/kube/dpkubelet.py) over
real gRPC on unix sockets with the vendored v1beta1 protos, and the state file (no
module: --kernel no, or a fake netlink client where the module's answers matter, such
as EBUSY for an instance whose nodes are open).

What the test kubelet covers: Register on kubelet.sock (version, endpoint, resource,
options), connecting back to the plugin's socket, GetDevicePluginOptions, the
ListAndWatch stream, Allocate and PreStartContainer, a kubelet restart (a new
kubelet.sock, the other sockets wiped). What it does not: no real kubelet, so no
device checkpoint or allocation bookkeeping, no pod admission or topology manager, no
container runtime (the CDI devices answered are checked against the spec file, not
injected), no API server (node capacity).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings, strategies as hst

from gpuslice.netlink import CAPS
from gpuslice.ops import cdi
from gpuslice import state as S
from gpuslice.kube import deviceplugin as DP
from gpuslice.kube.inventory import GpuInfo

from kube.dpkubelet import DpKubelet

GI = 1 << 30
REPO = Path(__file__).resolve().parent.parent


def gpu(minor: int, memory: int = 80 * GI, bus: str | None = None) -> GpuInfo:
    return GpuInfo(minor, f"GPU-{minor:08x}-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", "9.0",
                   "580.95.05", bus or f"0000:{0x18 + minor:02x}:00.0", memory)


# ---- config ----------------------------------------------------------------------------

GOOD = """
profiles:
  - name: gpu-8gi
    memory: 8Gi
    compute: 12%
    gpus: [0, 1]
  - name: small
    memory: 4GiB
    gpus: 2
    slots: 3
  - name: rest
    memory: 10737418240
"""


def test_config_good() -> None:
    c = DP.load_config(GOOD)
    assert [p.name for p in c.profiles] == ["gpu-8gi", "small", "rest"]
    p8, small, rest = c.profiles
    assert p8 == DP.Profile("gpu-8gi", 8 * GI, 0.12, (0, 1), None)
    assert p8.resource == "gpuslice.dev/gpu-8gi"
    assert small == DP.Profile("small", 4 * GI, None, (2,), 3)
    assert rest == DP.Profile("rest", 10 * GI, None, None, None)
    assert DP.load_config("") == DP.Config(())
    assert DP.load_config("profiles: []") == DP.Config(())


@pytest.mark.parametrize("text, err", [
    ("profile: []", "unknown key 'profile'"),
    ("- a", "top level must be a mapping"),
    ("profiles: {name: a}", "'profiles' must be a list"),
    ("profiles: [a]", "profiles[0]: must be a mapping"),
    ("profiles: [{name: a, memory: 1Gi, colour: red}]", "profile a: unknown key 'colour'"),
    ("profiles: [{memory: 1Gi}]", "profiles[0]: 'name' is missing"),
    ("profiles: [{name: a}]", "profile a: 'memory' is missing"),
    ("profiles: [{name: -a, memory: 1Gi}]", "gpuslice.dev/-a is not a valid extended resource name"),
    ("profiles: [{name: 'a/b', memory: 1Gi}]", "not a valid extended resource name"),
    ("profiles: [{name: 'a b', memory: 1Gi}]", "not a valid extended resource name"),
    (f"profiles: [{{name: {'a' * 64}, memory: 1Gi}}]", "not a valid extended resource name"),
    ("profiles: [{name: gpu, memory: 1Gi}]", "gpuslice.dev/gpu is the resource of whole GPUs"),
    ("profiles: [{name: a, memory: 8 apples}]", "profile a: memory: not a size"),
    ("profiles: [{name: a, memory: 0}]", "profile a: memory: size must be positive"),
    ("profiles: [{name: a, memory: -1Gi}]", "profile a: memory: not a size"),
    ("profiles: [{name: a, memory: 1Gi, compute: 150%}]", "profile a: compute: share must be in"),
    ("profiles: [{name: a, memory: 1Gi, compute: lots}]", "profile a: compute: not a share"),
    ("profiles: [{name: a, memory: 1Gi, gpus: []}]", "profile a: gpus must be a list"),
    ("profiles: [{name: a, memory: 1Gi, gpus: [0, 0]}]", "profile a: gpus must be a list"),
    ("profiles: [{name: a, memory: 1Gi, gpus: [32]}]", "profile a: gpus must be a list"),
    ("profiles: [{name: a, memory: 1Gi, gpus: [true]}]", "profile a: gpus must be a list"),
    ("profiles: [{name: a, memory: 1Gi, slots: 0}]", "profile a: slots must be a number 1..64"),
    ("profiles: [{name: a, memory: 1Gi, compute: 30%, slots: 4}]", "4 slots of 30.0% sum to 120.0% of a GPU"),
    ("profiles: [{name: a, memory: 1Gi, gpus: [0, 1]}, {name: b, memory: 2Gi, gpus: [1]}]",
     "GPU 1 is in two profiles: a and b"),
    ("profiles: [{name: a, memory: 1Gi}, {name: b, memory: 2Gi}]", "profiles a and b both take every other GPU"),
    ("profiles: [{name: a, memory: 1Gi, gpus: [0]}, {name: a, memory: 2Gi, gpus: [1]}]",
     "profile a: the name is used twice"),
    ("profiles: [{name: a, memory: 1Gi", "config is not YAML"),
])
def test_config_bad(text: str, err: str) -> None:
    with pytest.raises(DP.ConfigError) as e:
        DP.load_config(text)
    assert err in str(e.value)
    assert "\n" not in str(e.value)


def test_plan_errors_that_need_the_gpus() -> None:
    c = DP.load_config("profiles: [{name: big, memory: 96Gi, gpus: [0]}]")
    with pytest.raises(DP.ConfigError, match=r"profile big: memory 96GiB is more than GPU 0 has \(80GiB\)"):
        DP.plan_slots(c, [gpu(0)])
    c = DP.load_config("profiles: [{name: a, memory: 8Gi, gpus: [3]}]")
    with pytest.raises(DP.ConfigError, match=r"profile a: GPU 3 is not on this node \(GPUs: 0, 1\)"):
        DP.plan_slots(c, [gpu(0), gpu(1)])


# ---- slots -----------------------------------------------------------------------------

def test_plan_slots_example() -> None:
    c = DP.load_config(GOOD)
    plan = DP.plan_slots(c, [gpu(0), gpu(1), gpu(2), gpu(3), gpu(4, 40 * GI)],
                         numa=lambda b: 1 if b == "0000:19:00.0" else None)
    assert list(plan) == ["gpuslice.dev/gpu-8gi", "gpuslice.dev/rest", "gpuslice.dev/small"]
    s8 = plan["gpuslice.dev/gpu-8gi"]
    assert len(s8) == 16  # 80Gi / 8Gi = 10, capped by 100% / 12% = 8; on two GPUs
    assert s8[0] == DP.Slot("gpuslice.dev/gpu-8gi", "gpu0-slot0", "dp-gpu-8gi-0-0", 0, 8 * GI, 0.12, None)
    assert s8[-1].device_id == "gpu1-slot7" and s8[-1].instance == "dp-gpu-8gi-1-7" and s8[-1].numa_node == 1
    assert [s.device_id for s in plan["gpuslice.dev/small"]] == ["gpu2-slot0", "gpu2-slot1", "gpu2-slot2"]
    rest = plan["gpuslice.dev/rest"]  # every GPU no other profile names
    assert {s.gpu for s in rest} == {3, 4} and len(rest) == 8 + 4
    # no profile takes the rest: those GPUs are whole
    c2 = DP.load_config("profiles: [{name: a, memory: 40Gi, gpus: [1]}]")
    plan2 = DP.plan_slots(c2, [gpu(0), gpu(1), gpu(2)])
    assert plan2["gpuslice.dev/gpu"] == [DP.Slot("gpuslice.dev/gpu", f"gpu{m}", f"dp-gpu-{m}", m, 80 * GI, None)
                                         for m in (0, 2)]
    assert [s.device_id for s in plan2["gpuslice.dev/a"]] == ["gpu1-slot0", "gpu1-slot1"]
    # a profile with no GPU left is not advertised
    c3 = DP.load_config("profiles: [{name: a, memory: 40Gi, gpus: [0]}, {name: b, memory: 8Gi}]")
    assert list(DP.plan_slots(c3, [gpu(0)])) == ["gpuslice.dev/a"]
    assert DP.plan_slots(DP.Config(), []) == {}


def test_instance_names_short_stable_distinct() -> None:
    long1, long2 = "x" * 40 + "-one", "x" * 40 + "-two"
    n1, n2 = DP.instance_name(long1, 31, 63), DP.instance_name(long2, 31, 63)
    assert n1 != n2 and len(n1) <= 31 and len(n2) <= 31
    assert n1 == DP.instance_name(long1, 31, 63)
    assert S.valid_name(n1) and cdi.is_cdi_name(n1)
    assert DP.instance_name("gpu-8gi", 0, 3) == "dp-gpu-8gi-0-3"


NAME = hst.from_regex(r"[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?", fullmatch=True).filter(lambda n: n != "gpu")


@hst.composite
def configs(draw: Any) -> tuple[DP.Config, list[GpuInfo]]:
    mems = draw(hst.lists(hst.integers(1, 96).map(lambda g: g * GI), min_size=1, max_size=6))
    gpus = [gpu(i, m) for i, m in enumerate(mems)]
    names = draw(hst.lists(NAME, min_size=0, max_size=4, unique=True))
    owners = draw(hst.lists(hst.sampled_from([None, *range(len(names))]), min_size=len(gpus), max_size=len(gpus)))
    rest = draw(hst.sampled_from([None, *range(len(names))])) if names else None
    profiles = []
    for i, n in enumerate(names):
        mine = tuple(g.minor for g, o in zip(gpus, owners) if o == i)
        smallest = min((g.memory for g in gpus if g.minor in mine), default=96 * GI)
        if rest == i:
            mine_opt = None
            smallest = min(g.memory for g in gpus)
        elif not mine:
            continue
        else:
            mine_opt = mine
        memory = draw(hst.integers(1 << 20, smallest))
        ppt = draw(hst.none() | hst.integers(1, 10000))
        slots = draw(hst.none() | hst.integers(1, 64))
        if ppt is not None and slots is not None and slots * ppt > 10000:
            slots = 10000 // ppt
        profiles.append(DP.Profile(n, memory, None if ppt is None else ppt / 10000, mine_opt, slots))
    return DP.Config(tuple(profiles)), gpus


@settings(max_examples=200, deadline=None)
@given(configs())
def test_plan_slots_never_overcommits(cg: tuple[DP.Config, list[GpuInfo]]) -> None:
    config, gpus = cg
    plan = DP.plan_slots(config, gpus)
    slots = [s for ss in plan.values() for s in ss]
    for g in gpus:
        mine = [s for s in slots if s.gpu == g.minor]
        assert mine, f"GPU {g.minor} advertised nowhere"
        assert len({s.resource for s in mine}) == 1, "a GPU in two resources"
        assert sum(s.memory for s in mine) <= g.memory
        assert sum(round(s.share * 10000) for s in mine if s.share is not None) <= 10000
        assert len(mine) <= DP.MAX_SLOTS_PER_GPU
    names = [s.instance for s in slots]
    assert len(set(names)) == len(names)
    assert all(S.valid_name(n) and cdi.is_cdi_name(n) for n in names)
    for r, ss in plan.items():
        ids = [s.device_id for s in ss]
        assert len(set(ids)) == len(ids) and all(len(i) <= 63 for i in ids)
        assert all(s.resource == r for s in ss)
    # deterministic: the same plan again
    assert DP.plan_slots(config, gpus) == plan


# ---- the plugin, through the test kubelet ------------------------------------------------

class FakeNetlink:
    """The module's instance table: names made, deleted, and those whose nodes are open."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.busy: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def instances(self, name: str | None = None) -> list[dict[str, Any]]:
        return [{"name": n, "gpu_mask": 1} for n in sorted(self.names)]

    def instance_new(self, name: str, gpu_mask: int, mem_limit: int, **attrs: Any) -> None:
        if name in self.names:
            raise OSError(errno.EEXIST, "exists")
        self.calls.append(("new", name))
        self.names.add(name)

    def instance_del(self, name: str) -> None:
        if name in self.busy:
            raise OSError(errno.EBUSY, "Device or resource busy")
        if name not in self.names:
            raise OSError(errno.ENOENT, "no such instance")
        self.calls.append(("del", name))
        self.names.discard(name)


class Env:
    def __init__(self, root: str) -> None:
        self.root = root
        self.dir = os.path.join(root, "dp")
        self.cdi_dir = os.path.join(root, "cdi")
        self.state = os.path.join(root, "state.json")
        self.spec = os.path.join(self.cdi_dir, DP.SPEC_FILE)
        self.kubelet = DpKubelet(self.dir)
        self.running: list[tuple[DP.DevicePlugin, threading.Event, threading.Thread]] = []

    def plugin(self, config: str, gpus: list[GpuInfo], nl: Any = None, retry: float = 0.2,
               resync: float = 60.0) -> DP.DevicePlugin:
        slots = DP.plan_slots(DP.load_config(config), gpus)
        p = DP.DevicePlugin(slots, self.state, nl, plugin_dir=self.dir, cdi_dir=self.cdi_dir, poll=0.05, retry=retry,
                            resync=resync)
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                p.run(stop)
            except BaseException as e:  # reported by stop_plugin
                errors.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        p._test_errors = errors  # type: ignore[attr-defined]
        self.running.append((p, stop, t))
        return p

    def stop_plugin(self, p: DP.DevicePlugin) -> None:
        for q, stop, t in list(self.running):
            if q is p:
                stop.set()
                t.join(10)
                assert not t.is_alive()
                self.running.remove((q, stop, t))
                assert not p._test_errors, p._test_errors  # type: ignore[attr-defined]

    def ours(self) -> dict[str, S.Instance]:
        return {n: i for n, i in S.load(self.state).instances.items() if i.owner == DP.OWNER}

    def spec_devices(self) -> list[str]:
        if not os.path.exists(self.spec):
            return []
        with open(self.spec) as f:
            doc = yaml.safe_load(f)
        assert doc["kind"] == "gpuslice.dev/gpu" and doc["cdiVersion"] == cdi.CDI_VERSION
        assert cdi.check_spec(doc) == []
        return [d["name"] for d in doc["devices"]]

    def close(self) -> None:
        for p, _stop, _t in list(self.running):
            self.stop_plugin(p)
        self.kubelet.stop()


@pytest.fixture
def env() -> Iterator[Env]:
    root = tempfile.mkdtemp(prefix="gsdp", dir="/tmp")  # unix socket paths: at most 107 bytes
    e = Env(root)
    e.kubelet.start()
    try:
        yield e
    finally:
        e.close()
        shutil.rmtree(root, ignore_errors=True)


CFG = """
profiles:
  - name: gpu-8gi
    memory: 8Gi
    compute: 20%
    gpus: [0]
"""
R8, RW = "gpuslice.dev/gpu-8gi", "gpuslice.dev/gpu"
TWO = [gpu(0), gpu(1)]


def test_registration_per_resource(env: Env) -> None:
    env.plugin(CFG, TWO)
    plugins = env.kubelet.wait_registered([R8, RW])
    assert sorted(r.resource_name for r in env.kubelet.registrations) == [RW, R8]
    for r, sock in ((R8, "gpuslice-gpu-8gi.sock"), (RW, "gpuslice-gpu.sock")):
        req = plugins[r].request
        assert req.version == "v1beta1" and req.endpoint == sock
        assert not req.options.pre_start_required and not req.options.get_preferred_allocation_available
        opts = env.kubelet.wait_for(lambda: plugins[r].options, "options")
        assert not opts.pre_start_required and not opts.get_preferred_allocation_available
        assert os.path.exists(os.path.join(env.dir, sock))


def test_list_and_watch(env: Env) -> None:
    env.plugin(CFG, TWO)
    plugins = env.kubelet.wait_registered([R8, RW])
    healthy = env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    assert sorted(healthy) == sorted(f"gpu0-slot{i}" for i in range(5))  # 100% / 20%
    assert env.kubelet.wait_devices(RW, lambda d: d == {"gpu1": "Healthy"})
    assert plugins[R8].error is None


def test_allocate_answers_cdi_devices_of_existing_instances(env: Env) -> None:
    env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: d.get("gpu0-slot3") == "Healthy")
    resp = env.kubelet.allocate(R8, ["gpu0-slot3"], ["gpu0-slot1"])  # a pod of two containers
    names = [[c.name for c in cr.cdi_devices] for cr in resp.container_responses]
    assert names == [["gpuslice.dev/gpu=dp-gpu-8gi-0-3"], ["gpuslice.dev/gpu=dp-gpu-8gi-0-1"]]
    for cr in resp.container_responses:
        assert not cr.devices and not cr.mounts and not cr.envs and not cr.annotations
    ours = env.ours()
    inst = ours["dp-gpu-8gi-0-3"]
    assert inst.gpus == [0] and inst.memory == 8 * GI and inst.share == pytest.approx(0.2)
    assert S.load(env.state).policy_of(0).policy == "fixed"
    assert "dp-gpu-8gi-0-3" in env.spec_devices() and "dp-gpu-1" in env.spec_devices()
    whole = env.kubelet.allocate(RW, ["gpu1"])
    assert [c.name for c in whole.container_responses[0].cdi_devices] == ["gpuslice.dev/gpu=dp-gpu-1"]
    assert ours["dp-gpu-1"].memory == 80 * GI and ours["dp-gpu-1"].share is None
    assert sorted(ours) == sorted(env.spec_devices())
    assert env.kubelet.pre_start(R8, ["gpu0-slot3"]) is not None


@pytest.mark.parametrize("resource, containers, code, text", [
    (R8, [["gpu0-slot0", "gpu0-slot1"]], grpc.StatusCode.INVALID_ARGUMENT, "gpuslice.dev/gpu-8gi: one per container"),
    (RW, [["gpu1", "gpu0"]], grpc.StatusCode.INVALID_ARGUMENT, "unknown device ID 'gpu0'"),
    (R8, [["gpu0-slot9"]], grpc.StatusCode.INVALID_ARGUMENT, "unknown device ID 'gpu0-slot9'"),
    (R8, [["gpu0-slot0"], ["nope"]], grpc.StatusCode.INVALID_ARGUMENT, "unknown device ID 'nope'"),
    (R8, [[]], grpc.StatusCode.INVALID_ARGUMENT, "one per container"),
])
def test_allocate_errors_create_nothing(env: Env, resource: str, containers: list[list[str]],
                                        code: grpc.StatusCode, text: str) -> None:
    env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5)
    with open(env.state) as f:
        before = f.read()
    spec_before = env.spec_devices()
    with pytest.raises(grpc.RpcError) as e:
        env.kubelet.allocate(resource, *containers)
    assert e.value.code() == code and text in e.value.details()
    with open(env.state) as f:
        assert f.read() == before
    assert env.spec_devices() == spec_before


def test_kubelet_restart_reregisters(env: Env) -> None:
    env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.restart(wipe=True)  # a new kubelet.sock; the plugin sockets are gone
    plugins = env.kubelet.wait_registered([R8, RW], count=2)
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    assert os.path.exists(os.path.join(env.dir, "gpuslice-gpu-8gi.sock"))
    resp = env.kubelet.allocate(RW, ["gpu1"])
    assert resp.container_responses[0].cdi_devices[0].name == "gpuslice.dev/gpu=dp-gpu-1"
    assert plugins[RW].error is None
    env.kubelet.restart(wipe=False)  # the sockets stay: still a new kubelet, registered with again
    env.kubelet.wait_registered([R8, RW], count=3)


def test_kubelet_later_than_plugin(env: Env) -> None:
    env.kubelet.stop()
    p = env.plugin(CFG, TWO)
    env.kubelet.wait_for(lambda: all(r.server is not None for r in p.resources.values()), "servers")
    time.sleep(0.2)
    env.kubelet.start()
    env.kubelet.wait_registered([R8, RW])


def test_plugin_restart_keeps_instances(env: Env) -> None:
    p = env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5)
    first = env.ours()
    assert len(first) == 6
    env.stop_plugin(p)
    assert not os.path.exists(os.path.join(env.dir, "gpuslice-gpu-8gi.sock"))
    assert not os.path.exists(os.path.join(env.dir, "gpuslice-gpu.sock"))
    assert os.path.exists(env.kubelet.socket)
    assert env.ours() == first  # stopping leaves the instances
    nl = FakeNetlink()
    nl.names = set(first)  # the module has them too
    env.plugin(CFG, TWO, nl=nl)
    env.kubelet.wait_registered([R8, RW], count=2)
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    assert env.ours() == first and nl.calls == []  # nothing deleted or made again
    assert sorted(env.spec_devices()) == sorted(first)


def test_restart_recreates_instances_the_module_lost(env: Env) -> None:
    p = env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.stop_plugin(p)
    nl = FakeNetlink()  # module reloaded: it knows none of them
    env.plugin(CFG, TWO, nl=nl)
    env.kubelet.wait_registered([R8, RW], count=2)
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    assert nl.names == set(env.ours()) and len(nl.names) == 6


def test_profile_capabilities_reach_the_module_the_state_and_the_cdi_spec(env: Env) -> None:
    """A profile's capabilities are its slots' instances' capability set: in the module
    (INSTANCE_NEW's caps), the state file and each CDI device's
    NVIDIA_DRIVER_CAPABILITIES; a change of them re-makes the instances (a kept
    instance would keep the old set), and a profile without them gets all."""
    assert DP.load_config("profiles: [{name: a, memory: 1Gi}]").profiles[0].caps is None
    assert DP.load_config("profiles: [{name: a, memory: 1Gi, capabilities: all}]").profiles[0].caps is None
    nl = FakeNetlink()
    made: dict[str, Any] = {}
    new = nl.instance_new

    def instance_new(name: str, gpu_mask: int, mem_limit: int, **attrs: Any) -> None:
        new(name, gpu_mask, mem_limit, **attrs)
        made[name] = attrs.get("caps")

    nl.instance_new = instance_new  # type: ignore[method-assign]
    cfg = CFG + "    capabilities: compute,utility\n"
    p = env.plugin(cfg, TWO, nl=nl)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5)
    env.stop_plugin(p)
    want = CAPS['compute'] | CAPS['utility']
    assert {n: c for n, c in made.items() if n.startswith("dp-gpu-8gi")} == {f"dp-gpu-8gi-0-{i}": want
                                                                           for i in range(5)}
    assert made["dp-gpu-1"] is None  # a whole GPU: all
    ours = env.ours()
    assert ours["dp-gpu-8gi-0-2"].caps == want and ours["dp-gpu-1"].caps is None
    with open(env.spec) as f:
        envs = {d["name"]: d["containerEdits"]["env"] for d in yaml.safe_load(f)["devices"]}
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in envs["dp-gpu-8gi-0-2"], envs
    assert "NVIDIA_DRIVER_CAPABILITIES=all" in envs["dp-gpu-1"], envs

    made.clear()
    p = env.plugin(cfg.replace("compute,utility", "graphics,utility"), TWO, nl=nl)
    env.kubelet.wait_registered([R8, RW], count=2)
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    env.stop_plugin(p)
    assert {n: c for n, c in made.items()} == {f"dp-gpu-8gi-0-{i}": CAPS['graphics'] | CAPS['utility'] for i in range(5)}
    assert ("del", "dp-gpu-8gi-0-0") in nl.calls


@pytest.mark.parametrize("caps, err", [("'compute,gpu'", "capabilities: unknown capability 'gpu'"), ("[compute]", "capabilities must be")])
def test_profile_capabilities_bad(caps: str, err: str) -> None:
    with pytest.raises(DP.ConfigError, match=f"profile a: {re.escape(err)}"):
        DP.load_config(f"profiles: [{{name: a, memory: 1Gi, capabilities: {caps}}}]")


def test_config_change_busy_instances(env: Env) -> None:
    nl = FakeNetlink()
    p = env.plugin(CFG, TWO, nl=nl)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5)
    env.stop_plugin(p)
    nl.busy = {"dp-gpu-8gi-0-0", "dp-gpu-8gi-0-4"}  # containers hold these
    # slot 0 changes (memory), slot 4 goes away (5 -> 4 slots)
    new = CFG.replace("memory: 8Gi", "memory: 16Gi").replace("compute: 20%", "compute: 25%")
    env.plugin(new, TWO, nl=nl)
    env.kubelet.wait_registered([R8, RW], count=2)
    devs = env.kubelet.wait_devices(R8, lambda d: len(d) == 4 and d["gpu0-slot1"] == "Healthy")
    # slot 3 does not fit yet: the two busy instances still hold their 20% each (fixed
    # shares of GPU 0: 20 + 20 + 25 + 25 = 90%, a third 25% would be 115%)
    assert devs == {"gpu0-slot0": "Unhealthy", "gpu0-slot1": "Healthy", "gpu0-slot2": "Healthy",
                    "gpu0-slot3": "Unhealthy"}
    problems = env.running[-1][0].outcome.problems
    assert "in use" in problems["dp-gpu-8gi-0-0"] and "115.0% > 100%" in problems["dp-gpu-8gi-0-3"]
    ours = env.ours()
    assert ours["dp-gpu-8gi-0-0"].memory == 8 * GI  # left as it was
    assert ours["dp-gpu-8gi-0-1"].memory == 16 * GI and ours["dp-gpu-8gi-0-1"].share == pytest.approx(0.25)
    assert "dp-gpu-8gi-0-4" in ours and "dp-gpu-8gi-0-4" in env.spec_devices()  # still used: kept in the spec
    with pytest.raises(grpc.RpcError) as e:
        env.kubelet.allocate(R8, ["gpu0-slot0"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    stamp = S.file_stamp(env.state)
    time.sleep(0.5)  # two retries that change nothing: the state file is not rewritten
    assert S.file_stamp(env.state) == stamp
    nl.busy = set()  # the containers ended: the retry deletes and re-makes
    env.kubelet.wait_devices(R8, lambda d: all(h == "Healthy" for h in d.values()), "all healthy after the retry")
    ours = env.ours()
    assert sorted(ours) == sorted([f"dp-gpu-8gi-0-{i}" for i in range(4)] + ["dp-gpu-1"])
    assert all(i.memory == 16 * GI for n, i in ours.items() if n != "dp-gpu-1")
    assert sorted(env.spec_devices()) == sorted(ours) and nl.names == set(ours)


def test_hand_made_instances_left_alone(env: Env) -> None:
    with S.locked(env.state) as st:
        st.instances["dp-gpu-1"] = S.Instance("dp-gpu-1", [1], GI)  # a slot's name, made by hand
        st.instances["web"] = S.Instance("web", [1], GI)
    env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    assert env.kubelet.wait_devices(RW, lambda d: d == {"gpu1": "Unhealthy"})
    st = S.load(env.state)
    assert st.instances["dp-gpu-1"].owner is None and st.instances["dp-gpu-1"].memory == GI
    assert "web" in st.instances
    assert "dp-gpu-1" not in env.spec_devices() and "web" not in env.spec_devices()
    # the hand-made one goes: the plugin notices the state file changed and makes its own
    with S.locked(env.state) as st:
        del st.instances["dp-gpu-1"]
    env.kubelet.wait_devices(RW, lambda d: d == {"gpu1": "Healthy"})
    assert env.ours()["dp-gpu-1"].memory == 80 * GI


def test_unrelated_state_changes_are_not_rewritten(env: Env) -> None:
    env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
    with S.locked(env.state) as st:
        st.instances["web"] = S.Instance("web", [1], GI)  # `gpuctl instance create web`
    stamp = S.file_stamp(env.state)
    time.sleep(0.5)  # ten polls, two retry periods
    assert S.file_stamp(env.state) == stamp
    assert "web" not in env.spec_devices()


def test_resync_remakes_what_the_module_lost(env: Env) -> None:
    nl = FakeNetlink()
    env.plugin(CFG, TWO, nl=nl, resync=0.1)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_for(lambda: len(nl.names) == 6, "six instances in the module")
    nl.names.clear()  # the module was reloaded; the state file is as it was
    env.kubelet.wait_for(lambda: len(nl.names) == 6, "six instances in the module again")
    assert sorted(nl.names) == sorted(env.ours())


def test_instance_deleted_by_hand_is_made_again(env: Env) -> None:
    env.plugin(CFG, TWO)
    env.kubelet.wait_registered([R8, RW])
    env.kubelet.wait_devices(R8, lambda d: len(d) == 5)
    with S.locked(env.state) as st:
        del st.instances["dp-gpu-8gi-0-2"]
    env.kubelet.wait_for(lambda: "dp-gpu-8gi-0-2" in env.ours(), "the instance again")


# ---- the command -------------------------------------------------------------------------

DRIVER = textwrap.dedent("""
    import sys
    from gpuslice.kube import deviceplugin as DP
    from gpuslice.kube.inventory import GpuInfo
    DP.discover_gpus = lambda source: [GpuInfo(m, "GPU-%d" % m, None, None, None, None, 80 << 30) for m in (0, 1)]
    from gpuslice.cli import main
    from gpuslice.kube.cli import register
    if "device-plugin" not in main.commands:
        register(main)
    main(sys.argv[1:])
""")


def test_command_runs_and_stops_on_sigterm(env: Env) -> None:
    cfg = os.path.join(env.root, "dp.yaml")
    with open(cfg, "w") as f:
        f.write(CFG)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "--state", env.state, "--kernel", "no", "device-plugin",
                             "--config", cfg, "--device-plugin-dir", env.dir, "--cdi-dir", env.cdi_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
    try:
        env.kubelet.wait_registered([R8, RW])
        env.kubelet.wait_devices(R8, lambda d: len(d) == 5 and all(h == "Healthy" for h in d.values()))
        resp = env.kubelet.allocate(R8, ["gpu0-slot0"])
        assert resp.container_responses[0].cdi_devices[0].name == "gpuslice.dev/gpu=dp-gpu-8gi-0-0"
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert sorted(os.listdir(env.dir)) == ["kubelet.sock"]  # our sockets removed, the kubelet's kept
    assert len(env.ours()) == 6 and len(env.spec_devices()) == 6


@pytest.mark.parametrize("config, err", [
    ("profiles: [{name: a, memory: 1Gi, colour: red}]", "profile a: unknown key 'colour'"),
    ("profiles: [{name: a, memory: 96Gi, gpus: [0]}]", "memory 96GiB is more than GPU 0 has"),
    (None, "cannot read the config"),
])
def test_command_errors_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str | None,
                                 err: str) -> None:
    from gpuslice.cli import main
    from gpuslice.kube.cli import register

    if "device-plugin" not in main.commands:
        register(main)
    monkeypatch.setattr(DP, "discover_gpus", lambda source: [gpu(0)])
    cfg = tmp_path / "dp.yaml"
    if config is not None:
        cfg.write_text(config)
    r = CliRunner().invoke(main, ["--state", str(tmp_path / "s.json"), "--kernel", "no", "device-plugin",
                                  "--config", str(cfg), "--device-plugin-dir", str(tmp_path / "dp"),
                                  "--cdi-dir", str(tmp_path / "cdi")])
    assert r.exit_code != 0
    lines = [x for x in r.output.splitlines() if x.startswith("gpuctl: ")]
    assert len(lines) == 1 and err in lines[0], r.output
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "dp").exists()

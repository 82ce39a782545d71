"""The DRA kubelet plugin (gpuslice.kube.dra, claims, checkpoint): contract tests with a
test kubelet (tests/kube/drakubelet.py) over real gRPC on unix sockets, the vendored
v1 and v1beta1 protos, and the state file (no module here: instances are made in the
state file only; the guest test tests/guest/test_kube_guest.py makes them in the module).

Covered: registration, prepare/unprepare of claims with memory and compute amounts,
repeated and concurrent calls, a plugin restart between prepare and unprepare, a crash
in the middle of a prepare, unknown claims, malformed and forbidden configs (a clear
error, nothing created), amounts the node does not advertise, multi-GPU claims.
Claims come from a dict (what the API server would return); tests/test_kube_cli.py
runs the same through the real Kubernetes client against an API server stand-in.
Not covered: a real kubelet (its claim cache, retry timing, pod admission), a real
scheduler (the allocation results are written by the test).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from gpuslice import state as S
from gpuslice.kube import checkpoint as CP
from gpuslice.kube import claims as K
from gpuslice.kube.capacity import RequestPolicy, ValidRange
from gpuslice.kube.dra import CDI_KIND, Driver, Servers, cdi_spec_path

from kube.drakubelet import DraKubelet

GI, MI = 1 << 30, 1 << 20
NODE = "node-a"
GPU_MEM = 80 * GI
MEM_POLICY = RequestPolicy(default=GPU_MEM, valid_range=ValidRange(min=256 * MI, step=256 * MI))
COMPUTE_POLICY = RequestPolicy(default=100, valid_range=ValidRange(min=1, step=1))
GPUS = {g: K.Gpu(g, GPU_MEM, MEM_POLICY, COMPUTE_POLICY) for g in (0, 1)}


def claim(uid: str | None = None, *, results: list[dict[str, Any]] | None = None, memory: str = "4Gi",
          compute: str = "30", config: list[dict[str, Any]] | None = None, name: str = "c1",
          ns: str = "default") -> dict[str, Any]:
    uid = uid or str(uuid.uuid4())
    if results is None:
        results = [result("gpu", "gpu-0", memory=memory, compute=compute)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "status": {"allocation": {"devices": {"results": results, "config": config or []}}}}


def result(request: str, device: str, memory: str | None = "4Gi", compute: str | None = "30",
           pool: str = NODE, driver: str = K.DRIVER) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device,
                         "shareID": str(uuid.uuid4())}
    cc = {}
    if memory is not None:
        cc["memory"] = memory
    if compute is not None:
        cc["compute"] = compute
    if cc:
        r["consumedCapacity"] = cc
    return r


def cfg(source: str, **params: Any) -> dict[str, Any]:
    return {"source": source, "opaque": {"driver": K.DRIVER, "parameters": {
        "apiVersion": K.CONFIG_API_VERSION, "kind": K.CONFIG_KIND, **params}}}


class Api:
    """What the driver asks of the API server: claims by namespace and name."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, c: dict[str, Any]) -> tuple[str, str, str]:
        m = c["metadata"]
        self.claims[(m["namespace"], m["name"])] = c
        return (m["namespace"], m["uid"], m["name"])

    def get(self, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.claims[(ns, name)]
        except KeyError:
            raise ApiError(f"resourceclaims {name!r} not found") from None


class ApiError(Exception):
    pass


class Plugin:
    def __init__(self, tmp: Any, api: Api) -> None:
        self.tmp = tmp
        self.api = api
        self.dirs = {k: str(tmp / k) for k in ("plugin", "registry", "cdi")}
        self.state = str(tmp / "state.json")
        self.driver: Driver | None = None
        self.servers: Servers | None = None

    def start(self) -> DraKubelet:
        self.driver = Driver(NODE, GPUS, self.api.get, self.state, None, cdi_dir=self.dirs["cdi"],
                             plugin_dir=self.dirs["plugin"])
        self.driver.recover()
        self.servers = Servers(self.driver, self.dirs["plugin"], self.dirs["registry"])
        self.servers.start()
        k = DraKubelet(self.dirs["registry"])
        k.register()
        return k

    def stop(self) -> None:
        if self.servers:
            self.servers.stop(0)
            self.servers = None

    def instances(self) -> dict[str, S.Instance]:
        return S.load(self.state).instances

    def specs(self) -> list[str]:
        d = self.dirs["cdi"]
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def checkpoint(self) -> dict[str, Any]:
        return CP.load(os.path.join(self.dirs["plugin"], "checkpoint.json"))


@pytest.fixture
def plugin(tmp_path: Any) -> Any:
    p = Plugin(tmp_path, Api())
    yield p
    p.stop()


def test_registration(plugin: Plugin) -> None:
    k = plugin.start()
    assert k.info is not None
    assert (k.info.type, k.info.name) == ("DRAPlugin", "gpuslice.dev")
    assert set(k.info.versions) == {"v1.DRAPlugin", "v1beta1.DRAPlugin"}
    assert k.info.endpoint == os.path.join(plugin.dirs["plugin"], "dra.sock")
    assert plugin.servers is not None and plugin.servers.registered.is_set()


def test_registration_refused_is_recorded(plugin: Plugin) -> None:
    plugin.start()
    DraKubelet(plugin.dirs["registry"]).register(accept=False, error="version not supported")
    assert plugin.servers is not None and plugin.servers.registration_error == "version not supported"


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_makes_the_instance_spec_and_checkpoint(plugin: Plugin, version: str) -> None:
    k = plugin.start()
    c = claim(memory="4Gi", compute="30")
    ref = plugin.api.add(c)
    out = k.prepare([ref], version)
    r = out[ref[1]]
    assert r.error == ""
    name = K.instance_name(ref[1])
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in r.devices] == \
        [(["gpu"], NODE, "gpu-0", [f"{CDI_KIND}={name}"])]
    inst = plugin.instances()[name]
    assert (inst.gpus, inst.memory, inst.share, inst.priority, inst.owner) == ([0], 4 * GI, 0.3, "online",
                                                                                 "kubelet-plugin")
    assert S.load(plugin.state).policy_of(0).policy == "fixed"
    spec = yaml.safe_load(open(cdi_spec_path(plugin.dirs["cdi"], ref[1])))
    assert spec["kind"] == CDI_KIND and [d["name"] for d in spec["devices"]] == [name]
    nodes = {n["path"]: n["hostPath"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]}
    assert nodes == {"/dev/nvidiactl": f"/dev/gpuslice/{name}/nvidiactl",
                     "/dev/nvidia0": f"/dev/gpuslice/{name}/nvidia0",
                     "/dev/nvidia-uvm": f"/dev/gpuslice/{name}/nvidia-uvm"}
    assert plugin.checkpoint()[ref[1]]["state"] == CP.PREPARED
    if version == "v1":
        assert r.devices[0].share_id == c["status"]["allocation"]["devices"]["results"][0]["shareID"]


def test_prepare_is_idempotent_across_versions_and_calls(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim())
    first = k.prepare([ref])[ref[1]]
    for version in ("v1", "v1beta1", "v1"):
        again = k.prepare([ref], version)[ref[1]]
        assert again.error == ""
        assert [list(d.cdi_device_ids) for d in again.devices] == [list(d.cdi_device_ids) for d in first.devices]
    assert len(plugin.instances()) == 1 and len(plugin.specs()) == 1


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_claim_twice_in_one_request_is_answered_once(plugin: Plugin, version: str) -> None:
    """The kubelet lists a claim once per pod reference: one call may name it twice (and
    a second claim between). Each UID is answered once, with its devices once, on the
    first call and on a repeat of it."""
    k = plugin.start()
    two = claim(results=[result("a", "gpu-0"), result("b", "gpu-1")])
    ref, other = plugin.api.add(two), plugin.api.add(claim(name="c2"))
    for _ in range(2):
        out = k.prepare([ref, other, ref, ref], version)
        assert sorted(out) == sorted([ref[1], other[1]])
        r = out[ref[1]]
        assert r.error == ""
        assert [(list(d.request_names), d.device_name) for d in r.devices] == [(["a", "b"], "gpu-0"), (["b"], "gpu-1")]
        assert sum(len(d.cdi_device_ids) for d in r.devices) == 1
        assert len(out[other[1]].devices) == 1
    assert len(plugin.instances()) == 2 and len(plugin.specs()) == 2
    assert k.unprepare([ref, ref, other], version) == {ref[1]: "", other[1]: ""}
    assert plugin.instances() == {} and plugin.checkpoint() == {}


def test_unprepare_removes_everything_and_unknown_is_fine(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim())
    assert k.prepare([ref])[ref[1]].error == ""
    assert k.unprepare([ref]) == {ref[1]: ""}
    assert plugin.instances() == {} and plugin.specs() == [] and plugin.checkpoint() == {}
    assert k.unprepare([ref]) == {ref[1]: ""}
    never = ("default", str(uuid.uuid4()), "never-prepared")
    assert k.unprepare([never], "v1beta1") == {never[1]: ""}


def test_restart_between_prepare_and_unprepare(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim())
    first = k.prepare([ref])[ref[1]]
    plugin.stop()
    k = plugin.start()
    plugin.api.claims.clear()  # answered from the checkpoint, not the API server
    again = k.prepare([ref])[ref[1]]
    assert again.error == "" and list(again.devices[0].cdi_device_ids) == list(first.devices[0].cdi_device_ids)
    assert k.unprepare([ref]) == {ref[1]: ""}
    assert plugin.instances() == {} and plugin.specs() == []


def test_crash_mid_prepare_is_undone_at_start(plugin: Plugin) -> None:
    """A plugin killed after the instance was made but before the claim was recorded
    as prepared: the next start removes the instance, spec and entry."""
    k = plugin.start()
    ref = plugin.api.add(claim())
    assert k.prepare([ref])[ref[1]].error == ""
    plugin.stop()
    cp_path = os.path.join(plugin.dirs["plugin"], "checkpoint.json")
    claims = CP.load(cp_path)
    claims[ref[1]]["state"] = CP.PREPARING
    CP.save(cp_path, claims)
    plugin.start()
    assert plugin.instances() == {} and plugin.specs() == [] and plugin.checkpoint() == {}


def test_corrupt_checkpoint_is_refused_not_replaced(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim())
    assert k.prepare([ref])[ref[1]].error == ""
    plugin.stop()
    cp_path = os.path.join(plugin.dirs["plugin"], "checkpoint.json")
    doc = json.load(open(cp_path))
    doc["claims"][ref[1]]["instance"] = "dra-other"
    json.dump(doc, open(cp_path, "w"))
    with pytest.raises(CP.CheckpointError, match="checksum"):
        plugin.start()
    assert json.load(open(cp_path)) == doc


def test_concurrent_prepares(plugin: Plugin) -> None:
    k = plugin.start()
    refs = [plugin.api.add(claim(name=f"c{i}", memory="4Gi", compute="5")) for i in range(16)]
    out: dict[str, Any] = {}

    def one(ref: tuple[str, str, str]) -> None:
        out.update(k.prepare([ref], "v1" if int(ref[2][1:]) % 2 else "v1beta1"))

    threads = [threading.Thread(target=one, args=(r,)) for r in refs + refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(out[r[1]].error == "" for r in refs)
    insts = plugin.instances()
    assert len(insts) == 16 and sum(i.share or 0 for i in insts.values()) == pytest.approx(0.8)
    assert len(plugin.specs()) == 16


def test_unknown_claim(plugin: Plugin) -> None:
    k = plugin.start()
    ref = ("default", str(uuid.uuid4()), "nowhere")
    r = k.prepare([ref])[ref[1]]
    assert "not found" in r.error and not r.devices
    assert plugin.instances() == {} and plugin.specs() == [] and plugin.checkpoint() == {}


def test_uid_mismatch(plugin: Plugin) -> None:
    k = plugin.start()
    ns, uid, name = plugin.api.add(claim())
    r = k.prepare([(ns, str(uuid.uuid4()), name)])
    assert "has UID" in next(iter(r.values())).error
    assert plugin.instances() == {}


BAD_CONFIGS = [
    ([cfg("FromClaim", priority="offline")], "set by the DeviceClass"),
    ([cfg("FromClaim", minShare="5%")], "set by the DeviceClass"),
    ([cfg("FromClaim", policy="burst")], "set by the DeviceClass"),
    ([cfg("FromClass", policy="fastest")], "not one of"),
    ([cfg("FromClaim", ceiling="31%")], "may only lower its ceiling"),
    ([cfg("FromClaim", memory="8Gi")], "unknown field"),
    ([{"source": "FromClaim", "opaque": {"driver": K.DRIVER, "parameters": {"kind": "GpuConfig"}}}], "apiVersion"),
    ([{"source": "FromClaim", "opaque": {"driver": K.DRIVER, "parameters": "offline"}}], "must be an object"),
    ([cfg("FromClaim", ceiling=50)], "string"),
    ([cfg("FromClaim", ceiling="150%")], "ceiling"),
    ([cfg("FromClass", priority="urgent")], "not one of"),
]


@pytest.mark.parametrize("config,err", BAD_CONFIGS)
def test_malformed_or_forbidden_config_creates_nothing(plugin: Plugin, config: list[dict[str, Any]],
                                                       err: str) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim(config=config))
    r = k.prepare([ref])[ref[1]]
    assert err in r.error and not r.devices
    assert plugin.instances() == {} and plugin.specs() == [] and plugin.checkpoint() == {}


def test_other_drivers_config_is_ignored(plugin: Plugin) -> None:
    k = plugin.start()
    other = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"whatever": 1}}}
    ref = plugin.api.add(claim(config=[other]))
    assert k.prepare([ref])[ref[1]].error == ""


def test_offline_priority_from_the_class(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim(config=[cfg("FromClass", priority="offline", minShare="5%", policy="weight")],
                               compute="20"))
    assert k.prepare([ref])[ref[1]].error == ""
    inst = plugin.instances()[K.instance_name(ref[1])]
    assert (inst.priority, inst.min_share, inst.weight, inst.share) == ("offline", 0.05, 20, None)
    assert S.load(plugin.state).policy_of(0).policy == "weight"


def test_offline_floor_is_at_most_the_granted_compute(plugin: Plugin) -> None:
    """19 offline claims of 1% each cannot take 19 floors of 5% beside online work."""
    k = plugin.start()
    ref = plugin.api.add(claim(config=[cfg("FromClass", priority="offline", minShare="5%", policy="weight")],
                               compute="1"))
    assert k.prepare([ref])[ref[1]].error == ""
    assert plugin.instances()[K.instance_name(ref[1])].min_share == 0.01


def test_a_claim_may_lower_its_ceiling(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim(config=[cfg("FromClass", policy="equal", ceiling="50%"),
                                       cfg("FromClaim", ceiling="20%")], compute="30"))
    assert k.prepare([ref])[ref[1]].error == ""
    assert plugin.instances()[K.instance_name(ref[1])].ceiling == 0.2


def test_policy_conflict_on_a_gpu(plugin: Plugin) -> None:
    k = plugin.start()
    a = plugin.api.add(claim(name="a", config=[cfg("FromClass", policy="weight")]))
    b = plugin.api.add(claim(name="b"))
    assert k.prepare([a])[a[1]].error == ""
    assert "runs the weight policy" in k.prepare([b])[b[1]].error
    assert len(plugin.instances()) == 1


AMOUNTS = [
    ("4G", "30", "not an amount"),  # 4e9 bytes is not on the 256 MiB step
    ("100Mi", "30", "not an amount"),  # under the minimum
    ("81Gi", "30", "not an amount"),  # more than the GPU
    ("4Gi", "0", "not an amount"),
    ("4Gi", "101", "not an amount"),
    ("4Gi", "banana", "consumedCapacity.compute"),
]


@pytest.mark.parametrize("memory,compute,err", AMOUNTS)
def test_amounts_the_node_does_not_advertise(plugin: Plugin, memory: str, compute: str, err: str) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim(memory=memory, compute=compute))
    assert err in k.prepare([ref])[ref[1]].error
    assert plugin.instances() == {}


@pytest.mark.parametrize("memory,compute,key,bad", [
    ("4Gi", "20.5", "compute", "20.5"),  # once taken as 21%
    ("4Gi", "30500m", "compute", "30500m"),
    ("4Gi", "29.9999", "compute", "29.9999"),
    ("268435455.5", "30", "memory", "268435455.5"),  # once taken as 256Mi
])
def test_a_fraction_is_off_the_grid_as_memory_off_it_is(plugin: Plugin, memory: str, compute: str, key: str,
                                                        bad: str) -> None:
    """The allocator writes whole amounts on the request policy's grid (Quantity.Value()
    arithmetic): a fractional consumedCapacity was not written by it, and is refused with
    the error an off-grid amount gets, for compute as for memory; nothing is created."""
    k = plugin.start()
    ref = plugin.api.add(claim(memory=memory, compute=compute))
    whole = {"compute": 100, "memory": GPU_MEM}[key]
    assert k.prepare([ref])[ref[1]].error == (f"gpu-0: consumedCapacity.{key} {bad} is not an amount the node "
                                              f"advertises (a whole number on its request policy's grid, at "
                                              f"most {whole})")
    assert plugin.instances() == {} and plugin.specs() == [] and plugin.checkpoint() == {}


def test_whole_amounts_in_any_notation_are_taken(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim(memory="0.5Gi", compute="30000m"))
    assert k.prepare([ref])[ref[1]].error == ""
    inst = plugin.instances()[K.instance_name(ref[1])]
    assert (inst.memory, inst.share) == (512 * MI, 0.3)


def test_results_not_ours_or_not_here(plugin: Plugin) -> None:
    k = plugin.start()
    elsewhere = plugin.api.add(claim(name="e", results=[result("gpu", "gpu-0", pool="node-b")]))
    other = plugin.api.add(claim(name="o", results=[result("gpu", "gpu-0", driver="gpu.nvidia.com")]))
    nodev = plugin.api.add(claim(name="n", results=[result("gpu", "gpu-7")]))
    admin = plugin.api.add(claim(name="a", results=[{**result("gpu", "gpu-0"), "adminAccess": True}]))
    unalloc = plugin.api.add({**claim(name="u"), "status": {}})
    out = k.prepare([elsewhere, other, nodev, admin, unalloc])
    assert "no device of gpuslice.dev on node node-a" in out[elsewhere[1]].error
    assert "no device" in out[other[1]].error
    assert "not on this node" in out[nodev[1]].error
    assert "adminAccess" in out[admin[1]].error
    assert "not allocated" in out[unalloc[1]].error
    assert plugin.instances() == {}


def test_overcommit_across_claims_is_refused(plugin: Plugin) -> None:
    """A status written by someone else than the scheduler cannot make the node hold
    more than the GPU: the sum of prepared claims stays within it."""
    k = plugin.start()
    a = plugin.api.add(claim(name="a", memory="60Gi", compute="60"))
    b = plugin.api.add(claim(name="b", memory="30Gi", compute="30"))
    c = plugin.api.add(claim(name="c", memory="10Gi", compute="50"))
    assert k.prepare([a])[a[1]].error == ""
    assert "more than it has" in k.prepare([b])[b[1]].error
    assert "more than it has" in k.prepare([c])[c[1]].error
    assert k.unprepare([a]) == {a[1]: ""}
    assert k.prepare([b])[b[1]].error == ""


def test_multi_gpu_claim(plugin: Plugin) -> None:
    k = plugin.start()
    ref = plugin.api.add(claim(results=[result("gpus", "gpu-0", memory="8Gi", compute="40"),
                                        result("gpus", "gpu-1", memory="16Gi", compute="25"),
                                        result("extra", "gpu-1", memory="4Gi", compute="5")]))
    r = k.prepare([ref])[ref[1]]
    assert r.error == ""
    inst = plugin.instances()[K.instance_name(ref[1])]
    assert inst.gpus == [0, 1] and inst.gpu_memory == {0: 8 * GI, 1: 20 * GI}
    assert inst.share == 0.3  # the smallest of 40% and 25+5%
    assert [list(d.cdi_device_ids) for d in r.devices] == [[f"{CDI_KIND}={inst.name}"], [], []]
    assert sorted(r.devices[0].request_names) == ["extra", "gpus"]
    spec = yaml.safe_load(open(cdi_spec_path(plugin.dirs["cdi"], ref[1])))
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-uvm"]


def test_whole_device_allocation(plugin: Plugin) -> None:
    """A result without consumedCapacity (whole GPUs, consumable capacity off) gets
    the whole GPU."""
    k = plugin.start()
    ref = plugin.api.add(claim(results=[result("gpu", "gpu-1", memory=None, compute=None)]))
    assert k.prepare([ref])[ref[1]].error == ""
    inst = plugin.instances()[K.instance_name(ref[1])]
    assert (inst.gpus, inst.memory, inst.share) == ([1], GPU_MEM, 1.0)


def test_consumed_capacity_on_an_unshared_gpu_is_refused() -> None:
    gpus = {0: K.Gpu(0, GPU_MEM, None, None)}
    with pytest.raises(K.ClaimError, match="not shared"):
        K.plan(claim(), NODE, gpus, "fixed")


def test_instance_names() -> None:
    u = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert K.instance_name(u) == "dra-0f8fad5bd9cb469fa165708677"
    assert S.valid_name(K.instance_name(u)) and S.valid_name(K.instance_name("not a uuid/../x"))


# ---- property: what the driver creates never exceeds what the slice advertises -------

amount = st.tuples(st.integers(1, 400), st.integers(0, 120))  # (memory in 256 MiB steps, compute %)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from([0, 1]), amount), min_size=1, max_size=3), min_size=1,
                max_size=12))
def test_prepared_claims_never_exceed_the_gpus(tmp_path_factory: Any, claims_spec: list[Any]) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    api = Api()
    d = Driver(NODE, GPUS, api.get, str(tmp / "state.json"), None, cdi_dir=str(tmp / "cdi"),
               plugin_dir=str(tmp / "plugin"))
    for i, shares in enumerate(claims_spec):
        results = [result(f"r{j}", f"gpu-{g}", memory=f"{m * 256}Mi", compute=str(c))
                   for j, (g, (m, c)) in enumerate(shares)]
        ns, uid, name = api.add(claim(name=f"c{i}", results=results))
        try:
            d.prepare(uid, ns, name)
        except K.ClaimError:
            pass
        insts = S.load(str(tmp / "state.json")).instances
        for g in (0, 1):
            on = [x for x in insts.values() if g in x.gpus]
            assert sum(x.memory_of(g) for x in on) <= GPU_MEM
            assert sum(x.share or 0 for x in on) <= 1.0 + 1e-9
        prepared = d.claims
        for g in (0, 1):
            assert sum(c["per_gpu"].get(str(g), [0, 0])[0] for c in prepared.values()) <= GPU_MEM
            assert sum(c["per_gpu"].get(str(g), [0, 0])[1] for c in prepared.values()) <= 100


def test_hostile_uid_names_no_path(plugin: Plugin) -> None:
    """A UID is put in no path as given: the spec file is named by the instance."""
    k = plugin.start()
    ref = plugin.api.add(claim(uid="../../etc/x"))
    assert k.prepare([ref])[ref[1]].error == ""
    assert plugin.specs() == [f"gpuslice.dev-claim_{K.instance_name(ref[1])}.yaml"]
    assert k.unprepare([ref]) == {ref[1]: ""} and plugin.specs() == []


def test_instances_not_the_plugins_count_against_the_gpu(plugin: Plugin) -> None:
    """An instance made by hand (or left by the device plugin) holds its memory and share:
    a claim that would overcommit the GPU beside it is refused."""
    with S.locked(plugin.state) as st:
        st.instances["manual"] = S.Instance("manual", [1], 70 * GI, share=0.5)
        st.gpus[1] = S.GpuPolicy("fixed")
    k = plugin.start()
    big = plugin.api.add(claim(name="big", results=[result("gpu", "gpu-1", memory="16Gi", compute="10")]))
    hot = plugin.api.add(claim(name="hot", results=[result("gpu", "gpu-1", memory="4Gi", compute="60")]))
    ok = plugin.api.add(claim(name="ok", results=[result("gpu", "gpu-1", memory="8Gi", compute="40")]))
    out = k.prepare([big, hot, ok])
    assert "more than it has" in out[big[1]].error and "more than it has" in out[hot[1]].error
    assert out[ok[1]].error == ""


class FakeNl:
    """The module's instance table, as netlink shows it (tests only)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.fail_new: str | None = None

    def instances(self) -> list[dict[str, Any]]:
        return [{"name": n} for n in sorted(self.names)]

    def instance_new(self, name: str, *a: Any, **k: Any) -> None:
        if self.fail_new == name:
            raise OSError(19, "No such device")
        if name in self.names:
            raise OSError(17, "File exists")
        self.names.add(name)

    def instance_del(self, name: str) -> None:
        if name not in self.names:
            raise OSError(2, "No such file or directory")
        self.names.discard(name)


def test_killed_after_the_module_before_the_state_file(tmp_path: Any) -> None:
    """Killed after the instance was made in the module but before the state file was
    saved: the next start deletes it in the module, and the claim can be prepared."""
    api, nl = Api(), FakeNl()
    ref = api.add(claim())
    name = K.instance_name(ref[1])
    cp_path = tmp_path / "plugin" / "checkpoint.json"
    CP.save(str(cp_path), {ref[1]: {"namespace": ref[0], "name": ref[2], "instance": name, "state": CP.PREPARING,
                                    "per_gpu": {"0": [4 * GI, 30]}, "devices": []}})
    nl.names.add(name)
    d = Driver(NODE, GPUS, api.get, str(tmp_path / "state.json"), nl, cdi_dir=str(tmp_path / "cdi"),
               plugin_dir=str(tmp_path / "plugin"))
    assert d.recover()["undone"] == [ref[1]] and nl.names == set()
    assert d.prepare(ref[1], ref[0], ref[2]) and nl.names == {name}


def test_one_entry_that_cannot_be_restored_does_not_stop_the_start(tmp_path: Any) -> None:
    """After a reboot the module lost every instance and one cannot be made again (its
    GPU is gone): the others are restored and the plugin starts."""
    api = Api()
    refs = [api.add(claim(name=f"c{i}")) for i in range(3)]
    d = Driver(NODE, GPUS, api.get, str(tmp_path / "state.json"), None, cdi_dir=str(tmp_path / "cdi"),
               plugin_dir=str(tmp_path / "plugin"))
    for ns, uid, name in refs:
        d.prepare(uid, ns, name)
    nl = FakeNl()
    nl.fail_new = K.instance_name(refs[1][1])
    d = Driver(NODE, GPUS, api.get, str(tmp_path / "state.json"), nl, cdi_dir=str(tmp_path / "cdi"),
               plugin_dir=str(tmp_path / "plugin"))
    done = d.recover()
    assert done["failed"] == [refs[1][1]] and sorted(done["restored"]) == sorted([refs[0][1], refs[2][1]])


def test_a_renumbered_gpu_is_not_restored(tmp_path: Any, caplog: Any) -> None:
    """After a reboot gpu-0 is another GPU: the claim's instance is not made again on it."""
    api = Api()
    ns, uid, name = api.add(claim())
    gpus = {g: K.Gpu(g, GPU_MEM, MEM_POLICY, COMPUTE_POLICY, f"GPU-{g}") for g in (0, 1)}
    d = Driver(NODE, gpus, api.get, str(tmp_path / "state.json"), None, cdi_dir=str(tmp_path / "cdi"),
               plugin_dir=str(tmp_path / "plugin"))
    d.prepare(uid, ns, name)
    swapped = {0: K.Gpu(0, GPU_MEM, MEM_POLICY, COMPUTE_POLICY, "GPU-1"),
               1: K.Gpu(1, GPU_MEM, MEM_POLICY, COMPUTE_POLICY, "GPU-0")}
    nl = FakeNl()
    d = Driver(NODE, swapped, api.get, str(tmp_path / "state.json"), nl, cdi_dir=str(tmp_path / "cdi"),
               plugin_dir=str(tmp_path / "plugin"))
    assert d.recover()["failed"] == [uid] and nl.names == set()
    assert "gpu-0 was GPU-0 when the claim was prepared, now GPU-1" in caplog.text


# ---- the capability set (GpuConfig capabilities) ----

def test_capabilities_from_the_class_and_narrowed_by_the_claim(plugin: Plugin) -> None:
    """The DeviceClass's set is the most its claims get; a claim may narrow it, never widen it.
    Without any, the instance has all four (recorded as None)."""
    k = plugin.start()
    ref = plugin.api.add(claim(name="a", config=[cfg("FromClass", capabilities="compute,utility,video"),
                                                 cfg("FromClaim", capabilities="compute,utility")]))
    assert k.prepare([ref])[ref[1]].error == ""
    assert plugin.instances()[K.instance_name(ref[1])].caps == 0x3
    spec = yaml.safe_load(open(os.path.join(plugin.dirs["cdi"], plugin.specs()[0])))
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in spec["devices"][0]["containerEdits"]["env"]
    ref = plugin.api.add(claim(name="b"))
    assert k.prepare([ref])[ref[1]].error == ""
    assert plugin.instances()[K.instance_name(ref[1])].caps is None
    ref = plugin.api.add(claim(name="c", config=[cfg("FromClass", capabilities="compute,utility"),
                                                 cfg("FromClaim", capabilities="compute,graphics")]))
    assert "may only narrow" in k.prepare([ref])[ref[1]].error
    ref = plugin.api.add(claim(name="d", config=[cfg("FromClaim", capabilities="display")]))
    assert "unknown capability" in k.prepare([ref])[ref[1]].error

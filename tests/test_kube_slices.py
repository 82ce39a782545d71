"""The DRA driver's GPU inventory, ResourceSlices and their publishing (gpuslice.kube
inventory, slices, apiclient).

What runs against what:

* build_slices / to_version / from_version: pure, checked field by field against the
  resource.k8s.io v1 and v1beta1 layouts (kubernetes/api v0.36.3 resource/*/types.go).
* SlicePublisher and ApiClient go through the real official ``kubernetes`` client and
  real HTTP to tests/kube/apiserver.py, an API server STAND-IN: in-memory
  resourceslices (list with label/field selectors, create with generateName, get, PUT
  with resourceVersion conflicts, delete), resourceclaims get, nodes get, discovery of
  the resource.k8s.io versions it is configured with, v1beta1 <-> v1 conversion, the
  DRAConsumableCapacity gate's field dropping as upstream's strategy.go does it, and the
  cheap validation rules listed in its docstring (128 devices, DNS-label device names,
  required fields, attribute and request-policy rules) answering 422.
  NOT covered: a real API server, authentication, admission, watches, PATCH/apply,
  quantity canonicalisation, CEL, garbage collection, validation beyond those rules.
* inventory: NVML and the RM client are replaced by fakes (pynvml's functions
  monkeypatched; a fake RmClient answering the RM controls with packed parameters);
  no GPU and no driver are needed.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pynvml
import pytest

from gpuslice import abi
from gpuslice.kube import capacity as C
from gpuslice.kube import inventory as inv
from gpuslice.kube import slices as S
from gpuslice.kube.apiclient import ApiClient, ApiError, claim_to_v1
from gpuslice.kube.inventory import GpuInfo
from gpuslice.sched.rm import GpuHandles, RmError
from kube import apiserver as fakeapi  # tests/kube (tests/ is on sys.path under pytest)

GiB = 1 << 30
MiB = 1 << 20
H100_MEM = 85520809984  # 81559 MiB: an H100 80GB HBM3 as NVML reports it


def gpu(minor: int = 0, memory: int = H100_MEM, **kw: Any) -> GpuInfo:
    d: dict[str, Any] = dict(minor=minor, uuid=f"GPU-6e767374-7562-0000-0000-0000000000{minor:02x}",
                             name="NVIDIA H100 80GB HBM3", compute_capability="9.0",
                             driver_version="580.95.05", pci_bus_id=f"0000:{0x18 + minor:02x}:00.0", memory=memory)
    d.update(kw)
    return GpuInfo(**d)


MEM_POLICY = C.RequestPolicy(valid_range=C.ValidRange(min=256 * MiB, step=256 * MiB))


# ---- build_slices ---------------------------------------------------------------------

def test_build_shared_device() -> None:
    [s] = S.build_slices("node-a", [gpu(1), gpu(0)], 3, shared=True, memory_policy=MEM_POLICY, node_uid="u-1")
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    meta = s["metadata"]
    assert meta["generateName"] == "node-a-gpuslice.dev-"
    assert meta["labels"] == {S.LABEL_DRIVER: "gpuslice.dev", S.LABEL_NODE: "node-a"}
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u-1",
                                        "controller": True}]
    assert meta["annotations"][S.ANNOTATION_HASH] == S.spec_hash(s)
    spec = s["spec"]
    assert spec["driver"] == "gpuslice.dev" and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    d = spec["devices"][0]
    assert d["attributes"] == {
        "uuid": {"string": "GPU-6e767374-7562-0000-0000-000000000000"},
        "index": {"int": 0},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "computeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
    }
    assert d["allowMultipleAllocations"] is True
    mem, comp = d["capacity"]["memory"], d["capacity"]["compute"]
    assert C.parse_quantity(mem["value"]) == H100_MEM
    # default "whole GPU" lies on the min + n*step grid (upstream refuses it off the grid)
    whole = 256 * MiB * (H100_MEM // (256 * MiB))
    assert mem["requestPolicy"] == {"default": C.format_quantity(whole),
                                    "validRange": {"min": "256Mi", "step": "256Mi"}}
    assert C.validate_policy(C.RequestPolicy.from_api(mem["requestPolicy"]), H100_MEM) == []
    assert comp == {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "step": "1"}}}


def test_build_whole_device_and_missing_fields() -> None:
    [s] = S.build_slices("n", [gpu(0, name=None, compute_capability=None, driver_version="r535 beta",
                                   pci_bus_id=None)], 0, shared=False)
    d = s["spec"]["devices"][0]
    assert "allowMultipleAllocations" not in d
    assert d["capacity"] == {"memory": {"value": C.format_quantity(H100_MEM)}, "compute": {"value": "100"}}
    assert set(d["attributes"]) == {"uuid", "index", "driverVersion"}
    assert d["attributes"]["driverVersion"] == {"string": "r535 beta"}  # not semver: a string
    assert "ownerReferences" not in s["metadata"]


def test_semver() -> None:
    assert S.semver("9.0") == "9.0.0"
    assert S.semver("580.95.05") == "580.95.5"
    assert S.semver("535") == "535.0.0"
    assert S.semver("r535") is None and S.semver(None) is None and S.semver("1.2.3.4") is None


def test_memory_policy_checks() -> None:
    p = S.effective_memory_policy(10 * GiB, C.RequestPolicy(valid_range=C.ValidRange(min=GiB, step=3 * GiB)))
    assert p.default == 10 * GiB  # 1 + 3*3
    p = S.effective_memory_policy(10 * GiB, None)
    assert p.default == 10 * GiB and p.valid_range == C.ValidRange(min=MiB, step=MiB)
    with pytest.raises(S.SliceError, match="exceeds"):
        S.effective_memory_policy(GiB, C.RequestPolicy(valid_range=C.ValidRange(min=2 * GiB)))
    with pytest.raises(S.SliceError, match="refused"):
        S.effective_memory_policy(10 * GiB, C.RequestPolicy(default=GiB + 1,
                                                            valid_range=C.ValidRange(min=GiB, step=GiB)))


def test_split_at_128() -> None:
    gpus = [gpu(i, pci_bus_id=None) for i in range(300)]
    out = S.build_slices("n", gpus, 7, shared=True)
    assert [len(s["spec"]["devices"]) for s in out] == [128, 128, 44]
    assert all(s["spec"]["pool"] == {"name": "n", "generation": 7, "resourceSliceCount": 3} for s in out)
    assert [d["name"] for s in out for d in s["spec"]["devices"]] == [f"gpu-{i}" for i in range(300)]
    assert len(S.build_slices("n", gpus[:5], 1, shared=False, max_devices_per_slice=2)) == 3
    assert S.build_slices("n", [], 1, shared=True) == []
    with pytest.raises(S.SliceError):
        S.build_slices("n", gpus, 1, shared=True, max_devices_per_slice=129)
    with pytest.raises(S.SliceError, match="duplicate"):
        S.build_slices("n", [gpu(0), gpu(0)], 1, shared=True)


def test_long_node_name_is_no_label() -> None:
    node = "a" * 70 + ".example.com"
    [s] = S.build_slices(node, [gpu(0)], 1, shared=False)
    assert S.LABEL_NODE not in s["metadata"]["labels"]
    assert s["spec"]["nodeName"] == node


def test_v1beta1_layout() -> None:
    [s] = S.build_slices("n", [gpu(0)], 1, shared=True)
    b = S.to_version(s, "resource.k8s.io/v1beta1")
    assert b["apiVersion"] == "resource.k8s.io/v1beta1"
    [d] = b["spec"]["devices"]
    assert set(d) == {"name", "basic"} and d["name"] == "gpu-0"
    assert d["basic"]["allowMultipleAllocations"] is True
    assert d["basic"]["capacity"]["memory"]["requestPolicy"]
    assert S.from_version(b) == s
    assert S.to_version(s, "v1beta2") == {**s, "apiVersion": "resource.k8s.io/v1beta2"}
    assert s["spec"]["devices"][0]["name"] == "gpu-0" and "basic" not in s["spec"]["devices"][0]  # not mutated
    with pytest.raises(S.SliceError):
        S.to_version(s, "v1alpha3")


def test_consumable_fields_present() -> None:
    [s] = S.build_slices("n", [gpu(0)], 1, shared=True)
    assert S.consumable_fields_present(s)
    fakeapi.drop_consumable_capacity(s, None)
    assert not S.consumable_fields_present(s)


# ---- the stand-in's own rules -----------------------------------------------------------

@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_standin_accepts_built_slices(version: str) -> None:
    srv = fakeapi.FakeApiServer()
    for s in S.build_slices("node-a", [gpu(i) for i in range(130)], 1, shared=True, memory_policy=MEM_POLICY):
        srv.add_slice(S.to_version(s, version), version)
    assert len(srv.slices()) == 2


def test_standin_refuses_bad_slices() -> None:
    srv = fakeapi.FakeApiServer()
    [ok] = S.build_slices("n", [gpu(0)], 1, shared=True)

    def refused(mutate: Any, match: str) -> None:
        s = S.to_version(ok, "v1")
        mutate(s)
        code, body = srv.handle("POST", "/apis/resource.k8s.io/v1/resourceslices", fakeapi.json.dumps(s).encode())
        assert code == 422 and body["reason"] == "Invalid", body
        assert match in body["message"]

    refused(lambda s: s["spec"].update(devices=[dict(ok["spec"]["devices"][0], name=f"gpu-{i}")
                                                for i in range(129)]), "at most 128")
    refused(lambda s: s["spec"]["devices"][0].update(name="GPU_0"), "RFC 1123 label")
    refused(lambda s: s["spec"]["devices"][0].pop("allowMultipleAllocations"), "allowMultipleAllocations must be true")
    refused(lambda s: s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"].update(default="1073741825"),
            "not a multiple of step")
    refused(lambda s: s["spec"]["devices"][0]["attributes"].update(driverVersion={"version": "580.95.05"}),
            "semver")
    refused(lambda s: s["spec"].pop("nodeName"), "exactly one of")
    refused(lambda s: s["spec"]["pool"].update(resourceSliceCount=0), "greater than zero")
    assert srv.slices() == []


# ---- publishing through the real client -----------------------------------------------

@pytest.fixture
def server() -> Iterator[fakeapi.FakeApiServer]:
    with fakeapi.FakeApiServer() as srv:
        yield srv


def client(srv: fakeapi.FakeApiServer) -> ApiClient:
    return ApiClient(srv.configuration(), timeout=10)


def test_publish_create_and_idempotent(server: fakeapi.FakeApiServer) -> None:
    node = server.add_node("node-a")
    api = client(server)
    pub = S.SlicePublisher(api, "node-a", memory_policy=MEM_POLICY)
    r = pub.publish([gpu(0), gpu(1)], shared_wanted=True)
    assert r.shared and r.fallback_reason is None and r.generation == 1 and r.changed
    [stored] = server.slices()
    assert r.slices == [stored["metadata"]["name"]] and stored["metadata"]["name"].startswith("node-a-gpuslice.dev-")
    assert stored["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    assert S.consumable_fields_present(stored)
    assert ("GET", "/apis/resource.k8s.io") in server.log

    server.clear_log()
    r2 = S.SlicePublisher(api, "node-a", memory_policy=MEM_POLICY).publish([gpu(1), gpu(0)], shared_wanted=True)
    assert server.writes() == [] and not r2.changed
    assert r2.slices == r.slices and r2.generation == 1 and r2.shared


def test_publish_change_bumps_generation(server: fakeapi.FakeApiServer) -> None:
    pub = S.SlicePublisher(client(server), "node-a", owner_from_api=False)
    first = pub.publish([gpu(0)], shared_wanted=True)
    r = pub.publish([gpu(0), gpu(1)], shared_wanted=True)
    assert r.generation == 2 and r.slices == first.slices and r.writes == [f"update {first.slices[0]}"]
    [stored] = server.slices()
    assert stored["spec"]["pool"]["generation"] == 2
    assert stored["metadata"]["generation"] == 2  # metadata.generation: the server's, per spec change
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    # sharing switched off: another generation, whole devices
    r = pub.publish([gpu(0), gpu(1)], shared_wanted=False)
    assert r.generation == 3 and not r.shared and r.fallback_reason is None
    assert "allowMultipleAllocations" not in server.slices()[0]["spec"]["devices"][0]


def test_publish_split_shrink_and_extras(server: fakeapi.FakeApiServer) -> None:
    api = client(server)
    # another node's slice and another driver's slice on this node stay
    server.add_slice(S.build_slices("node-b", [gpu(0)], 1, shared=False)[0])
    server.add_slice(S.build_slices("node-a", [gpu(0)], 1, shared=False, driver="other.dev")[0])
    # a stray slice of ours (an older plugin's, no hash) goes
    stray = S.build_slices("node-a", [gpu(9)], 4, shared=False)[0]
    stray["metadata"]["annotations"] = {}
    stray = server.add_slice(stray)

    pub = S.SlicePublisher(api, "node-a", max_devices_per_slice=2, owner_from_api=False)
    r = pub.publish([gpu(i) for i in range(5)], shared_wanted=True)
    assert r.generation == 5  # above the stray's 4
    ours = [s for s in server.slices() if s["spec"]["nodeName"] == "node-a" and s["spec"]["driver"] == S.DRIVER]
    assert sorted(s["metadata"]["name"] for s in ours) == sorted(r.slices) and len(ours) == 3
    assert stray["metadata"]["name"] in r.slices  # reused in place
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in ours} == {3}
    assert {s["spec"]["pool"]["generation"] for s in ours} == {5}

    r2 = pub.publish([gpu(0)], shared_wanted=True)
    assert r2.generation == 6 and len(r2.slices) == 1
    assert sum(w.startswith("delete ") for w in r2.writes) == 2
    ours = [s for s in server.slices() if s["spec"]["nodeName"] == "node-a" and s["spec"]["driver"] == S.DRIVER]
    assert [s["metadata"]["name"] for s in ours] == r2.slices
    assert ours[0]["spec"]["pool"]["resourceSliceCount"] == 1
    assert len(server.slices()) == 3  # node-b's and other.dev's untouched

    r3 = pub.publish([], shared_wanted=True)
    assert r3.slices == [] and [w.split()[0] for w in r3.writes] == ["delete"]
    assert len(server.slices()) == 2


def test_publish_fallback_when_gate_off() -> None:
    with fakeapi.FakeApiServer(gate_consumable_capacity=False) as srv:
        pub = S.SlicePublisher(client(srv), "node-a", owner_from_api=False)
        r = pub.publish([gpu(0)], shared_wanted=True)
        assert not r.shared and r.fallback_reason and "DRAConsumableCapacity" in r.fallback_reason
        assert "\n" not in r.fallback_reason
        assert r.generation == 2 and [w.split()[0] for w in r.writes] == ["create", "update"]
        [stored] = srv.slices()
        d = stored["spec"]["devices"][0]
        assert "allowMultipleAllocations" not in d and "requestPolicy" not in d["capacity"]["memory"]
        assert stored["metadata"]["annotations"][S.ANNOTATION_HASH] == \
            S.spec_hash(S.build_slices("node-a", [gpu(0)], 2, shared=False)[0])
        srv.clear_log()
        r2 = pub.publish([gpu(0)], shared_wanted=True)
        assert srv.writes() == [] and not r2.shared and r2.fallback_reason == r.fallback_reason
        assert pub.publish([gpu(0)], shared_wanted=False).fallback_reason is None


def test_gate_keeps_fields_already_in_use() -> None:
    """strategy.go: a slice stored with the fields keeps them on update with the gate off."""
    with fakeapi.FakeApiServer() as srv:
        pub = S.SlicePublisher(client(srv), "node-a", owner_from_api=False)
        pub.publish([gpu(0)], shared_wanted=True)
        srv.gate_consumable_capacity = False
        r = S.SlicePublisher(client(srv), "node-a", owner_from_api=False).publish([gpu(0), gpu(1)], True)
        assert r.shared and r.fallback_reason is None
        assert S.consumable_fields_present(srv.slices()[0])


@pytest.mark.parametrize("gate", [True, False])
def test_publish_v1beta1_only_server(gate: bool) -> None:
    with fakeapi.FakeApiServer(versions=["v1beta1"], gate_consumable_capacity=gate) as srv:
        api = client(srv)
        assert api.resource_version() == "v1beta1"
        pub = S.SlicePublisher(api, "node-a", owner_from_api=False)
        r = pub.publish([gpu(0), gpu(1)], shared_wanted=True)
        assert r.shared is gate and (r.fallback_reason is None) is gate
        assert all("/v1beta1/" in p for m, p in srv.writes())
        listed = api.list_slices("node-a", S.DRIVER)
        assert listed[0]["apiVersion"] == "resource.k8s.io/v1"
        assert "basic" not in listed[0]["spec"]["devices"][0]
        assert S.consumable_fields_present(listed[0]) is gate
        srv.clear_log()
        pub.publish([gpu(0), gpu(1)], shared_wanted=True)
        assert srv.writes() == []


def test_version_preference() -> None:
    for versions, want in ((["v1", "v1beta1"], "v1"), (["v1beta2", "v1beta1"], "v1beta2")):
        with fakeapi.FakeApiServer(versions=versions) as srv:
            assert client(srv).resource_version() == want
    with fakeapi.FakeApiServer(versions=[]) as srv:
        with pytest.raises(ApiError, match="does not serve resource.k8s.io") as e:
            client(srv).resource_version()
        assert e.value.status == 404


# ---- ApiClient --------------------------------------------------------------------------

def test_api_errors(server: fakeapi.FakeApiServer) -> None:
    api = client(server)
    with pytest.raises(ApiError) as e:
        api.get_claim("default", "nope")
    assert e.value.status == 404 and "not found" in e.value.reason and "\n" not in str(e.value)
    with pytest.raises(ApiError) as e:
        api.get_node("nope")
    assert e.value.status == 404
    with pytest.raises(ApiError) as e:
        api.delete_slice("nope")
    assert e.value.status == 404

    [obj] = S.build_slices("node-a", [gpu(0)], 1, shared=True)
    created = api.create_slice(obj)
    stale = dict(created, metadata=dict(created["metadata"]))
    api.replace_slice(created)  # moves resourceVersion on
    with pytest.raises(ApiError) as e:
        api.replace_slice(stale)
    assert e.value.status == 409 and "modified" in e.value.reason

    bad = S.build_slices("node-a", [gpu(0)], 1, shared=True)[0]
    bad["spec"]["devices"][0]["name"] = "Bad_Name"
    with pytest.raises(ApiError) as e:
        api.create_slice(bad)
    assert e.value.status == 422


def test_api_unreachable() -> None:
    srv = fakeapi.FakeApiServer().start()
    cfg = srv.configuration()
    srv.stop()
    cfg.retries = 0
    with pytest.raises(ApiError) as e:
        ApiClient(cfg, timeout=2).resource_version()
    assert e.value.status == 0 and "\n" not in str(e.value)


def test_list_selectors(server: fakeapi.FakeApiServer) -> None:
    api = client(server)
    for node in ("node-a", "node-b"):
        api.create_slice(S.build_slices(node, [gpu(0)], 1, shared=False)[0])
    assert [s["spec"]["nodeName"] for s in api.list_slices("node-b", S.DRIVER)] == ["node-b"]
    assert api.list_slices("node-b", "other.dev") == []
    assert len(api.list_slices("node-a", S.DRIVER, label_selector=f"{S.LABEL_DRIVER}={S.DRIVER}")) == 1
    assert api.list_slices("node-a", S.DRIVER, label_selector=f"{S.LABEL_NODE}!=node-a") == []
    assert ("GET", "/apis/resource.k8s.io/v1/resourceslices") in server.log


def claim_v1() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "ns1", "uid": "0d7c5a52-8a1e-4b5a-9f7e-0a1b2c3d4e5f"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpuslice.dev", "allocationMode": "ExactCount",
                                        "count": 1, "capacity": {"requests": {"memory": "4Gi"}}}},
            {"name": "any", "firstAvailable": [{"name": "a", "deviceClassName": "gpuslice.dev"}]},
        ]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpuslice.dev", "pool": "node-a", "device": "gpu-0",
             "shareID": "3f1e0c4a-0b6e-4c1d-9a51-6f3e2d1c0b9a", "consumedCapacity": {"memory": "4Gi"}}]}}},
    }


@pytest.mark.parametrize("versions", [["v1"], ["v1beta2"], ["v1beta1"]])
def test_get_claim_in_v1_layout(versions: list[str]) -> None:
    with fakeapi.FakeApiServer(versions=versions) as srv:
        srv.add_claim(claim_v1())
        got = client(srv).get_claim("ns1", "c1")
        want = claim_v1()
        assert got["apiVersion"] == "resource.k8s.io/v1"
        assert got["spec"] == want["spec"] and got["status"] == want["status"]
        assert ("GET", f"/apis/resource.k8s.io/{versions[0]}/namespaces/ns1/resourceclaims/c1") in srv.log


def test_claim_to_v1_pure() -> None:
    beta = fakeapi.claim_out(fakeapi.claim_in(claim_v1()), "v1beta1")
    assert beta["spec"]["devices"]["requests"][0]["deviceClassName"] == "gpuslice.dev"
    assert claim_to_v1(beta)["spec"] == claim_v1()["spec"]


def test_from_env_bad_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="no Kubernetes configuration"):
        ApiClient.from_env(str(tmp_path / "missing"))
    cfg = tmp_path / "kubeconfig"
    cfg.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\n"
                   "users:\n- name: u\n  user: {token: abc}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                   "current-context: x\n")
    api = ApiClient.from_env(str(cfg))
    assert api._client.configuration.host == "http://127.0.0.1:1"


# ---- inventory --------------------------------------------------------------------------

class FakeNvmlDev:
    def __init__(self, minor: int) -> None:
        self.minor = minor


def fake_nvml(monkeypatch: pytest.MonkeyPatch, devs: list[int], fail_init: bool = False) -> list[str]:
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def no_name(h: FakeNvmlDev) -> str:
        if h.minor == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return "NVIDIA H100 80GB HBM3"

    fns = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlSystemGetDriverVersion": lambda: "580.95.05",
        "nvmlDeviceGetCount": lambda: len(devs),
        "nvmlDeviceGetHandleByIndex": lambda i: FakeNvmlDev(devs[i]),
        "nvmlDeviceGetMinorNumber": lambda h: h.minor,
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h.minor}-0000-0000-0000-000000000000",
        "nvmlDeviceGetName": no_name,
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{0x18 + h.minor:02X}:00.0".encode()),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=H100_MEM, free=1, used=0),
    }
    for k, v in fns.items():
        monkeypatch.setattr(pynvml, k, v)
    return calls


def test_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_nvml(monkeypatch, [3, 0])
    gpus = inv.from_nvml()
    assert [g.minor for g in gpus] == [0, 3]
    assert gpus[0] == GpuInfo(0, "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", "9.0",
                              "580.95.05", "0000:18:00.0", H100_MEM)
    assert gpus[1].name is None and gpus[1].pci_bus_id == "0000:1b:00.0"
    assert calls == ["init", "shutdown"]


def test_pci_and_arch() -> None:
    assert inv.normalize_pci_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert inv.normalize_pci_bus_id(b"00000001:AB:1F.7\0junk") == "0001:ab:1f.7"
    assert inv.normalize_pci_bus_id("18:00.0") == "0000:18:00.0"
    assert inv.normalize_pci_bus_id("garbage") is None and inv.normalize_pci_bus_id(None) is None
    assert inv.compute_capability_from_arch(abi.NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_GH100, 0) == "9.0"
    assert inv.compute_capability_from_arch(0x170, 0x0) == "8.0"
    assert inv.compute_capability_from_arch(0x170, 0x4) == "8.6"
    assert inv.compute_capability_from_arch(0x1A0, 0) is None


class FakeRm:
    """gpuslice.sched.rm.RmClient's surface that from_rm uses, answering like tests/standin."""

    instances: list["FakeRm"] = []
    fail_open: str | None = None
    fail_uuid = False

    def __init__(self, ctl_path: str = "/dev/nvidiactl") -> None:
        self.ctl_path = ctl_path
        self.fd = -1
        self.version = "580.95.05"
        self.closed = False
        FakeRm.instances.append(self)

    def __enter__(self) -> "FakeRm":
        if FakeRm.fail_open:
            raise RmError(FakeRm.fail_open, err=2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def fb_info(self, minor: int) -> dict[str, int]:
        return {"total": (80 << 30) + minor, "heap": 0, "free": 0}

    def attach(self, minor: int) -> GpuHandles:
        return GpuHandles(minor, -1, 0x100 + minor, 0x200 + minor)

    def control(self, h_object: int, cmd: int, params: bytes) -> bytes:
        minor = h_object - 0x200
        if cmd == abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING:
            assert len(params) == abi.NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS_SIZE
            assert struct.unpack_from("<I", params)[0] == 0  # ASCII
            name = b"NVIDIA H100 80GB HBM3 (nvstub)"
            return params[:4] + name + bytes(len(params) - 4 - len(name))
        if cmd == abi.NV2080_CTRL_CMD_MC_GET_ARCH_INFO:
            arch = abi.NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_GH100 if minor == 0 else 0x1A0
            return abi.MC_ARCH_INFO.pack(arch, 0, 0xA1, 0)
        if cmd == inv.NV2080_CTRL_CMD_GPU_GET_GID_INFO:
            if FakeRm.fail_uuid:
                raise RmError("RM_CONTROL GET_GID_INFO", 0x1F)
            index, flags, _length, _data = inv.GID_INFO.unpack(params)
            assert flags == 0
            s = f"GPU-6e767374-7562-0000-0000-0000000000{minor:02x}".encode() + b"\0"
            return inv.GID_INFO.pack(index, flags, len(s), s)
        raise RmError(f"RM_CONTROL 0x{cmd:x}", 0x56)


@pytest.fixture
def fake_rm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    FakeRm.instances, FakeRm.fail_open, FakeRm.fail_uuid = [], None, False
    for n in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm", "nvidia-modeset", "nvidia10x"):
        (tmp_path / n).write_text("")
    monkeypatch.setattr(inv, "RmClient", FakeRm)
    monkeypatch.setattr(inv, "card_info", lambda fd: {0: "0000:18:00.0"})
    monkeypatch.setattr(inv.rm_mod, "driver_version", lambda: None)
    return tmp_path / "nvidiactl"


def test_from_rm(fake_rm: Path) -> None:
    gpus = inv.from_rm(str(fake_rm))
    assert gpus == [
        GpuInfo(0, "GPU-6e767374-7562-0000-0000-000000000000", "NVIDIA H100 80GB HBM3 (nvstub)", "9.0",
                "580.95.05", "0000:18:00.0", (80 << 30)),
        GpuInfo(1, "GPU-6e767374-7562-0000-0000-000000000001", "NVIDIA H100 80GB HBM3 (nvstub)", None,
                "580.95.05", None, (80 << 30) + 1),
    ]
    assert FakeRm.instances[0].ctl_path == str(fake_rm) and FakeRm.instances[0].closed


def test_from_rm_errors(fake_rm: Path, tmp_path: Path) -> None:
    FakeRm.fail_uuid = True
    with pytest.raises(inv.InventoryError, match="GET_GID_INFO"):
        inv.from_rm(str(fake_rm))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(inv.InventoryError, match="no GPU device nodes"):
        inv.from_rm(str(empty / "nvidiactl"))


def test_discover(monkeypatch: pytest.MonkeyPatch, fake_rm: Path) -> None:
    fake_nvml(monkeypatch, [0])
    assert [g.name for g in inv.discover(ctl=str(fake_rm))] == ["NVIDIA H100 80GB HBM3"]
    assert FakeRm.instances == []
    assert inv.discover("rm", ctl=str(fake_rm))[0].name == "NVIDIA H100 80GB HBM3 (nvstub)"

    fake_nvml(monkeypatch, [0], fail_init=True)
    assert inv.discover(ctl=str(fake_rm))[0].name == "NVIDIA H100 80GB HBM3 (nvstub)"  # NVML missing: RM
    with pytest.raises(inv.InventoryError, match="NVML did not initialise"):
        inv.discover("nvml")

    FakeRm.fail_open = "open /dev/nvidiactl: No such file or directory"
    with pytest.raises(inv.InventoryError) as e:
        inv.discover(ctl=str(fake_rm))
    msg = str(e.value)
    assert "\n" not in msg and "NVML did not initialise" in msg and "RM on" in msg
    with pytest.raises(inv.InventoryError, match="unknown inventory source"):
        inv.discover("magic")

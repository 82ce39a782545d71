"""deploy/kubernetes/: the Kubernetes manifests of the DRA kubelet plugin, the device plugin
and their examples.

Covered: schema validity of every YAML document (multi-document files too) against the
Kubernetes 1.34 and 1.35 OpenAPI schemas and the newest one kubernetes-validate ships,
strict (an unknown or misspelled field is an error); and internal consistency: the
DaemonSets' gpuctl command lines against gpuctl's own click options (skipped while the
`kubelet-plugin` / `device-plugin` commands do not exist), the RBAC rules against the
API calls the plugin makes (and nothing more), every host path the plugins use mounted
from the host at the same path, the examples' DeviceClasses, claim templates and
extended resources defined in these files, and the device plugin's ConfigMap.

Not covered: API server admission (defaulting, validation beyond the schema, feature
gates, Pod Security), CEL evaluation (DeviceClass selectors, the admission policy), the
container image (the Dockerfile is not built), and any real cluster or node.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Iterator

import click
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from gpuslice import units
from gpuslice.cli import main

REPO = os.path.join(os.path.dirname(__file__), "..")
KUBE = os.path.join(REPO, "deploy", "kubernetes")
FILES = sorted(glob.glob(os.path.join(KUBE, "**", "*.yaml"), recursive=True))
IMAGE = "ghcr.io/gpuslice/gpuctl:0.1.0"
DRIVER = "gpuslice.dev"
NAMESPACE = "gpuslice-system"


def rel(path: str) -> str:
    return os.path.relpath(path, KUBE)


def load(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


DOCS = [(rel(p), i, d) for p in FILES for i, d in enumerate(load(p))]


def docs(kind: str, under: str = "") -> list[dict[str, Any]]:
    return [d for (p, _, d) in DOCS if d["kind"] == kind and p.startswith(under)]


def one(kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in docs(kind) if d["metadata"]["name"] == name]
    return d


def daemonset(name: str) -> dict[str, Any]:
    return one("DaemonSet", name)


def pod_spec(d: dict[str, Any]) -> dict[str, Any]:
    if d["kind"] == "Pod":
        return d["spec"]
    if d["kind"] == "CronJob":
        return d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return d["spec"]["template"]["spec"]


WORKLOADS = ("Pod", "Job", "DaemonSet", "Deployment", "StatefulSet", "CronJob")


def versions() -> list[str]:
    """1.34 (DRA's resource.k8s.io/v1 is GA there), 1.35, and the newest schema set."""
    newest = ".".join(latest_version().split(".")[:2])
    return sorted({"1.34", "1.35", newest}, key=lambda v: tuple(map(int, v.split("."))))


# ---- the set of files ------------------------------------------------------------------

def test_the_files_are_there() -> None:
    names = {rel(p) for p in FILES}
    assert names == {
        "namespace.yaml", "rbac.yaml", "deviceclasses.yaml", "kubelet-plugin.yaml",
        "resourceslice-policy.yaml", "device-plugin.yaml",
        "examples/share.yaml", "examples/offline-job.yaml", "examples/two-gpus.yaml",
        "examples/whole-gpu.yaml", "examples/device-plugin-pod.yaml",
    }
    for f in ("README.md", "Dockerfile"):
        assert os.path.isfile(os.path.join(KUBE, f))
    readme = open(os.path.join(KUBE, "README.md")).read()
    for name in names:
        assert name in readme, f"README.md does not mention {name}"


def test_dockerfile() -> None:
    text = open(os.path.join(KUBE, "Dockerfile")).read()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^RUN pip install -c constraints\.txt '\.\[kube\]'", text, re.M)  # the plugins' extra
    assert re.search(r'^ENTRYPOINT \["gpuctl"\]', text, re.M)
    assert "not built by the test suite" in text.lower()
    assert re.search(r"^COPY \. /src$", text, re.M)
    # the build context (Dockerfile.dockerignore, an allowlist) keeps what `pip install .`
    # needs: the project files at the root and the package
    ignore = [ln.strip() for ln in open(os.path.join(KUBE, "Dockerfile.dockerignore"))
              if ln.strip() and not ln.startswith("#")]
    assert ignore[0] == "*"
    kept = {ln[1:] for ln in ignore if ln.startswith("!")}
    assert {"pyproject.toml", "pyctl"} <= kept
    for build_file in ("setup.py", "setup.cfg", "MANIFEST.in"):
        if os.path.exists(os.path.join(REPO, build_file)):
            assert build_file in kept, build_file


def test_every_document_has_kind_and_name() -> None:
    assert DOCS
    for path, i, d in DOCS:
        assert {"apiVersion", "kind", "metadata"} <= d.keys(), (path, i)
        assert d["metadata"].get("name"), (path, i)


def test_names_are_unique() -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for path, _, d in DOCS:
        key = (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        assert key not in seen, f"{key} in {seen.get(key)} and {path}"
        seen[key] = path


# ---- schemas ---------------------------------------------------------------------------

def test_versions_cover_1_34_1_35_and_newest() -> None:
    vs = versions()
    assert vs[:2] == ["1.34", "1.35"] and len(vs) >= 2
    # resource.k8s.io/v1 (DRA GA) is in every schema set used
    for v in vs:
        kubernetes_validate.validate(
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
             "spec": {}}, v, strict=True)


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("path,index,doc", DOCS, ids=[f"{p}#{i}" for p, i, _ in DOCS])
def test_schema_valid(version: str, path: str, index: int, doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{path}#{index} {doc['kind']}/{doc['metadata']['name']} against {version}: "
                    f"{'.'.join(map(str, e.path))}: {e.message}")


def test_strict_validation_would_catch_a_misspelled_field() -> None:
    """The check above is not vacuous: a wrong field name (capacity.request instead of
    capacity.requests) and an unknown DaemonSet field are errors."""
    tmpl = one("ResourceClaimTemplate", "gpu-share-4gi")
    bad = yaml.safe_load(yaml.safe_dump(tmpl))
    req = bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    req["capacity"]["request"] = req["capacity"].pop("requests")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.34", strict=True)
    ds = yaml.safe_load(yaml.safe_dump(daemonset("gpuslice-kubelet-plugin")))
    ds["spec"]["template"]["spec"]["hostNetworking"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, "1.34", strict=True)


# ---- the DaemonSets --------------------------------------------------------------------

PLUGINS = {
    # DaemonSet: (gpuctl command, host paths it must have mounted at the same path)
    "gpuslice-kubelet-plugin": ("kubelet-plugin", {
        "/var/lib/kubelet/plugins/gpuslice.dev", "/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/dev",
        "/var/lib/gpuslice", "/run/gpuslice"}),
    "gpuslice-device-plugin": ("device-plugin", {
        "/var/lib/kubelet/device-plugins", "/var/run/cdi", "/dev", "/var/lib/gpuslice",
        "/run/gpuslice"}),
}
# the flags whose value is a host path the process reads or writes
PATH_FLAGS = {"--state": "file", "--plugin-dir": "dir", "--registry-dir": "dir", "--cdi-dir": "dir",
              "--device-plugin-dir": "dir"}


def plugin_container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in pod_spec(ds)["containers"] if c["name"] == "plugin"]
    return c


def argv(ds: dict[str, Any]) -> list[str]:
    """The container's command line, $(VAR) expanded the way kubelet does (NODE_NAME is
    the only one, and becomes a sample node name)."""
    c = plugin_container(ds)
    env = {e["name"] for e in c.get("env", [])}
    out = []
    for a in [*c["command"], *c.get("args", [])]:
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            assert var in env, f"$({var}) is not in the container's env"
        out.append(a.replace("$(NODE_NAME)", "node-a"))
    return out


def split(args: list[str], sub: str) -> tuple[list[str], list[str]]:
    i = args.index(sub)
    return args[:i], args[i + 1:]


def options(args: list[str]) -> dict[str, str | None]:
    """--opt=value / --opt value / --flag -> {opt: value or None}."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        a = args[i]
        assert a.startswith("--"), f"positional argument {a!r}"
        if "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[a] = args[i + 1]
            i += 1
        else:
            out[a] = None
        i += 1
    return out


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_daemonset_basics(name: str) -> None:
    ds = daemonset(name)
    spec = pod_spec(ds)
    assert ds["metadata"]["namespace"] == NAMESPACE
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["hostNetwork"] is True  # the module's netlink family is in init_net only
    assert not spec.get("hostPID")
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"]["gpuslice.dev/enabled"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        assert c["image"] == IMAGE, c["name"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    c = plugin_container(ds)
    assert c["securityContext"]["privileged"] is True
    assert c["command"] == ["gpuctl"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    # a first container that fails clearly where the module is missing
    (init,) = spec["initContainers"]
    assert "/sys/module/gpuslice" in " ".join(init["command"])
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0


def test_kubelet_plugin_specifics() -> None:
    ds = daemonset("gpuslice-kubelet-plugin")
    spec = pod_spec(ds)
    env = {e["name"]: e for e in plugin_container(ds)["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    _, sub = split(argv(ds), "kubelet-plugin")
    opts = options(sub)
    assert opts["--node-name"] == "node-a"
    assert opts["--plugin-dir"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert opts["--registry-dir"] == "/var/lib/kubelet/plugins_registry"
    assert opts["--cdi-dir"] == "/var/run/cdi"
    (sa,) = [d for d in docs("ServiceAccount") if d["metadata"]["name"] == spec["serviceAccountName"]]
    assert sa["metadata"]["namespace"] == NAMESPACE and sa.get("automountServiceAccountToken", True)


def test_device_plugin_specifics() -> None:
    ds = daemonset("gpuslice-device-plugin")
    spec = pod_spec(ds)
    assert spec["automountServiceAccountToken"] is False
    sa = one("ServiceAccount", spec["serviceAccountName"])
    assert sa["metadata"]["namespace"] == NAMESPACE and sa["automountServiceAccountToken"] is False
    # no API access: nothing binds the device plugin's account
    for b in [*docs("ClusterRoleBinding"), *docs("RoleBinding")]:
        assert all(s["name"] != sa["metadata"]["name"] for s in b["subjects"]), b["metadata"]["name"]
    # --config is a key of the ConfigMap mounted read-only at its directory
    _, sub = split(argv(ds), "device-plugin")
    config = options(sub)["--config"]
    assert config
    c = plugin_container(ds)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    m = mounts[os.path.dirname(config)]
    assert m.get("readOnly") is True
    (vol,) = [v for v in spec["volumes"] if v["name"] == m["name"]]
    cm = one("ConfigMap", vol["configMap"]["name"])
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert os.path.basename(config) in cm["data"]


def test_a_node_runs_one_plugin_or_the_other() -> None:
    """The DRA plugin stays off nodes labelled gpuslice.dev/mode=device-plugin, and the
    device plugin runs only there."""
    dra = pod_spec(daemonset("gpuslice-kubelet-plugin"))
    (term,) = dra["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "gpuslice.dev/mode", "operator": "NotIn", "values": ["device-plugin"]} in term["matchExpressions"]
    assert "gpuslice.dev/mode" not in dra["nodeSelector"]
    dp = pod_spec(daemonset("gpuslice-device-plugin"))
    assert dp["nodeSelector"]["gpuslice.dev/mode"] == "device-plugin"


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_host_paths_are_mounted(name: str) -> None:
    """Every host path the plugin needs (and every path its flags name) lies under a
    hostPath volume mounted at the same path in the container: kubelet and the runtime
    resolve the sockets and CDI specs the plugin reports on the host."""
    ds = daemonset(name)
    sub_name, needed = PLUGINS[name]
    spec = pod_spec(ds)
    vols = {v["name"]: v for v in spec["volumes"]}
    host_mounts = {}
    glob_args, sub = split(argv(ds), sub_name)
    flags = {**options(glob_args[1:]), **options(sub)}
    for m in plugin_container(ds)["volumeMounts"]:
        hp = vols[m["name"]].get("hostPath")
        root = flags.get("--driver-root") or ""
        if hp and root and m["mountPath"].startswith(root.rstrip("/") + "/"):
            # the host's driver directories, read only, under --driver-root: the plugin
            # names the files by their host paths (cdi.scan_host's root)
            assert hp["path"] == m["mountPath"][len(root.rstrip("/")):] and m.get("readOnly") is True, (m, hp)
            continue
        if hp:
            assert hp["path"] == m["mountPath"], (m, hp)
            assert hp.get("type") in ("Directory", "DirectoryOrCreate"), hp
            assert not m.get("readOnly"), m  # the plugins write in each of them
            host_mounts[m["mountPath"]] = hp
    assert needed <= host_mounts.keys(), needed - host_mounts.keys()
    assert flags.get("--driver-root"), "the driver files are looked up in the container's own root"
    # paths the flags name
    for flag, what in PATH_FLAGS.items():
        if flag in flags:
            path = flags[flag]
            assert path and os.path.isabs(path), (flag, path)
            d = os.path.dirname(path) if what == "file" else path
            assert any(d == mp or d.startswith(mp.rstrip("/") + "/") for mp in host_mounts), (flag, path)
    # kubelet's own directories must exist (kubelet makes them); ours may be created
    for mp, hp in host_mounts.items():
        if (mp.startswith("/var/lib/kubelet") or mp == "/dev") and not mp.endswith("/gpuslice.dev"):
            assert hp["type"] == "Directory", mp


def check_command_line(group: click.Group, args: list[str], sub_name: str) -> None:
    """Each option given exists on gpuctl's group or on the subcommand (click's params),
    and the whole command line parses and converts there (make_context: nothing runs)."""
    assert args[0] == "gpuctl"
    glob_args, sub = split(args[1:], sub_name)
    cmd = group.commands[sub_name]

    def opts_of(c: click.Command) -> set[str]:
        return {o for p in c.params for o in (*p.opts, *p.secondary_opts)}

    unknown = set(options(glob_args)) - opts_of(group)
    assert not unknown, f"not options of gpuctl: {unknown}"
    unknown = set(options(sub)) - opts_of(cmd)
    assert not unknown, f"not options of gpuctl {sub_name}: {unknown}"
    with group.make_context("gpuctl", [*glob_args, sub_name]) as ctx:
        cmd.make_context(sub_name, list(sub), parent=ctx)


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_gpuctl_command_line_parses(name: str) -> None:
    sub_name = PLUGINS[name][0]
    # a manifest naming a command gpuctl lacks (renamed, removed) fails: no skip hides it
    assert sub_name in main.commands, f"the {name} manifest runs `gpuctl {sub_name}`, which gpuctl lacks"
    check_command_line(main, argv(daemonset(name)), sub_name)


def test_the_parse_check_would_catch_a_wrong_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_command_line against a stand-in for `gpuctl kubelet-plugin` with the options
    the manifests were written for: the DaemonSet's line passes; a misspelled option, a
    bad choice and a missing required option fail."""
    @click.group()
    @click.option("--state")
    @click.option("--kernel")
    def fake(state: str | None, kernel: str | None) -> None:
        pass

    @fake.command("kubelet-plugin")
    @click.option("--node-name", envvar="NODE_NAME", required=True)
    @click.option("--plugin-dir")
    @click.option("--registry-dir")
    @click.option("--cdi-dir")
    @click.option("--kubeconfig")
    @click.option("--memory-min")
    @click.option("--memory-step")
    @click.option("--policy", type=click.Choice(["fixed", "weight", "burst", "equal"]))
    @click.option("--gpu-source", type=click.Choice(["auto", "nvml", "rm"]))
    @click.option("--no-share", is_flag=True)
    @click.option("--driver-root")
    def kubelet_plugin(**kw: Any) -> None:
        pass

    monkeypatch.delenv("NODE_NAME", raising=False)
    good = argv(daemonset("gpuslice-kubelet-plugin"))
    check_command_line(fake, good, "kubelet-plugin")
    for bad in (["--node-nam=n"], ["--gpu-source=cuda"]):
        with pytest.raises((AssertionError, click.UsageError)):
            check_command_line(fake, [*good, *bad], "kubelet-plugin")
    with pytest.raises(click.UsageError):
        check_command_line(fake, [a for a in good if not a.startswith("--node-name")], "kubelet-plugin")


# ---- RBAC --------------------------------------------------------------------------------

# (apiGroup, resource) -> verbs: what `gpuctl kubelet-plugin` calls, and all it may call
PLUGIN_API = {
    ("resource.k8s.io", "resourceslices"): {"get", "list", "create", "update", "delete"},
    ("resource.k8s.io", "resourceclaims"): {"get"},
    ("", "nodes"): {"get"},
}


def granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                out.setdefault((g, r), set()).update(rule["verbs"])
    return out


def test_rbac_covers_the_plugin_and_no_more() -> None:
    ds = daemonset("gpuslice-kubelet-plugin")
    sa = pod_spec(ds)["serviceAccountName"]
    bindings = [b for b in docs("ClusterRoleBinding")
                if any(s["kind"] == "ServiceAccount" and s["name"] == sa and s["namespace"] == NAMESPACE
                       for s in b["subjects"])]
    assert len(bindings) == 1 and not docs("RoleBinding")
    ref = bindings[0]["roleRef"]
    assert ref["kind"] == "ClusterRole" and ref["apiGroup"] == "rbac.authorization.k8s.io"
    assert granted(one("ClusterRole", ref["name"])) == PLUGIN_API


def test_admission_policy_names_the_plugin_account() -> None:
    sa = pod_spec(daemonset("gpuslice-kubelet-plugin"))["serviceAccountName"]
    vap = one("ValidatingAdmissionPolicy", "gpuslice-resourceslices")
    (cond,) = vap["spec"]["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{sa}"' in cond["expression"]
    binding = one("ValidatingAdmissionPolicyBinding", "gpuslice-resourceslices")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert all("resourceslices" in r["resources"] for r in vap["spec"]["matchConstraints"]["resourceRules"])


def test_namespace_allows_privileged_pods() -> None:
    ns = one("Namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for path, _, d in DOCS:
        if d["metadata"].get("namespace"):
            assert d["metadata"]["namespace"] == NAMESPACE, path


# ---- DeviceClasses and examples ------------------------------------------------------------

def classes() -> dict[str, dict[str, Any]]:
    out = {d["metadata"]["name"]: d for (p, _, d) in DOCS if d["kind"] == "DeviceClass"}
    assert {p for (p, _, d) in DOCS if d["kind"] == "DeviceClass"} == {"deviceclasses.yaml"}
    return out


def test_deviceclasses() -> None:
    cls = classes()
    assert set(cls) == {DRIVER, f"{DRIVER}-offline"}
    for c in cls.values():
        assert [s["cel"]["expression"] for s in c["spec"]["selectors"]] == [f'device.driver == "{DRIVER}"']
    assert "config" not in cls[DRIVER]["spec"]
    (cfg,) = cls[f"{DRIVER}-offline"]["spec"]["config"]
    assert cfg["opaque"]["driver"] == DRIVER
    assert cfg["opaque"]["parameters"] == {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuConfig",
                                           "priority": "offline", "minShare": "5%"}
    assert units.parse_share(cfg["opaque"]["parameters"]["minShare"]) == 0.05


def claim_specs() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, name, ResourceClaimSpec) of every claim and claim template."""
    for d in docs("ResourceClaimTemplate"):
        yield d["kind"], d["metadata"]["name"], d["spec"]["spec"]
    for d in docs("ResourceClaim"):
        yield d["kind"], d["metadata"]["name"], d["spec"]


_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?")
_SUFFIX = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(q: Any) -> float:
    """A Kubernetes resource.Quantity (the forms these files use) -> a number."""
    m = _QUANTITY.fullmatch(str(q))
    assert m, f"not a quantity: {q!r}"
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def test_claims_use_classes_that_exist() -> None:
    cls = classes()
    seen = set()
    for kind, name, spec in claim_specs():
        for req in spec["devices"]["requests"]:
            subs = [req["exactly"]] if "exactly" in req else req["firstAvailable"]
            for sub in subs:
                assert sub["deviceClassName"] in cls, (kind, name)
                seen.add(sub["deviceClassName"])
    assert seen == set(cls)  # each class has an example


def test_claim_capacity_requests() -> None:
    """Capacities are the driver's `memory` (bytes) and `compute` (percent of a GPU)."""
    n = 0
    for kind, name, spec in claim_specs():
        for req in spec["devices"]["requests"]:
            caps = req["exactly"].get("capacity", {}).get("requests", {})
            assert set(caps) <= {"memory", "compute"}, (name, caps)
            if "memory" in caps:
                assert quantity(caps["memory"]) >= 256 * 2**20 and quantity(caps["memory"]) % (256 * 2**20) == 0
                n += 1
            if "compute" in caps:
                assert isinstance(caps["compute"], str), "quote compute: a Quantity is a string"
                assert 1 <= quantity(caps["compute"]) <= 100, (name, caps)
    assert n >= 3
    share = one("ResourceClaimTemplate", "gpu-share-4gi")["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert share["capacity"]["requests"] == {"memory": "4Gi", "compute": "30"}
    whole = one("ResourceClaim", "whole-gpu")["spec"]["devices"]["requests"][0]["exactly"]
    assert "capacity" not in whole and whole.get("count", 1) == 1


def test_claims_never_set_priority() -> None:
    """Priority is honoured from a DeviceClass only: no claim carries driver config
    that would look as if it set one."""
    for kind, name, spec in claim_specs():
        for cfg in spec["devices"].get("config", []):
            params = cfg.get("opaque", {}).get("parameters", {})
            assert not {"priority", "minShare"} & set(params), (kind, name)


def test_two_gpu_claim() -> None:
    spec = one("ResourceClaimTemplate", "two-gpu-shares")["spec"]["spec"]["devices"]
    (req,) = spec["requests"]
    assert req["exactly"]["count"] == 2 and req["exactly"].get("allocationMode", "ExactCount") == "ExactCount"
    (con,) = spec["constraints"]
    assert con["distinctAttribute"] == f"{DRIVER}/uuid"  # fully qualified, as the API requires
    assert con["requests"] == [req["name"]]


def test_offline_example_uses_the_offline_class() -> None:
    job = one("Job", "gpu-offline-batch")
    (rc,) = pod_spec(job)["resourceClaims"]
    tmpl = one("ResourceClaimTemplate", rc["resourceClaimTemplateName"])
    (req,) = tmpl["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == f"{DRIVER}-offline"


def example_workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(p, d) for (p, _, d) in DOCS if p.startswith("examples/") and d["kind"] in WORKLOADS]


def test_example_pods_reference_what_exists() -> None:
    """Pod claims name a template or claim of these files; containers name pod claims;
    each pod claim is used; extended resources are profiles of the device plugin."""
    templates = {d["metadata"]["name"] for d in docs("ResourceClaimTemplate")}
    claims = {d["metadata"]["name"] for d in docs("ResourceClaim")}
    resources = {f"{DRIVER}/{p['name']}" for p in device_plugin_config()["profiles"]} | {f"{DRIVER}/gpu"}
    assert len(example_workloads()) == 5
    for path, d in example_workloads():
        spec = pod_spec(d)
        pod_claims = {}
        for rc in spec.get("resourceClaims", []):
            if "resourceClaimTemplateName" in rc:
                assert rc["resourceClaimTemplateName"] in templates, path
            else:
                assert rc["resourceClaimName"] in claims, path
            pod_claims[rc["name"]] = rc
        used = set()
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            for cl in c.get("resources", {}).get("claims", []):
                assert cl["name"] in pod_claims, (path, cl)
                used.add(cl["name"])
            for r in c.get("resources", {}).get("limits", {}):
                if r.startswith(f"{DRIVER}/"):
                    assert r in resources, (path, r)
                    used.add(r)
            # CUDA images set NVIDIA_VISIBLE_DEVICES=all; the NVIDIA runtime must not add GPUs
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", (path, c["name"])
        assert used, f"{path}: asks for no GPU"
        assert set(pod_claims) <= used, path
        assert spec["restartPolicy"] in ("Never", "OnFailure")


def test_examples_are_in_no_system_namespace() -> None:
    for path, _, d in DOCS:
        if path.startswith("examples/"):
            assert "namespace" not in d["metadata"], path


# ---- the device plugin's ConfigMap -------------------------------------------------------

def device_plugin_config() -> dict[str, Any]:
    ds = daemonset("gpuslice-device-plugin")
    _, sub = split(argv(ds), "device-plugin")
    key = os.path.basename(options(sub)["--config"] or "")
    cm = one("ConfigMap", "gpuslice-device-plugin")
    cfg = yaml.safe_load(cm["data"][key])
    assert isinstance(cfg, dict)
    return cfg


_RESOURCE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def test_device_plugin_config() -> None:
    cfg = device_plugin_config()
    assert set(cfg) == {"profiles"}
    profiles = cfg["profiles"]
    # no `gpus`: a list would name GPUs every node must have
    assert profiles == [{"name": "gpu-8gi", "memory": "8Gi", "compute": "12%"}]
    names = set()
    for p in profiles:
        assert set(p) <= {"name", "memory", "compute", "gpus", "slots"} and {"name", "memory"} <= set(p), p
        # the resource gpuslice.dev/<name>: a valid extended resource name, not the
        # whole-GPU resource, unique
        assert _RESOURCE_NAME.fullmatch(p["name"]) and len(p["name"]) <= 63, p
        assert p["name"] != "gpu" and p["name"] not in names
        names.add(p["name"])
        assert quantity(p["memory"]) >= 256 * 2**20
        if "compute" in p:
            assert 0 < units.parse_share(p["compute"]) <= 1
        if "gpus" in p:
            assert p["gpus"] and all(isinstance(g, int) and 0 <= g < units.MAX_GPUS for g in p["gpus"])
            assert len(set(p["gpus"])) == len(p["gpus"])


def test_device_plugin_config_reads_with_gpuctls_reader(tmp_path) -> None:
    """The ConfigMap's file as `gpuctl device-plugin --config` reads it (skipped until
    gpuslice.kube.deviceplugin.read_config exists)."""
    try:
        from gpuslice.kube import deviceplugin as DP
    except ImportError as e:
        pytest.skip(f"gpuslice.kube.deviceplugin: {e}")
    if not hasattr(DP, "read_config"):
        pytest.skip("gpuslice.kube.deviceplugin.read_config does not exist")
    path = tmp_path / "device-plugin.yaml"
    path.write_text(yaml.safe_dump(device_plugin_config()))
    config = DP.read_config(str(path))
    (p,) = config.profiles
    assert (p.name, p.memory, p.compute, p.gpus) == ("gpu-8gi", 8 << 30, 0.12, None)


def test_offline_class_config_parses_with_gpuctls_parser() -> None:
    """The offline DeviceClass's parameters as the DRA driver reads them: accepted from
    a class, refused from a claim (skipped until gpuslice.kube.claims.parse_config exists)."""
    try:
        from gpuslice.kube import claims as K
    except ImportError as e:
        pytest.skip(f"gpuslice.kube.claims: {e}")
    if not hasattr(K, "parse_config"):
        pytest.skip("gpuslice.kube.claims.parse_config does not exist")
    (cfg,) = classes()[f"{DRIVER}-offline"]["spec"]["config"]
    parsed = K.parse_config(cfg["opaque"]["parameters"], from_class=True)
    assert parsed.priority == "offline"
    with pytest.raises(ValueError):
        K.parse_config(cfg["opaque"]["parameters"], from_class=False)

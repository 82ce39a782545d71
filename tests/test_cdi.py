"""`gpuctl cdi generate`: the CDI spec (pure parts with hypothesis), the host scan on a
fake tree, and the CLI with an injected netlink client."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.ops import cdi
from gpuslice.cli import main

LIB = "/usr/lib/x86_64-linux-gnu"
DRIVER = [f"{LIB}/libcuda.so.580.159.04", f"{LIB}/libcuda.so.1", f"{LIB}/libcuda.so",
          f"{LIB}/libnvidia-ml.so.580.159.04", f"{LIB}/libnvidia-ml.so.1",
          f"{LIB}/libnvidia-ptxjitcompiler.so.580.159.04", f"{LIB}/libnvidia-ptxjitcompiler.so.1",
          "/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump",
          "/lib/firmware/nvidia/580.159.04/gsp_ga10x.bin", "/lib/firmware/nvidia/580.159.04/gsp_tu10x.bin"]
OTHER = [f"{LIB}/libc.so.6", f"{LIB}/libnvidia-glcore.so.580.159.04", f"{LIB}/libcudart.so.12",
         f"{LIB}/libcuda.so.1.bak", "/usr/share/doc/nvidia-smi", "/dev/nvidia0", "/dev/nvidiactl",
         "/usr/bin/nvidia-smi-wrapper", "relative/libcuda.so.1", "/lib/firmware/nvidia/580/readme.txt"]


def test_driver_files_takes_what_nvidia_ctk_takes() -> None:
    got = cdi.driver_files(OTHER + DRIVER[::-1] + DRIVER)
    assert got == sorted(set(DRIVER) - {f"{LIB}/libcuda.so"})  # not the development link


def test_driver_files_none_when_absent() -> None:
    assert cdi.driver_files(OTHER) == []
    assert cdi.driver_files([]) == []


@given(st.lists(st.sampled_from(DRIVER + OTHER) | st.text(max_size=40)))
def test_driver_files_properties(listing: list[str]) -> None:
    got = cdi.driver_files(listing)
    assert got == sorted(set(got)) and set(got) <= set(listing)
    assert all(p.startswith("/") and not p.startswith("/dev/") and not p.endswith(".so") for p in got)


names = st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,30}", fullmatch=True).filter(lambda n: not n.endswith((".", "-", "_")))
instances = st.lists(st.builds(cdi.Instance, names, st.lists(st.integers(0, 31), min_size=1, max_size=4, unique=True)
                               .map(lambda g: tuple(sorted(g)))), unique_by=lambda i: i.name, max_size=8)


@given(instances, st.lists(st.sampled_from(DRIVER), unique=True), st.sampled_from([None, "/usr/bin/nvidia-ctk"]))
def test_spec_properties(insts: list[cdi.Instance], files: list[str], ctk: str | None) -> None:
    spec = cdi.build_spec(insts, sorted(files), ctk)
    assert cdi.check_spec(spec) == []
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "gpuslice.dev/gpu"
    assert [d["name"] for d in spec["devices"]] == sorted(i.name for i in insts)
    for inst, dev in zip(sorted(insts, key=lambda i: i.name), spec["devices"]):
        nodes = dev["containerEdits"]["deviceNodes"]
        assert [n["path"] for n in nodes] == ["/dev/nvidiactl", *(f"/dev/nvidia{g}" for g in inst.gpus),
                                              "/dev/nvidia-uvm"]
        for n in nodes:  # never a real node: every host path is the instance's own
            assert n["hostPath"] == f"/dev/gpuslice/{inst.name}/{os.path.basename(n['path'])}"
        assert f"GPUSLICE_INSTANCE={inst.name}" in dev["containerEdits"]["env"]
    edits = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    assert [m["hostPath"] for m in edits.get("mounts", [])] == sorted(files)
    assert all(m["containerPath"] == m["hostPath"] and "ro" in m["options"] for m in edits.get("mounts", []))
    hooks = edits.get("hooks", [])
    assert bool(hooks) == (ctk is not None and any(".so." in f for f in files))
    # YAML round trip: what runtimes read is what was built
    assert yaml.safe_load(cdi.render(spec)) == spec


def test_check_spec_catches_a_real_node() -> None:
    spec = cdi.build_spec([cdi.Instance("web", (0,))], [])
    spec["devices"][0]["containerEdits"]["deviceNodes"][1]["hostPath"] = "/dev/nvidia0"
    assert cdi.check_spec(spec) == ["web: the real node /dev/nvidia0 in the spec"]
    spec["devices"][0]["containerEdits"]["deviceNodes"][1]["hostPath"] = "/tmp/x"
    assert "not an instance node" in cdi.check_spec(spec)[0]


def test_ldcache_hook_like_nvidia_ctk() -> None:
    hooks = cdi.ldcache_hook(DRIVER, "/usr/bin/nvidia-ctk")
    assert hooks == [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
                      "args": ["nvidia-ctk", "hook", "update-ldcache", "--folder", LIB]}]
    assert cdi.ldcache_hook(DRIVER, None) == []


def test_instances_from_netlink() -> None:
    got = cdi.instances_from_netlink([{"name": "b", "gpu_mask": 0b101}, {"name": "a", "gpu_mask": 1}, {"id": 3}])
    assert got == [cdi.Instance("a", (0,)), cdi.Instance("b", (0, 2))]


def test_scan_host_on_a_fake_tree(tmp_path) -> None:
    lib, bin_, fw = tmp_path / "usr/lib/x86_64-linux-gnu", tmp_path / "usr/bin", tmp_path / "lib/firmware/nvidia"
    for d in (lib, bin_, fw / "580.159.04"):
        d.mkdir(parents=True)
    (lib / "libcuda.so.580.159.04").write_bytes(b"")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.159.04")
    (bin_ / "nvidia-smi").write_bytes(b"")
    (fw / "580.159.04" / "gsp_ga10x.bin").write_bytes(b"")
    (tmp_path / "lib64").symlink_to(lib)  # usrmerge-style alias: listed once
    listing = cdi.scan_host([str(lib), str(tmp_path / "lib64"), str(tmp_path / "missing")], [str(bin_)], str(fw))
    assert len(listing) == 4
    files = cdi.driver_files(listing)
    # the firmware is recognised under /lib/firmware/nvidia only, so not in this tree
    assert sorted(os.path.basename(f) for f in files) == ["libcuda.so.1", "libcuda.so.580.159.04", "nvidia-smi"]


def test_write_spec_is_atomic_and_world_readable(tmp_path) -> None:
    path = tmp_path / "cdi" / "gpuslice.yaml"
    cdi.write_spec(str(path), "a: 1\n")
    cdi.write_spec(str(path), "a: 2\n")
    assert path.read_text() == "a: 2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(path.parent) == ["gpuslice.yaml"]


class FakeNetlink:
    """The part of GpusliceNetlink that create/delete and cdi generate use."""

    def __init__(self) -> None:
        self.insts: dict[str, int] = {}

    def instance_new(self, name: str, gpu_mask: int, mem_limit: int, **_kw: object) -> None:
        self.insts[name] = gpu_mask

    def instance_del(self, name: str) -> None:
        del self.insts[name]

    def instances(self, name: str | None = None) -> list[dict[str, object]]:
        return [{"name": n, "gpu_mask": m, "id": i} for i, (n, m) in enumerate(self.insts.items())]


@pytest.fixture()
def gpuctl(tmp_path):
    nl = FakeNetlink()

    def run(*args: str):
        return CliRunner().invoke(main, ["--state", str(tmp_path / "state.json"), "--kernel", "yes", *args],
                                  obj={"nl": nl})

    return run


def test_cli_generate_from_the_module(gpuctl, tmp_path) -> None:
    assert gpuctl("instance", "create", "web", "--gpu", "1", "--memory", "1GiB").exit_code == 0
    res = gpuctl("cdi", "generate", "--json")
    assert res.exit_code == 0, res.stderr
    spec = json.loads(res.stdout)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][1] == {"path": "/dev/nvidia1",
                                                                       "hostPath": "/dev/gpuslice/web/nvidia1"}
    text = gpuctl("cdi", "generate").stdout
    assert yaml.safe_load(text)["devices"] == spec["devices"]
    out = tmp_path / "etc-cdi" / "gpuslice.yaml"
    res = gpuctl("cdi", "generate", "--output", str(out))
    assert res.exit_code == 0 and res.stdout.startswith(f"wrote {out}: 1 devices")
    assert "gpuslice.dev/gpu=web" in res.stdout
    assert yaml.safe_load(out.read_text())["devices"] == spec["devices"]


def test_create_and_delete_regenerate(gpuctl, tmp_path) -> None:
    out = tmp_path / "gpuslice.yaml"
    assert gpuctl("--cdi-spec", str(out), "instance", "create", "a", "--memory", "1GiB").exit_code == 0
    assert gpuctl("--cdi-spec", str(out), "instance", "create", "b", "--memory", "1GiB").exit_code == 0
    assert [d["name"] for d in yaml.safe_load(out.read_text())["devices"]] == ["a", "b"]
    assert gpuctl("--cdi-spec", str(out), "instance", "delete", "a").exit_code == 0
    assert [d["name"] for d in yaml.safe_load(out.read_text())["devices"]] == ["b"]
    assert gpuctl("instance", "create", "c", "--memory", "1GiB").exit_code == 0  # no spec path: untouched
    assert [d["name"] for d in yaml.safe_load(out.read_text())["devices"]] == ["b"]
    assert gpuctl("--cdi-spec", str(out), "instance", "delete", "b").exit_code == 0
    assert gpuctl("--cdi-spec", str(out), "instance", "delete", "c").exit_code == 0
    assert not out.exists()  # no device left: no spec (CDI refuses an empty one)


def test_cli_unwritable_output_is_one_line(gpuctl, tmp_path) -> None:
    gpuctl("instance", "create", "web", "--memory", "1GiB")
    (tmp_path / "file").write_text("")
    res = gpuctl("cdi", "generate", "-o", str(tmp_path / "file" / "x.yaml"))
    assert res.exit_code == 1
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("gpuctl: cannot write the CDI spec")


@pytest.mark.parametrize("content", ["cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n", "notes\n", "{{{"])
def test_a_file_that_is_not_our_spec_is_neither_replaced_nor_removed(gpuctl, tmp_path, content: str) -> None:
    """`cdi generate -o` and --cdi-spec at another vendor's spec, or any other file: one
    line, the file as it was (with no instance left, it used to be deleted; with some,
    replaced)."""
    other = tmp_path / "nvidia.yaml"
    other.write_text(content)
    res = gpuctl("cdi", "generate", "-o", str(other))  # no instance: would remove
    assert res.exit_code == 1 and res.stderr.strip() == (
        f"gpuctl: {other} is not a CDI spec of kind {cdi.KIND}: left as it is")
    res = gpuctl("--cdi-spec", str(other), "instance", "create", "web", "--memory", "1GiB")  # would replace
    assert res.exit_code == 1 and "created web, but" in res.stderr and "left as it is" in res.stderr
    assert other.read_text() == content
    ours = tmp_path / "gpuslice.yaml"
    assert gpuctl("cdi", "generate", "-o", str(ours)).exit_code == 0
    assert gpuctl("instance", "delete", "web").exit_code == 0
    assert gpuctl("cdi", "generate", "-o", str(ours)).exit_code == 0 and not ours.exists()  # ours: removed


def test_run_args(gpuctl, monkeypatch) -> None:
    """Docker-style flags: the same nodes as the CDI device, HOST:CONTAINER."""
    monkeypatch.setattr(cdi, "scan_host", lambda: DRIVER + OTHER)
    assert gpuctl("instance", "create", "web", "--gpu", "2", "--memory", "1GiB").exit_code == 0
    res = gpuctl("run-args", "web", "--json")
    assert res.exit_code == 0, res.stderr
    args = json.loads(res.stdout)
    devs = [args[i + 1] for i, a in enumerate(args) if a == "--device"]
    assert devs == ["/dev/gpuslice/web/nvidiactl:/dev/nvidiactl", "/dev/gpuslice/web/nvidia2:/dev/nvidia2",
                    "/dev/gpuslice/web/nvidia-uvm:/dev/nvidia-uvm"]
    vols = [args[i + 1] for i, a in enumerate(args) if a == "--volume"]
    assert vols == [f"{f}:{f}:ro" for f in cdi.driver_files(DRIVER)]
    line = gpuctl("run-args", "web", "--no-driver").stdout.strip()
    assert line == ("--device /dev/gpuslice/web/nvidiactl:/dev/nvidiactl --device /dev/gpuslice/web/nvidia2:/dev/nvidia2 "
                    "--device /dev/gpuslice/web/nvidia-uvm:/dev/nvidia-uvm --env GPUSLICE_INSTANCE=web "
                    "--env NVIDIA_DRIVER_CAPABILITIES=all --env NVIDIA_VISIBLE_DEVICES=void")
    err = gpuctl("run-args", "nope").stderr.strip()
    assert err == "gpuctl: no instance 'nope'"


def test_run_args_env_is_the_cdi_specs(gpuctl, monkeypatch) -> None:
    """run-args sets the environment the CDI spec gives the instance's device (its own
    edits and the spec's shared ones): NVIDIA_VISIBLE_DEVICES=void too, or under a host
    whose default runtime is NVIDIA's the real nodes come back and the module refuses the
    instance's."""
    monkeypatch.setattr(cdi, "scan_host", lambda: DRIVER)
    assert gpuctl("instance", "create", "web", "--gpu", "1", "--memory", "1GiB").exit_code == 0
    spec = json.loads(gpuctl("cdi", "generate", "--json").stdout)
    (dev,) = [d for d in spec["devices"] if d["name"] == "web"]
    want = dev["containerEdits"].get("env", []) + spec["containerEdits"].get("env", [])
    assert "NVIDIA_VISIBLE_DEVICES=void" in want and "GPUSLICE_INSTANCE=web" in want
    for extra in ([], ["--no-driver"]):
        args = json.loads(gpuctl("run-args", "web", "--json", *extra).stdout)
        assert sorted(args[i + 1] for i, a in enumerate(args) if a == "--env") == sorted(want)
    assert cdi.container_env("web") == want


def test_restore_recreates_what_the_module_lacks(gpuctl, tmp_path) -> None:
    from gpuslice import state as S

    assert gpuctl("instance", "create", "a", "--memory", "1GiB").exit_code == 0
    path = str(tmp_path / "state.json")
    with S.locked(path) as stt:  # as after a reboot: in the state file, not in the module
        stt.instances["b"] = S.Instance("b", [0, 3], 2 << 30, weight=5)
    out = tmp_path / "g.yaml"
    res = gpuctl("--cdi-spec", str(out), "instance", "restore", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout) == {"created": ["b"], "failed": []}
    assert [d["name"] for d in yaml.safe_load(out.read_text())["devices"]] == ["a", "b"]
    assert gpuctl("instance", "restore").stdout.strip() == "nothing to restore"
    no_module = CliRunner().invoke(main, ["--state", path, "--kernel", "no", "instance", "restore"])
    assert no_module.exit_code == 2 and "needs the gpuslice module whatever --kernel says" in no_module.stderr


def test_a_failed_regeneration_keeps_the_change(gpuctl, tmp_path) -> None:
    """The instance is made (module and state file) even when the spec cannot be
    written; the error says both, in one line."""
    from gpuslice import state as S

    (tmp_path / "file").write_text("")
    bad = str(tmp_path / "file" / "g.yaml")
    res = gpuctl("--cdi-spec", bad, "instance", "create", "web", "--memory", "1GiB")
    assert res.exit_code == 1
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith(f"gpuctl: created web, but the CDI spec {bad} was not written")
    assert list(S.load(str(tmp_path / "state.json")).instances) == ["web"]


def test_names_that_are_not_cdi_names_are_refused_and_old_ones_left_out(gpuctl, tmp_path) -> None:
    """A new name must be a CDI device name; one made before that rule (in the state file
    and the module) still loads, and is left out of the spec with one warning line."""
    from gpuslice import state as S

    assert cdi.is_cdi_name("web-1.a_b") and not cdi.is_cdi_name("_web") and not cdi.is_cdi_name("web-")
    out = tmp_path / "g.yaml"
    assert gpuctl("--cdi-spec", str(out), "instance", "create", "ok", "--memory", "1GiB").exit_code == 0
    res = gpuctl("--cdi-spec", str(out), "instance", "create", "_hidden", "--memory", "1GiB")
    assert res.exit_code == 2 and "bad instance name '_hidden'" in res.stderr
    path = str(tmp_path / "state.json")
    with S.locked(path) as st:  # as an older gpuctl made them
        for n in ("_hidden", "x-"):
            st.instances[n] = S.Instance(n, [0], 1 << 30)
    assert gpuctl("instance", "restore").exit_code == 0
    res = gpuctl("--cdi-spec", str(out), "instance", "create", "ok2", "--memory", "1GiB")
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ("gpuctl: warning: left out of the CDI spec, as CDI device names start and end with a "
                          "letter or digit: '_hidden', 'x-' (made before names had to be; recreate under another "
                          "name)\n")
    assert [d["name"] for d in yaml.safe_load(out.read_text())["devices"]] == ["ok", "ok2"]
    assert sorted(S.load(path).instances) == ["_hidden", "ok", "ok2", "x-"]


def test_scan_host_under_a_root_gives_host_paths(tmp_path) -> None:
    """A plugin in a container scans the host's root mounted at /host: the names are the
    host's paths (what the runtime, on the host, mounts)."""
    from gpuslice.ops import cdi

    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.159.04").write_text("")
    (tmp_path / "lib").symlink_to("usr/lib")  # usrmerge: listed once
    (tmp_path / "usr/bin").mkdir()
    (tmp_path / "usr/bin/nvidia-ctk").write_text("")
    os.chmod(tmp_path / "usr/bin/nvidia-ctk", 0o755)
    got = cdi.scan_host(lib_dirs=("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"), bin_dirs=("/usr/bin",),
                        root=str(tmp_path))
    assert cdi.driver_files(got) == ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"]
    assert cdi.find_nvidia_ctk(("/usr/bin",), root=str(tmp_path)) == "/usr/bin/nvidia-ctk"

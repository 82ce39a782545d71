"""The vendored kubelet protos (pyctl/gpuslice/kube/proto) are the pinned upstream files,
and the modules generated from them at build time serve the gRPC names the kubelet calls."""

from __future__ import annotations

import importlib
import shutil

from gpuslice.kube import protogen


def test_protos_match_their_pins() -> None:
    assert protogen.check_pins() == []


def test_a_changed_proto_is_refused(tmp_path) -> None:
    d = tmp_path / "proto"
    shutil.copytree(protogen.PROTO_DIR, d)
    p = d / "dra_v1.proto"
    p.write_text(p.read_text().replace("string share_id = 5;", "string share_id = 6;"))
    assert protogen.check_pins(str(d)) == ["dra_v1.proto"]


def test_generated_services_have_the_kubelets_names() -> None:
    names = {}
    for mod in ("dra_v1_pb2", "dra_v1beta1_pb2", "pluginregistration_v1_pb2", "deviceplugin_v1beta1_pb2"):
        m = importlib.import_module(f"gpuslice.kube.gen.{mod}")
        names.update({s.full_name: sorted(x.name for x in s.methods) for s in m.DESCRIPTOR.services_by_name.values()})
    assert names == {
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"],
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"],
        "pluginregistration.Registration": ["GetInfo", "NotifyRegistrationStatus"],
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": ["Allocate", "GetDevicePluginOptions", "GetPreferredAllocation", "ListAndWatch",
                                 "PreStartContainer"],
    }


def test_generation_into_a_fresh_directory(tmp_path) -> None:
    written = protogen.generate(str(tmp_path / "gen"))
    assert len(written) == 2 * len(protogen.PINNED)
    text = (tmp_path / "gen" / "dra_v1_pb2_grpc.py").read_text()
    assert "from . import dra_v1_pb2 as" in text and "\nimport dra_v1_pb2" not in text


def test_a_wheel_from_a_clean_tree_has_the_generated_modules(tmp_path) -> None:
    """`pip install .` of a clean checkout (the container image's build): the modules
    generated at build time are in the wheel, though gen/ did not exist when setuptools
    listed the packages."""
    import os
    import subprocess
    import sys
    import zipfile

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = subprocess.run(["git", "-C", repo, "ls-files", "-z", "pyproject.toml", "setup.py", "pyctl"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for f in filter(None, files):
        if os.path.exists(os.path.join(repo, f)):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.join(repo, f), src / f)
    assert not (src / "pyctl/gpuslice/kube/gen").exists()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").iterdir()
    names = zipfile.ZipFile(wheel).namelist()
    for stem in protogen.PINNED:
        assert f"gpuslice/kube/gen/{stem[:-len('.proto')]}_pb2.py" in names
        assert f"gpuslice/kube/gen/{stem[:-len('.proto')]}_pb2_grpc.py" in names

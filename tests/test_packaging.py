"""Packaging: the CLI's dependencies alone on a host that does not run the Kubernetes
plugins (grpcio, protobuf and kubernetes are the ``kube`` extra), the tested versions in
constraints.txt (what scripts/setup.sh installs), a ``test`` extra without the test
bed's other tools (``dev``), and `pip install .` that leaves nothing in the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KUBE = {"grpcio", "protobuf", "kubernetes"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def test_kube_packages_are_an_extra() -> None:
    proj = _project()
    core = {_name(r) for r in proj["dependencies"]}
    extras = proj["optional-dependencies"]
    assert not core & KUBE, core & KUBE
    assert {_name(r) for r in extras["kube"]} == KUBE
    assert "gpuslice[kube]" in extras["test"]  # the tests test the plugins
    assert "virtme-ng" not in {_name(r) for r in extras["test"]}  # the guest's tool, not pytest's
    assert "gpuslice[test]" in extras["dev"] and "virtme-ng" in {_name(r) for r in extras["dev"]}


def test_constraints_pin_every_dependency_and_setup_installs_from_them() -> None:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+-]+)", line)
            assert m, f"constraints.txt: not NAME==VERSION: {line!r}"
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    proj = _project()
    wanted = {_name(r) for r in proj["dependencies"]}
    for extra in proj["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra if not r.startswith("gpuslice[")}
    wanted.discard("prometheus-client")  # Debian's python3-prometheus-client (scripts/setup.sh: apt)
    assert sorted(wanted - set(pins)) == []
    setup = (REPO / "scripts/setup.sh").read_text()
    assert re.search(r"pip install -q -c constraints\.txt -e '\.\[dev\]'", setup)
    assert "constraints.txt" in (REPO / "deploy/kubernetes/Dockerfile").read_text()
    assert "!constraints.txt" in (REPO / "deploy/kubernetes/Dockerfile.dockerignore").read_text()


BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("grpc", "kubernetes") or name.startswith("google.protobuf"):
                raise ImportError(f"No module named {name!r} (blocked)")
            return None
    sys.meta_path.insert(0, Block())
    from gpuslice.cli import main
    main(sys.argv[1:])
""")


@pytest.mark.parametrize("args,rc", [(["--help"], 0), (["instance", "list"], 0), (["policy", "show"], 0),
                                     (["cdi", "generate", "--json"], 0), (["status", "--json"], 0)],
                         ids=lambda a: " ".join(a) if isinstance(a, list) else str(a))
def test_the_cli_runs_without_the_kube_extra(tmp_path, args: list[str], rc: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "pyctl"), "GPUSLICE_CDI_SPEC": ""}
    res = subprocess.run([sys.executable, "-c", BLOCKER, "--state", str(tmp_path / "s.json"), "--kernel", "no",
                          *args], capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in res.stderr and "blocked" not in res.stderr, res.stderr
    if args[0] == "status":
        assert res.returncode in (0, 1), res.stderr  # no daemon: its own one-line answer
    else:
        assert res.returncode == rc, res.stderr


@pytest.mark.parametrize("args", [["kubelet-plugin", "--node-name", "n1"], ["device-plugin", "--config", "x.yaml"]],
                         ids=lambda a: a[0])
def test_a_kube_command_without_the_extra_names_it_in_one_line(tmp_path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "pyctl")}
    res = subprocess.run([sys.executable, "-c", BLOCKER, "--state", str(tmp_path / "s.json"), "--kernel", "no",
                          *args], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"gpuctl: gpuctl {args[0]} needs the kube extra")
    assert "pip install 'gpuslice[kube]'" in res.stderr


def test_pip_install_leaves_nothing_in_the_checkout(tmp_path) -> None:
    """A wheel built from a copy of the tracked files (what `pip install .` builds): the
    copy has no file more afterwards (no build/, *.egg-info, generated kube/gen), and
    the wheel has the generated modules, the build record and the extras."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "pyproject.toml", "setup.py", "pyctl"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for f in filter(None, files):
        if (REPO / f).exists():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    after = sorted(p.relative_to(src) for p in src.rglob("*"))
    assert [str(p) for p in after if p not in before] == []
    (wheel,) = (tmp_path / "dist").iterdir()
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    assert "gpuslice/kube/gen/dra_v1_pb2_grpc.py" in names and "gpuslice/_build.py" in names
    assert "BUILD = 'unknown'" in z.read("gpuslice/_build.py").decode()  # the copy is in no git checkout
    meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for pkg in ("grpcio", "protobuf", "kubernetes"):
        (line,) = [m for m in meta.splitlines() if re.match(rf"Requires-Dist: {pkg}\b(?!-)", m)]
        assert re.search(r"extra == ['\"]kube['\"]", line), line

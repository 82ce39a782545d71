"""podman (issue 13): an instance reaches a container through CDI
(`podman run --device gpuslice.dev/gpu=NAME`, spec from `gpuctl cdi generate --output`)
and through the flags `gpuctl run-args NAME` prints, with the module's production
setting require_device_cgroup=Y (the container's device cgroup must deny the real node).

Podman and its image (tests/guest/podmanlib.py, fixtures in conftest.py): everything
podman keeps is under the test session's directory in /tmp, the image holds only
tests/guest/rmclient.c built with `gcc -static`, and CDI specs are read from the
directory bind-mounted over /etc/cdi in a private mount namespace.

Inside the container, rmclient lists every device node and allocates video memory through
/dev/nvidiactl and /dev/nvidia0: the nodes are the instance's (same major:minor as
/dev/gpuslice/NAME/*), no node has the driver's majors (195, and the stand-in's
nvidia-uvm major), and the instance's memory limit holds (NV_ERR_NO_MEMORY, 0x51).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuslice import abi

from gsinst import Instance, needs_modules, rdev_major, wait_for
from podmanlib import IMAGE, REPO, Podman, parse

MIB = 1 << 20
LIMIT_MIB = 64
UNDER_MIB, OVER_MIB = 16, 128  # the first fits the limit, the second does not

pytestmark = [
    needs_modules,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the static test client"),
]


def run(podman: Podman, *args: str) -> subprocess.CompletedProcess[str]:
    return podman.rmclient(list(args), "devs", "alloc", str(UNDER_MIB), str(OVER_MIB))


def gpuctl(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from gpuslice.cli import main; main()", "--state",
                           str(tmp / "state.json"), "--kernel", "yes", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})


def check_container(r: subprocess.CompletedProcess[str], inst: Instance) -> None:
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    devs, allocs, session = parse(r.stdout)
    for leaf in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        st = os.stat(inst.path(leaf)).st_rdev
        assert devs.get(f"/dev/{leaf}") == (os.major(st), os.minor(st)), (leaf, devs)
    real = {abi.NV_MAJOR_DEVICE_NUMBER, rdev_major("/dev/nvidia-uvm")}  # the stand-in's nodes
    assert not {p: d for p, d in devs.items() if d[0] in real}, devs
    assert session == ["session ok"], r.stdout
    assert allocs == {UNDER_MIB: abi.NV_OK, OVER_MIB: abi.NV_ERR_NO_MEMORY}, r.stdout
    # charged to this instance while the container ran, released when it exited
    assert wait_for(lambda: inst.get()["mem_used"] == 0), inst.get()
    d = inst.get()
    assert d["mem_peak"] >= UNDER_MIB * MIB and d["nr_refused_quota"] >= 1, d


def test_podman_cdi_device(podman: Podman, nl, devcg_required, tmp_path: Path) -> None:
    with Instance(nl, LIMIT_MIB * MIB) as inst:
        spec_file = podman.cdi / "gpuslice.yaml"
        r = gpuctl(tmp_path, "cdi", "generate", "--output", str(spec_file))
        assert r.returncode == 0, r.stderr
        spec = yaml.safe_load(spec_file.read_text())
        assert inst.name in [d["name"] for d in spec["devices"]]
        try:
            r = run(podman, "--device", f"gpuslice.dev/gpu={inst.name}")
            check_container(r, inst)
        finally:
            spec_file.unlink()


def test_podman_run_args(podman: Podman, nl, devcg_required, tmp_path: Path) -> None:
    with Instance(nl, LIMIT_MIB * MIB) as inst:
        r = gpuctl(tmp_path, "run-args", inst.name)
        assert r.returncode == 0, r.stderr
        args = shlex.split(r.stdout)
        assert args.count("--device") == 3 and f"GPUSLICE_INSTANCE={inst.name}" in args
        assert "NVIDIA_VISIBLE_DEVICES=void" in args  # as the CDI spec sets it
        check_container(run(podman, *args), inst)


def test_podman_real_node_beside_refused(podman: Podman, nl, devcg_required) -> None:
    """A container that is also given the real /dev/nvidiactl gets no instance node:
    its device cgroup would let it open the real one."""
    with Instance(nl, LIMIT_MIB * MIB) as inst:
        r = podman("run", "--rm", "--network", "none", "--device", "/dev/nvidiactl:/dev/nvidiactl-real",
                   "--device", f"{inst.path('nvidiactl')}:/dev/nvidiactl",
                   "--device", f"{inst.path('nvidia0')}:/dev/nvidia0", IMAGE, "/rmclient", "alloc", "1")
        assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "session FAIL open-nvidiactl errno 1 " in r.stdout, r.stdout

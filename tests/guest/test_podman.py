"""podman (issue 13): an instance reaches a container through CDI
(`podman run --device gpuslice.dev/gpu=NAME`, spec from `gpuctl cdi generate --output`)
and through the flags `gpuctl run-args NAME` prints, with the module's production
setting require_device_cgroup=Y (the container's device cgroup must deny the real node).

Everything podman keeps is under the test's directory in /tmp: a local image with no
registry (`podman import` of a tarball holding only tests/guest/rmclient.c, built here
with `gcc -static`), vfs storage (--root), its run state (--runroot, --tmpdir), a
storage.conf (CONTAINERS_STORAGE_CONF). Rootful podman with crun, --network none, cgroupfs.
Debian 12's podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (no
--cdi-spec-dir, no cdi_spec_dirs): each podman command runs in a private mount namespace
(`unshare -m`) where the test's spec directory is bind-mounted over /etc/cdi.

Inside the container, rmclient lists every device node and allocates video memory through
/dev/nvidiactl and /dev/nvidia0: the nodes are the instance's (same major:minor as
/dev/gpuslice/NAME/*), no node has the driver's majors (195, and the stand-in's
nvidia-uvm major), and the instance's memory limit holds (NV_ERR_NO_MEMORY, 0x51).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuslice import abi

from gsinst import Instance, needs_modules, rdev_major, wait_for

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/gpuslice-rmclient:test"
PARAM = Path("/sys/module/gpuslice/parameters/require_device_cgroup")
MIB = 1 << 20
LIMIT_MIB = 64
UNDER_MIB, OVER_MIB = 16, 128  # the first fits the limit, the second does not

pytestmark = [
    needs_modules,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the static test client"),
]

# $1: the CDI spec directory; the rest: the podman command.
CDI_NS = r'''
spec="$1"; shift
for t in /etc/cdi /var/run/cdi; do
    if [ -d "$t" ] || mkdir -p "$t" 2>/dev/null; then
        mount --bind "$spec" "$t" && exec "$@"
    fi
done
echo "no place for the CDI spec directory (/etc/cdi, /var/run/cdi)" >&2
exit 125
'''


class Podman:
    """Rootful podman with all its state under base (a directory in /tmp)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cdi = base / "cdi"
        for d in ("storage", "run", "tmp", "cdi"):
            (base / d).mkdir(parents=True, exist_ok=True)
        conf = base / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{base}/storage"\nrunroot = "{base}/run"\n')
        self.env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf), "TMPDIR": str(base / "tmp")}
        self.argv = ["podman", "--root", str(base / "storage"), "--runroot", str(base / "run"),
                     "--tmpdir", str(base / "tmp"), "--storage-driver", "vfs", "--runtime", "crun",
                     "--cgroup-manager", "cgroupfs",
                     "--events-backend", "none"]

    def __call__(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", CDI_NS, "cdi-ns", str(self.cdi),
               *self.argv, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self("run", "--rm", "--network", "none", *args, IMAGE,
                    "/rmclient", "devs", "alloc", str(UNDER_MIB), str(OVER_MIB))


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    base = tmp_path_factory.mktemp("podman")
    root = base / "rootfs"
    for d in ("dev", "proc", "sys", "etc", "tmp"):
        (root / d).mkdir(parents=True)
    r = subprocess.run(["gcc", "-static", "-O2", "-Wall", "-I", str(REPO / "kmod/core"), "-o", str(root / "rmclient"),
                        str(REPO / "tests/guest/rmclient.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tar = base / "rootfs.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    p = Podman(base)
    r = p("import", str(tar), IMAGE)
    assert r.returncode == 0, r.stderr
    return p


@pytest.fixture
def devcg_required():
    """The module's production setting while the containers run: a process whose device
    cgroup lets it open the real node gets no instance node."""
    old = PARAM.read_text().strip()
    PARAM.write_text("Y")
    try:
        yield
    finally:
        PARAM.write_text(old)


def gpuctl(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from gpuslice.cli import main; main()", "--state",
                           str(tmp / "state.json"), "--kernel", "yes", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})


def parse(out: str) -> tuple[dict[str, tuple[int, int]], dict[int, int], list[str]]:
    """rmclient's output: {path: (major, minor)} of the character devices, {MiB: RM status}
    of the allocations, and the session lines."""
    devs, allocs, session = {}, {}, []
    for line in out.splitlines():
        if m := re.fullmatch(r"dev c (\d+):(\d+) (\S+)", line):
            devs[m[3]] = (int(m[1]), int(m[2]))
        elif m := re.fullmatch(r"alloc (\d+) 0x([0-9a-f]+)", line):
            allocs[int(m[1])] = int(m[2], 16)
        elif line.startswith("session"):
            session.append(line)
    return devs, allocs, session


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
            r = podman.run("--device", f"gpuslice.dev/gpu={inst.name}")
            check_container(r, inst)
        finally:
            spec_file.unlink()


def test_podman_run_args(podman: Podman, nl, devcg_required, tmp_path: Path) -> None:
    with Instance(nl, LIMIT_MIB * MIB) as inst:
        r = gpuctl(tmp_path, "run-args", inst.name)
        assert r.returncode == 0, r.stderr
        args = shlex.split(r.stdout)
        assert args.count("--device") == 3 and f"GPUSLICE_INSTANCE={inst.name}" in args
        check_container(podman.run(*args), inst)


def test_podman_real_node_beside_refused(podman: Podman, nl, devcg_required) -> None:
    """A container that is also given the real /dev/nvidiactl gets no instance node:
    its device cgroup would let it open the real one."""
    with Instance(nl, LIMIT_MIB * MIB) as inst:
        r = podman("run", "--rm", "--network", "none", "--device", "/dev/nvidiactl:/dev/nvidiactl-real",
                   "--device", f"{inst.path('nvidiactl')}:/dev/nvidiactl",
                   "--device", f"{inst.path('nvidia0')}:/dev/nvidia0", IMAGE, "/rmclient", "alloc", "1")
        assert r.returncode == 1, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "session FAIL open-nvidiactl errno 1 " in r.stdout, r.stdout

"""Rootful podman for the container tests (test_podman.py, test_kube_guest.py), with
everything it keeps under a directory in /tmp, and the image that holds only rmclient.

- the image: `podman import` of a tarball holding only tests/guest/rmclient.c, built with
  `gcc -static` (no registry, no shell, no Python in the container);
- podman's state: vfs storage (--root), its run state (--runroot, --tmpdir), a
  storage.conf (CONTAINERS_STORAGE_CONF); crun, cgroupfs, --network none;
- CDI: Debian 12's podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (no
  --cdi-spec-dir, no cdi_spec_dirs): each podman command runs in a private mount namespace
  (`unshare -m`) where the spec directory (``Podman.cdi``, or the one a call names) is
  bind-mounted over /etc/cdi.

The fixtures `podman` (one image for the whole session) and `devcg_required` are in
conftest.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/gpuslice-rmclient:test"
DEVCG_PARAM = Path("/sys/module/gpuslice/parameters/require_device_cgroup")

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
    """Rootful podman with all its state under base (a directory in /tmp); CDI specs
    are read from ``self.cdi``."""

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

    def __call__(self, *args: str, timeout: int = 300, cdi: Path | None = None) -> subprocess.CompletedProcess[str]:
        """podman ARGS, with the CDI specs of ``cdi`` (default ``self.cdi``)."""
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", CDI_NS, "cdi-ns", str(cdi or self.cdi),
               *self.argv, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)

    def rmclient(self, run_args: list[str], *client_args: str, cdi: Path | None = None
                 ) -> subprocess.CompletedProcess[str]:
        """`podman run --rm --network none RUN_ARGS IMAGE /rmclient CLIENT_ARGS`."""
        return self("run", "--rm", "--network", "none", *run_args, IMAGE, "/rmclient", *client_args, cdi=cdi)


def build_image(base: Path) -> Podman:
    """A Podman under ``base`` with the rmclient image imported."""
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


def parse_fb(out: str) -> dict[str, dict[str, int]]:
    """rmclient fbinfo's lines `fb WHEN NAME KIB`: {when: {name: bytes}} (when: "start",
    before the allocations, and "end", after them)."""
    fb: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        if m := re.fullmatch(r"fb (\w+) (\w+) (\d+)", line):
            fb.setdefault(m[1], {})[m[2]] = int(m[3]) << 10
    return fb


def check_instance_container(podman: Podman, cdi_id: str, cdi: Path, inst: str, limit: int,
                             sizes: dict[int, int]) -> None:
    """A container given CDI device ``cdi_id`` (spec directory ``cdi``) sees instance
    ``inst``'s nodes at /dev/nvidiactl and /dev/nvidia0 and no real NVIDIA node, RM's
    framebuffer figures are the instance's ``limit`` (bytes) and all free, and its
    allocations of ``sizes`` (MiB) get the RM status given (the limit ends them), after
    which nothing is free. What both Kubernetes plugins' container tests check."""
    from gpuslice import abi
    from gsinst import rdev_major

    out = podman.rmclient(["--device", cdi_id], "devs", "fbinfo", "alloc", *map(str, sizes), cdi=cdi)
    assert out.returncode == 0, f"rc {out.returncode}\n{out.stdout}\n{out.stderr}"
    devs, allocs, session = parse(out.stdout)
    assert session == ["session ok"], out.stdout
    for leaf in ("nvidiactl", "nvidia0"):
        st = os.stat(f"/dev/gpuslice/{inst}/{leaf}").st_rdev
        assert devs.get(f"/dev/{leaf}") == (os.major(st), os.minor(st)), (leaf, devs)
    real = {abi.NV_MAJOR_DEVICE_NUMBER, rdev_major("/dev/nvidia-uvm")}
    assert not {p: d for p, d in devs.items() if d[0] in real}, devs
    fb = parse_fb(out.stdout)
    assert fb["start"] == {"ram": limit, "total_ram": limit, "heap": limit, "heap_free": limit,
                           "usable_ram": limit}, out.stdout
    assert fb["end"]["total_ram"] == limit and fb["end"]["heap_free"] == 0, out.stdout
    assert allocs == sizes, out.stdout

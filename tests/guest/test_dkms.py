"""DKMS (issue 13): dkms.conf at the repository root, driven by scripts/dkms.sh, gives a
gpuslice.ko for the guest's kernel that dkms installs and modprobe loads, and it works.

Where it is built: ON THE HOST, by scripts/build-modules.sh (`scripts/dkms.sh tarball`:
dkms add, dkms build -k <guest kernel> in a sandbox, dkms mktarball --binaries-only to
build/dkms/). Compiling the module in the TCG guest takes about 8 minutes of the run.
In the guest this test only installs and loads: `scripts/dkms.sh install-tarball`
(dkms ldtarball, dkms install: the module goes to /lib/modules/<kver>/updates/dkms and
depmod runs), then rmmod of the test bed's module and `modprobe gpuslice`. With
GPUSLICE_DKMS_BUILD_IN_GUEST=1 it builds in the guest instead (`scripts/dkms.sh install`:
dkms add, dkms build -k $(uname -r), dkms install). Without a tarball for the current
sources (build-modules.sh run without root or dkms) the test skips.

The guest's root file system is the host's, read-only. Everything dkms writes
(/var/lib/dkms, /usr/src, /lib/modules/<kver>) goes to overlays whose upper directories
are on a tmpfs, in a private mount namespace (`scripts/dkms.sh sandbox`, unshare -m) that
only the dkms commands and modprobe see; nothing outside it changes. The module modprobe
loads is the kernel's, so this process then checks it through netlink and an instance,
and restores the test bed's module (the test build, build/test-kmod/gpuslice.ko) at the end.
The module DKMS built is the shipped one: none of the test build's parameters.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuslice import abi
from gpuslice.netlink import GpusliceNetlink

from gsinst import GPUSLICE_KO, TEST_PARAMS, Instance, loaded, needs_modules, release_module, session

REPO = Path(__file__).resolve().parents[2]
DKMS_SH = REPO / "scripts/dkms.sh"
KVER = os.uname().release
MIB = 1 << 20
BUILD_IN_GUEST = os.environ.get("GPUSLICE_DKMS_BUILD_IN_GUEST") == "1"

pytestmark = [
    needs_modules,
    pytest.mark.skipif(shutil.which("dkms") is None, reason="dkms is not installed (scripts/setup.sh installs it)"),
]

# Runs in scripts/dkms.sh's sandbox: $1 output directory (on /tmp, which the test reads),
# $2 the repository, $3 the tarball to install (empty: build here). Each step writes its
# name to $1/stage first, so the test knows how far it got (and whether to restore).
INNER = r'''
set -euo pipefail
OUT="$1" REPO="$2" TARBALL="$3" KVER="$(uname -r)"
step() { echo "$1" > "$OUT/stage"; echo "== $1 ($SECONDS s)" >&2; }
step install
if [ -n "$TARBALL" ]; then
    bash "$REPO/scripts/dkms.sh" install-tarball "$TARBALL" "$KVER"
else
    bash "$REPO/scripts/dkms.sh" install "$KVER"
fi
dkms status -m gpuslice -k "$KVER" > "$OUT/status"
modinfo -n gpuslice > "$OUT/path"
modinfo -p gpuslice > "$OUT/params"
find /var/lib/dkms/gpuslice -name make.log -exec cat {} + > "$OUT/make.log"
step rmmod
rmmod gpuslice
step modprobe
# shellcheck disable=SC2086
modprobe -v gpuslice ${GPUSLICE_ARGS:-require_device_cgroup=0} > "$OUT/modprobe" 2>&1
step done
'''


def _tarball() -> Path:
    r = subprocess.run(["bash", str(DKMS_SH), "tarball-name", KVER], capture_output=True, text=True, check=True)
    return REPO / "build/dkms" / r.stdout.strip()


def _restore_testbed_module() -> None:
    release_module()
    if loaded():
        r = subprocess.run(["rmmod", "gpuslice"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    r = subprocess.run(["insmod", str(GPUSLICE_KO), *os.environ.get("GPUSLICE_ARGS", "").split()],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"test bed module not restored: {r.stderr}"


def test_dkms_install_and_load(tmp_path: Path) -> None:
    tarball = "" if BUILD_IN_GUEST else str(_tarball())
    if tarball and not os.path.exists(tarball):
        pytest.skip(f"no DKMS tarball for these sources ({tarball}): scripts/build-modules.sh makes it "
                    "as root with dkms installed; GPUSLICE_DKMS_BUILD_IN_GUEST=1 builds in the guest (~8 min)")
    out = tmp_path / "out"
    out.mkdir()
    release_module()
    t0 = time.monotonic()
    try:
        r = subprocess.run(["bash", str(DKMS_SH), "sandbox", KVER, "--", "bash", "-c", INNER, "inner",
                            str(out), str(REPO), tarball], capture_output=True, text=True, timeout=1500)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(e.cmd, 124, "", f"timed out after {e.timeout} s")
    took = time.monotonic() - t0
    stage = (out / "stage").read_text().strip() if (out / "stage").exists() else "?"
    print(f"dkms in the guest ({'build' if BUILD_IN_GUEST else 'tarball'}): {took:.0f} s, reached {stage}\n"
          f"{r.stderr[-3000:]}")
    try:
        assert r.returncode == 0, f"stopped at {stage}: {r.stderr[-4000:]}"
        assert (out / "status").read_text().strip().endswith(": installed")
        dest = f"/lib/modules/{KVER}/updates/dkms/gpuslice.ko"
        assert (out / "path").read_text().strip() == dest
        params = {line.split(":", 1)[0] for line in (out / "params").read_text().splitlines()}
        assert "require_device_cgroup" in params and not params & set(TEST_PARAMS), params
        # dkms compiled it from the staged sources (no objects of the checkout): its make.log,
        # written here or, in the tarball, on the host
        log = (out / "make.log").read_text()
        assert "kmod/main.o" in log and "kmod/core/quota.o" in log, log[-2000:]
        # modprobe loaded the file dkms installed (found through depmod's modules.dep)
        assert f"insmod {dest}" in (out / "modprobe").read_text()
        assert loaded()
        for p in TEST_PARAMS:
            assert not os.path.exists(f"/sys/module/gpuslice/parameters/{p}")

        with GpusliceNetlink() as nl, Instance(nl, 4 * MIB) as inst:
            assert Path(inst.path("nvidiactl")).exists()
            s = session(inst)
            try:
                assert s.alloc_vidmem(8 * MIB)[0] == abi.NV_ERR_NO_MEMORY
                st, h, _ = s.alloc_vidmem(2 * MIB)
                assert st == abi.NV_OK
                assert inst.get()["mem_used"] >= 2 * MIB
                assert s.free(h) == abi.NV_OK
            finally:
                s.close()
    finally:
        if stage in ("rmmod", "modprobe", "done") or not loaded():
            _restore_testbed_module()

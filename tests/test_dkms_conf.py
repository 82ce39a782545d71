"""dkms.conf and scripts/dkms.sh on the host, without dkms: the conf as dkms sources it,
the version's one place (pyproject.toml), and the staged tree dkms copies to /usr/src.
The build, install and load run in the guest: tests/guest/test_dkms.py."""

from __future__ import annotations

import platform
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DKMS_SH = REPO / "scripts/dkms.sh"


def project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def source_conf(conf: Path, cwd: Path) -> dict[str, str]:
    """dkms.conf's variables as dkms sees them (it sources the file with bash, from
    elsewhere, with kernel_source_dir and dkms_tree set)."""
    script = ('kernelver=6.1.0-test kernel_source_dir=/lib/modules/6.1.0-test/build dkms_tree=/var/lib/dkms; '
              f'. "{conf}"; '
              'for v in PACKAGE_NAME PACKAGE_VERSION "BUILT_MODULE_NAME[0]" "BUILT_MODULE_LOCATION[0]" '
              '"DEST_MODULE_LOCATION[0]" "MAKE[0]" CLEAN AUTOINSTALL; do eval "echo \\"$v=\\${$v}\\""; done')
    out = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_conf_as_dkms_reads_it(tmp_path: Path) -> None:
    c = source_conf(REPO / "dkms.conf", tmp_path)
    assert c["PACKAGE_NAME"] == "gpuslice"
    assert c["PACKAGE_VERSION"] == project_version()
    assert c["BUILT_MODULE_NAME[0]"] == "gpuslice"
    assert c["BUILT_MODULE_LOCATION[0]"] == "kmod/"  # the top-level Kbuild: obj-m += kmod/
    assert c["DEST_MODULE_LOCATION[0]"] == "/updates/dkms"
    build = f"/var/lib/dkms/gpuslice/{project_version()}/build"
    assert c["MAKE[0]"] == f"make -C /lib/modules/6.1.0-test/build M={build} modules"
    assert c["CLEAN"] == f"make -C /lib/modules/6.1.0-test/build M={build} clean"
    assert c["AUTOINSTALL"] == "yes"
    assert "obj-m += kmod/" in (REPO / "Kbuild").read_text()


def test_script_version_is_pyprojects() -> None:
    out = subprocess.run(["bash", str(DKMS_SH), "version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == project_version()


def test_stage_holds_the_sources_and_a_fixed_version(tmp_path: Path) -> None:
    dst = tmp_path / "gpuslice"
    subprocess.run(["bash", str(DKMS_SH), "stage", str(dst)], check=True)
    got = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    want = sorted(str(p.relative_to(REPO)) for p in (REPO / "kmod").rglob("*")
                  if p.is_file() and (p.suffix in (".c", ".h") or p.name == "Kbuild") and not p.name.endswith(".mod.c"))
    assert got == sorted(["Kbuild", "dkms.conf", *want])
    assert not [g for g in got if g.endswith((".o", ".ko", ".cmd", ".mod.c"))]
    # the staged conf names its version itself: dkms's copies (and binaries-only
    # tarballs) carry no pyproject.toml
    conf = (dst / "dkms.conf").read_text()
    assert f'PACKAGE_VERSION="{project_version()}"' in conf.splitlines()
    assert source_conf(dst / "dkms.conf", tmp_path)["PACKAGE_VERSION"] == project_version()


def test_tarball_name_follows_the_sources() -> None:
    def name() -> str:
        return subprocess.run(["bash", str(DKMS_SH), "tarball-name", "6.1.0-test"], capture_output=True,
                              text=True, check=True).stdout.strip()

    n = name()
    assert n.startswith(f"gpuslice-{project_version()}-") and n.endswith(f"-kernel6.1.0-test-{platform.machine()}.dkms.tar.gz")
    assert name() == n  # stable while the sources are

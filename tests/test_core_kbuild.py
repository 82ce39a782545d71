"""kmod/core/*.c compile as kernel code (warnings are errors), in a throwaway module;
gpuslice.ko builds against every other kernel whose headers are installed (DKMS builds it
for the host's kernel, which is rarely the guest's: kmod/compat.h); and the module DKMS
builds has no test parameters, which only the test build (GPUSLICE_TEST=1, kmod/inject.h)
adds.

Skipped where no kernel build tree is installed (scripts/guest-kver.sh names the one
the guest runs; any installed /lib/modules/*/build will do otherwise). Debian 12's 6.12:
`apt-get install linux-headers-6.12-amd64` (it brings the image too; scripts/guest-kver.sh
keeps the guest on linux-image-amd64's kernel).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "kmod" / "core"


def kbuild_dir() -> Path | None:
    try:
        kver = subprocess.run([str(REPO / "scripts" / "guest-kver.sh")], capture_output=True, text=True,
                              check=True).stdout.strip()
        d = Path(f"/lib/modules/{kver}/build")
        if d.is_dir():
            return d
    except (OSError, subprocess.CalledProcessError):
        pass
    found = sorted(Path("/lib/modules").glob("*/build"))
    return found[-1] if found else None


KDIR = kbuild_dir()


@pytest.mark.skipif(KDIR is None, reason="no kernel build tree")
@pytest.mark.parametrize("test_build", [False, True], ids=["shipped", "test"])
def test_core_builds_as_kernel_code(tmp_path, test_build):
    """In the test build (GPUSLICE_TEST) the core's allocations call the glue's
    gs_inject_fail() (kmod/inject.c); in the shipped one, nothing (kmod/inject.h)."""
    objs = [f.stem + ".o" for f in sorted(CORE.glob("*.c"))]
    for f in CORE.glob("*.c"):
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "dummy.c").write_text(
        "// SPDX-License-Identifier: GPL-2.0\n#include <linux/module.h>\n#include \"core.h\"\n"
        + ("bool gs_inject_fail(void)\n{\n\treturn false;\n}\n\n" if test_build else "")
        + "static int __init gsd_init(void)\n{\n\tstruct gs_inst *in = gs_inst_new(1, NULL);\n\n"
        "\tgs_inst_free(in);\n\treturn 0;\n}\nmodule_init(gsd_init);\nMODULE_LICENSE(\"GPL\");\n")
    flags = f"-Werror -I{CORE}" + (" -DGPUSLICE_TEST" if test_build else "")
    (tmp_path / "Kbuild").write_text(
        f"obj-m := gscore.o\ngscore-y := {' '.join(objs)} dummy.o\nccflags-y := {flags}\n")
    p = subprocess.run(["make", "-C", str(KDIR), f"M={tmp_path}", "modules"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (tmp_path / "gscore.ko").exists()
    assert "warning:" not in p.stderr


def other_kernels() -> list[Path]:
    try:
        guest = subprocess.run([str(REPO / "scripts" / "guest-kver.sh")], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        guest = ""
    return [d for d in sorted(Path("/lib/modules").glob("*/build")) if d.parent.name != guest and d.is_dir()]


@pytest.mark.parametrize("kdir", other_kernels() or [None], ids=lambda d: d.parent.name if d else "none")
def test_the_module_builds_for_other_kernels(kdir, tmp_path):
    if kdir is None:
        pytest.skip("no kernel headers installed besides the guest's")
    (tmp_path / "Kbuild").write_text((REPO / "Kbuild").read_text())
    shutil.copytree(REPO / "kmod", tmp_path / "kmod",
                    ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod", "*.mod.c", ".*.cmd", "*.order"))
    p = subprocess.run(["make", "-C", str(kdir), f"M={tmp_path}", "-j2", "modules"], capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (tmp_path / "kmod" / "gpuslice.ko").exists()
    assert "warning:" not in p.stderr and "WARNING:" not in p.stdout + p.stderr


def test_the_module_never_vouches_for_another_process():
    """gs_call.fd_sibling / src_sibling let a call through on the glue's word that another
    process's core counted what it names: only the user-space build (one core per
    process) may say so. The module has one core per instance; its glue must leave them 0
    (kmod/ioctl.c builds the call with a designated initializer)."""
    for f in sorted((REPO / "kmod").glob("*.c")):
        text = f.read_text()
        assert "fd_sibling" not in text and "src_sibling" not in text, f.name
    assert "struct gs_call c = {" in (REPO / "kmod" / "ioctl.c").read_text()


# Only the test build (kmod/Kbuild with GPUSLICE_TEST=1: kmod/inject.c) declares these.
TEST_PARAMS = {"fail_alloc_every", "race_delay_fd_us", "allow_test_escapes", "handover_corrupt"}
SHIPPED_PARAMS = {"passthrough_only", "require_device_cgroup", "userd_sample_ms"}
KMOD_SOURCES = shutil.ignore_patterns("*.o", "*.ko", "*.mod", "*.mod.c", ".*.cmd", "*.order", "*.symvers")


def module_params(ko: Path) -> set[str]:
    """The parameters a .ko file declares: modinfo reads its .modinfo section, nothing is loaded."""
    modinfo = shutil.which("modinfo", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    assert modinfo, "no modinfo (kmod: scripts/setup.sh installs it)"
    out = subprocess.run([modinfo, "-p", str(ko)], capture_output=True, text=True, check=True).stdout
    return {line.split(":", 1)[0] for line in out.splitlines() if line}


def inject_symbols(ko: Path) -> list[str]:
    out = subprocess.run(["nm", str(ko)], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if "inject" in line]


def make_module(kdir: Path, tree: Path, *args: str) -> None:
    p = subprocess.run(["make", "-C", str(kdir), f"M={tree}", f"-j{os.cpu_count() or 2}", *args, "modules"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "warning:" not in p.stderr and "WARNING:" not in p.stdout + p.stderr


@pytest.mark.skipif(KDIR is None, reason="no kernel build tree")
def test_the_shipped_module_has_no_test_parameters(tmp_path):
    """What DKMS installs: the tree scripts/dkms.sh stages, built as dkms.conf's MAKE builds
    it. None of the test hooks is in it, as a parameter or as code."""
    stage = tmp_path / "gpuslice"
    subprocess.run(["bash", str(REPO / "scripts/dkms.sh"), "stage", str(stage)], check=True)
    make_module(KDIR, stage)
    ko = stage / "kmod" / "gpuslice.ko"
    params = module_params(ko)
    assert SHIPPED_PARAMS <= params  # modinfo read them: the check below is not vacuous
    assert not params & TEST_PARAMS, f"test parameters in the shipped module: {sorted(params & TEST_PARAMS)}"
    assert not inject_symbols(ko)


@pytest.mark.skipif(KDIR is None, reason="no kernel build tree")
def test_the_test_build_adds_the_test_parameters(tmp_path):
    """kmod/Kbuild with GPUSLICE_TEST=1 (scripts/build-modules.sh builds it so into
    build/test-kmod/): the shipped parameters and the test ones."""
    shutil.copytree(REPO / "kmod", tmp_path / "kmod", ignore=KMOD_SOURCES)
    make_module(KDIR, tmp_path / "kmod", "GPUSLICE_TEST=1")
    assert module_params(tmp_path / "kmod" / "gpuslice.ko") == SHIPPED_PARAMS | TEST_PARAMS


@pytest.mark.parametrize("ko, test_build", [("kmod/gpuslice.ko", False), ("build/test-kmod/gpuslice.ko", True)],
                         ids=["shipped", "test"])
def test_the_built_modules(ko, test_build):
    """scripts/build-modules.sh's two modules (scripts/test.sh builds them before the host
    tests): kmod/gpuslice.ko, which the demo loads, without the test parameters;
    build/test-kmod/gpuslice.ko, which the guest suite loads, with them."""
    path = REPO / ko
    if not path.exists():
        pytest.skip(f"{ko} not built (scripts/build-modules.sh)")
    params = module_params(path)
    assert SHIPPED_PARAMS <= params
    assert params & TEST_PARAMS == (TEST_PARAMS if test_build else set()), \
        f"{ko}: {sorted(params)} (stale? scripts/build-modules.sh rebuilds it)"

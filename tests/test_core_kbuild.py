"""kmod/core/*.c compile as kernel code (warnings are errors), in a throwaway module.

Skipped where no kernel build tree is installed (scripts/guest-kver.sh names the one
the guest runs; any installed /lib/modules/*/build will do otherwise).
"""

from __future__ import annotations

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
def test_core_builds_as_kernel_code(tmp_path):
    objs = [f.stem + ".o" for f in sorted(CORE.glob("*.c"))]
    for f in CORE.glob("*.c"):
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "dummy.c").write_text(
        "// SPDX-License-Identifier: GPL-2.0\n#include <linux/module.h>\n#include \"core.h\"\n"
        "bool gs_inject_fail(void)\n{\n\treturn false;\n}\n\n"  # the glue's (kmod/inject.c)
        "static int __init gsd_init(void)\n{\n\tstruct gs_inst *in = gs_inst_new(1, NULL);\n\n"
        "\tgs_inst_free(in);\n\treturn 0;\n}\nmodule_init(gsd_init);\nMODULE_LICENSE(\"GPL\");\n")
    (tmp_path / "Kbuild").write_text(
        f"obj-m := gscore.o\ngscore-y := {' '.join(objs)} dummy.o\nccflags-y := -Werror -I{CORE}\n")
    p = subprocess.run(["make", "-C", str(KDIR), f"M={tmp_path}", "modules"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (tmp_path / "gscore.ko").exists()
    assert "warning:" not in p.stderr


def test_the_module_never_vouches_for_another_process():
    """gs_call.fd_sibling / src_sibling let a call through on the glue's word that another
    process's core counted what it names: only the user-space build (one core per
    process) may say so. The module has one core per instance; its glue must leave them 0
    (kmod/ioctl.c builds the call with a designated initializer)."""
    for f in sorted((REPO / "kmod").glob("*.c")):
        text = f.read_text()
        assert "fd_sibling" not in text and "src_sibling" not in text, f.name
    assert "struct gs_call c = {" in (REPO / "kmod" / "ioctl.c").read_text()

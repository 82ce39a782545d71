"""The stand-in (tests/standin, nvstub.ko) takes its ABI from NVIDIA's headers, not from
the module's: a layout error in kmod/core/nvrm_abi.h cannot hide in the guest tests
behind a stand-in compiled from the same header.

- No source of the stand-in includes kmod/core (nvrm_abi.h, nvrm_tables.c), and its build
  names no include path there.
- tests/standin/nvstub_abi.h and nvstub_tables.c are what `scripts/nvrm-abi.py standin`
  makes of the headers vendored in abi/nvidia/headers.tar.xz alone (no mirror; made here
  with kmod/core out of reach), and they compile, their static asserts of NVIDIA's sizes
  and offsets holding; a layout that is not NVIDIA's fails them.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "nvrm-abi.py"
STANDIN = REPO / "tests" / "standin"


def standin_sources() -> list[Path]:
    """The stand-in's sources and build files (kbuild's own output left out)."""
    return sorted(p for p in STANDIN.iterdir()
                  if (p.suffix in (".c", ".h") and not p.name.endswith(".mod.c")) or p.name in ("Kbuild", "Makefile"))


def test_standin_does_not_use_kmod_core() -> None:
    bad = []
    for f in standin_sources():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r'#\s*include\s*[<"](.*/)?nvrm_(abi\.h|tables\.c)[>"]', line) \
                    or re.search(r"-I\S*kmod|\bkmod/core\b", line) and not line.lstrip().startswith(("*", "/*", "//", "#")):
                bad.append(f"{f.relative_to(REPO)}:{n}: {line.strip()}")
    assert not bad, "the stand-in uses kmod/core:\n" + "\n".join(bad)
    kbuild = (STANDIN / "Kbuild").read_text()
    assert "kmod" not in re.sub(r"#[^\n]*", "", kbuild)


def test_standin_abi_compiles_and_holds(tmp_path) -> None:
    """NVIDIA's sizes and offsets, asserted in nvstub_abi.h, hold for its structs
    (here on the host; the kernel build checks them again)."""
    src = tmp_path / "check.c"
    src.write_text('#include "nvstub_abi.h"\n')
    for f in (src, STANDIN / "nvstub_tables.c"):
        p = subprocess.run(["gcc", "-fsyntax-only", "-Wall", "-Werror", f"-I{STANDIN}", str(f)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-3000:]


@pytest.fixture(scope="module")
def abi_script():
    spec = importlib.util.spec_from_file_location("nvrm_abi_standin", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    assert spec.loader
    spec.loader.exec_module(m)
    return m


def test_standin_abi_is_generated_from_the_vendored_headers(abi_script, tmp_path) -> None:
    """Regenerated from abi/nvidia/ with kmod/core out of reach, the files are those of
    the tree: nothing of them comes from the module's header or tables."""
    abi_script.CORE = tmp_path / "no-kmod-core"
    abi_script.TABLES_C = abi_script.CORE / "nvrm_tables.c"
    header, tables = abi_script.standin_files()
    assert (STANDIN / "nvstub_abi.h").read_text() == header, "stale: run scripts/nvrm-abi.py standin"
    assert (STANDIN / "nvstub_tables.c").read_text() == tables, "stale: run scripts/nvrm-abi.py standin"
    # every struct is NVIDIA's (its comment names NVIDIA's type) and sized as NVIDIA sizes it
    structs = re.findall(r"^struct (\w+) \{\t/\* (\w+)", header, re.M)
    assert len(structs) > 50
    for name, _ in structs:
        assert re.search(rf"NVSTUB_ABI\(offsetof\(struct {name}, ", header), name
    for name in ("nvos64_params", "nvos54_params", "nv_ioctl_card_info", "uvm_register_gpu_params"):
        assert re.search(rf"NVSTUB_ABI\(sizeof\(struct {name}\), \d+\);", header), name


def test_a_layout_that_is_not_nvidias_fails_the_build(tmp_path) -> None:
    """The asserts can fail: NVOS64's hClass as 8 bytes moves every field after it."""
    header = (STANDIN / "nvstub_abi.h").read_text()
    bad = re.sub(r"(struct nvos64_params \{.*?\n)\tnv_u32 h_class;", r"\1\tnv_u64 h_class;", header, count=1,
                 flags=re.S)
    assert bad != header
    (tmp_path / "nvstub_abi.h").write_text(bad)
    src = tmp_path / "check.c"
    src.write_text('#include "nvstub_abi.h"\n')
    p = subprocess.run(["gcc", "-fsyntax-only", f"-I{tmp_path}", str(src)], capture_output=True, text=True)
    assert p.returncode != 0
    assert "offsetof(struct nvos64_params, p_alloc_parms)" in p.stderr

"""The per-release ABI tables (abi/, kmod/core/nvrm_tables.c, gpuslice.nvrm_versions).

- abi/layouts/ against the tagged source of every supported release: only where a clone
  of NVIDIA/open-gpu-kernel-modules is (scripts/nvrm-abi.py's default, or $NVIDIA_OGKM);
  skipped elsewhere, CI included.
- abi/layouts/ and kmod/core against NVIDIA's own headers everywhere, CI included: the
  extract of one tag per layout that abi/nvidia/headers.tar.xz carries (nvrm-abi.py
  vendor), a probe compiled against each (the stand-in's ABI, generated from the same
  headers: tests/test_standin_abi.py).
- kmod/core against abi/: every value of abi/manifest.tsv, as the core's defines and each
  release's row of nvrm_tables[] give it, equals the release's extracted value.
- the generated files are current; the refusal of a release without a table names the
  supported ones (the module's and the library's summary, the doctor's).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice import nvrm_versions

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "nvrm-abi.py"
CORE = REPO / "kmod" / "core"
MIRROR = Path(os.environ.get("NVIDIA_OGKM") or "/work/.mirror/NVIDIA+open-gpu-kernel-modules/repo")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1800)


def test_generated_files_are_current() -> None:
    p = run("gen", "--check")
    assert p.returncode == 0, p.stdout + p.stderr


def test_kmod_core_agrees_with_abi() -> None:
    """The defines hold on every supported release and each row holds its releases' values:
    a layout that moved between branches and is read through a define fails here."""
    p = run("ours")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert " 0 differences" in p.stdout


def test_a_moved_layout_fails_the_check(tmp_path) -> None:
    """The check can fail: 535's NVOS46 (MAP_MEMORY_DMA) is 56 bytes; a core that read
    580's 64 on every release is caught."""
    tables = (CORE / "nvrm_tables.c").read_text()
    assert ".nvos46_size = 56," in tables
    env = dict(os.environ)
    bad = tmp_path / "core"
    bad.mkdir()
    for f in CORE.glob("*.h"):
        (bad / f.name).write_text(f.read_text())
    (bad / "nvrm_tables.c").write_text(tables.replace(".nvos46_size = 56,", ".nvos46_size = 64,"))
    p = subprocess.run([sys.executable, "-c", f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("nvrm_abi", {str(SCRIPT)!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
from pathlib import Path
m.CORE = Path({str(bad)!r}); m.TABLES_C = m.CORE / "nvrm_tables.c"
sys.exit(m.cmd_ours(None))
"""], capture_output=True, text=True, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "535.288.01: NVOS46_PARAMS_SIZE: kmod/core gives 64" in p.stdout


@pytest.fixture(scope="module")
def abi_script():
    """scripts/nvrm-abi.py as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("nvrm_abi_script", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    assert spec.loader
    spec.loader.exec_module(m)
    return m


@pytest.fixture(scope="module")
def nvidia_values(abi_script) -> dict[str, dict[str, str]]:
    """Each layout's values as NVIDIA's expressions give them against its vendored tag
    (abi/nvidia/headers.tar.xz): one probe per layout, compiled in parallel, no mirror."""
    missing = abi_script.missing_vendored()
    assert not missing, f"layouts without a vendored tag (scripts/nvrm-abi.py vendor): {missing}"
    layouts = sorted({r.layout for r in abi_script.supported()}, key=abi_script.vkey)
    return abi_script.vendored_values(layouts)


def test_vendored_nvidia_headers_give_the_layouts(abi_script, nvidia_values) -> None:
    """Every layout has a vendored tag, and NVIDIA's expressions (the manifest's second
    column), compiled against that tag's headers, give the layout's values: what
    `nvrm-abi.py check --vendored` checks, with no mirror."""
    tags = abi_script.vendored_tags()
    bad = abi_script.layouts_against(nvidia_values, {lay: f"abi/nvidia/{tags[lay][0]}" for lay in nvidia_values})
    assert not bad, "\n".join(bad[:50])
    assert len(nvidia_values) == len(list((REPO / "abi" / "layouts").glob("*.tsv")))


def test_kmod_core_agrees_with_nvidia_headers(abi_script, nvidia_values) -> None:
    """Our expressions (nvrm_abi.h's defines, each release's row of nvrm_tables.c) give
    what NVIDIA's give against the vendored headers, for every release of every layout:
    `nvrm-abi.py ours --vendored`."""
    tags = abi_script.vendored_tags()
    bad, checked = abi_script.ours_against(abi_script.ours_values(), nvidia_values,
                                           {lay: f"abi/nvidia/{tags[lay][0]}" for lay in nvidia_values})
    assert not bad, "\n".join(bad[:50])
    assert checked == len(abi_script.supported())


def test_a_wrong_offset_in_nvrm_abi_h_fails_against_nvidia_headers(abi_script, nvidia_values, tmp_path,
                                                                   monkeypatch) -> None:
    """The check can fail: NVOS32's status (RM_ALLOC_MEMORY's) is at 20 on every release;
    a header that said 24 is caught, against NVIDIA's headers, on every release."""
    bad = tmp_path / "core"
    bad.mkdir()
    for f in list(CORE.glob("*.h")) + [CORE / "nvrm_tables.c"]:
        (bad / f.name).write_text(f.read_text())
    abi_h = (bad / "nvrm_abi.h").read_text()
    good = "#define NVOS32_OFF_STATUS\t\t\t20"
    assert good in abi_h
    (bad / "nvrm_abi.h").write_text(abi_h.replace(good, "#define NVOS32_OFF_STATUS\t\t\t24"))
    monkeypatch.setattr(abi_script, "CORE", bad)
    monkeypatch.setattr(abi_script, "TABLES_C", bad / "nvrm_tables.c")
    tags = abi_script.vendored_tags()
    diffs, _ = abi_script.ours_against(abi_script.ours_values(), nvidia_values,
                                       {lay: f"abi/nvidia/{tags[lay][0]}" for lay in nvidia_values})
    assert len(diffs) == len(abi_script.supported()), "\n".join(diffs[:20])
    assert "580.142: NVOS32_OFF_STATUS: kmod/core gives 24, abi/nvidia/580.142 20" in diffs
    assert "535.43.02: NVOS32_OFF_STATUS: kmod/core gives 24, abi/nvidia/535.54.03 20" in diffs


@pytest.mark.skipif(not MIRROR.exists(), reason=f"no clone of open-gpu-kernel-modules at {MIRROR}")
def test_layouts_match_each_tagged_release() -> None:
    p = run("check", "--mirror", str(MIRROR))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert " 0 differences" in p.stdout


def test_every_supported_branch_has_a_table() -> None:
    branches = {nvrm_versions.branch_of(v) for v in nvrm_versions.supported()}
    assert branches == {"535", "550", "570", "575", "580"}
    for v in ("535.288.01", "550.163.01", "570.211.01", "575.64.05", "580.142", "580.159.04"):
        assert nvrm_versions.table(v) is not None, v
    assert nvrm_versions.table("580.159.04") == nvrm_versions.table("580.142")
    assert nvrm_versions.table("590.44.01") is None and nvrm_versions.table("580.1") is None


def test_tables_differ_where_the_branches_do() -> None:
    """What docs/driver-versions.md lists, as the tables hold it."""
    old, new = nvrm_versions.table("535.288.01"), nvrm_versions.table("580.142")
    assert old and new
    assert (old["nvos46_size"], new["nvos46_size"]) == (56, 64)
    assert (old["memory_alloc_size"], new["memory_alloc_size"]) == (120, 128)
    assert (old["uvm_map_external_size"], new["uvm_map_external_size"]) == (1200, 9264)
    assert (old["wait_open_complete"], new["wait_open_complete"]) == (0, 1)


@pytest.fixture(scope="module")
def abi_lib(tmp_path_factory) -> ctypes.CDLL:
    """kmod/core/abi.c and nvrm_tables.c alone, as a shared library."""
    out = tmp_path_factory.mktemp("abi") / "libabi.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{CORE}", str(CORE / "abi.c"),
                    str(CORE / "nvrm_tables.c"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.gs_abi_select.argtypes = [ctypes.c_char_p]
    lib.gs_abi_supported.argtypes = [ctypes.c_char_p, ctypes.c_ulong]
    return lib


def test_core_selects_and_refuses(abi_lib: ctypes.CDLL) -> None:
    assert abi_lib.gs_abi_select(b"590.44.01") == -1
    assert abi_lib.gs_abi_select(b"535.288.01") == 0
    assert abi_lib.gs_abi_select(b"") == -1
    buf = ctypes.create_string_buffer(512)
    abi_lib.gs_abi_supported(buf, 512)
    assert buf.value.decode() == nvrm_versions.supported_summary()
    assert buf.value.decode().startswith("535.43.02..535.288.01, 550.40.07..550.163.01")
    small = ctypes.create_string_buffer(16)
    abi_lib.gs_abi_supported(small, 16)
    assert small.value.decode() == nvrm_versions.supported_summary()[:15]


def test_the_docs_list_the_current_differences() -> None:
    doc = (REPO / "docs" / "driver-versions.md").read_text()
    start = doc.index("<!-- nvrm-abi doc")
    body = doc[doc.index("\n", start) + 1:doc.index("<!-- end nvrm-abi doc -->")]
    assert body == run("doc").stdout

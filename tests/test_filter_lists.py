"""The filter's tables (kmod/core/filter.c) against the traces and NVIDIA's source.

- each row has a capability and a reason, and a refused row an RM status;
- sorted (the core binary-searches them) and free of duplicates;
- every control CUDA / PyTorch / nvidia-smi issue in the traces is listed;
- no listed control carries RMCTRL_FLAGS_PRIVILEGED in src/nvidia/generated/g_*_nvoc.c
  of branch 580 (skipped where the NVIDIA mirror is absent);
- no listed control is one of the named whole-GPU controls.
"""

from __future__ import annotations

import functools
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "core"))
import coreshim as cs  # noqa: E402
from coreshim import abi  # noqa: E402

FILTER = (cs.REPO / "kmod" / "core" / "filter.c").read_text()
MIRROR = Path("/work/.mirror/NVIDIA+open-gpu-kernel-modules/repo")


CONTROL_ROW = re.compile(
    r'\{\s*(\w+),\s*([\w |]+?),\s*((?:"[^"]*"\s*)+),\s*(GS_REFUSE_\w+),\s*(\w+),\s*(NULL|&\w+)\s*\}', re.S)
CLASS_ROW = re.compile(r"\{\s*\.klass = (\w+),(.*?)\s*\},", re.S)


def _table(name: str) -> str:
    m = re.search(rf"{name}\[\] = {{(.*?)\n}};", FILTER, re.S)
    assert m, name
    return re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)


def c_rows(name: str) -> list[tuple[str, str, str, str, str]]:
    """The rows of a table of struct gs_control_row (positional) or gs_class_row
    (designated initializers; refusal and status default to allowed): (key, caps, why,
    refusal, status)."""
    body = _table(name)
    out = []
    if name == "gs_classes":
        for key, fields in CLASS_ROW.findall(body):
            f = dict(re.findall(r'\.(\w+) = ((?:"[^"]*"\s*)+|[^,]+)', fields))
            out.append((key, f.get("caps", "").strip(), re.sub(r'"\s*"', "", f.get("why", "")).strip().strip('"'),
                        f.get("refusal", "GS_REFUSE_NONE").strip(), f.get("status", "NV_OK").strip()))
    else:
        for key, caps, why, ref, st, _handler in CONTROL_ROW.findall(body):
            out.append((key, caps, re.sub(r'"\s*"', "", why).strip('"'), ref, st))
    assert len(out) == body.count("{"), f"{name}: a row the test cannot read"
    return out


def allowed(name: str) -> list[int]:
    return [value(r[0]) for r in c_rows(name) if r[3] == "GS_REFUSE_NONE"]


def value(tok: str) -> int:
    if tok.startswith("0x"):
        return int(tok, 16)
    return getattr(abi, tok)


ALLOWED = allowed("gs_allowed_controls")
CLASSES = allowed("gs_classes")
REFUSED = [value(r[0]) for r in c_rows("gs_refused_controls")]
GLOBAL = [value(r[0]) for r in c_rows("gs_refused_controls") if r[3] == "GS_REFUSE_GLOBAL"]
# what RM answers a caller that may not have something, or a feature that is absent
# RM's answers to a client without the right or the feature; INSUFFICIENT_RESOURCES: a full
# ZBC table (ctrl9096.h), which the graphics driver meets with an ordinary clear
RM_REFUSALS = {"NV_ERR_INSUFFICIENT_PERMISSIONS", "NV_ERR_NOT_SUPPORTED", "NV_ERR_INVALID_CLASS",
               "NV_ERR_INSUFFICIENT_RESOURCES"}
TABLES = ("gs_allowed_controls", "gs_refused_controls", "gs_classes")


@pytest.mark.parametrize("table", TABLES)
def test_every_row_has_a_capability_a_reason_and_rms_answer(table):
    for key, caps, why, refusal, status in c_rows(table):
        assert caps and all(c.strip() in ("GS_CAP_COMPUTE", "GS_CAP_UTILITY", "GS_CAP_GRAPHICS",
                                          "GS_CAP_VIDEO") for c in caps.split("|")), key
        assert len(why) >= 10, key
        if refusal == "GS_REFUSE_NONE":
            assert status == "NV_OK", key
        else:
            assert status in RM_REFUSALS, key
    assert table != "gs_allowed_controls" or all(r[3] == "GS_REFUSE_NONE" for r in c_rows(table))


def test_no_control_is_both_allowed_and_refused():
    assert not set(ALLOWED) & set(REFUSED)


def test_sorted_unique():
    assert ALLOWED == sorted(set(ALLOWED))
    classes = [value(r[0]) for r in c_rows("gs_classes")]
    assert len(classes) == len(set(classes))


def test_no_global_control_listed():
    assert not set(ALLOWED) & set(GLOBAL)
    assert abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS not in ALLOWED


def test_traced_controls_and_classes_listed():
    cmds, classes = set(), set()
    for name in ("cuda-driver-alloc.log.gz", "torch-matmul.log.gz", "nvidia-smi-q.log.gz"):
        for tc in cs.read_trace(name):
            if tc.nr == abi.NV_ESC_RM_CONTROL:
                cmds.add(struct.unpack_from("<I", tc.inb, 8)[0])
            elif tc.nr == abi.NV_ESC_RM_ALLOC:
                classes.add(struct.unpack_from("<I", tc.inb, 12)[0])
    assert cmds <= set(ALLOWED), sorted(hex(c) for c in cmds - set(ALLOWED))
    assert classes <= set(CLASSES), sorted(hex(c) for c in classes - set(CLASSES))


@functools.lru_cache(maxsize=1)
def nvoc_flags() -> dict[int, int]:
    files = subprocess.run(["git", "-C", str(MIRROR), "ls-tree", "--name-only", "580:src/nvidia/generated"],
                           capture_output=True, text=True, check=True).stdout.split()
    flags: dict[int, int] = {}
    for f in files:
        if not f.endswith("_nvoc.c"):
            continue
        text = subprocess.run(["git", "-C", str(MIRROR), "show", f"580:src/nvidia/generated/{f}"],
                              capture_output=True, text=True, check=True).stdout
        fl = None
        for line in text.splitlines():
            m = re.search(r"/\*flags=\*/\s*(0x[0-9a-fA-F]+)u", line)
            if m:
                fl = int(m.group(1), 16)
            m = re.search(r"/\*methodId=\*/\s*(0x[0-9a-fA-F]+)u", line)
            if m and fl is not None:
                flags[int(m.group(1), 16)] = flags.get(int(m.group(1), 16), 0) | fl
    return flags


@pytest.mark.skipif(not MIRROR.is_dir(), reason="NVIDIA source mirror not present")
def test_no_privileged_control_listed():
    flags = nvoc_flags()
    assert len(flags) > 1000
    priv = [hex(c) for c in ALLOWED if flags.get(c, 0) & abi.RMCTRL_FLAGS_PRIVILEGED]
    assert priv == []
    # the named whole-GPU controls are real ones (two are in the SDK headers but have no
    # handler exported in 580's nvoc tables)
    missing = {c for c in GLOBAL if c not in flags}
    assert missing <= {abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION_V2, abi.NV0080_CTRL_CMD_BIF_RESET}


def sdk_classes() -> set[int]:
    """Every class id branch 580 knows (src/nvidia/generated/g_allclasses.h)."""
    text = subprocess.run(["git", "-C", str(MIRROR), "show", "580:src/nvidia/generated/g_allclasses.h"],
                          capture_output=True, text=True, check=True).stdout
    return {int(m, 16) for m in re.findall(r"^#define\s+\w+\s+\(0x([0-9a-fA-F]+)\)", text, re.M)}


def sdk_controls() -> set[int]:
    """Every control command defined in branch 580's SDK headers (ctrl/**/*.h)."""
    out = subprocess.run(["git", "-C", str(MIRROR), "grep", "-h", "-E", r"^#define[[:space:]]+[A-Za-z0-9_]+_CTRL_CMD_[A-Za-z0-9_]+[[:space:]]+\(0x[0-9a-fA-F]+U?\)",
                          "580", "--", "src/common/sdk/nvidia/inc/ctrl/"],
                         capture_output=True, text=True, check=True).stdout
    return {int(m, 16) for m in re.findall(r"\(0x([0-9a-fA-F]+)U?\)", out)}


@pytest.mark.skipif(not MIRROR.is_dir(), reason="NVIDIA source mirror not present")
def test_every_row_names_what_the_580_driver_has():
    """Each control row is a control 580 has: a method of its nvoc tables, a command of its
    SDK headers, or one RM forwards to GSP whole (RM_GSS_LEGACY_MASK, 0x8000: traced, not
    in the open source), or one on an NV2081_BINAPI object (binapiControl forwards those to
    GSP); each class row a class it knows. A row with a wrong number would allow or refuse
    nothing. The one exception: ECC_GET_UNREPAIRABLE_MEMORY_FLAG, named in the 590 SDK and
    answered by 580.159 (traced), absent from 580.142's source."""
    known = set(nvoc_flags()) | sdk_controls() | {0x20803406}
    missing = {hex(c) for c in ALLOWED + REFUSED if c not in known and not c & 0x8000 and c >> 16 != 0x2081}
    assert missing == set(), sorted(missing)
    classes = sdk_classes()
    assert len(classes) > 100
    rows = [value(r[0]) for r in c_rows("gs_classes")]
    assert {hex(k) for k in rows if k not in classes} == set()


def _traced_uvm() -> set[int]:
    import gzip

    out = set()
    for f in cs.TRACES.glob("*.log.gz"):
        for line in gzip.open(f, "rt"):
            w = line.split()
            if len(w) > 3 and w[2] == "/dev/nvidia-uvm":
                out.add(int(w[3].split("=")[1], 16))
    return out


@pytest.fixture
def core(tmp_path_factory):
    c = cs.Core(cs.build(tmp_path_factory.mktemp("core")), 1 << 30)
    yield c
    c.close()


def test_uvm_allowlist_covers_the_traces_and_refuses_the_rest(core):
    traced = _traced_uvm()
    if not traced:
        pytest.fail(f"no nvidia-uvm call in {cs.TRACES}")
    for cmd in traced:
        r = core.call(cmd, bytearray(), kind=cs.GS_FILE_UVM)
        assert r.verdict == cs.GS_PASS, hex(cmd)
    # the tools interface reads and writes other processes' memory; RUN_TEST is a test hook
    for cmd in (62, 63, 9, 56, 76, 71, 80):
        r = core.call(cmd, bytearray(), kind=cs.GS_FILE_UVM)
        assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, 1, cs.GS_REFUSE_UNLISTED), hex(cmd)


def test_nvlink_caps_allowed(core):
    """NV2080_CTRL_CMD_NVLINK_GET_NVLINK_CAPS was refused for a workload on the H100
    (issue 11 item 9): a read-only query in nvproxy's compute set."""
    assert 0x20803001 in ALLOWED


# what OpenGL (EGL), Vulkan (wgpu), NVDEC and NVJPG decoding issue on the H100, recorded
# without gpuslice by tests/gpu/rmtrace.c (scripts/gpu-run.sh render; docs/render-video.md)
RENDER_VIDEO_TRACE = Path(__file__).parent / "traces" / "render-video-h100.jsonl"
# refused on purpose, each with the reason in kmod/core/filter.c (and the callers go on)
RENDER_VIDEO_REFUSED = {abi.NV9096_CTRL_CMD_SET_ZBC_COLOR_CLEAR}
# the escapes the core decodes for them (kmod/core/core.c, legacy.c) besides the plain ones
RENDER_VIDEO_ESCAPES = {abi.NV_ESC_RM_ALLOC, abi.NV_ESC_RM_CONTROL, abi.NV_ESC_RM_FREE, abi.NV_ESC_RM_DUP_OBJECT,
                        abi.NV_ESC_RM_ALLOC_MEMORY, abi.NV_ESC_RM_MAP_MEMORY, abi.NV_ESC_RM_UNMAP_MEMORY,
                        abi.NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, abi.NV_ESC_RM_VID_HEAP_CONTROL,
                        abi.NV_ESC_RM_IDLE_CHANNELS, abi.NV_ESC_RM_ALLOC_CONTEXT_DMA2, abi.NV_ESC_RM_MAP_MEMORY_DMA,
                        abi.NV_ESC_RM_UNMAP_MEMORY_DMA, abi.NV_ESC_CARD_INFO, abi.NV_ESC_REGISTER_FD,
                        abi.NV_ESC_ALLOC_OS_EVENT, abi.NV_ESC_FREE_OS_EVENT, abi.NV_ESC_CHECK_VERSION_STR,
                        abi.NV_ESC_ATTACH_GPUS_TO_FD, abi.NV_ESC_SYS_PARAMS, abi.NV_ESC_NUMA_INFO,
                        abi.NV_ESC_WAIT_OPEN_COMPLETE}


def render_video_calls() -> list[dict]:
    return [json.loads(line) for line in RENDER_VIDEO_TRACE.read_text().splitlines() if '"esc"' in line]


def test_render_video_trace_is_listed():
    calls = render_video_calls()
    workloads = {c["workload"] for c in calls}
    assert workloads == {"egl_render", "vulkan_wgpu", "nvdec_decode", "nvjpg_decode"}
    cmds = {c["what"] for c in calls if c["esc"] == abi.NV_ESC_RM_CONTROL}
    classes = {c["what"] for c in calls if c["esc"] == abi.NV_ESC_RM_ALLOC}
    escapes = {c["esc"] for c in calls}
    assert cmds - RENDER_VIDEO_REFUSED <= set(ALLOWED), sorted(hex(c) for c in cmds - set(ALLOWED))
    assert RENDER_VIDEO_REFUSED <= set(GLOBAL)
    assert classes <= set(CLASSES), sorted(hex(c) for c in classes - set(CLASSES))
    assert escapes <= RENDER_VIDEO_ESCAPES, sorted(hex(e) for e in escapes - RENDER_VIDEO_ESCAPES)
    # every escape named is one the core decides (a row of its escape table, core.c
    # gs_escapes[], or a case of legacy.c's dispatch) or passes plainly
    core = (cs.REPO / "kmod" / "core" / "core.c").read_text()
    rows = re.search(r"gs_escapes\[\] = \{(.*?)\n\};", core, re.S).group(1)
    legacy = (cs.REPO / "kmod" / "core" / "legacy.c").read_text()
    plain = re.search(r"gs_plain_escapes\[\] = \{(.*?)\};", FILTER, re.S).group(1)
    for e in escapes:
        name = next(k for k, v in vars(abi).items() if k.startswith("NV_ESC_") and v == e)
        assert f"{{ {name}," in rows or f"case {name}:" in legacy or name in plain, name


def test_graphics_and_video_rows_carry_their_capability():
    """A row whose source letters say only the render and video trace issues it (g, v: the
    header comment of kmod/core/filter.c) is for the graphics or video capability, and each
    call only that trace issues has such a row or an older one."""
    rows = c_rows("gs_allowed_controls") + c_rows("gs_classes")
    for key, caps, why, _ref, _st in rows:
        letters = why.split(":", 1)[0]
        if re.fullmatch(r"[gv]+", letters):
            assert "GS_CAP_GRAPHICS" in caps or "GS_CAP_VIDEO" in caps, key
    lettered = {value(k) for k, _c, why, _r, _s in c_rows("gs_allowed_controls")
                if re.fullmatch(r"[dsthpgv]+", why.split(":", 1)[0])}
    cmds = {c["what"] for c in render_video_calls() if c["esc"] == abi.NV_ESC_RM_CONTROL}
    assert cmds - RENDER_VIDEO_REFUSED <= lettered, sorted(hex(c) for c in cmds - lettered)


def test_tsg_and_channel_parameters_are_staged():
    """The engine a TSG or channel names decides whether the controller gates it: RM must
    read the parameters the core read (kmod/shadow.c), all of them (580's sizes)."""
    rows = {key: fields for key, fields in CLASS_ROW.findall(_table("gs_classes"))}
    for cls in ("KEPLER_CHANNEL_GROUP_A", "HOPPER_CHANNEL_GPFIFO_A", "AMPERE_CHANNEL_GPFIFO_A"):
        assert ".stage = 1" in rows[cls], cls
    assert "NV_CHANNEL_GROUP_ALLOC_PARAMS_SIZE" in rows["KEPLER_CHANNEL_GROUP_A"]
    assert "NV_CHANNEL_ALLOC_PARAMS_SIZE" in rows["HOPPER_CHANNEL_GPFIFO_A"]
    abi_h = (cs.REPO / "kmod" / "core" / "nvrm_abi.h").read_text()
    assert re.search(r"#define NV_CHANNEL_GROUP_ALLOC_PARAMS_SIZE\s+20\b", abi_h)
    assert re.search(r"#define NV_CHANNEL_ALLOC_PARAMS_SIZE\s+368\b", abi_h)

"""Replay the three real H100 traces against the stand-in driver (tests/standin).

Every call the stand-in implements must come back with the recorded outcome (the same
RM status, zero or not). Calls it does not implement are listed (printed, and written
to build/replay/<trace>.txt and .json for the report); the core classes and controls
that gpuslice depends on must all be implemented.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuslice import abi
from gpuslice.trace import replay as rp
from gpuslice.trace import records as t

import nvstub

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "traces"
OUT = REPO / "build" / "replay"
NAMES = ("torch-matmul", "cuda-driver-alloc", "nvidia-smi-q")

CORE_CLASSES = (abi.NV01_ROOT_CLIENT, abi.NV01_DEVICE_0, abi.NV20_SUBDEVICE_0, abi.NV01_MEMORY_SYSTEM,
                abi.NV01_MEMORY_LOCAL_USER, abi.FERMI_VASPACE_A, abi.KEPLER_CHANNEL_GROUP_A,
                abi.HOPPER_CHANNEL_GPFIFO_A)
CORE_CONTROLS = (abi.NV2080_CTRL_CMD_FB_GET_INFO_V2, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
                 abi.NVA06C_CTRL_CMD_SET_TIMESLICE, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS)

pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(not (os.path.exists("/dev/nvidiactl") and rp.IMPLEMENTED_PATH.exists()),
                       reason="stand-in driver (nvstub.ko) not loaded"),
]


def peak_vidmem(calls: list[t.TraceCall]) -> int:
    """Most device memory (class 0x40, granted sizes) the trace held at once."""
    live: dict[int, int] = {}
    peak = 0
    sizes = {m.index: m for m in t.memory_allocs(calls)}
    for c in calls:
        if c.index in sizes and sizes[c.index].status == abi.NV_OK and sizes[c.index].h_class == abi.NV01_MEMORY_LOCAL_USER:
            m = sizes[c.index]
            live[m.h_new] = m.granted or m.requested
        elif c.kind == "nv" and c.nr == abi.NV_ESC_RM_FREE and c.arg_in is not None:
            live.pop(t.decode_free(c.arg_in).h_object, None)
        peak = max(peak, sum(live.values()))
    return peak


@pytest.fixture(scope="module")
def implemented() -> rp.Implemented:
    impl = rp.read_implemented()
    assert impl is not None
    return impl


def test_core_is_implemented(implemented: rp.Implemented) -> None:
    missing = [f"class {c:#x}" for c in CORE_CLASSES if c not in implemented.classes]
    missing += [f"ctrl {c:#x}" for c in CORE_CONTROLS if c not in implemented.controls]
    assert not missing, f"the stand-in lacks core RM objects: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_replay_trace(name: str, implemented: rp.Implemented) -> None:
    calls = t.read_trace(TRACES / f"{name}.log.gz")
    fb_mib = int(Path("/sys/module/nvstub/parameters/fb_mib").read_text())
    need = peak_vidmem(calls)
    assert need <= fb_mib << 20, (
        f"{name} holds {need >> 20} MiB of video memory at once; load nvstub with fb_mib >= that "
        f"(scripts/guest-tests.sh does: NVSTUB_ARGS)")

    rep = rp.replay(calls, implemented, "/dev/", name)
    text = rp.format_report(rep)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.txt").write_text(text + "\n")
    (OUT / f"{name}.json").write_text(json.dumps(rep.to_json(), indent=1))
    print("\n" + text)

    s = rep.summary()
    assert s["match"] > 0
    assert s["match"] + s["mismatch"] + s["unimplemented"] + s["dependent"] + s["not_replayable"] == len(calls)
    mism = [f"[{r.index}] {r.name}: expected {r.expected}, got {r.got} {r.reason}" for r in rep.by("mismatch")
            if r.name not in nvstub.release_differences()]
    assert not mism, f"{len(mism)} calls differ from the real driver:\n" + "\n".join(mism)
    # nothing the core needs is among the calls it skipped
    skipped = {r.reason for r in rep.by("unimplemented")}
    core = {f"class {c:#x}" for c in CORE_CLASSES} | {f"ctrl {c:#x}" for c in CORE_CONTROLS}
    assert not (skipped & core), f"core calls unimplemented: {sorted(skipped & core)}"
    # RM_ALLOC of the root class comes back as a client handle of the stand-in
    roots = [r for r in rep.results if r.name.startswith("RM_ALLOC(NV01_ROOT")]
    assert roots and all(r.category == "match" for r in roots)


def test_refused_200gib_alloc_replays_as_0x51(implemented: rp.Implemented) -> None:
    calls = t.read_trace(TRACES / "cuda-driver-alloc.log.gz")
    rep = rp.replay(calls, implemented, "/dev/", "cuda-driver-alloc")
    failed = [m.index for m in t.memory_allocs(calls) if m.status == abi.NV_ERR_NO_MEMORY]
    assert failed
    for r in rep.results:
        if r.index in failed:
            assert r.category == "match", r
            assert "status=0x51" in r.got and r.got.startswith("ok")

"""The decision core fed with the real calls recorded on an H100 (tests/traces).

Each recorded call goes through gs_pre(); if the core passes it, RM's recorded reply
(out, pout) is written into the block, as the real driver would, and gs_post() runs.
Expected values are computed here from the trace itself, independently of the core.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "core"))
import coreshim as cs  # noqa: E402
from coreshim import GiB, MiB, abi  # noqa: E402


ALL = ["cuda-driver-alloc.log.gz", "torch-matmul.log.gz", "nvidia-smi-q.log.gz"]


@pytest.fixture(scope="module")
def so(tmp_path_factory):
    return cs.build(tmp_path_factory.mktemp("core"))


def vidmem_allocs(calls):
    """(index, handle, requested, allocated, status) of every class-0x40 RM_ALLOC."""
    out = []
    for i, tc in enumerate(calls):
        if tc.nr == abi.NV_ESC_RM_ALLOC and struct.unpack_from("<I", tc.inb, 12)[0] == 0x40:
            req = struct.unpack_from("<Q", tc.pin, 64)[0]
            got = struct.unpack_from("<Q", tc.pout, 64)[0]
            st = struct.unpack_from("<I", tc.outb, 40)[0]
            out.append((i, struct.unpack_from("<I", tc.inb, 8)[0], req, got, st))
    return out


def expected_used(calls, upto):
    """Bytes of class-0x40 memory live after calls[:upto], from the trace alone."""
    live = {}
    for tc in calls[:upto]:
        if tc.nr == abi.NV_ESC_RM_ALLOC:
            h_root, _, h_new, klass = struct.unpack_from("<IIII", tc.outb)
            if klass == 0x40 and struct.unpack_from("<I", tc.outb, 40)[0] == 0:
                live[(h_root, h_new)] = struct.unpack_from("<Q", tc.pout, 64)[0]
        elif tc.nr == abi.NV_ESC_RM_FREE:
            h_root, _, h_old, st = abi.NVOS00.unpack_from(tc.outb)
            if st == 0:
                live.pop((h_root, h_old), None)
                if h_old == h_root:
                    live = {k: v for k, v in live.items() if k[0] != h_root}
    return sum(live.values())


@pytest.mark.parametrize("name", ALL)
def test_traces_pass_unchanged_with_a_large_limit(so, name):
    """Deny-by-default must still let every traced call of CUDA, PyTorch and nvidia-smi through."""
    calls = cs.read_trace(name)
    core = cs.Core(so, 80 * GiB)
    rp = cs.Replayer(core)
    refused = []
    emulated = 0
    for tc in calls:
        r = rp.replay(tc)
        if r.result.verdict != cs.GS_PASS and r.result.refusal == cs.GS_REFUSE_NONE:
            # answered by the core as RM answered in the recording (issue 11 item 6)
            assert tc.nr == abi.NV_ESC_SYS_PARAMS or (
                tc.nr == abi.NV_ESC_RM_CONTROL and struct.unpack_from("<I", tc.inb, 8)[0]
                == abi.NVA06C_CTRL_CMD_SET_TIMESLICE and r.result.status == abi.NV_OK), tc.line
            emulated += 1
        elif r.result.verdict != cs.GS_PASS:
            refused.append((tc.line, hex(tc.nr), r.result))
    st = core.stats()
    print(f"{name}: {len(calls)} calls, {emulated} answered without the driver (SYS_PARAMS, SET_TIMESLICE)")
    # the only refusals are the 200 GiB allocations RM itself refused in the recording
    assert all(r[2].refusal == cs.GS_REFUSE_QUOTA and r[2].status == abi.NV_ERR_NO_MEMORY for r in refused)
    assert st["refused_filter"] == 0
    assert st["ioctls"] == len(calls)
    assert st["used"] == expected_used(calls, len(calls))
    for fd in {tc.fd for tc in calls}:
        core.file_closed(fd)
    assert core.stats()["used"] == 0
    assert core.stats()["objects"] == 0
    core.close()


def test_cuda_driver_alloc_accounting_step_by_step(so):
    calls = cs.read_trace("cuda-driver-alloc.log.gz")
    allocs = vidmem_allocs(calls)
    sizes = [a[2] for a in allocs]
    # the workload: 64, 128, 192 MiB then two 200 GiB attempts
    assert sizes[-5:] == [64 * MiB, 128 * MiB, 192 * MiB, 200 * GiB, 200 * GiB]
    core = cs.Core(so, 80 * GiB)
    rp = cs.Replayer(core)
    seen = []
    for i, tc in enumerate(calls):
        r = rp.replay(tc)
        assert core.stats()["used"] == expected_used(calls, i + 1) or r.result.verdict != cs.GS_PASS
        if tc.nr in (abi.NV_ESC_RM_ALLOC, abi.NV_ESC_RM_FREE):
            seen.append(core.stats()["used"])
    ctx = expected_used(calls, allocs[-5][0])
    assert ctx > 0
    # used went ctx -> ctx+64M -> ctx -> ctx+128M -> ctx -> ctx+192M -> ctx
    for mib in (64, 128, 192):
        assert ctx + mib * MiB in seen
    assert core.stats()["used"] == ctx
    assert core.stats()["peak"] >= ctx + 192 * MiB
    assert core.stats()["refused_quota"] == 2
    ev = [e for e in core.events() if e["type"] == cs.EV_ALLOC_REFUSED]
    assert [e["size"] for e in ev] == [200 * GiB, 200 * GiB]
    assert all(e["status"] == abi.NV_ERR_NO_MEMORY for e in ev)
    core.close()


def _replay_until(so, calls, stop, limit):
    core = cs.Core(so, limit)
    rp = cs.Replayer(core)
    for tc in calls[:stop]:
        rp.replay(tc)
    return core, rp


@pytest.mark.parametrize("slack,ok", [(0, True), (-1, False), (1, True)])
def test_limit_exactly_and_one_byte_over(so, slack, ok):
    calls = cs.read_trace("cuda-driver-alloc.log.gz")
    idx64 = vidmem_allocs(calls)[-5][0]
    ctx = expected_used(calls, idx64)
    core, rp = _replay_until(so, calls, idx64, 80 * GiB)
    assert core.stats()["used"] == ctx
    core.set_limit(ctx + 64 * MiB + slack)
    r = rp.replay(calls[idx64])
    if ok:
        assert r.result.verdict == cs.GS_PASS
        assert core.stats()["used"] == ctx + 64 * MiB
    else:
        assert r.result.verdict == cs.GS_REPLY
        assert r.result.refusal == cs.GS_REFUSE_QUOTA
        # refused exactly like RM refuses: status 0x51 in the block, the ioctl succeeds
        assert struct.unpack_from("<I", r.arg, 40)[0] == abi.NV_ERR_NO_MEMORY
        assert core.stats()["used"] == ctx
    core.close()


def test_fb_get_info_v2_is_virtualized(so):
    calls = cs.read_trace("torch-matmul.log.gz")
    limit = 4 * GiB
    core = cs.Core(so, limit)
    rp = cs.Replayer(core)
    checked = 0
    for i, tc in enumerate(calls):
        r = rp.replay(tc)
        if tc.nr != abi.NV_ESC_RM_CONTROL or struct.unpack_from("<I", tc.inb, 8)[0] != 0x20801303:
            continue
        n = struct.unpack_from("<I", tc.pout)[0]
        real = {struct.unpack_from("<I", tc.pout, 4 + 8 * k)[0]: struct.unpack_from("<I", tc.pout, 8 + 8 * k)[0]
                for k in range(n)}
        got = {struct.unpack_from("<I", r.params, 4 + 8 * k)[0]: struct.unpack_from("<I", r.params, 8 + 8 * k)[0]
               for k in range(n)}
        used = core.stats()["used"]
        for idx, val in real.items():
            if idx in (0x7, 0x8, 0x9, 0x20):
                assert got[idx] == min(val, limit >> 10)
                checked += 1
            elif idx in (0x16, 0x12):
                assert got[idx] == min(val, (limit - used) >> 10)
                assert got[idx] <= val
                checked += 1
            else:
                assert got[idx] == val  # other indices untouched
    # CUDA's cuMemGetInfo pair (HEAP_FREE, HEAP_SIZE) was seen and rewritten
    assert checked >= 6
    core.close()


def test_fb_info_free_never_above_physical_free(so):
    calls = cs.read_trace("cuda-driver-alloc.log.gz")
    core = cs.Core(so, 1 << 50)  # a limit far above the GPU
    rp = cs.Replayer(core)
    for tc in calls:
        r = rp.replay(tc)
        if tc.nr == abi.NV_ESC_RM_CONTROL and struct.unpack_from("<I", tc.inb, 8)[0] == 0x20801303:
            assert r.params[: len(tc.pout)] == tc.pout
    core.close()


def test_trace_objects_and_events(so):
    """4 TSGs and 20 channels per CUDA context, with engines, parents, and events."""
    calls = cs.read_trace("cuda-driver-alloc.log.gz")
    core = cs.Core(so, 80 * GiB)
    rp = cs.Replayer(core)
    for tc in calls:
        rp.replay(tc)
    objs = core.objects()
    tsgs = [o for o in objs if o["kind"] == cs.OBJ_TSG]
    chans = [o for o in objs if o["kind"] == cs.OBJ_CHANNEL]
    assert len(tsgs) == 4 and len(chans) == 20
    tsg_handles = {o["handle"] for o in tsgs}
    assert all(c["parent"] in tsg_handles for c in chans)
    assert all(t["klass"] == abi.KEPLER_CHANNEL_GROUP_A for t in tsgs)
    assert any(t["engine"] != 0 for t in tsgs)
    # CUDA leaves channels' engineType 0: the core reports their TSG's engine
    eng = {t["handle"]: t["engine"] for t in tsgs}
    assert all(c["engine"] == eng[c["parent"]] != 0 for c in chans)
    ev = core.events()
    assert sum(e["type"] == cs.EV_TSG_NEW for e in ev) == 4
    assert sum(e["type"] == cs.EV_CHANNEL_NEW for e in ev) == 20
    # CUDA opens a probe client and frees it before its real one: attach, detach, attach
    procs = [e["type"] for e in ev if e["type"] in (cs.EV_PROC_ATTACH, cs.EV_PROC_DETACH)]
    assert procs == [cs.EV_PROC_ATTACH, cs.EV_PROC_DETACH, cs.EV_PROC_ATTACH]
    pid = calls[0].pid
    assert core.pids() == [pid]
    for fd in {tc.fd for tc in calls}:
        core.file_closed(fd)
    ev = core.events()
    assert sum(e["type"] == cs.EV_TSG_DEL for e in ev) == 4
    assert sum(e["type"] == cs.EV_CHANNEL_DEL for e in ev) == 20
    assert ev[-1]["type"] == cs.EV_PROC_DETACH
    assert core.pids() == []
    core.close()


def test_trace_with_a_small_limit_refuses_cleanly(so):
    """Replaying PyTorch under 256 MiB: the big context allocations are refused with 0x51."""
    calls = cs.read_trace("torch-matmul.log.gz")
    core = cs.Core(so, 256 * MiB)
    rp = cs.Replayer(core)
    for tc in calls:
        r = rp.replay(tc)
        if r.result.verdict == cs.GS_REPLY and r.result.refusal != cs.GS_REFUSE_NONE:
            assert r.result.refusal == cs.GS_REFUSE_QUOTA
            assert struct.unpack_from("<I", r.arg, 40)[0] == abi.NV_ERR_NO_MEMORY
        assert core.stats()["used"] <= 256 * MiB + 2 * MiB  # RM's padding at most
    assert core.stats()["refused_quota"] >= 1
    core.close()


@pytest.mark.parametrize("name", ALL)
def test_objects_get_their_device_gpu_not_the_nvidiactl_minor(so, name):
    """CUDA allocates on nvidiactl (minor 255): TSGs and channels are on the GPU of their
    device ancestor (NV0080_ALLOC_PARAMETERS.deviceId, 0 on the one-GPU H100 host)."""
    calls = cs.read_trace(name)
    dev_ids = {struct.unpack_from("<I", tc.pin)[0] for tc in calls
               if tc.nr == abi.NV_ESC_RM_ALLOC and struct.unpack_from("<I", tc.inb, 12)[0] == abi.NV01_DEVICE_0
               and len(tc.pin) >= 4}
    assert dev_ids == {0}
    assert any(tc.kind == cs.GS_FILE_CTL for tc in calls)
    core = cs.Core(so, 80 * GiB)
    rp = cs.Replayer(core)
    objs = []
    for tc in calls:
        rp.replay(tc)
        if tc.nr == abi.NV_ESC_RM_ALLOC and struct.unpack_from("<I", tc.inb, 12)[0] in (
                abi.NV01_DEVICE_0, abi.HOPPER_CHANNEL_GPFIFO_A):
            objs = core.objects()  # the table at the last device or channel allocation
    ev = core.events()
    new = [e for e in ev if e["type"] in (cs.EV_TSG_NEW, cs.EV_CHANNEL_NEW)]
    if name != "nvidia-smi-q.log.gz":
        assert new
    assert all(e["gpu"] == 0 for e in new)
    devices = [o for o in objs if o["klass"] == abi.NV01_DEVICE_0]
    assert devices and all(o["gpu"] == 0 for o in devices)
    # everything below a device is on GPU 0; what has no device above (clients, and objects
    # allocated right under a client such as NV_CONFIDENTIAL_COMPUTE) keeps 255
    by = {(o["client"], o["handle"]): o for o in objs}
    for o in objs:
        up, below_device = o, False
        while up["parent"] and (up["client"], up["parent"]) in by:
            up = by[(up["client"], up["parent"])]
            below_device |= up["klass"] == abi.NV01_DEVICE_0
        want = 0 if below_device or o["klass"] == abi.NV01_DEVICE_0 else 255
        assert o["gpu"] == want, o
    assert sum(o["kind"] in (cs.OBJ_TSG, cs.OBJ_CHANNEL, cs.OBJ_MEMORY) for o in objs) == \
        sum(o["gpu"] == 0 and o["kind"] in (cs.OBJ_TSG, cs.OBJ_CHANNEL, cs.OBJ_MEMORY) for o in objs)
    core.close()

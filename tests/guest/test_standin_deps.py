"""Guest tests of RM's dependants as the stand-in models them (tests/standin/nvstub_rm.c
nvstub_obj_free), alone and through a gpuslice instance.

RM (open-gpu-kernel-modules 580.142, src/nvidia/src/libraries/resserv/src/): freeing an
object frees its descendants (handles gone); an object that depends on something freed
(refAddDependant, rs_resource.c:699-716: a TSG on its hVASpace, kernel_channel_group_api.c:
281-288; a subcontext on its hVASpace, kernel_ctxshare.c:151-159; a channel on its
hContextShare, kernel_channel.c:1008-1014) and is not a descendant of it is only invalidated,
with its children (rs_server.c:1338-1366, rs_client.c:840): its destructor runs, its handle
stays until the caller frees it (rs_server.c:239-246). A control on it answers
NV_ERR_RESOURCE_LOST (rs_server.c:1556), a dup NV_ERR_RESOURCE_LOST (:1703), a new object
under its handle NV_ERR_INSERT_DUPLICATE_NAME (rs_client.c:1463-1464), FIFO_DISABLE_CHANNELS
naming it NV_ERR_INVALID_CHANNEL (kernel_channel.c:1718-1740 CliGetKernelChannel: no
pResource).
"""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvstub  # noqa: E402
from gpuslice import abi  # noqa: E402

pytestmark = [pytest.mark.guest,
              pytest.mark.skipif(not nvstub.present(), reason="nvstub.ko is not loaded")]

MIB = 1 << 20
TSG_PARAMS_SIZE = 20      # nvos.h NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS; hVASpace @8
CTXSHARE_PARAMS_SIZE = 12  # nvos.h NV_CTXSHARE_ALLOCATION_PARAMETERS; hVASpace @0
CHANNEL_H_CONTEXT_SHARE = 24  # NV_CHANNEL_ALLOC_PARAMS.hContextShare


def alloc(s: nvstub.Session, parent: int, h: int, cls: int, params: ctypes.Array | None = None) -> int:
    return nvstub.rm_alloc(s.ctl, s.client, parent, h, cls, params)[0]


def chan_schedule(s: nvstub.Session, h_channel: int) -> int:
    """NVA06F_CTRL_CMD_GPFIFO_SCHEDULE (bEnable=1) on a channel."""
    p = ctypes.create_string_buffer(b"\x01\x00\x00", 3)
    return nvstub.rm_control(s.ctl, s.client, h_channel, abi.NVA06F_CTRL_CMD_GPFIFO_SCHEDULE, p)


def vaspace_tsg_channel(s: nvstub.Session) -> tuple[int, int, int]:
    """A VA space, a TSG on it (hVASpace) with a channel and its compute object, scheduled:
    (hVASpace, hTsg, hChannel)."""
    vas, tsg, ch, gr = s.handle(), s.handle(), s.handle(), s.handle()
    assert alloc(s, s.device, vas, abi.FERMI_VASPACE_A) == abi.NV_OK
    tp = ctypes.create_string_buffer(TSG_PARAMS_SIZE)
    struct.pack_into("<I", tp, 8, vas)
    assert alloc(s, s.device, tsg, abi.KEPLER_CHANNEL_GROUP_A, tp) == abi.NV_OK
    assert alloc(s, tsg, ch, abi.HOPPER_CHANNEL_GPFIFO_A) == abi.NV_OK
    assert alloc(s, ch, gr, abi.HOPPER_COMPUTE_A) == abi.NV_OK
    assert nvstub.schedule(s.ctl, s.client, tsg) == abi.NV_OK
    return vas, tsg, ch


def engine_channels(s: nvstub.Session) -> set[int]:
    return {c.channel for c in nvstub.read_engine() if c.client == s.client}


def check_lost_channel(s: nvstub.Session, tsg: int, ch: int, direct: bool = True) -> None:
    """After its TSG's VA space was freed: the channel and the TSG are invalidated. direct:
    on the stand-in's own nodes (through an instance, GET_TIMESLICE is not listed and
    FIFO_DISABLE_CHANNELS is refused as a global control before the driver sees them)."""
    assert chan_schedule(s, ch) == abi.NV_ERR_RESOURCE_LOST
    assert nvstub.schedule(s.ctl, s.client, tsg) == abi.NV_ERR_RESOURCE_LOST
    assert ch not in engine_channels(s)  # the destructor ran: off the runlist
    if direct:
        assert nvstub.get_timeslice(s.ctl, s.client, tsg)[0] == abi.NV_ERR_RESOURCE_LOST
        assert nvstub.disable_channels(s.ctl, s.client, s.subdevice, [(s.client, ch)], True) == \
            abi.NV_ERR_INVALID_CHANNEL
    # the handles stay: a new object under either is a duplicate name
    assert alloc(s, s.device, ch, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_ERR_INSERT_DUPLICATE_NAME
    assert alloc(s, s.device, tsg, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_ERR_INSERT_DUPLICATE_NAME


@pytest.fixture
def sess():
    s = nvstub.Session()
    yield s
    s.close()


def test_freeing_a_vaspace_invalidates_its_tsg_and_channel(sess):
    s = sess
    other_tsg, other_ch = s.tsg_channel()  # on the device's default VA space: untouched
    vas, tsg, ch = vaspace_tsg_channel(s)
    assert {ch, other_ch} <= engine_channels(s)
    assert s.free(vas) == abi.NV_OK
    check_lost_channel(s, tsg, ch)
    assert s.dup(tsg)[0] == abi.NV_ERR_RESOURCE_LOST
    assert chan_schedule(s, other_ch) == abi.NV_OK
    assert other_ch in engine_channels(s)
    # the caller's RM_FREE of the invalidated channel succeeds and releases the handle
    assert s.free(ch, tsg) == abi.NV_OK
    assert alloc(s, s.device, ch, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK
    assert s.free(ch) == abi.NV_OK
    assert s.free(tsg) == abi.NV_OK
    assert alloc(s, s.device, tsg, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK


def test_freeing_an_invalidated_tsg_takes_its_channels(sess):
    s = sess
    vas, tsg, ch = vaspace_tsg_channel(s)
    assert s.free(vas) == abi.NV_OK
    assert s.free(tsg) == abi.NV_OK  # its invalidated children go with it (rs_server.c:1358-1366)
    assert alloc(s, s.device, ch, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK
    assert alloc(s, s.device, tsg, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK


def test_a_subcontexts_vaspace_invalidates_the_channels_on_it(sess):
    """kernel_ctxshare.c:151-159, kernel_channel.c:1008-1014: VA space <- subcontext <- channel;
    the TSG itself depends on nothing and stays."""
    s = sess
    vas, tsg, ctx, ch, plain = (s.handle() for _ in range(5))
    assert alloc(s, s.device, vas, abi.FERMI_VASPACE_A) == abi.NV_OK
    assert alloc(s, s.device, tsg, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK
    cp = ctypes.create_string_buffer(CTXSHARE_PARAMS_SIZE)
    struct.pack_into("<I", cp, 0, vas)
    assert alloc(s, tsg, ctx, abi.FERMI_CONTEXT_SHARE_A, cp) == abi.NV_OK
    chp = ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE)
    struct.pack_into("<I", chp, CHANNEL_H_CONTEXT_SHARE, ctx)
    assert alloc(s, tsg, ch, abi.HOPPER_CHANNEL_GPFIFO_A, chp) == abi.NV_OK
    assert alloc(s, tsg, plain, abi.HOPPER_CHANNEL_GPFIFO_A) == abi.NV_OK
    assert nvstub.schedule(s.ctl, s.client, tsg) == abi.NV_OK
    assert s.free(vas) == abi.NV_OK
    assert chan_schedule(s, ch) == abi.NV_ERR_RESOURCE_LOST
    assert ch not in engine_channels(s)
    assert chan_schedule(s, plain) == abi.NV_OK
    assert plain in engine_channels(s)
    assert nvstub.schedule(s.ctl, s.client, tsg) == abi.NV_OK
    assert alloc(s, s.device, ctx, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_ERR_INSERT_DUPLICATE_NAME
    assert s.free(ch, tsg) == abi.NV_OK
    assert s.free(ctx, tsg) == abi.NV_OK
    assert s.free(tsg) == abi.NV_OK


def test_freeing_the_subcontext_itself_invalidates_its_channel(sess):
    s = sess
    tsg, ctx, ch = s.handle(), s.handle(), s.handle()
    assert alloc(s, s.device, tsg, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK
    assert alloc(s, tsg, ctx, abi.FERMI_CONTEXT_SHARE_A, ctypes.create_string_buffer(CTXSHARE_PARAMS_SIZE)) \
        == abi.NV_OK
    chp = ctypes.create_string_buffer(abi.CHANNEL_ALLOC_PARAMS_SIZE)
    struct.pack_into("<I", chp, CHANNEL_H_CONTEXT_SHARE, ctx)
    assert alloc(s, tsg, ch, abi.HOPPER_CHANNEL_GPFIFO_A, chp) == abi.NV_OK
    assert s.free(ctx, tsg) == abi.NV_OK
    assert chan_schedule(s, ch) == abi.NV_ERR_RESOURCE_LOST
    assert s.free(tsg) == abi.NV_OK
    assert alloc(s, s.device, ch, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK


# ---- through a gpuslice instance -------------------------------------------------------

def _inst_mem_used(inst) -> int:
    from gpuslice.netlink import gpu_mem
    return gpu_mem(inst.get())[0]["used"]


def _client_vidmem(client: int) -> int:
    return next(c["vidmem"] for c in nvstub.clients() if c["client"] == client)


def test_through_an_instance(nl):
    from gpuslice import netlink as nlm
    from gsinst import Instance, loaded, session

    if not loaded():
        pytest.skip("gpuslice.ko is not loaded")
    nl.subscribe()
    nl.poll_events(0)
    with Instance(nl, 256 * MIB) as inst:
        s = session(inst)
        try:
            st, h_mem, _ = s.alloc_vidmem(8 * MIB)
            assert st == abi.NV_OK
            vas, tsg, ch = vaspace_tsg_channel(s)
            objs = {(o["obj_kind"], o["handle"]) for o in nl.objects(inst.name)}
            assert (nlm.OBJ_TSG, tsg) in objs and (nlm.OBJ_CHANNEL, ch) in objs
            used = _inst_mem_used(inst)
            assert used == _client_vidmem(s.client) > 0
            nl.poll_events(0.2)

            assert s.free(vas) == abi.NV_OK
            check_lost_channel(s, tsg, ch, direct=False)
            # the core no longer lists (gates) the channel nor the TSG; it said so
            objs = {(o["obj_kind"], o["handle"]) for o in nl.objects(inst.name)}
            assert (nlm.OBJ_CHANNEL, ch) not in objs
            assert (nlm.OBJ_TSG, tsg) not in objs
            evs = [(e["event"], e.get("handle")) for e in nl.poll_events(1.0) if e.get("name") == inst.name]
            assert (nlm.EVENTS["GPUSLICE_EV_CHANNEL_DEL"], ch) in evs
            assert (nlm.EVENTS["GPUSLICE_EV_TSG_DEL"], tsg) in evs
            # memory: unchanged on both sides (nothing charged was a dependant)
            assert _inst_mem_used(inst) == used == _client_vidmem(s.client)

            assert s.free(ch, tsg) == abi.NV_OK
            assert alloc(s, s.device, ch, abi.KEPLER_CHANNEL_GROUP_A) == abi.NV_OK
            assert s.free(ch) == abi.NV_OK
            assert s.free(tsg) == abi.NV_OK
            assert s.free(h_mem) == abi.NV_OK
            assert _inst_mem_used(inst) == 0 == _client_vidmem(s.client)
        finally:
            s.close()
        assert nl.objects(inst.name) == []

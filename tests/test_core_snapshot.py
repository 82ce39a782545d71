"""An instance's state handed from one core to another (kmod/core/snapshot.c): a core that
reads what another wrote answers every later call as the writer would, with the same charges
and limits; what it cannot read (another magic, a newer version, short or corrupt bytes,
another ABI row) it refuses, and then it is left as it was."""

from __future__ import annotations

import copy
import ctypes
import errno
import re
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_core import ALLOC, CONTROL, DEV, DUP, Proc, cs, env, so  # noqa: F401  (fixtures)
from test_core_fabric import fabric
from test_core_lifetimes import (CH, CTX, TSG, VAS, chan_params, ctxshare_params, gated, os_event, scheduled_tsg,
                                 tsg_params)
from test_core_uvm import BASE, UVM_FILE, map_arg, range_arg, region, register_channel, unregister_channel, uvm
from coreshim import GiB, LOCK_HIST_BUCKETS, MAX_GPUS, MiB, abi

REPO = Path(__file__).resolve().parents[1]
EXPORT_FILE = 78  # the nvidiactl file holding the export (not the UVM file, 77)
RM_TYPE = abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM

# snapshot.c's layout
HDR = 96
INST = HDR
LOCK = INST + 72 + 32 * MAX_GPUS
LOCK_LEN = 8 * (6 + 2 * LOCK_HIST_BUCKETS)
MEMS = LOCK + LOCK_LEN
COUNTS = ("mems", "objs", "edges", "orphans", "parked", "exports", "uvm", "uvm_gpus", "osev")


def api(core):
    lib = core.lib
    lib.gs_snapshot_size.restype = ctypes.c_long
    lib.gs_snapshot_size.argtypes = [ctypes.c_void_p]
    lib.gs_snapshot_write.restype = ctypes.c_long
    lib.gs_snapshot_write.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong]
    lib.gs_snapshot_read.restype = ctypes.c_int
    lib.gs_snapshot_read.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong]
    lib.gs_inst_caps.restype = ctypes.c_uint32
    lib.gs_inst_caps.argtypes = [ctypes.c_void_p]
    return lib


def snapshot(core) -> bytes:
    lib = api(core)
    n = lib.gs_snapshot_size(core.inst)
    assert n > 0, n
    buf = ctypes.create_string_buffer(n)
    assert lib.gs_snapshot_write(core.inst, buf, n) == n
    return buf.raw


def read(core, data: bytes) -> int:
    return api(core).gs_snapshot_read(core.inst, data, len(data))


def counts(data: bytes) -> dict:
    return dict(zip(COUNTS, struct.unpack_from("<9I", data, 56)))


def masked(data: bytes) -> bytes:
    """Without the checksum and the lock's figures (every take of the lock adds to them)."""
    b = bytearray(data)
    b[8:12] = bytes(4)
    b[LOCK:LOCK + LOCK_LEN] = bytes(LOCK_LEN)
    return bytes(b)


def with_crc(b: bytearray) -> bytes:
    b[8:12] = bytes(4)
    struct.pack_into("<I", b, 8, zlib.crc32(bytes(b)))
    return bytes(b)


def stats(core) -> dict:
    s = core.stats()
    del s["max_chain"]  # the reader's hash key is its own
    return s


def state(core) -> dict:
    """Everything a caller of the core can see of an instance."""
    key = lambda o: (o["client"], o["handle"])  # noqa: E731  (walks follow the hash)
    return {"stats": stats(core), "gpu_mem": core.gpu_mem(), "caps": api(core).gs_inst_caps(core.inst),
            "objects": sorted(core.objects(), key=key), "pids": core.pids(), "snapshot": masked(snapshot(core))}


def fresh(so, limit: int = 0):
    core = cs.Core(so, limit)
    api(core)
    return core


# ---- a session: everything the core keeps ----

def failing(off: int, status: int = abi.NV_ERR_INVALID_ARGUMENT):
    def drv(arg: bytearray) -> int:
        struct.pack_into("<I", arg, off, status)
        return 0
    return drv


def fd_control(p: Proc, cmd: int, params: bytes, fd_file_id: int = EXPORT_FILE, driver=None):
    buf = ctypes.create_string_buffer(params, len(params))
    p.keep.append(buf)
    arg = cs.control_arg(p.client, p.client, cmd, cs.addr(buf), len(params))
    return p.core.call(CONTROL, arg, driver or p.rm.ok(28), file_id=p.file_id, pid=p.pid,
                       fd_file_id=fd_file_id)


def export(p: Proc, h: int):
    return fd_control(p, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD,
                      abi.EXPORT_OBJECT_TO_FD.pack(RM_TYPE, DEV, DEV, h, 5, 0))


def import_(p: Proc, h: int):
    return fd_control(p, abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD,
                      abi.IMPORT_OBJECT_FROM_FD.pack(5, RM_TYPE, 0, DEV, h))


def ok(r) -> None:
    assert (r.verdict, r.status, r.refusal) == (cs.GS_PASS, 0, cs.GS_REFUSE_NONE), r


def session(core, rm):
    """A tenant with two processes: a scheduled (gated) TSG and channel, a TSG invalidated
    with its VA space, memory with a duplicate, an orphan charge, a parked one, nvidia-uvm
    mappings, page tables and a retained channel, OS events, an export, a stray, refusals,
    and its capability set narrowed. Returns the two processes."""
    core.set_gpu_limits({0: 768 * MiB})
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    p = Proc(core, rm)
    p.keep = scheduled_tsg(p)
    # a second TSG on its own VA space, invalidated with it: kept, lost
    p.keep += [tsg_params(0x5B0), chan_params(vas=0x5B0)]
    ok(p.alloc(DEV, abi.FERMI_VASPACE_A, 0x5B0)[0])
    ok(p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x710, p.keep[-2])[0])
    ok(p.alloc(0x710, abi.HOPPER_CHANNEL_GPFIFO_A, 0x711, p.keep[-1])[0])
    ok(p.free(0x5B0))
    # memory, a duplicate holding it after its free, an orphan, a parked charge
    r, m1 = p.mem(128 * MiB)
    ok(r)
    r, m2 = p.mem(64 * MiB)
    ok(r)
    ok(core.call(DUP, cs.dup_arg(p.client, DEV, 0x7777, p.client, m1), rm.ok(24)))
    ok(p.free(m1))
    orphan = cs.mem_params(32 * MiB)
    p.keep.append(orphan)
    ok(p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, handle=0, params=orphan)[0])
    r, _ = fabric(p, m2, 64 * MiB, driver=failing(40))
    assert r.verdict == cs.GS_PASS and r.status != 0
    # nvidia-uvm: two maps of m2 (the second charged for its page tables), a region
    ok(uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, m2, BASE, 64 * MiB)))
    ok(uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, map_arg(p.client, m2, BASE + GiB, 64 * MiB)))
    ok(region(core, abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION, BASE + 4 * GiB, 2 * MiB))
    # channels UVM registered: one live (the gated one), one freed and retained
    p.keep.append(chan_params(ctx=CTX))
    ok(p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, 0x720, p.keep[-1])[0])
    ok(register_channel(p, CH))
    ok(register_channel(p, 0x720))
    ok(p.free(0x720, parent=TSG))
    ok(os_event(p, 3))
    ok(os_event(p, 4))
    # an export that outlives its handle
    r, mx = p.mem(16 * MiB)
    ok(r)
    ok(export(p, mx))
    ok(p.free(mx))
    # a channel whose TSG's reply never came right: a stray for good; no snapshot meanwhile
    seen = {}

    def tsg_then_channel(arg: bytearray) -> int:
        seen["busy"] = api(core).gs_snapshot_size(core.inst)
        p.keep.append(chan_params())
        seen["ch"] = p.alloc(0x730, abi.HOPPER_CHANNEL_GPFIFO_A, 0x731, p.keep[-1])[0]
        return failing(40)(arg)

    p.keep.append(tsg_params())
    core.call(ALLOC, cs.alloc_arg(p.client, DEV, 0x730, abi.KEPLER_CHANNEL_GROUP_A, cs.addr(p.keep[-1])),
              tsg_then_channel, file_id=p.file_id, pid=p.pid)
    assert seen["busy"] == -errno.EBUSY
    ok(seen["ch"])
    # refusals: over the limit, a class outside the capability set
    assert p.mem(2 * GiB)[0].refusal == cs.GS_REFUSE_QUOTA
    assert p.alloc(CH, abi.HOPPER_A)[0].refusal == cs.GS_REFUSE_CAPS
    # another process, in its own pid namespace
    q = Proc(core, rm, file_id=2, pid=101, ns_pid=7)
    q.keep = []
    ok(q.mem(8 * MiB)[0])
    core.events()
    return p, q


def proceed(core, p: Proc, q: Proc) -> list:
    """The calls after the handover, each with its answer, events, charges and limits."""
    out = []

    def rec(what, r=None):
        out.append((what, r, core.events(), stats(core), core.gpu_mem()[:2]))

    rec("mem 512M", p.mem(512 * MiB)[0])
    rec("mem 256M", p.mem(256 * MiB)[0])
    rec("mem 400M", p.mem(400 * MiB)[0])
    dup_handle = cs.mem_params(MiB)
    rec("registered handle", p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, 0x7777, dup_handle)[0])
    cp = chan_params(ctx=CTX)
    rec("channel in the scheduled TSG", p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, 0x740, cp)[0])
    rec("graphics", p.alloc(CH, abi.HOPPER_A)[0])
    rec("free the dup", p.free(0x7777))
    rec("uvm free", uvm(core, abi.UVM_FREE, range_arg(BASE, 64 * MiB)))
    rec("uvm unregister", unregister_channel(p, 0x720))
    rec("free the VA space", p.free(VAS))
    rec("free the lost TSG", p.free(0x710))
    rec("free an OS event", os_event(p, 3, req=abi.IOCTL_RM_FREE_OS_EVENT))
    rec("OS event again", os_event(p, 3))
    rec("import", import_(p, 0x7800))
    rec("free the stray's parent", p.free(0x730))
    rec("q's memory", q.mem(600 * MiB)[0])
    for f in (UVM_FILE, EXPORT_FILE, p.file_id, q.file_id):
        core.file_closed(f)
        rec(f"close {f}")
    assert stats(core)["used"] == 0 and stats(core)["objects"] == 0
    del dup_handle, cp
    return out


def on(core, p: Proc, rm) -> Proc:
    """p's process, as seen by another core (same handles, same RM)."""
    v = copy.copy(p)
    v.core, v.rm = core, rm
    return v


# ---- (a), (b): a core reading the snapshot carries on as the writer ----

def test_a_core_taking_over_answers_every_later_call_as_the_old_one(so):
    a, rm = fresh(so, GiB), cs.MockRM()
    p, q = session(a, rm)
    data = snapshot(a)
    n = counts(data)
    assert n["objs"] == stats(a)["objects"] and all(n[k] for k in COUNTS), n
    b = fresh(so)
    assert read(b, data) == 0
    assert state(b) == state(a)
    rm_b = copy.copy(rm)
    theirs = proceed(b, on(b, p, rm_b), on(b, q, rm_b))
    ours = proceed(a, p, q)
    assert [x[0] for x in theirs] == [x[0] for x in ours]
    for t, o in zip(theirs, ours):
        assert t == o, t[0]
    a.close()
    b.close()


def test_charges_limits_and_caps_are_the_same_after_the_handover(so):
    a = fresh(so, GiB)
    p, q = session(a, cs.MockRM())
    a.set_limit(3 * GiB)
    a.set_gpus(0b101)
    a.set_gpu_ids({0: 0x100, 2: 0x300})
    a.set_flags(cs.GS_INST_ALLOW_TEST_ESCAPES)
    b = fresh(so, 5)
    assert read(b, snapshot(a)) == 0
    for key in ("stats", "gpu_mem", "caps", "snapshot"):
        assert state(b)[key] == state(a)[key], key
    assert [g["limit"] for g in b.gpu_mem()[:3]] == [768 * MiB, 0, 3 * GiB]
    assert b.stats()["used"] == a.stats()["used"] > 0 and b.stats()["peak"] == a.stats()["peak"]
    assert api(b).gs_inst_caps(b.inst) == cs.CAP_COMPUTE | cs.CAP_UTILITY
    assert b.stats()["ioctls"] == a.stats()["ioctls"] and b.stats()["refused_filter"] >= 1
    # the lock's figures go on from the writer's
    assert b.lock_stats()["acquired"] >= a.lock_stats()["acquired"]
    # what a snapshot reads back is the same snapshot
    assert masked(snapshot(b)) == masked(snapshot(a))
    a.close()
    b.close()


def test_an_empty_instance_round_trips(so):
    a = fresh(so, GiB)
    b = fresh(so)
    assert read(b, snapshot(a)) == 0
    assert state(b) == state(a)


# ---- (c) refusals, and the destination unchanged ----

@pytest.fixture(scope="module")
def written(so):
    a = fresh(so, GiB)
    session(a, cs.MockRM())
    data = snapshot(a)
    a.close()
    return data


@pytest.fixture(scope="module")
def dest(so):
    """One destination for the refusals: each must leave it as it is."""
    core = fresh(so, 123 * MiB)
    core.set_caps(cs.CAP_VIDEO)
    yield core, state(core)
    core.close()


def refused(dest, data: bytes, err: int) -> None:
    core, before = dest
    assert read(core, data) == -err
    assert state(core) == before


def test_a_snapshot_of_another_magic_is_malformed(written, dest):
    b = bytearray(written)
    b[0] ^= 1
    refused(dest, with_crc(b), errno.EBADMSG)


def test_a_newer_or_older_version_is_refused_as_unknown(written, dest):
    for v in (0, 2, 0xFFFFFFFF):
        b = bytearray(written)
        struct.pack_into("<I", b, 4, v)
        refused(dest, bytes(b), errno.EPROTONOSUPPORT)  # the checksum is not looked at first
        refused(dest, with_crc(b), errno.EPROTONOSUPPORT)


def test_another_abi_row_or_build_is_refused(written, dest):
    for off, new in ((16, b"999".ljust(8, b"\0")), (24, b"1.2.3".ljust(24, b"\0")), (48, struct.pack("<I", MAX_GPUS * 2)),
                     (52, struct.pack("<I", LOCK_HIST_BUCKETS + 1))):
        b = bytearray(written)
        b[off:off + len(new)] = new
        refused(dest, with_crc(b), errno.ENOEXEC)


def test_every_truncation_is_refused(written, dest):
    for n in range(len(written)):
        refused(dest, written[:n], errno.EBADMSG)
    refused(dest, written + b"\0", errno.EBADMSG)


def test_every_byte_corrupted_is_refused(written, dest):
    """Without a checksum to match, a byte changed anywhere is refused."""
    for off in range(len(written)):
        b = bytearray(written)
        b[off] ^= 0x41
        want = errno.EPROTONOSUPPORT if 4 <= off < 8 else errno.EBADMSG
        refused(dest, bytes(b), want)


def test_an_edge_to_no_record_is_refused(written, dest):
    """An edge whose target is NONE (or past the records) from a slot that is NONE too: its
    from's dep[slot] matches it, and the edges still count as many as the slots in use, so
    only a bound on the target keeps the reader from linking record 0xffffffff."""
    n = counts(written)
    last = layout(written)["edges"] + 12 * (n["edges"] - 1)
    assert n["edges"] and struct.unpack_from("<I", written, layout(written)["objs"])[0] == cs.OBJ_CLIENT
    b = bytearray(written)
    struct.pack_into("<3I", b, last, 0xFFFFFFFF, 0, 0)  # from record 0, a client: every slot NONE
    refused(dest, with_crc(b), errno.EBADMSG)


def accepted_as_written(so, data: bytes) -> bool:
    """Read into a fresh core: refused (-EBADMSG) with the core unchanged, or taken, and then a
    snapshot of it gives the same bytes: nothing read is outside what a writer writes."""
    core = fresh(so)
    before = state(core)
    err = read(core, data)
    try:
        if err:
            assert err in (-errno.EBADMSG, -errno.ENOEXEC, -errno.EPROTONOSUPPORT), err
            assert state(core) == before
            return False
        assert masked(snapshot(core)) == masked(data)
        return True
    finally:
        core.close()


def test_each_field_corrupted_with_its_checksum_is_refused_or_consistent(so, written):
    """Every 32-bit word past the header's fixed part set to values a corruption would give,
    the checksum made to match: what the reader takes is exactly a state a writer writes, and
    a count, a link between records or a charge's reference changed is refused."""
    taken = []
    for off in range(56, len(written) - 3, 4):
        word = struct.unpack_from("<I", written, off)[0]
        for new in {word + 1, word - 1 if word else 0xFFFFFFFF, 0xFFFFFFFF, 0, word ^ 0x80000000} - {word}:
            b = bytearray(written)
            struct.pack_into("<I", b, off, new & 0xFFFFFFFF)
            if accepted_as_written(so, with_crc(b)):
                taken.append(off)
    # counts, indexes, links and charges are never taken changed
    lay = layout(written)
    for off in taken:
        assert not 56 <= off < HDR
        assert not lay["objs"] <= off < lay["edges"] or (off - lay["objs"]) % 104 not in (72, 76, 80, 84, 88, 92)
        assert not lay["edges"] <= off < lay["orphans"]
        # an orphan or a parked reference may go to another client; its charge stays its own
        assert not lay["orphans"] <= off < lay["exports"] or (off - lay["orphans"]) % 8 == 0


def layout(data: bytes) -> dict:
    n = counts(data)
    out = {"mems": MEMS}
    out["objs"] = out["mems"] + 24 * n["mems"]
    out["edges"] = out["objs"] + 104 * n["objs"]
    out["orphans"] = out["edges"] + 12 * n["edges"]
    out["parked"] = out["orphans"] + 8 * n["orphans"]
    out["exports"] = out["parked"] + 8 * n["parked"]
    out["uvm"] = out["exports"] + 40 * n["exports"]
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_is_refused_or_consistent(so, written, data):
    b = bytearray(written)
    for _ in range(data.draw(st.integers(1, 4))):
        off = data.draw(st.integers(56, len(b) - 1))
        b[off] = data.draw(st.integers(0, 255))
    accepted_as_written(so, with_crc(b))


def test_a_destination_that_holds_anything_is_refused(so, written):
    core = fresh(so, GiB)
    Proc(core, cs.MockRM())
    before = state(core)
    assert read(core, written) == -errno.EBUSY
    assert state(core) == before
    core.close()


def test_a_snapshot_needs_no_call_in_flight_and_room(so):
    core = fresh(so, GiB)
    p = Proc(core, cs.MockRM())
    seen = {}

    def during(arg: bytearray) -> int:
        seen["size"] = api(core).gs_snapshot_size(core.inst)
        buf = ctypes.create_string_buffer(1 << 16)
        seen["write"] = api(core).gs_snapshot_write(core.inst, buf, len(buf))
        return p.rm.alloc(arg)

    mp = cs.mem_params(MiB)
    core.call(ALLOC, cs.alloc_arg(p.client, DEV, 0x900, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp)), during)
    assert seen == {"size": -errno.EBUSY, "write": -errno.EBUSY}
    n = api(core).gs_snapshot_size(core.inst)
    buf = ctypes.create_string_buffer(n)
    assert api(core).gs_snapshot_write(core.inst, buf, n - 1) == -errno.ENOSPC
    assert api(core).gs_snapshot_write(core.inst, buf, n) == n
    core.close()


def snapshot_during(core, then):
    """A driver that asks for a snapshot while RM runs the call, then answers as then does."""
    seen = {}

    def drv(arg: bytearray) -> int:
        seen["size"] = api(core).gs_snapshot_size(core.inst)
        buf = ctypes.create_string_buffer(1 << 20)
        seen["write"] = api(core).gs_snapshot_write(core.inst, buf, len(buf))
        return then(arg)
    return drv, seen


def handed_over(so, core):
    """A fresh core reading core's snapshot: the same state."""
    new = fresh(so)
    assert read(new, snapshot(core)) == 0
    assert state(new) == state(core)
    return new


BUSY = {"size": -errno.EBUSY, "write": -errno.EBUSY}


def test_an_import_in_flight_holds_off_a_snapshot(so):
    """An import holds no busy handle, reservation or pending export while RM runs it: the
    count of calls in flight refuses the snapshot; after its gs_post() the import's handle
    and its share of the charge are handed over."""
    core = fresh(so, GiB)
    rm = cs.MockRM()
    p = Proc(core, rm)
    q = Proc(core, rm, file_id=2, pid=200)
    r, h = p.mem(256 * MiB)
    ok(r)
    p.keep = []
    ok(export(p, h))
    q.keep = []
    drv, seen = snapshot_during(core, p.rm.ok(28))
    ok(fd_control(q, abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD,
                  abi.IMPORT_OBJECT_FROM_FD.pack(5, RM_TYPE, 0, DEV, 0xB0001), driver=drv))
    assert seen == BUSY
    new = handed_over(so, core)
    assert any((o["client"], o["handle"]) == (q.client, 0xB0001) for o in new.objects())
    # the exporter's handle and the export go: the import still holds the charge
    pn = on(new, p, copy.copy(rm))
    ok(pn.free(h))
    new.file_closed(EXPORT_FILE)
    assert stats(new)["used"] == 256 * MiB
    core.close()
    new.close()


def test_a_schedule_in_flight_holds_off_a_snapshot(so):
    """NVA06C_GPFIFO_SCHEDULE marks its TSG's channels in gs_post() and holds nothing before:
    a snapshot waits for it, and then the new core gates the channel as the old one does."""
    core = fresh(so, GiB)
    rm = cs.MockRM()
    p = Proc(core, rm)
    keep = [tsg_params(VAS), chan_params(ctx=CTX)]
    ok(p.alloc(DEV, abi.FERMI_VASPACE_A, VAS)[0])
    ok(p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, TSG, keep[0])[0])
    keep.append(ctxshare_params(VAS))
    ok(p.alloc(TSG, abi.FERMI_CONTEXT_SHARE_A, CTX, keep[-1])[0])
    ok(p.alloc(TSG, abi.HOPPER_CHANNEL_GPFIFO_A, CH, keep[1])[0])
    drv, seen = snapshot_during(core, rm.control)
    r, _ = p.control(TSG, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, driver=drv)
    ok(r)
    assert seen == BUSY
    new = handed_over(so, core)
    assert gated(new) == gated(core) == [CH]
    core.close()
    new.close()


def test_a_client_allocation_in_flight_holds_off_a_snapshot(so):
    """RM_ALLOC of NV01_ROOT passes before any busy handle is added."""
    core = fresh(so, GiB)
    rm = cs.MockRM()
    drv, seen = snapshot_during(core, rm.alloc)
    arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
    assert core.call(ALLOC, arg, drv).verdict == cs.GS_PASS
    assert seen == BUSY
    client = struct.unpack_from("<I", arg, 8)[0]
    new = handed_over(so, core)
    assert [o["handle"] for o in new.objects()] == [client]
    core.close()
    new.close()


def test_a_failed_or_lost_call_leaves_nothing_in_flight(so):
    """A call RM failed, one the driver never ran (an error return) and one whose reply was
    lost all reach gs_post() once: the snapshot is not held off after them."""
    core = fresh(so, GiB)
    p = Proc(core, cs.MockRM())
    mp = cs.mem_params(MiB)
    r = core.call(ALLOC, cs.alloc_arg(p.client, DEV, 0x901, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp)),
                  failing(40), file_id=1, pid=100)
    assert r.verdict == cs.GS_PASS
    r = core.call(ALLOC, cs.alloc_arg(p.client, DEV, 0x902, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp)),
                  p.rm.alloc, file_id=1, pid=100, ret=-errno.EFAULT)
    assert r.verdict == cs.GS_PASS
    core.run(ALLOC, cs.alloc_arg(p.client, DEV, 0x903, abi.NV01_MEMORY_LOCAL_USER, cs.addr(mp)),
             p.rm.alloc, file_id=1, pid=100, unread=True, lost=True)
    assert api(core).gs_snapshot_size(core.inst) > 0
    core.close()


def with_deps(data: bytes, pairs) -> bytes:
    """data with record frm depending on record to, for each (frm, to): in frm's first free
    slot, and the edge on to's list, the edges kept in order and counted."""
    b = bytearray(data)
    n, lay = counts(data), layout(data)
    edges = [struct.unpack_from("<3I", b, lay["edges"] + 12 * k) for k in range(n["edges"])]
    for frm, to in pairs:
        deps = list(struct.unpack_from("<4I", b, lay["objs"] + 104 * frm + 80))
        slot = deps.index(0xFFFFFFFF)
        struct.pack_into("<I", b, lay["objs"] + 104 * frm + 80 + 4 * slot, to)
        edges.append((to, frm, slot))
    edges.sort(key=lambda e: e[0])
    out = bytearray(b[:lay["edges"]] + b"".join(struct.pack("<3I", *e) for e in edges) +
                    b[lay["orphans"]:])
    struct.pack_into("<I", out, 64, len(edges))
    struct.pack_into("<I", out, 12, len(out))
    return with_crc(out)


def record(data: bytes, handle: int) -> int:
    lay = layout(data)
    return next(i for i in range(counts(data)["objs"])
                if struct.unpack_from("<I", data, lay["objs"] + 104 * i + 12)[0] == handle)


def test_a_dependency_graph_the_live_core_cannot_build_is_refused(so):
    """The live core makes a TSG, a subcontext or a channel depend on a VA space of its device
    or a subcontext of its TSG (core.c gs_dep_placed()), nothing else: mutual dependencies, a
    dependency on the record's own ancestor or descendant, and one between records of other
    classes are refused (-EBADMSG) with the destination unchanged; the graph the live core
    built is taken."""
    old = fresh(so, GiB)
    p = Proc(old, cs.MockRM())
    keep = scheduled_tsg(p)
    r1, m1 = p.mem(64 * MiB)
    r2, m2 = p.mem(32 * MiB)
    ok(r1)
    ok(r2)
    data = snapshot(old)
    new = fresh(so)
    before = state(new)
    i, j, dev, tsg, ch, ctx, vas = (record(data, h) for h in (m1, m2, DEV, TSG, CH, CTX, VAS))
    for pairs in ([(i, j), (j, i)],       # mutual, between memory
                  [(dev, i)],             # the device on its own child
                  [(i, dev)],             # memory on its own parent's... device (an ancestor)
                  [(tsg, ch)],            # a TSG on its own channel (a descendant)
                  [(ctx, tsg)],           # a subcontext on its own TSG (an ancestor)
                  [(vas, tsg)],           # a VA space on the TSG that depends on it (a cycle)
                  [(ch, i)]):             # a channel on memory
        assert read(new, with_deps(data, pairs)) == -errno.EBADMSG, pairs
        assert state(new) == before
    assert read(new, data) == 0
    assert state(new) == state(old)
    del keep
    old.close()
    new.close()


COUNT_ALLOC = r"""
#include <stddef.h>
void *__real_calloc(size_t n, size_t size);
unsigned long t_callocs;
void *__wrap_calloc(size_t n, size_t size) { t_callocs++; return __real_calloc(n, size); }
"""


def test_counts_past_what_a_core_holds_are_refused_before_any_allocation(tmp_path, written):
    """More orphans and parked references than twice the objects' cap, or more charges than
    references to them, are refused (-EBADMSG) from the header's counts, before the staging
    allocates a record for them (a core whose calloc is counted)."""
    src = tmp_path / "count_alloc.c"
    src.write_text(COUNT_ALLOC)
    lib_so = cs.build(tmp_path, extra=[str(src), "-Wl,--wrap=calloc"])
    core = fresh(lib_so)
    callocs = ctypes.c_ulong.in_dll(core.lib, "t_callocs")
    n, lay = counts(written), layout(written)

    def grown(table: str, after: str, rec: bytes, k: int) -> bytes:
        b = bytearray(written[:lay[after]] + rec * k + written[lay[after]:])
        struct.pack_into("<I", b, 56 + 4 * COUNTS.index(table), n[table] + k)
        struct.pack_into("<I", b, 12, len(b))
        return with_crc(b)

    refs = n["objs"] + n["orphans"] + n["parked"] + n["exports"] + 2 * n["uvm"]
    more_mems = grown("mems", "objs", struct.pack("<Q4I", 0, 1, 0, 0, 0), refs - n["mems"] + 1)
    more_orphans = grown("orphans", "parked", struct.pack("<2I", 0, 0), 2 * 65536 - n["orphans"] - n["parked"] + 1)
    for data in (more_mems, more_orphans):
        before = callocs.value
        assert read(core, data) == -errno.EBADMSG
        assert callocs.value == before
    core.close()


# ---- (d) a hostile tenant at its caps ----

def test_a_tenant_at_every_cap_round_trips_and_stays_capped(so):
    """Objects (65536), TSGs, channels, nvidia-uvm records (65536) and OS events at their caps:
    the snapshot holds them all, and the reader refuses the next one as the writer does."""
    a = fresh(so, 1 << 40)
    rm = cs.MockRM()
    p = Proc(a, rm)
    n = 0
    while ok_pass(p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x10000 + n, tsg_params())[0]):
        n += 1
    assert n == 256
    n = 0
    while ok_pass(p.alloc(0x10000, abi.HOPPER_CHANNEL_GPFIFO_A, 0x20000 + n, chan_params())[0]):
        n += 1
    assert n == 1024
    fd = 0
    while ok_pass(os_event(p, fd)):
        fd += 1
    assert fd == 1024
    _, h = p.mem(2 * MiB)
    arg = map_arg(p.client, h, BASE, 2 * MiB)
    n = 0
    while ok_pass(uvm(a, abi.UVM_MAP_EXTERNAL_ALLOCATION, bytearray(arg))):
        n += 1
    assert n == 65536
    mp = cs.mem_params(64 << 10)
    n = 0
    while ok_pass(p.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, 0x100000 + n, mp)[0]):
        n += 1
    assert a.stats()["objects"] == 65536
    data = snapshot(a)
    assert counts(data)["objs"] == 65536 and counts(data)["uvm"] == 65536
    b = fresh(so)
    assert read(b, data) == 0
    assert state(b) == state(a)
    pb = on(b, p, copy.copy(rm))
    for core, proc in ((a, p), (b, pb)):
        assert proc.alloc(DEV, abi.NV01_MEMORY_LOCAL_USER, 0x300000, mp)[0].refusal == cs.GS_REFUSE_LIMIT
        assert uvm(core, abi.UVM_MAP_EXTERNAL_ALLOCATION, bytearray(arg)).refusal == cs.GS_REFUSE_LIMIT
        assert os_event(proc, 5000).refusal == cs.GS_REFUSE_LIMIT
        core.file_closed(proc.file_id)
        core.file_closed(UVM_FILE)
        assert stats(core)["used"] == 0 and stats(core)["objects"] == 0
    a.close()
    b.close()


def ok_pass(r) -> bool:
    return r.verdict == cs.GS_PASS and r.status == 0


# ---- what the snapshot carries: every field of the records it reads ----

# Each field of the core's records, and where snapshot.c has it. A field added to one of these
# structs fails here: carry it in snapshot.c (a new format version if the bytes change) or
# say why it is not carried, then list it.
CARRIED = {
    "gs_inst": {
        "lock": "its figures; the mutex is the reader's", "ops": "the reader's glue", "reg": "the reader's",
        "flags": "instance", "caps": "instance", "limit": "instance", "gpus": "instance",
        "gpu_ids": "instance", "gpu_ids_set": "instance", "used": "instance", "peak": "instance",
        "gpu_limit": "instance", "gpu_used": "instance", "gpu_reserved": "0: no call in flight",
        "gpu_peak": "instance", "sys_used": "instance", "sys_reserved": "0: no call in flight",
        "nr_ioctls": "instance", "nr_refused_quota": "instance", "nr_refused_filter": "instance",
        "nr_objects": "counted again", "nr_channels": "counted again", "nr_tsgs": "counted again",
        "nr_strays": "counted again", "nr_mappers": "counted again", "nr_os_events": "os_events",
        "busy": "NULL: no call in flight", "nr_inflight": "0: no call in flight",
        "exports": "exports", "nr_exports": "exports",
        "uvm_recs": "uvm", "nr_uvm_recs": "counted again", "nr_uvm_regions": "counted again",
        "nr_uvm_channels": "counted again", "hash": "rebuilt with the reader's key",
        "clients": "objs, clients first", "os_events": "os_events", "by_pid": "rebuilt",
        "by_ns_pid": "state 4", "hash_key": "the reader's",
    },
    "gs_obj": {
        "next": "hash chain, rebuilt", "kill": "free between calls", "up": "up", "kids": "order",
        "strays": "order, state 1", "sib": "order", "psib": "order", "pid_next": "rebuilt",
        "pid_pprev": "rebuilt", "nspid_next": "state 4", "nspid_pprev": "state 4", "dep": "dep[4]",
        "dependants": "edges", "o": "the record's fields", "mem": "mem", "ns_pid": "ns_pid",
        "orphans": "orphans", "held": "parked", "uvm_registered": "state 2", "stray": "state 1",
        "dying": "0 between calls", "snap_idx": "the writer's own",
    },
    "gs_object": {
        "obj_kind": "", "file_id": "", "pid": "", "gpu": "", "client": "", "handle": "", "parent": "",
        "klass": "", "engine": "", "size": "", "flags": "", "userd_mem": "", "userd_off": "",
        "gp_entries": "",
    },
    "gs_mem": {"next": "orphans' order", "size": "", "refs": "", "gpu": "", "sys": "flags 1",
               "uvm_maps": "", "snap_idx": "the writer's own"},
    "gs_memref": {"next": "parked's order", "mem": ""},
    "gs_export": {"next": "order", "file_id": "", "slot": "", "pending": "NULL: no call in flight",
                  "client": "", "parent": "", "handle": "", "klass": "", "gpu": "", "mem": "",
                  "held": "NULL outside a call", "sibling": "flags 1"},
    "gs_uvm_rec": {"next": "order", "file_id": "", "kind": "", "start": "", "end": "", "mem": "",
                   "pt": "NONE when never charged", "client": "", "handle": "", "orphan": "",
                   "nr_gpus": "and the uuids after it"},
    "gs_osev": {"next": "order", "file_id": "", "client": "", "fd": ""},
    "gs_dep": {"from": "edges", "to": "dep[]", "next": "edges' order", "pprev": "edges' order"},
}


def struct_fields(text: str, name: str) -> set[str]:
    body = re.search(r"^struct %s \{\n(.*?)^\};" % name, text, re.M | re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    body = re.sub(r"struct \w+ \{.*?\} (\w+);", r"int \1;", body, flags=re.S)
    return {re.findall(r"(\w+)\s*(?:\[[^\]]*\])?$", decl.strip())[0]
            for decl in body.split(";") if decl.strip() and "(" not in decl}


def test_every_field_of_the_core_s_records_is_carried_or_said_why_not():
    core = REPO / "kmod" / "core"
    text = (core / "core_int.h").read_text() + (core / "core.h").read_text()
    for name, fields in CARRIED.items():
        assert struct_fields(text, name) == set(fields), name

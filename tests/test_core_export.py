"""RM objects shared through fds within an instance (kmod/core/export.c), on the core alone.

The glue resolves the fd a control names to a nvidiactl file of the caller's instance
(gs_call.fd_file_id; 0 for anything else). These tests play that part, and RM's.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "core"))
import coreshim as cs  # noqa: E402
from coreshim import GiB, MiB, abi  # noqa: E402

CONTROL = abi.IOCTL_RM_CONTROL
DUP_REQ = abi.IOCTL_RM_DUP_OBJECT
PERM = abi.NV_ERR_INSUFFICIENT_PERMISSIONS
DEV = 0x5C000001
EXPORT_FILE = 77  # the id of the nvidiactl file that holds the exports
RM = abi.NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM


@pytest.fixture(scope="module")
def so(tmp_path_factory):
    return cs.build(tmp_path_factory.mktemp("core"))


@pytest.fixture
def core(so):
    c = cs.Core(so, 1 * GiB)
    yield c
    c.close()


class Proc:
    """A process: a client with a device, on file file_id."""

    def __init__(self, core, file_id: int, pid: int):
        self.core, self.rm, self.file_id, self.pid = core, cs.MockRM(), file_id, pid
        self.rm.next_client = 0xC1D00000 + (file_id << 8)
        arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
        assert core.call(abi.IOCTL_RM_ALLOC, arg, self.rm.alloc, file_id=file_id, pid=pid).verdict == cs.GS_PASS
        self.client = struct.unpack_from("<I", arg, 8)[0]
        self.next = 0x100
        self.keep: list = []
        r = self.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(self.client, self.client, DEV, abi.NV01_DEVICE_0))
        assert r.status == abi.NV_OK

    def call(self, req, arg, driver=None, **kw):
        return self.core.call(req, arg, driver or self.rm.alloc, file_id=self.file_id, pid=self.pid, **kw)

    def mem(self, size: int) -> int:
        self.next += 1
        p = cs.mem_params(size)
        self.keep.append(p)
        arg = cs.alloc_arg(self.client, DEV, self.next, abi.NV01_MEMORY_LOCAL_USER, cs.addr(p))
        assert self.call(abi.IOCTL_RM_ALLOC, arg).status == abi.NV_OK
        return self.next

    def free(self, h: int) -> None:
        assert self.call(abi.IOCTL_RM_FREE, cs.free_arg(self.client, DEV, h), self.rm.ok(12)).status == abi.NV_OK

    def control(self, cmd: int, params: bytes, fd_file_id: int = EXPORT_FILE, status: int = abi.NV_OK,
                ret: int = 0):
        buf = ctypes.create_string_buffer(params, len(params))
        self.keep.append(buf)
        arg = cs.control_arg(self.client, self.client, cmd, cs.addr(buf), len(params))

        def rm(a: bytearray) -> int:
            struct.pack_into("<I", a, 28, status)
            return ret

        return self.core.call(CONTROL, arg, rm, file_id=self.file_id, pid=self.pid, ret=ret,
                              fd_file_id=fd_file_id)

    def export(self, h: int, **kw):
        return self.control(abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD,
                            abi.EXPORT_OBJECT_TO_FD.pack(RM, DEV, DEV, h, 5, 0), **kw)

    def export_many(self, handles: list[int], index: int = 0, **kw):
        objs = handles + [0] * (512 - len(handles))
        return self.control(abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD,
                            abi.EXPORT_OBJECTS_TO_FD.pack(5, DEV, 16, b"", *objs, len(handles), index), **kw)

    def import_(self, h: int, **kw):
        return self.control(abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD,
                            abi.IMPORT_OBJECT_FROM_FD.pack(5, RM, 0, DEV, h), **kw)

    def import_many(self, handles: list[int], index: int = 0, **kw):
        objs = handles + [0] * (128 - len(handles))
        return self.control(abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD,
                            abi.IMPORT_OBJECTS_FROM_FD.pack(5, DEV, *objs, b"", len(handles), index), **kw)


def used(core) -> int:
    return core.stats()["used"]


def test_the_fd_is_found_where_each_control_keeps_it(core):
    """gs_call_fd() reads the fd the glue must resolve, from each control's own offset."""
    blocks = {
        abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD: abi.EXPORT_OBJECT_TO_FD.pack(RM, 1, 2, 3, 41, 0),
        abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD: abi.IMPORT_OBJECT_FROM_FD.pack(42, RM, 1, 2, 3),
        abi.NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO: abi.GET_EXPORT_OBJECT_INFO.pack(43, 0, 0, 0, b""),
        abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD: abi.EXPORT_OBJECTS_TO_FD.pack(44, 0, 1, b"",
                                                                                        *[0] * 512, 0, 0),
        abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD: abi.IMPORT_OBJECTS_FROM_FD.pack(45, 0, *[0] * 128,
                                                                                            b"", 0, 0),
    }
    for cmd, params in blocks.items():
        buf = ctypes.create_string_buffer(params, len(params))
        arg = cs.control_arg(1, 1, cmd, cs.addr(buf), len(params))
        assert core.call_fd(CONTROL, arg) == struct.unpack_from("<i", params, 16 if cmd == 0x3D05 else 0)[0]
    buf = ctypes.create_string_buffer(8)
    assert core.call_fd(CONTROL, cs.control_arg(1, 1, 0x20800102, cs.addr(buf), 8)) is None  # GPU_GET_INFO_V2


def test_export_then_import_within_the_instance_shares_one_charge(core):
    a, b = Proc(core, 1, 100), Proc(core, 2, 200)
    h = a.mem(64 * MiB)
    assert a.export(h).verdict == cs.GS_PASS
    assert b.import_(0xB0001).status == abi.NV_OK
    assert used(core) == 64 * MiB
    objs = {(o["client"], o["handle"]): o for o in core.objects()}
    assert objs[(b.client, 0xB0001)]["size"] == 64 * MiB
    # the exporter frees its handle and exits; the import and the export hold the memory
    a.free(h)
    core.file_closed(1)
    assert used(core) == 64 * MiB
    core.file_closed(2)  # the importer goes: the export still holds it (RM's export client)
    assert used(core) == 64 * MiB
    core.file_closed(EXPORT_FILE)  # the export file is released: RM freed its duplicate
    assert used(core) == 0


def test_an_export_outlives_its_exporter_and_stays_charged(core):
    """What an export keeps alive is charged until its file goes: without the record, a
    process could allocate, export, free and repeat, holding memory nobody pays for."""
    a = Proc(core, 1, 100)
    for i in range(4):
        h = a.mem(100 * MiB)
        a.export_many([h], index=i)
        a.free(h)
    assert used(core) == 400 * MiB
    core.file_closed(EXPORT_FILE)
    assert used(core) == 0


def test_an_fd_that_is_not_the_instances_is_refused_and_counted(core):
    a = Proc(core, 1, 100)
    h = a.mem(8 * MiB)
    before = core.stats()["refused_filter"]
    for r in (a.export(h, fd_file_id=0), a.import_(0xB1, fd_file_id=0),
              a.control(abi.NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO,
                        abi.GET_EXPORT_OBJECT_INFO.pack(5, 0, 0, 0, b""), fd_file_id=0)):
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_FOREIGN)
    assert core.stats()["refused_filter"] == before + 3
    assert used(core) == 8 * MiB


def test_only_registered_objects_are_exported(core):
    a = Proc(core, 1, 100)
    r = a.export(0xDEAD)
    assert (r.status, r.refusal) == (PERM, cs.GS_REFUSE_FOREIGN)
    r = a.export(a.client)  # a client is not an object RM exports
    assert r.refusal == cs.GS_REFUSE_FOREIGN


def test_a_slot_is_written_once(core):
    """RM's EXPORT_OBJECTS_TO_FD replaces (or, for handle 0, clears) what a slot holds:
    an import racing that could take the new object while the core counted the old."""
    a = Proc(core, 1, 100)
    h1, h2 = a.mem(8 * MiB), a.mem(16 * MiB)
    assert a.export_many([h1]).status == abi.NV_OK
    for r in (a.export_many([h2]), a.export_many([0]), a.export(h2)):
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE, cs.GS_REFUSE_MALFORMED)
    assert a.export_many([h2], index=1).status == abi.NV_OK


def test_import_of_an_empty_slot_is_answered_without_rm(core):
    a = Proc(core, 1, 100)
    # a file with no export the core recorded: none the instance made (in the user-space
    # build, another process's), refused
    for r in (a.import_(0xB2), a.import_many([0xB3])):
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_FOREIGN)
    assert a.export_many([a.mem(MiB)], index=1).status == abi.NV_OK
    r = a.import_(0xB2)  # slot 0 is empty
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_PARAMETER, cs.GS_REFUSE_NONE)
    # several: RM skips empty slots, so nothing to register for them and the call passes;
    # a handle named for an empty slot is refused (RM's rollback would free it: os.c)
    assert a.import_many([0]).verdict == cs.GS_PASS
    r = a.import_many([0xB3])
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_ARGUMENT, cs.GS_REFUSE_MALFORMED)
    assert not [o for o in core.objects() if o["handle"] == 0xB3]


def test_an_import_needs_handles_the_caller_chose(core):
    a = Proc(core, 1, 100)
    a.export_many([a.mem(8 * MiB), a.mem(8 * MiB)])
    r = a.import_many([0xB5, 0])
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_ARGUMENT, cs.GS_REFUSE_MALFORMED)
    r = a.import_(0)
    assert r.refusal == cs.GS_REFUSE_MALFORMED


def test_import_many_registers_each_with_its_own_charge(core):
    a, b = Proc(core, 1, 100), Proc(core, 2, 200)
    hs = [a.mem(s * MiB) for s in (4, 8, 16)]
    assert a.export_many(hs, index=2).status == abi.NV_OK
    assert b.import_many([0, 0xC2, 0xC3, 0xC4], index=1).status == abi.NV_OK  # slot 1 is empty
    sizes = {o["handle"]: o["size"] for o in core.objects() if o["client"] == b.client}
    assert (sizes.get(0xC1), sizes[0xC2], sizes[0xC3], sizes[0xC4]) == (None, 4 * MiB, 8 * MiB, 16 * MiB)
    for h in hs:
        a.free(h)
    core.file_closed(EXPORT_FILE)
    assert used(core) == 28 * MiB  # the imports hold it now
    core.file_closed(2)
    assert used(core) == 0


def test_a_free_racing_the_export_leaves_the_charge(core):
    """The export's reference is taken at the check: RM may duplicate the object before a
    free on another thread runs, whichever order the two calls come back in."""
    a = Proc(core, 1, 100)
    h = a.mem(32 * MiB)
    buf = ctypes.create_string_buffer(abi.EXPORT_OBJECT_TO_FD.pack(RM, DEV, DEV, h, 5, 0), 24)
    arg = cs.control_arg(a.client, a.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, cs.addr(buf), 24)

    def rm(blk: bytearray) -> int:
        a.free(h)  # the free's whole call runs inside the export's
        struct.pack_into("<I", blk, 28, abi.NV_OK)
        return 0

    assert core.call(CONTROL, arg, rm, file_id=1, pid=100, fd_file_id=EXPORT_FILE).status == abi.NV_OK
    assert used(core) == 32 * MiB
    core.file_closed(EXPORT_FILE)
    assert used(core) == 0


def test_a_slot_being_filled_is_not_imported(core):
    a, b = Proc(core, 1, 100), Proc(core, 2, 200)
    h = a.mem(8 * MiB)
    seen = {}

    def rm(blk: bytearray) -> int:
        seen["import"] = b.import_(0xD1)
        struct.pack_into("<I", blk, 28, abi.NV_OK)
        return 0

    buf = ctypes.create_string_buffer(abi.EXPORT_OBJECT_TO_FD.pack(RM, DEV, DEV, h, 5, 0), 24)
    arg = cs.control_arg(a.client, a.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, cs.addr(buf), 24)
    core.call(CONTROL, arg, rm, file_id=1, pid=100, fd_file_id=EXPORT_FILE)
    assert (seen["import"].verdict, seen["import"].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)
    assert b.import_(0xD1).status == abi.NV_OK  # once the export is done


def test_a_failure_status_undoes_nothing(core):
    """The reply (its status too) can be rewritten by another thread once RM has begun
    writing it: an export reported failed keeps its charge until its file goes, and a
    failed import registers its handle unless that handle is taken."""
    a, b = Proc(core, 1, 100), Proc(core, 2, 200)
    h = a.mem(8 * MiB)
    assert a.export(h, status=abi.NV_ERR_INVALID_PARAMETER).verdict == cs.GS_PASS
    a.free(h)
    assert used(core) == 8 * MiB
    assert b.import_(0xE1, status=abi.NV_ERR_INVALID_OBJECT_HANDLE).verdict == cs.GS_PASS
    core.file_closed(EXPORT_FILE)
    assert used(core) == 8 * MiB  # the import may hold it
    core.file_closed(2)
    assert used(core) == 0
    # the failed import's handle stays registered until freed (RM frees nothing there)
    assert [o["size"] for o in core.objects() if o["handle"] == 0xE1] == []  # its client went


def test_an_export_the_driver_never_ran_frees_its_slot(core):
    a = Proc(core, 1, 100)
    h = a.mem(8 * MiB)
    assert a.export(h, ret=-22).verdict == cs.GS_PASS
    a.free(h)
    assert used(core) == 0
    assert a.export(a.mem(4 * MiB)).status == abi.NV_OK  # slot 0 is free again


def test_exports_are_capped(core):
    a = Proc(core, 1, 100)
    hs = [a.mem(4096) for _ in range(8)]
    for i in range(4096 // 8):
        assert a.export_many(hs, index=8 * i, fd_file_id=1000 + i).status == abi.NV_OK
    r = a.export_many(hs[:1], fd_file_id=5000)
    assert (r.status, r.refusal) == (abi.NV_ERR_INSUFFICIENT_RESOURCES, cs.GS_REFUSE_LIMIT)
    core.file_closed(1000)
    assert a.export_many(hs[:1], fd_file_id=5000).status == abi.NV_OK


def test_malformed_parameters_are_refused(core):
    a = Proc(core, 1, 100)
    r = a.control(abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD, b"\0" * 100)  # wrong size
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_POINTER, cs.GS_REFUSE_MALFORMED)
    arg = cs.control_arg(a.client, a.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, 16, 24)
    r = core.call(CONTROL, arg, file_id=1, pid=100, fd_file_id=EXPORT_FILE)  # unreadable
    assert r.refusal == cs.GS_REFUSE_MALFORMED
    # counts RM refuses (over its maximum) pass to RM and record nothing
    objs = [0] * 512
    r = a.control(abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD,
                  abi.EXPORT_OBJECTS_TO_FD.pack(5, DEV, 1, b"", *objs, 513, 0))
    assert r.verdict == cs.GS_PASS


def test_the_deprecated_create_export_fd_stays_refused(core):
    a = Proc(core, 1, 100)
    r = a.control(abi.NV0000_CTRL_CMD_OS_UNIX_CREATE_EXPORT_OBJECT_FD, b"\0" * 76)
    assert r.refusal == cs.GS_REFUSE_FOREIGN


def test_attach_gpus_names_the_instances_gpus_only(core):
    """NV_ESC_ATTACH_GPUS_TO_FD (CUDA, on a shareable handle's export file) opens and holds
    each GPU it names: only the instance's GPUs (0 entries are skipped by RM)."""
    req = lambda n: abi.iowr(abi.NV_ESC_ATTACH_GPUS_TO_FD, 4 * n)  # noqa: E731
    ids = lambda *v: bytearray(struct.pack(f"<{len(v)}I", *v))  # noqa: E731
    # the user-space build sets no ids: any passes
    assert core.call(req(1), ids(0x900)).verdict == cs.GS_PASS
    core.set_gpu_ids({0: 0x100, 1: 0x200})
    assert core.call(req(3), ids(0x200, 0, 0x100)).verdict == cs.GS_PASS
    before = core.stats()["refused_filter"]
    r = core.call(req(2), ids(0x100, 0x300))
    assert (r.verdict, r.err, r.refusal) == (cs.GS_FAIL, 1, cs.GS_REFUSE_FOREIGN)
    assert core.stats()["refused_filter"] == before + 1
    for bad in (bytearray(b"\0" * 6), bytearray(4 * 33)):  # not whole ids; more than RM's 32 GPUs
        r = core.call(abi.iowr(abi.NV_ESC_ATTACH_GPUS_TO_FD, len(bad)), bad)
        assert (r.verdict, r.refusal) == (cs.GS_FAIL, cs.GS_REFUSE_MALFORMED)


def test_peer_access_between_the_instances_gpus_is_listed(core):
    """NV50_P2P (both subdevices are resolved in the caller's client: p2p_api.c) and the
    read-only P2P caps queries, what cuCtxEnablePeerAccess needs on several GPUs."""
    a = Proc(core, 1, 100)
    arg = cs.alloc_arg(a.client, a.client, 0x5C0000F1, abi.NV50_P2P)
    assert core.call(abi.IOCTL_RM_ALLOC, arg, a.rm.alloc, file_id=1, pid=100).refusal == cs.GS_REFUSE_NONE
    for cmd in (0x127, 0x12B):
        r = a.control(cmd, b"\0" * 16, fd_file_id=0)
        assert r.refusal == cs.GS_REFUSE_NONE, hex(cmd)


def test_an_import_names_a_handle_nobody_holds(core):
    """A failed import leaves its handle registered (its status is not trusted); an import
    that later succeeds in RM under that handle must not go unrecorded. So an import into
    a registered handle is refused (reviewer's attack: a big buffer imported under a
    handle the core already held for a small one, then its owner freed: RM kept it, the
    core charged the small one)."""
    a, b = Proc(core, 1, 100), Proc(core, 2, 200)
    small = a.mem(1 * MiB)
    a.export(small)
    assert b.import_(0xF1, status=abi.NV_ERR_INVALID_OBJECT_PARENT).verdict == cs.GS_PASS
    big = a.mem(512 * MiB)
    assert a.export(big, fd_file_id=78).status == abi.NV_OK
    r = b.import_(0xF1, fd_file_id=78)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME,
                                                 cs.GS_REFUSE_MALFORMED)
    # and within one call, the same handle twice
    assert a.export_many([a.mem(MiB), a.mem(MiB)], fd_file_id=79).status == abi.NV_OK
    r = b.import_many([0xF2, 0xF2], fd_file_id=79)
    assert r.refusal == cs.GS_REFUSE_MALFORMED
    # b frees the leftover handle (RM frees nothing, answers OK): it can be imported into
    assert b.call(abi.IOCTL_RM_FREE, cs.free_arg(b.client, DEV, 0xF1), b.rm.ok(12)).status == abi.NV_OK
    assert b.import_(0xF1, fd_file_id=78).status == abi.NV_OK


def test_an_export_or_dup_racing_a_free_of_its_handle_waits(core):
    """FREE(H) checked, then ALLOC(H) of something big checked, then EXPORT(H) checked: RM
    may run them in that order and export the big one while the core counted the small
    one (reviewer's attack). While a free of H, or of an ancestor, is in flight, what
    references H is answered NV_ERR_STATE_IN_USE."""
    a = Proc(core, 1, 100)
    h = a.mem(1 * MiB)
    seen = {}

    def rm(blk: bytearray) -> int:
        seen["export"] = a.export(h)
        seen["dup"] = a.call(DUP_REQ, cs.dup_arg(a.client, DEV, 0xD2, a.client, h), a.rm.ok(24))
        struct.pack_into("<I", blk, 12, abi.NV_OK)
        return 0

    a.call(abi.IOCTL_RM_FREE, cs.free_arg(a.client, DEV, h), rm)
    for k in ("export", "dup"):
        assert (seen[k].verdict, seen[k].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE), k
    # a free of the device (an ancestor) too
    h2 = a.mem(1 * MiB)

    def rm2(blk: bytearray) -> int:
        seen["export"] = a.export(h2, fd_file_id=90)
        struct.pack_into("<I", blk, 12, abi.NV_OK)
        return 0

    a.call(abi.IOCTL_RM_FREE, cs.free_arg(a.client, a.client, DEV), rm2)
    assert seen["export"].status == abi.NV_ERR_STATE_IN_USE
    assert used(core) == 0


def test_a_free_racing_a_dup_leaves_the_charge(core):
    """The dup's source charge is referenced at the check: RM may duplicate before a free
    on another thread runs, whichever order the two calls come back in (before: the source
    was looked up after RM answered, and a free in between left the dup uncharged)."""
    a = Proc(core, 1, 100)
    h = a.mem(32 * MiB)

    def rm(blk: bytearray) -> int:
        a.free(h)
        struct.pack_into("<I", blk, 24, abi.NV_OK)
        return 0

    assert a.call(DUP_REQ, cs.dup_arg(a.client, DEV, 0xD3, a.client, h), rm).status == abi.NV_OK
    assert used(core) == 32 * MiB
    assert [o["size"] for o in core.objects() if o["handle"] == 0xD3] == [32 * MiB]
    a.free(0xD3)
    assert used(core) == 0


def test_only_counted_memory_is_exported(core):
    """An export keeps its object alive past its owner: a TSG's context buffers would be
    counted by nobody, and an imported TSG would come back unknown to the scheduler."""
    a = Proc(core, 1, 100)
    r = a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, 0x7501, abi.KEPLER_CHANNEL_GROUP_A))
    assert r.status == abi.NV_OK
    for h in (0x7501, DEV):
        r = a.export(h)
        assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CLASS)


def test_an_export_file_of_more_slots_than_one_call_fills_is_refused(core):
    """maxObjects sizes the array RM allocates for the file (up to 65535 handles, kernel
    memory nobody's cgroup pays for)."""
    a = Proc(core, 1, 100)
    objs = [0] * 512
    for mx, ok in ((512, True), (513, False), (65535, False)):
        r = a.control(abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD,
                      abi.EXPORT_OBJECTS_TO_FD.pack(5, DEV, mx, b"", *objs, 0, 0), fd_file_id=100 + mx)
        assert (r.verdict == cs.GS_PASS) == ok, mx
        if not ok:
            assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_PARAMETER, cs.GS_REFUSE_MALFORMED)


def test_a_handle_taken_from_is_not_made_again_meanwhile(core):
    """Second review: an export (or dup) checked, then a free and an allocation of its
    handle run whole while RM has not run the export yet: RM would export the new,
    bigger object. Creating a handle an export or dup in flight takes from waits; so does
    taking from a handle whose creation is in flight, and freeing one being created or
    creating one being freed (RM may free first and the core register the new object
    before it forgets the old)."""
    a = Proc(core, 1, 100)
    h = a.mem(1 * MiB)
    seen = {}
    big = cs.mem_params(512 * MiB)

    def alloc_h(params=big):
        return a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, h, abi.NV01_MEMORY_LOCAL_USER,
                                                        cs.addr(params)))

    def in_export(blk: bytearray) -> int:
        a.free(h)
        seen["alloc"] = alloc_h()
        struct.pack_into("<I", blk, 28, abi.NV_OK)
        return 0

    buf = ctypes.create_string_buffer(abi.EXPORT_OBJECT_TO_FD.pack(RM, DEV, DEV, h, 5, 0), 24)
    core.call(CONTROL, cs.control_arg(a.client, a.client, abi.NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD,
                                      cs.addr(buf), 24), in_export, file_id=1, pid=100, fd_file_id=EXPORT_FILE)
    assert (seen["alloc"].verdict, seen["alloc"].status) == (cs.GS_REPLY, abi.NV_ERR_STATE_IN_USE)
    core.file_closed(EXPORT_FILE)
    assert used(core) == 0
    # the same with a dup taking from h2
    h2 = a.mem(1 * MiB)

    def in_dup(blk: bytearray) -> int:
        a.free(h2)
        seen["alloc"] = a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, h2, abi.NV01_MEMORY_LOCAL_USER,
                                                                 cs.addr(big)))
        struct.pack_into("<I", blk, 24, abi.NV_OK)
        return 0

    a.call(DUP_REQ, cs.dup_arg(a.client, DEV, 0xD5, a.client, h2), in_dup)
    assert seen["alloc"].status == abi.NV_ERR_STATE_IN_USE
    # an allocation of h3 while h3 is live: RM fails it (NV_ERR_INSERT_DUPLICATE_NAME), and
    # the core answers so before RM runs, whatever an export or free of h3 would do meanwhile
    h3 = a.mem(1 * MiB)
    r = a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, h3, abi.NV01_MEMORY_LOCAL_USER, cs.addr(big)),
               lambda blk: pytest.fail("RM must not see it"))
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME)
    # and a free of h4 in flight: its allocation is refused (h4 is still registered)
    h4 = a.mem(1 * MiB)

    def in_free(blk: bytearray) -> int:
        seen["alloc"] = a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, h4, abi.NV01_MEMORY_LOCAL_USER,
                                                                 cs.addr(big)))
        struct.pack_into("<I", blk, 12, abi.NV_OK)
        return 0

    a.call(abi.IOCTL_RM_FREE, cs.free_arg(a.client, DEV, h4), in_free)
    assert seen["alloc"].status == abi.NV_ERR_INSERT_DUPLICATE_NAME
    assert used(core) == 2 * MiB  # h2's dup and h3


def test_a_duplicated_tsg_gates_its_channels(core):
    a = Proc(core, 1, 100)
    assert a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, 0x7601, abi.KEPLER_CHANNEL_GROUP_A)).status == 0
    assert a.call(DUP_REQ, cs.dup_arg(a.client, DEV, 0x7602, a.client, 0x7601), a.rm.ok(24)).status == 0
    kinds = {o["handle"]: o["kind"] for o in core.objects()}
    assert kinds[0x7602] == kinds[0x7601]


def test_a_forged_success_does_not_replace_a_live_charge(core):
    """Second review: an allocation under a handle that holds memory fails in RM
    (NV_ERR_INSERT_DUPLICATE_NAME); another thread rewrites its status to NV_OK before the
    module reads the reply. The live object's charge must stay (before: the core took the
    old entry as stale, uncharged 512 MiB and charged 64 KiB)."""
    a = Proc(core, 1, 100)
    p = cs.mem_params(512 * MiB)
    a.keep.append(p)
    assert a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, 0xAB1, abi.NV01_MEMORY_LOCAL_USER,
                                                    cs.addr(p))).status == abi.NV_OK
    small = cs.mem_params(64 * 1024)
    a.keep.append(small)
    r = a.call(abi.IOCTL_RM_ALLOC, cs.alloc_arg(a.client, DEV, 0xAB1, abi.NV01_MEMORY_LOCAL_USER,
                                                cs.addr(small)))  # the mock RM would answer NV_OK
    # refused as RM refuses it, before RM runs: no reply to forge
    assert (r.verdict, r.status) == (cs.GS_REPLY, abi.NV_ERR_INSERT_DUPLICATE_NAME)
    assert used(core) == 512 * MiB
    core.file_closed(1)
    assert used(core) == 0


def sibling_import(p: Proc, handles: list[int], types: list[int], *, status: int = abi.NV_OK,
                   sibling: bool = True):
    """p imports slots 0.. of a file another process's core exported into (the user-space
    build: one core per process); RM answers each slot's object type (os.c)."""
    objs = handles + [0] * (128 - len(handles))
    params = abi.IMPORT_OBJECTS_FROM_FD.pack(5, DEV, *objs, b"", len(handles), 0)
    buf = ctypes.create_string_buffer(params, len(params))
    p.keep.append(buf)
    arg = cs.control_arg(p.client, p.client, abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD,
                         cs.addr(buf), len(params))

    def rm(a: bytearray) -> int:
        ctypes.memmove(cs.addr(buf) + 520, bytes(types), len(types))
        struct.pack_into("<I", a, 28, status)
        return 0

    return p.core.call(CONTROL, arg, rm, file_id=p.file_id, pid=p.pid, fd_file_id=EXPORT_FILE,
                       fd_sibling=sibling)


def test_an_import_from_a_sibling_process_is_registered_uncharged(so):
    """The user-space build: the exporter's core charges and keeps the charge; the
    importer's registers what RM says it imported, charging nothing twice."""
    ca, cb = cs.Core(so, 1 * GiB), cs.Core(so, 1 * GiB)
    try:
        a, b = Proc(ca, 1, 100), Proc(cb, 2, 200)
        hs = [a.mem(64 * MiB), a.mem(8 * MiB)]
        assert a.export_many(hs).status == abi.NV_OK
        # without the glue's word the file is foreign to b's core, as before
        r = sibling_import(b, [0xB1, 0xB2], [1, 1], sibling=False)
        assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, PERM, cs.GS_REFUSE_FOREIGN)
        VID, NONE, SYS = (abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM,
                          abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE,
                          abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_SYSMEM)
        r = sibling_import(b, [0xB1, 0xB2, 0xB3], [VID, NONE, SYS])
        assert (r.verdict, r.status) == (cs.GS_PASS, abi.NV_OK)
        mine = {o["handle"]: o for o in cb.objects() if o["client"] == b.client}
        assert 0xB2 not in mine  # an empty slot: RM made nothing
        assert (mine[0xB1]["klass"], mine[0xB1]["size"]) == (abi.NV01_MEMORY_LOCAL_USER, 0)
        assert mine[0xB3]["klass"] == abi.NV01_MEMORY_SYSTEM
        assert (used(ca), used(cb)) == (72 * MiB, 0)
        # a handle it holds, or one named twice, is refused as for any import
        for hs2 in ([0xB1], [0xB4, 0xB4]):
            r = sibling_import(b, hs2, [VID] * len(hs2))
            assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_MALFORMED)
        # a failed import registers nothing
        assert sibling_import(b, [0xB5], [VID], status=abi.NV_ERR_INVALID_ARGUMENT).verdict == cs.GS_PASS
        assert 0xB5 not in {o["handle"] for o in cb.objects()}
        b.free(0xB1)
        assert 0xB1 not in {o["handle"] for o in cb.objects()}
        assert used(ca) == 72 * MiB
    finally:
        ca.close()
        cb.close()


def test_a_dup_from_a_sibling_processs_client_is_registered_uncharged(so):
    """Legacy CUDA IPC in the user-space build: the exporter shares its memory (RM_SHARE),
    the importer duplicates it from the exporter's client, which only the glue can vouch
    for (gs_call.src_sibling); nothing is charged twice, and without it the dup is foreign."""
    ca, cb = cs.Core(so, 1 * GiB), cs.Core(so, 1 * GiB)
    try:
        a, b = Proc(ca, 1, 100), Proc(cb, 2, 200)
        h = a.mem(32 * MiB)
        r = b.call(DUP_REQ, cs.dup_arg(b.client, DEV, 0xD1, a.client, h), b.rm.ok(24))
        assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_FOREIGN)
        r = b.call(DUP_REQ, cs.dup_arg(b.client, DEV, 0xD1, a.client, h), b.rm.ok(24), fd_sibling=True)
        assert (r.verdict, r.status) == (cs.GS_PASS, abi.NV_OK)
        assert (0xD1, 0) in {(o["handle"], o["size"]) for o in cb.objects() if o["client"] == b.client}
        assert (used(ca), used(cb)) == (32 * MiB, 0)
        # the importer's own client is still required
        r = b.call(DUP_REQ, cs.dup_arg(a.client, DEV, 0xD2, a.client, h), b.rm.ok(24), fd_sibling=True)
        assert (r.verdict, r.refusal) == (cs.GS_REPLY, cs.GS_REFUSE_FOREIGN)
    finally:
        ca.close()
        cb.close()


def test_a_free_through_a_file_that_does_not_hold_the_client_never_reaches_rm(core):
    """RM refuses a free of a client's objects through another open file than the one
    holding the client (NV_ERR_INVALID_CLIENT). The core took a free's outcome from the
    reply, which a sibling thread can rewrite to NV_OK after the driver's copy-out
    (docs/isolation.md): the core then forgot memory and channels RM still held. Now the
    core answers such a free as RM would and never passes it, so no reply decides it."""
    p = Proc(core, 5, 300)
    h = p.mem(256 * MiB)
    before = used(core)
    objs = len(core.objects())
    calls = []

    def forged(a: bytearray) -> int:  # RM refused it; the sibling thread wrote NV_OK
        calls.append(1)
        struct.pack_into("<I", a, 12, abi.NV_OK)
        return 0

    for target in (h, DEV, p.client):
        r = core.call(abi.IOCTL_RM_FREE, cs.free_arg(p.client, p.client, target), forged, file_id=6, pid=300)
        assert (r.verdict, r.status, calls) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLIENT, [])
        assert used(core) == before and len(core.objects()) == objs
    p.free(h)  # through its own file: RM's answer stands
    assert used(core) == before - 256 * MiB


def test_register_fd_is_for_gpu_files_only(core):
    """NV_ESC_REGISTER_FD on an nvidiactl file links it to another nvidiactl file, and RM
    then checks every client named through it against that other file (escape.c,
    rmclientValidate_IMPL compares nvfp->ctl_nvfp). The core's file of a client would no
    longer be RM's, and a free RM refuses would pass the core's file check, its reply
    open to a forged NV_OK (a reviewer's bypass of the check above). On a GPU file it is
    what CUDA does, and passes."""
    p = Proc(core, 5, 300)
    h = p.mem(64 * MiB)
    reg = bytearray(abi.REGISTER_FD.pack(7))  # the other nvidiactl's fd
    r = core.call(abi.IOCTL_REGISTER_FD, reg, lambda a: 0, kind=cs.GS_FILE_CTL, file_id=5, pid=300)
    assert (r.verdict, r.err) == (cs.GS_FAIL, 1)  # EPERM, not passed
    r = core.call(abi.IOCTL_REGISTER_FD, reg, lambda a: 0, kind=cs.GS_FILE_GPU, file_id=9, pid=300)
    assert r.verdict == cs.GS_PASS
    p.free(h)

"""RM objects shared through file descriptors (issue 15), through the module against the
stand-in, which models 580's export and import (tests/standin/nvstub_export.c):
cuMemExportToShareableHandle(POSIX_FD), cudaIpc* on recent drivers and NCCL's cuMem path
put memory in a nvidiactl file with EXPORT_OBJECT(S)_TO_FD, pass that fd to another process
and IMPORT_OBJECT(S)_FROM_FD it there.

- Within an instance this works, between processes, and the memory stays charged to the
  instance for as long as the export file or an import holds it (kmod/core/export.c).
- Another instance's export file is refused and counted: it cannot be imported, read, or
  made to hold this instance's exports.
- The file the driver resolves is the one the module checked, whatever the caller dup2()s
  over the fd meanwhile (kmod/fdswap.c, the pinned fd)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest

from gpuslice import abi
from gpuslice.netlink import GpusliceNetlink, gpu_mem

import nvstub
from gsinst import Instance, session, wait_for

MIB = 1 << 20
PERM = abi.NV_ERR_INSUFFICIENT_PERMISSIONS
DELAY = "/sys/module/gpuslice/parameters/race_delay_fd_us"

pytestmark = pytest.mark.skipif(not (nvstub.present() and os.path.exists("/sys/module/gpuslice")),
                                reason="needs nvstub.ko and gpuslice.ko loaded")


@pytest.fixture(scope="module")
def nl():
    with GpusliceNetlink() as sock:
        yield sock


def used(inst: Instance) -> int:
    return gpu_mem(inst.get())[0]["used"]


def test_an_exported_handle_reaches_the_instances_other_processes(nl) -> None:
    """A process exports its memory into a fresh nvidiactl file, sends the fd over a unix
    socket and exits; another process of the instance imports it. One charge all along,
    held by the export file, then by the import, and gone with the last of them."""
    base = nvstub.pool_used()
    with Instance(nl, 64 * MIB) as a:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # the exporting process
            code = 1
            try:
                s = session(a)
                st, h, _ = s.alloc_vidmem(8 * MIB)
                efd = nvstub.open_node(a.path("nvidiactl"))
                # CUDA keeps the GPU up for the export's file (cuMemExportToShareableHandle)
                assert nvstub.attach_gpus(efd, [nvstub.gpu_ids(efd)[0]]) == 0
                st2 = s.export_fd(h, efd)
                socket.send_fds(child, [struct.pack("<II", st, st2)], [efd])
                os.close(efd)
                s.free(h)
                s.close()
                code = 0
            finally:
                os._exit(code)
        msg, fds, _, _ = socket.recv_fds(parent, 8, 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert struct.unpack("<II", msg) == (abi.NV_OK, abi.NV_OK)
        # the exporter freed its handle and is gone: the export file holds the memory
        assert used(a) == 8 * MIB and nvstub.pool_used() == base + 8 * MIB
        s = session(a)
        try:
            st, devinst, nmax = s.export_info(fds[0])
            assert (st, devinst, nmax) == (abi.NV_OK, 0, 1)
            st, h = s.import_fd(fds[0])
            assert st == abi.NV_OK
            assert used(a) == 8 * MIB  # one charge, shared
            os.close(fds[0])  # the export file goes; the import holds the memory
            assert wait_for(lambda: nvstub.pool_used() == base + 8 * MIB)
            assert used(a) == 8 * MIB
            assert s.free(h) == abi.NV_OK
            assert used(a) == 0 and nvstub.pool_used() == base
        finally:
            s.close()
            parent.close()
            child.close()
    assert nvstub.pool_used() == base


def test_several_objects_in_one_file(nl) -> None:
    """EXPORT_OBJECTS_TO_FD / IMPORT_OBJECTS_FROM_FD (what NCCL's cuMem path batches): each
    slot imported with its own size and type; an empty slot is skipped (and may name no
    handle: RM's rollback of a failed batch would free it); a slot once written is not
    rewritten through the module."""
    base = nvstub.pool_used()
    with Instance(nl, 64 * MIB) as a:
        s, t = session(a), session(a)
        efd = nvstub.open_node(a.path("nvidiactl"))
        try:
            hs = [s.alloc_vidmem(n * MIB)[1] for n in (2, 4, 1)]
            assert s.export_many(hs[:2], efd, index=1) == abi.NV_OK
            assert s.export_many(hs[2:], efd, index=1) == abi.NV_ERR_STATE_IN_USE
            st, got, types = t.import_many(efd, 3, empty=(0,))
            assert st == abi.NV_OK
            vid = abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM
            assert types == [abi.NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE, vid, vid]
            assert used(a) == 7 * MIB
            assert t.import_many(efd, 3)[0] == abi.NV_ERR_INVALID_ARGUMENT  # a handle for slot 0
            for h in hs:
                s.free(h)
            os.close(efd)
            efd = -1
            assert wait_for(lambda: nvstub.pool_used() == base + 6 * MIB)  # 1 MiB went with its free
            assert used(a) == 6 * MIB  # t's imports hold 2 + 4
        finally:
            if efd >= 0:
                os.close(efd)
            s.close()
            t.close()
    assert nvstub.pool_used() == base


def test_another_instance_can_neither_import_nor_hold_an_export(nl) -> None:
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        sa, sb = session(a), session(b)
        fa = nvstub.open_node(a.path("nvidiactl"))
        fb = nvstub.open_node(b.path("nvidiactl"))
        r, w = os.pipe()
        try:
            _, ha, _ = sa.alloc_vidmem(8 * MIB)
            _, hb, _ = sb.alloc_vidmem(4 * MIB)
            assert sa.export_fd(ha, fa) == abi.NV_OK
            refused_a, refused_b = a.get()["nr_refused_filter"], b.get()["nr_refused_filter"]
            assert sb.import_fd(fa)[0] == PERM  # RM itself would import it
            assert sb.export_info(fa)[0] == PERM
            assert sb.export_fd(hb, fa) == PERM  # b's memory held by a's file, charged to nobody
            assert b.get()["nr_refused_filter"] == refused_b + 3
            assert sa.export_fd(ha, fb) == PERM
            assert sa.import_fd(r)[0] == PERM  # not a gpuslice file at all
            assert sa.import_fd(sa.dev_fd)[0] == PERM  # a GPU node: RM wants a nvidiactl
            assert a.get()["nr_refused_filter"] == refused_a + 3
            assert used(b) == 4 * MIB and used(a) == 8 * MIB
            assert sa.import_fd(fa)[0] == abi.NV_OK  # within a
        finally:
            for fd in (fa, fb, r, w):
                os.close(fd)
            sa.close()
            sb.close()


def test_the_driver_resolves_the_file_that_was_checked(nl) -> None:
    """A thread dup2()s another instance's export file over the fd an import names, after
    the module checked it and before the driver runs (the window widened by the TEST ONLY
    parameter race_delay_fd_us). The driver still sees the checked file: the import takes
    this instance's memory, and the other instance's goes back to the pool with its own
    files. Before the fd was pinned, the driver imported the other instance's memory."""
    if not os.path.exists(DELAY):
        pytest.skip("gpuslice without race_delay_fd_us")
    base = nvstub.pool_used()
    with Instance(nl, 64 * MIB) as a, Instance(nl, 64 * MIB) as b:
        sa, sb = session(a), session(b)
        fa = nvstub.open_node(a.path("nvidiactl"))
        fb = nvstub.open_node(b.path("nvidiactl"))
        try:
            _, ha, _ = sa.alloc_vidmem(4 * MIB)
            _, hb, _ = sb.alloc_vidmem(12 * MIB)
            assert sa.export_fd(ha, fa) == abi.NV_OK
            assert sb.export_fd(hb, fb) == abi.NV_OK
            racer = threading.Thread(target=lambda: (time.sleep(0.1), os.dup2(fb, fa, inheritable=False)))
            with open(DELAY, "w") as f:
                f.write("400000\n")
            try:
                racer.start()
                st, h = sa.import_fd(fa)
            finally:
                with open(DELAY, "w") as f:
                    f.write("0\n")
                racer.join()
            assert st == abi.NV_OK
            # fa now names b's file; b lets go of everything it has
            assert sb.free(hb) == abi.NV_OK
            sb.close()
            os.close(fb)
            os.close(fa)
            fa = fb = -1
            assert wait_for(lambda: used(b) == 0)
            # b's 12 MiB is back in the pool: nothing of a's holds it
            assert wait_for(lambda: nvstub.pool_used() == base + 4 * MIB), nvstub.pool_used() - base
            assert used(a) == 4 * MIB
        finally:
            for fd in (fa, fb):
                if fd >= 0:
                    os.close(fd)
            sa.close()
            if fb >= 0:
                sb.close()
    assert nvstub.pool_used() == base

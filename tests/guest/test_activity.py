"""The module's activity signal (issue 12): CHANNEL_WORK from its sampler of the channels'
USERD (kmod/activity.c), against the stand-in, which models RM's own USERD of a channel
and its mapping through the channel's handle (kernel_channel.c kchannelMap_IMPL; the
engine moves GPGet up to GPPut as it fetches, tests/standin/nvstub_engine.c).

A process submits by writing GPPut in its mapped USERD, with no ioctl: the module must
see that, only for announced channels of the instance, and nothing a process does to its
own mappings may stall the sampler of its instance or anyone else's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gpuslice.netlink import EVENTS, GpusliceNetlink

import nvstub
from gsinst import Instance, dmesg_tail, session

SAMPLE = "/sys/module/gpuslice/parameters/userd_sample_ms"
WORK = EVENTS["GPUSLICE_EV_CHANNEL_WORK"]

pytestmark = pytest.mark.skipif(not (nvstub.present() and os.path.exists(SAMPLE)),
                                reason="needs nvstub.ko and gpuslice.ko (with its USERD sampler) loaded")


@pytest.fixture(scope="module")
def nl():
    with GpusliceNetlink() as sock:
        yield sock


@pytest.fixture()
def events():
    """A subscribed netlink socket: the module samples only while somebody listens."""
    with GpusliceNetlink() as sock:
        sock.subscribe()
        yield sock


def work_of(evs: list[dict], name: str, key: tuple[int, int] | None = None) -> list[dict]:
    return [e for e in evs if e.get("event") == WORK and e.get("name") == name
            and (key is None or (e.get("client"), e.get("handle")) == key)]


def collect(sock: GpusliceNetlink, seconds: float) -> list[dict]:
    out: list[dict] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out += sock.poll_events(max(0.0, min(0.1, end - time.monotonic())), limit=100)
    return out


def wait_work(sock: GpusliceNetlink, name: str, key: tuple[int, int], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if work_of(sock.poll_events(0.1, limit=100), name, key):
            return True
    return False


def fetch(u: nvstub.Userd) -> None:
    """What the PBDMA does when it fetches (the stand-in's engine, when the channel runs):
    GPGet catches up with GPPut. Here written by the test: this boot's module refuses the
    stand-in's submit escape through an instance."""
    u.set_get(u.words()[1])


def test_submissions_in_userd_become_channel_work(nl, events):
    """No ioctl: GPPut moving in the process's own mapping is reported for that channel,
    named by its instance; a quiet channel (GPGet == GPPut, GPPut still) is not; entries
    not yet fetched (GPGet != GPPut: a disabled channel) are reported while they wait."""
    with Instance(nl, 64 << 20) as inst, Instance(nl, 64 << 20) as other:
        s = session(inst)
        s2 = session(other)
        try:
            _tsg, ch, u = s.userd_channel()
            _t2, ch2, u2 = s2.userd_channel()
            key, key2 = (s.client, ch), (s2.client, ch2)
            time.sleep(0.3)
            evs = collect(events, 0.5)
            assert not work_of(evs, inst.name) and not work_of(evs, other.name), evs
            u.put()  # one submission, not fetched yet
            assert wait_work(events, inst.name, key), "no CHANNEL_WORK for a submission"
            pending = collect(events, 0.5)
            assert len(work_of(pending, inst.name, key)) >= 2  # waiting entries stay visible
            fetch(u)
            time.sleep(0.2)
            events.poll_events(0.0)
            assert not work_of(collect(events, 0.5), inst.name), "a fetched, quiet channel reported"
            for _ in range(20):  # a channel that keeps submitting: reported, at most every 10 ms
                u.put()
                fetch(u)
                time.sleep(0.01)
            burst = work_of(collect(events, 0.3), inst.name, key)
            assert 1 <= len(burst) <= 60
            assert not work_of(collect(events, 0.2), other.name), "the other instance's quiet channel reported"
            u.close()
            u2.close()
        finally:
            s.close()
            s2.close()


def test_an_instance_asked_to_sample_sooner_is_reported_sooner(nl):
    """SAMPLE_US and REPEAT_US (INSTANCE_SET: what the daemon asks of an online instance
    beside offline ones, so that its work preempts at once): a channel whose entries wait
    is reported at most every 50 ms by default (at most 21 in a second, 25 allowed), and
    more often than that once asked (REPEAT_US 10 ms here; how often: tests/guest/
    bench_activity.py, which prints the rates);
    INSTANCE_GET reads the values back; one without the other or a value out of range is
    refused; 0 and 0 give the default back."""
    import errno

    from gpuslice.netlink import REPEAT_US_MAX, REPEAT_US_MIN, SAMPLE_US_MAX, SAMPLE_US_MIN

    with Instance(nl, 64 << 20) as inst:
        s = session(inst)
        try:
            _tsg, ch, u = s.userd_channel()
            key = (s.client, ch)
            assert (inst.get()["sample_us"], inst.get()["repeat_us"]) == (0, 0)
            time.sleep(0.3)
            u.put()  # not fetched: it waits, and stays visible

            def rate() -> int:
                """Its CHANNEL_WORK in a second, on a socket of its own (none queued before)."""
                with GpusliceNetlink() as sock:
                    sock.subscribe()
                    return len(work_of(collect(sock, 1.0), inst.name, key))

            slow = rate()
            # every 10 ms (the stand-in's guest, under TCG, parses about 1000 events a second:
            # faster reports would measure the reader)
            nl.instance_set(inst.name, sample_us=1000, repeat_us=10000)
            assert (inst.get()["sample_us"], inst.get()["repeat_us"]) == (1000, 10000)
            fast = rate()
            for bad in ({"sample_us": SAMPLE_US_MIN - 1, "repeat_us": 1000},
                        {"sample_us": SAMPLE_US_MAX + 1, "repeat_us": 1000},
                        {"sample_us": 200, "repeat_us": REPEAT_US_MIN - 1},
                        {"sample_us": 200, "repeat_us": REPEAT_US_MAX + 1},
                        {"sample_us": 200}, {"repeat_us": 1000}):
                with pytest.raises(OSError) as e:
                    nl.instance_set(inst.name, **bad)
                assert e.value.errno == errno.EINVAL, bad
            assert (inst.get()["sample_us"], inst.get()["repeat_us"]) == (1000, 10000)
            nl.instance_set(inst.name, sample_us=0, repeat_us=0)
            again = rate()
            print(f"CHANNEL_WORK of a waiting channel in 1 s: default {slow}, asked 1000/10000 us {fast}, "
                  f"default again {again}")
            assert 1 <= slow <= 25 and 1 <= again <= 25
            assert fast > 25, (slow, fast)  # more than the default period allows
            fetch(u)
            u.close()
        finally:
            s.close()


def test_a_replaced_userd_is_not_read(nl, events):
    """Once the process unmaps its USERD the sampler reads nothing there, and when it maps
    its own memory at the same address and writes moving GPGet/GPPut words into it, the
    sampler does not read that either: it reads only the driver's mapping it recorded
    (the vma's file and start are checked under the mmap lock's trylock), in the process's
    own page tables, never a kernel mapping of what RM mapped."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    with Instance(nl, 64 << 20) as inst:
        s = session(inst)
        try:
            _tsg, ch, u = s.userd_channel()
            u.put()
            assert wait_work(events, inst.name, (s.client, ch))
            fetch(u)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(u.m))
            base = u.base
            # the USERD's address becomes the process's own memory (the mmap object stays
            # exported, so it is never touched again)
            got = libc.mmap(addr, mmap.PAGESIZE, 3, 0x22 | 0x10, -1, 0)  # RW, PRIVATE|ANON|FIXED
            assert got == addr, ctypes.get_errno()
            word = (ctypes.c_uint32 * 2).from_address(addr + base + nvstub.Userd.GPGET)
            time.sleep(0.2)
            events.poll_events(0.0, limit=1000)
            seen = []
            for i in range(50):
                word[0], word[1] = i % 7, (i + 3) % 1024  # GPGet != GPPut, GPPut moving
                seen += work_of(events.poll_events(0.01, limit=100), inst.name)
            assert not seen, "the sampler read memory that is no longer the driver's mapping"
            u.m.close()  # unmaps the process's page
            os.close(u.fd)
        finally:
            s.close()


TRAP = textwrap.dedent("""
    import ctypes, mmap, os, struct, sys, time
    sys.path[:0] = sys.argv[3].split(":")
    import nvstub
    from gsinst import InstSession
    s = InstSession(sys.argv[1], sys.argv[2])
    _tsg, ch, u = s.userd_channel()
    u.put()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.syscall.restype = ctypes.c_long
    addr = ctypes.addressof(ctypes.c_char.from_buffer(u.m))
    # the USERD's address becomes anonymous memory whose faults a userfaultfd holds forever
    got = libc.mmap(addr, mmap.PAGESIZE, 3, 0x22 | 0x10, -1, 0)  # RW, PRIVATE|ANON|FIXED
    assert got == addr, ctypes.get_errno()
    uffd = libc.syscall(323, os.O_CLOEXEC)  # userfaultfd(2)
    assert uffd >= 0, ctypes.get_errno()
    import fcntl
    api = bytearray(struct.pack("<QQQ", 0xAA, 0, 0))
    fcntl.ioctl(uffd, 0xC018AA3F, api)  # UFFDIO_API
    reg = bytearray(struct.pack("<QQQQ", addr, mmap.PAGESIZE, 1, 0))  # MODE_MISSING
    fcntl.ioctl(uffd, 0xC020AA00, reg)  # UFFDIO_REGISTER
    print("trapped", s.client, ch, flush=True)
    time.sleep(3600)
""")


def test_a_trapped_userd_stalls_nobody(nl, events):
    """A hostile process puts a page whose faults a userfaultfd holds (never resolved)
    where its USERD was. The sampler reads without faulting and without waiting for the
    mm's lock: the same instance's other process still gets its CHANNEL_WORK, another
    instance too, and the instance can still be deleted (its sampler stopped)."""
    with Instance(nl, 64 << 20) as other:
        inst = Instance(nl, 64 << 20).__enter__()
        guest = os.path.dirname(os.path.abspath(__file__))
        pyctl = os.path.join(os.path.dirname(os.path.dirname(guest)), "pyctl")
        trap = subprocess.Popen([sys.executable, "-c", TRAP, inst.path("nvidiactl"), inst.path("nvidia0"),
                                 f"{guest}:{pyctl}"], stdout=subprocess.PIPE, text=True)
        s = s2 = None
        try:
            assert trap.stdout is not None
            line = trap.stdout.readline().split()
            assert line and line[0] == "trapped", line
            time.sleep(0.3)  # the sampler has met the trap a few times
            s = session(inst)
            _t, ch, u = s.userd_channel()
            s2 = session(other)
            _t2, ch2, u2 = s2.userd_channel()
            u.put()
            u2.put()
            assert wait_work(events, inst.name, (s.client, ch)), "the trapped process stalled its instance's sampler"
            assert wait_work(events, other.name, (s2.client, ch2))
            u.close()
            u2.close()
        finally:
            for x in (s, s2):
                if x is not None:
                    x.close()
            trap.kill()
            trap.wait()
        done = threading.Event()

        def delete() -> None:
            for _ in range(100):
                try:
                    nl.instance_del(inst.name)
                    break
                except OSError:
                    time.sleep(0.1)  # the killed process's files are still being released
            done.set()

        t = threading.Thread(target=delete, daemon=True)
        t.start()
        assert done.wait(30), "deleting the instance hung (its sampler did not stop)"
        assert not os.path.exists(inst.path("nvidiactl"))


def test_processes_killed_while_sampled_leave_nothing(nl, events):
    """Processes that map their USERD and submit, killed with SIGKILL while the sampler
    reads them, over and over: the instance still deletes once their files are gone, and
    the kernel logged no warning."""
    inst = Instance(nl, 64 << 20).__enter__()
    guest = os.path.dirname(os.path.abspath(__file__))
    pyctl = os.path.join(os.path.dirname(os.path.dirname(guest)), "pyctl")
    code = textwrap.dedent("""
        import sys, time
        sys.path[:0] = sys.argv[3].split(":")
        from gsinst import InstSession
        s = InstSession(sys.argv[1], sys.argv[2])
        _t, ch, u = s.userd_channel()
        print("ready", flush=True)
        while True:
            u.put()
            time.sleep(0.002)
    """)
    before = _kernel_complaints()
    seen = 0
    for _ in range(6):
        ps = [subprocess.Popen([sys.executable, "-c", code, inst.path("nvidiactl"), inst.path("nvidia0"),
                                f"{guest}:{pyctl}"], stdout=subprocess.PIPE, text=True) for _ in range(3)]
        for p in ps:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        seen += len(work_of(collect(events, 0.1), inst.name))
        for p in ps:
            p.kill()
        for p in ps:
            p.wait()
    assert seen > 0  # they were sampled while they ran
    deleted = False
    end = time.monotonic() + 20
    while not deleted and time.monotonic() < end:
        try:
            nl.instance_del(inst.name)
            deleted = True
        except OSError:
            time.sleep(0.1)  # the killed processes' files are still being released
    assert deleted
    assert _kernel_complaints() == before, dmesg_tail()


def _kernel_complaints() -> int:
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return sum(log.count(w) for w in ("WARNING:", "BUG:", "general protection"))

"""Handing an instance's decision state to a fresh core while its containers run
(INSTANCE_HANDOVER, kmod/instance.c gs_instance_handover()), in the guest against the
stand-in.

Four instances, each with a workload process that allocates, frees and issues controls
in a loop, while the test hands each instance over again and again:
- every call of a workload gets what it would have had without handovers: an allocation
  is allowed exactly while it fits the limit (the worker counts what it holds), a free
  and a control succeed, no ioctl fails;
- with the workloads paused, each instance's charges, limits, peaks and counters are
  the same right before and right after a handover, and the module's used adds up to
  what the stand-in holds;
- a hostile tenant (processes allocating at the limit, calls in flight at the moment of
  the handover) ends neither above its limit nor with memory the module did not charge;
- a refused handover (the test build's handover_corrupt: the fresh core refuses the
  snapshot) leaves the instance working, its figures unchanged.
Printed (never asserted): the pause new calls saw (max, p50), the part of it spent
waiting for the calls in flight, and the snapshot's size.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "guest"))
sys.path.insert(0, str(REPO / "pyctl"))

MIB = 1 << 20
LIMIT = 64 * MIB
N_INST = 4
CORRUPT = "/sys/module/gpuslice/parameters/handover_corrupt"
# what INSTANCE_GET gives that a handover must not change (the core lock's figures do:
# the handover itself takes the lock, and they are not the decision state)
KEPT = ("mem_limit", "mem_used", "mem_peak", "gpu_mem_limit", "gpu_mem_used", "gpu_mem_peak",
        "nr_ioctls", "nr_refused_quota", "nr_refused_filter", "caps", "pids")


def _worker(dev: str, limit: int, hostile: bool) -> None:
    """One workload: allocate, free, control, in a loop. SIGUSR1 pauses it between calls
    (it prints "paused"), SIGUSR2 resumes it, SIGTERM ends it (it prints its counts)."""
    import gsinst
    import nvstub
    from gpuslice import abi

    state = {"pause": False, "stop": False}
    signal.signal(signal.SIGUSR1, lambda *_: state.__setitem__("pause", True))
    signal.signal(signal.SIGUSR2, lambda *_: state.__setitem__("pause", False))
    signal.signal(signal.SIGTERM, lambda *_: state.__setitem__("stop", True))
    s = gsinst.InstSession(f"{dev}/nvidiactl", f"{dev}/nvidia0")
    print("ready", flush=True)
    rnd = random.Random(os.getpid())
    held: dict[int, int] = {}
    counts = {"calls": 0, "alloc": 0, "refused": 0, "free": 0, "control": 0}
    bad: list[str] = []
    while not state["stop"]:
        if state["pause"]:
            print("paused", flush=True)
            while state["pause"] and not state["stop"]:
                time.sleep(0.005)  # not signal.pause(): the resume may come before it
            print("resumed", flush=True)
            continue
        r = rnd.random()
        counts["calls"] += 1
        try:
            if held and (r < 0.35 or len(held) > 24):
                h = rnd.choice(list(held))
                st = s.free(h)
                if st != abi.NV_OK:
                    bad.append(f"free 0x{h:x}: 0x{st:x}")
                del held[h]
                counts["free"] += 1
            elif r < 0.85 or hostile:
                size = (4 if hostile else rnd.choice((2, 4, 6, 8))) * MIB
                st, h, _ = s.alloc_vidmem(size)
                fits = sum(held.values()) + size <= limit
                if st == abi.NV_OK:
                    held[h] = size
                    counts["alloc"] += 1
                    if not fits and not hostile:
                        bad.append(f"alloc {size} allowed past the limit holding {sum(held.values())}")
                elif st == abi.NV_ERR_NO_MEMORY:
                    counts["refused"] += 1
                    if fits and not hostile:
                        bad.append(f"alloc {size} refused holding {sum(held.values())}")
                else:
                    bad.append(f"alloc {size}: 0x{st:x}")
            else:
                st, _ = nvstub.fb_info(s.ctl, s.client, s.subdevice, [abi.NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE])
                if st != abi.NV_OK:
                    bad.append(f"control: 0x{st:x}")
                counts["control"] += 1
        except OSError as e:
            bad.append(f"ioctl: {e!r}")
    print(json.dumps({"counts": counts, "bad": bad[:20], "nr_bad": len(bad),
                      "held": sum(held.values())}), flush=True)
    s.close()


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker(sys.argv[2], int(sys.argv[3]), "--hostile" in sys.argv)
    sys.exit(0)

import pytest  # noqa: E402

from gpuslice.netlink import NetlinkError  # noqa: E402

from gsinst import Instance, needs_modules, wait_for  # noqa: E402
from test_quota_hostile import Pool  # noqa: E402

pytestmark = needs_modules


class Worker:
    def __init__(self, inst: Instance, hostile: bool = False) -> None:
        self.inst = inst
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", str(Path(inst.path("nvidiactl")).parent),
                                   str(inst.mem_limit)] + (["--hostile"] if hostile else []),
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None
        assert self.p.stdout.readline().strip() == "ready"

    def pause(self) -> None:
        self.p.send_signal(signal.SIGUSR1)
        assert self.p.stdout is not None
        assert self.p.stdout.readline().strip() == "paused"

    def resume(self) -> None:
        self.p.send_signal(signal.SIGUSR2)
        assert self.p.stdout is not None
        assert self.p.stdout.readline().strip() == "resumed"

    def stop(self) -> dict:
        self.p.send_signal(signal.SIGTERM)
        out, _ = self.p.communicate(timeout=60)
        return json.loads(out.strip().splitlines()[-1])


def kept(nl, name: str) -> dict:
    (d,) = nl.instances(name)
    return {k: d.get(k) for k in KEPT}


class Pauses:
    def __init__(self) -> None:
        self.rows: list[dict[str, int]] = []
        self.busy = 0

    def handover(self, nl, name: str) -> dict[str, int]:
        for _ in range(50):
            try:
                r = nl.instance_handover(name)
            except NetlinkError as e:
                if e.errno != errno.EBUSY:
                    raise
                self.busy += 1  # calls in flight did not finish in time: nothing changed
                continue
            self.rows.append(r)
            return r
        raise AssertionError(f"{name}: 50 handovers in a row refused busy")

    def report(self, what: str) -> None:
        if not self.rows:
            return
        us = sorted(r["handover_ns"] / 1000 for r in self.rows)
        drain = sorted(r["handover_drain_ns"] / 1000 for r in self.rows)
        size = max(r["snapshot_bytes"] for r in self.rows)
        print(f"\nhandover pause ({what}, {len(us)} handovers, {self.busy} refused busy): "
              f"p50 {statistics.median(us):.0f} us, max {us[-1]:.0f} us; "
              f"drain p50 {statistics.median(drain):.0f} us, max {drain[-1]:.0f} us; "
              f"snapshot up to {size} bytes")


@pytest.fixture
def pool():
    p = Pool()
    yield p
    p.close()


def test_handover_under_load(nl, pool) -> None:
    pauses = Pauses()
    with Instance(nl, LIMIT) as i0, Instance(nl, LIMIT) as i1, Instance(nl, LIMIT) as i2, \
            Instance(nl, LIMIT) as i3:
        insts = [i0, i1, i2, i3]
        workers = [Worker(i) for i in insts]
        try:
            for _round in range(4):
                end = time.monotonic() + 2.0
                while time.monotonic() < end:  # handovers with calls in flight
                    for i in insts:
                        pauses.handover(nl, i.name)
                for w in workers:
                    w.pause()
                for i in insts:  # quiet: the same figures right before and after
                    before = kept(nl, i.name)
                    pauses.handover(nl, i.name)
                    assert kept(nl, i.name) == before, i.name
                    pauses.handover(nl, i.name)
                    assert kept(nl, i.name) == before, i.name
                assert sum(kept(nl, i.name)["mem_used"] for i in insts) == pool.held()
                for w in workers:
                    w.resume()
        finally:
            results = [w.stop() for w in workers]
        for i, r in zip(insts, results):
            assert r["nr_bad"] == 0, (i.name, r["bad"])
            assert r["counts"]["alloc"] and r["counts"]["free"] and r["counts"]["control"], r
            assert wait_for(lambda: kept(nl, i.name)["mem_used"] == 0)
            assert kept(nl, i.name)["mem_peak"] <= LIMIT
        assert wait_for(lambda: pool.held() == 0)
        print(f"\nworkload calls: {[r['counts']['calls'] for r in results]}")
    pauses.report("4 instances, a workload each")


def test_handover_hostile_at_the_limit(nl, pool) -> None:
    limit = 32 * MIB
    pauses = Pauses()
    with Instance(nl, limit) as inst:
        workers = [Worker(inst, hostile=True) for _ in range(4)]
        try:
            end = time.monotonic() + 6.0
            while time.monotonic() < end:
                pauses.handover(nl, inst.name)
                d = kept(nl, inst.name)
                assert d["mem_used"] <= limit and d["mem_peak"] <= limit, d
                assert pool.held() <= limit
            for w in workers:
                w.pause()
            d = kept(nl, inst.name)
            assert d["mem_used"] == pool.held() <= limit, (d, pool.held())
            assert d["nr_refused_quota"] > 0  # they were at the limit
            for w in workers:
                w.resume()
        finally:
            results = [w.stop() for w in workers]
        for r in results:
            assert r["nr_bad"] == 0, r["bad"]
        assert wait_for(lambda: kept(nl, inst.name)["mem_used"] == 0 == pool.held())
        assert kept(nl, inst.name)["mem_peak"] <= limit
    pauses.report("hostile tenant, 4 processes at the limit")


def test_refused_handover_changes_nothing(nl, pool) -> None:
    if not os.path.exists(CORRUPT):
        pytest.skip("not the test build")
    with Instance(nl, LIMIT) as inst:
        w = Worker(inst)
        try:
            time.sleep(1.0)
            w.pause()
            before = kept(nl, inst.name)
            Path(CORRUPT).write_text("1")
            try:
                for _ in range(3):
                    with pytest.raises(NetlinkError) as e:
                        nl.instance_handover(inst.name)
                    assert e.value.errno == errno.EBADMSG
                    assert kept(nl, inst.name) == before
            finally:
                Path(CORRUPT).write_text("0")
            assert before["mem_used"] == pool.held()
            w.resume()
            time.sleep(1.0)  # still working, on the old core
            w.pause()
            after = kept(nl, inst.name)
            assert after["nr_ioctls"] > before["nr_ioctls"]
            assert after["mem_used"] == pool.held()
            r = nl.instance_handover(inst.name)  # and a handover goes through again
            assert r["snapshot_bytes"] > 0
            assert kept(nl, inst.name) == after
            w.resume()
        finally:
            res = w.stop()
        assert res["nr_bad"] == 0, res["bad"]
        assert wait_for(lambda: kept(nl, inst.name)["mem_used"] == 0 == pool.held())


def test_handover_unknown_instance(nl) -> None:
    with pytest.raises(NetlinkError) as e:
        nl.instance_handover("no-such-instance")
    assert e.value.errno == errno.ENOENT

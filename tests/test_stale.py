"""A stale (hClient, hChannel) pair in the gate's batches (sched/stale.py, sched/gate.py).

RM fails a whole FIFO_DISABLE_CHANNELS call when one listed pair names no live channel
(freed, or invalidated with its VA space or subcontext). A tenant that leaves such a pair
in the daemon's lists must not get its other channels out of the gating, nor make every
switch cost a call per channel."""

from __future__ import annotations

import logging
from typing import Sequence

import pytest

from gpuslice import abi
from gpuslice.ops.exporter import families
from gpuslice.sched import stale
from gpuslice.sched.gate import RmGate
from gpuslice.sched.rm import RmClient, RmError, GpuHandles
from gpuslice.sched.sources import Channel

Pair = tuple[int, int]
MS = 1_000_000


class BatchRm:
    """RM as the H100 answers FIFO_DISABLE_CHANNELS: the whole call fails with the status
    of the first listed pair that names no live channel (``stale``: pair -> status), and
    then switches nothing; else every pair is switched. ``state`` holds what RM has
    disabled; ``log`` every call as (disable, pairs, ok)."""

    def __init__(self, stale_pairs: dict[Pair, int] | None = None) -> None:
        self.stale = dict(stale_pairs or {})
        self.state: set[Pair] = set()
        self.calls = 0
        self.log: list[tuple[bool, list[Pair], bool]] = []

    def _one(self, chunk: list[Pair], disable: bool) -> None:
        self.calls += 1
        bad = [self.stale[p] for p in chunk if p in self.stale]
        self.log.append((disable, chunk, not bad))
        if bad:
            raise RmError("RM_CONTROL NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS", bad[0])
        if disable:
            self.state |= set(chunk)
        else:
            self.state -= set(chunk)

    def disable_channels(self, gpu: int, pairs, disable: bool) -> int:
        uniq = sorted(set(pairs))
        for i in range(0, len(uniq), 64):
            self._one(uniq[i:i + 64], disable)
        return (len(uniq) + 63) // 64

    def disable_channels_each(self, gpu: int, pairs, disable: bool) -> list[tuple[Pair, RmError]]:
        bad = []
        for p in sorted(set(pairs)):
            try:
                self._one([p], disable)
            except RmError as e:
                bad.append((p, e))
        return bad


class Guard:
    def __init__(self) -> None:
        self.known: set[Channel] = set()

    def announce(self, chans) -> None:
        self.known |= set(chans)

    def forget(self, chans) -> None:
        self.known -= set(chans)

    def close(self) -> None:
        pass


def setup(status: int, n: int = 64) -> tuple[BatchRm, RmGate, list[int], set[Channel], set[Channel], Channel]:
    now = [0]
    victim = {Channel(0, 0xC1D00001, 0x5C000000 + h, pid=11) for h in range(n - 1)}
    bad = Channel(0, 0xC1D00001, 0x5C0000FF, pid=11)
    rm = BatchRm({bad.pair: status})
    gate = RmGate(rm, Guard(), enable_first=True, clock=lambda: now[0])  # type: ignore[arg-type]
    other = {Channel(0, 0xC1D00002, 0x5C000000 + h, pid=12) for h in range(8)}
    return rm, gate, now, victim | {bad}, other, bad


@pytest.mark.parametrize("status", sorted(stale.STALE))
def test_one_stale_channel_leaves_the_others_of_its_instance_disabled(status: int) -> None:
    """(a) With one stale pair among an instance's 64 channels, the other 63 are disabled
    at the switch, found by bisecting the failed call - about 2 log2(64) + 1 calls, not
    one per channel (which left them running the while) - and at every later switch."""
    rm, gate, now, a, b, bad = setup(status)
    calls = gate.apply(0, a)
    assert {c.pair for c in a - {bad}} <= rm.state
    assert bad not in gate.disabled and gate.disabled == a - {bad}
    assert calls <= 2 * 6 + 1, calls  # the old per-channel fallback: 1 + 1 + 64
    for _ in range(20):
        now[0] += 10 * MS
        gate.apply(0, b)
        assert not ({c.pair for c in a} & rm.state)
        now[0] += 10 * MS
        gate.apply(0, a)
        assert {c.pair for c in a - {bad}} <= rm.state and not ({c.pair for c in b} & rm.state)
    gate.release_all()
    assert not rm.state and not gate.disabled


def test_a_stale_channel_is_dropped_and_not_retried_at_every_switch(caplog) -> None:
    """(b) Once found, the stale channel is out of the gate's sets and of every batch:
    each switch is one call again; it is probed alone, backing off (RM lets a client reuse
    a handle, so the pair may name a live channel again), counted and logged in one line.
    When the source stops reporting it, nothing of it is left."""
    rm, gate, now, a, b, bad = setup(abi.NV_ERR_RESOURCE_LOST)
    with caplog.at_level(logging.WARNING, logger="gpuslice.sched.gate"):
        gate.apply(0, a)
        rm.log.clear()
        per_switch = []
        for _ in range(100):  # 2 s of 10 ms slots
            now[0] += 10 * MS
            per_switch.append(gate.apply(0, b))
            now[0] += 10 * MS
            per_switch.append(gate.apply(0, a))
    batched = [p for _d, ps, _ok in rm.log if len(ps) > 1 for p in ps]
    assert bad.pair not in batched
    probes = [ps for _d, ps, _ok in rm.log if ps == [bad.pair]]
    # probed after 100, 200, 400, 800 ms, then every 2 s at most: 4 or 5 in 2 s
    assert 1 <= len(probes) <= 5, len(probes)
    assert all(ok for _d, ps, ok in rm.log if ps != [bad.pair])
    assert set(per_switch) <= {2, 3} and sum(per_switch) == 2 * len(per_switch) + len(probes)  # enable + disable
    assert bad in gate.dropped and bad not in gate.disabled and bad not in gate.announced
    assert bad not in gate.guard.known  # type: ignore[union-attr]
    assert gate.stats.stale == 1 and gate.stats.probes == len(probes)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "dropped 1 stale channel" in lines[0] and "NV_ERR_RESOURCE_LOST" in lines[0], lines
    gate.forget({bad})  # the source no longer reports it
    assert bad not in gate.dropped
    n = rm.calls
    now[0] += 10_000 * MS
    gate.apply(0, b)
    gate.apply(0, a - {bad})
    assert rm.calls == n + 4  # two switches, a call each way: nothing of it probed


def test_a_dropped_pair_that_names_a_live_channel_again_is_gated() -> None:
    """A client that frees a channel and makes a new one under the same handle: the probe
    finds it alive, and from then on it is in the batches as any other channel."""
    rm, gate, now, a, b, bad = setup(abi.NV_ERR_OBJECT_NOT_FOUND)
    gate.apply(0, a)
    assert bad in gate.dropped
    del rm.stale[bad.pair]  # a live channel under the pair
    now[0] += stale.PROBE_FIRST_NS
    gate.apply(0, b)
    gate.apply(0, a)  # probed: disabled
    assert bad.pair in rm.state and bad in gate.disabled and not gate.dropped
    assert bad in gate.guard.known  # type: ignore[union-attr]  # announced before the probe


def test_no_extra_calls_without_a_stale_channel() -> None:
    """(c) The normal case: one batched call to disable, one to enable, nothing else."""
    rm = BatchRm()
    gate = RmGate(rm, Guard(), enable_first=True)  # type: ignore[arg-type]
    a = {Channel(0, 1, h) for h in range(40)}
    b = {Channel(0, 2, h) for h in range(20)}
    assert gate.apply(0, a) == 1
    for _ in range(10):
        assert gate.apply(0, b) == 2
        assert gate.apply(0, a) == 2
    assert all(ok and len(ps) in (20, 40) for _d, ps, ok in rm.log)
    assert gate.stats.stale == 0 and gate.stats.probes == 0 and not gate.dropped


def test_several_stale_channels_each_found_once() -> None:
    now = [0]
    chans = {Channel(0, 1, h) for h in range(64)}
    bad = {Channel(0, 1, h) for h in (3, 40, 41)}
    rm = BatchRm({c.pair: abi.NV_ERR_INVALID_CLIENT for c in bad})
    gate = RmGate(rm, Guard(), clock=lambda: now[0])  # type: ignore[arg-type]
    gate.apply(0, chans)
    assert gate.disabled == chans - bad and set(gate.dropped) == bad
    assert rm.calls <= 2 * 64 - 1
    assert gate.stats.stale == 3
    gate.apply(0, set())
    n = rm.calls
    now[0] += 1
    assert gate.apply(0, chans) == 1 and rm.calls == n + 1


# --- the pure parts ----------------------------------------------------------------

def test_statuses_and_probe_times() -> None:
    assert stale.is_stale(abi.NV_ERR_RESOURCE_LOST) and stale.is_stale(abi.NV_ERR_OBJECT_NOT_FOUND)
    assert not stale.is_stale(abi.NV_ERR_INVALID_CHANNEL)  # on no runlist: gate.NOT_ON_A_RUNLIST
    assert not stale.is_stale(abi.NV_ERR_INSUFFICIENT_PERMISSIONS)
    assert abi.STATUS_NAMES[0x6E] == "NV_ERR_RESOURCE_LOST"
    times = [stale.probe_after_ns(k) for k in range(1, 10)]
    assert times[0] == stale.PROBE_FIRST_NS and times == sorted(times) and times[-1] == stale.PROBE_MAX_NS
    d = stale.strike(None, abi.NV_ERR_RESOURCE_LOST, 5)
    assert d == stale.Dropped(abi.NV_ERR_RESOURCE_LOST, 1, 5 + stale.PROBE_FIRST_NS)
    assert stale.strike(d, abi.NV_ERR_RESOURCE_LOST, 10).strikes == 2


def test_due_takes_the_most_overdue_within_the_budget() -> None:
    ds = {k: stale.Dropped(0, 1, t) for k, t in {"a": 30, "b": 10, "c": 20, "d": 99}.items()}
    assert stale.due(ds, 50, budget=2) == ["b", "c"]
    assert stale.due(ds, 50) == ["b", "c", "a"]
    assert stale.due(ds, 5) == [] and stale.due(ds, 50, budget=0) == []


@pytest.mark.parametrize("n,bad", [(1, set()), (1, {0}), (64, {17}), (64, {0, 63}), (7, set(range(7)))])
def test_bisect_finds_each_failing_item(n: int, bad: set[int]) -> None:
    calls: list[list[int]] = []
    done: set[int] = set()

    def call(part: Sequence[int]) -> None:
        calls.append(list(part))
        if set(part) & bad:
            raise RmError("x", abi.NV_ERR_OBJECT_NOT_FOUND)
        done.update(part)

    out = stale.bisect(list(range(n)), call, lambda e: getattr(e, "status", None))
    assert sorted(p for p, _e in out) == sorted(bad) and done == set(range(n)) - bad
    assert len(calls) <= 2 * n - 1
    if not bad:
        assert len(calls) == 1
    if len(bad) == 1 and n == 64:
        assert len(calls) == 1 + 2 * 6


def test_bisect_with_a_known_first_failure_and_a_broken_call() -> None:
    calls: list[list[int]] = []

    def call(part: Sequence[int]) -> None:
        calls.append(list(part))

    assert stale.bisect([1, 2], call, lambda e: 1, first=RmError("x", 1)) == []
    assert calls == [[1], [2]]  # the failed call on both is not made again

    def broken(part: Sequence[int]) -> None:
        raise ValueError("no RM status")

    with pytest.raises(ValueError):
        stale.bisect([1, 2, 3], broken, lambda e: None)


def test_drop_report_is_rate_limited() -> None:
    r = stale.DropReport(every_ns=100)
    assert r.note(1, "x", 0) is not None
    assert r.note(2, "y", 50) is None and r.flush(60) is None
    line = r.flush(100)
    assert line is not None and "dropped 2 stale" in line and "first y" in line and "3 since start" in line
    assert r.flush(300) is None


# --- RmClient.disable_channels_each and the exporter -----------------------------------

class ControlRm(RmClient):
    """RmClient with its RM_CONTROL answered here, as RM would for ``stale`` pairs."""

    def __init__(self, stale_pairs: set[Pair]) -> None:
        super().__init__("/nonexistent")
        self.stale_pairs = stale_pairs
        self.sent: list[list[Pair]] = []
        self.gpus[0] = GpuHandles(0, -1, 1, 2)

    def control(self, h_object: int, cmd: int, params: bytes, h_client: int | None = None) -> bytes:
        head = abi.DISABLE_CHANNELS_HEAD.unpack_from(params)
        n = head[1]
        base = abi.DISABLE_CHANNELS_HEAD.size
        chan_base = base + 4 * abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES
        pairs = [(int.from_bytes(params[base + 4 * i:base + 4 * i + 4], "little"),
                  int.from_bytes(params[chan_base + 4 * i:chan_base + 4 * i + 4], "little")) for i in range(n)]
        self.calls += 1
        self.sent.append(pairs)
        if set(pairs) & self.stale_pairs:
            raise RmError("RM_CONTROL", abi.NV_ERR_RESOURCE_LOST)
        return params


def test_rm_client_disable_channels_each_bisects() -> None:
    rm = ControlRm({(1, 9)})
    bad = rm.disable_channels_each(0, [(1, h) for h in range(16)], True)
    assert [(p, e.status) for p, e in bad] == [((1, 9), abi.NV_ERR_RESOURCE_LOST)]
    assert rm.calls == 1 + 2 * 4  # not 1 + 16
    ok = {p for ps in rm.sent[1:] for p in ps if (1, 9) not in ps}
    assert ok == {(1, h) for h in range(16)} - {(1, 9)}
    rm.sent.clear()
    assert rm.disable_channels_each(0, [(1, h) for h in range(8)], False) == [] and len(rm.sent) == 1


def test_the_exporter_reports_stale_channels() -> None:
    status = {"running": True, "pid": 1, "switches": 3, "rm_calls": 9, "stale_channels": 2, "stale_now": 1, "gpus": {}}
    got = {m.name: m.samples[0].value for m in families(None, status, None, []) if m.samples and "stale" in m.name}
    assert got == {"gpuslice_daemon_stale_channels": 2, "gpuslice_daemon_stale_channels_held": 1}

"""Slot gating: disable/enable channel sets with FIFO_DISABLE_CHANNELS, never losing track.

RmGate remembers every channel it has disabled (marked BEFORE the RM call, so an
interruption can only over-report) and :meth:`RmGate.release_all` re-enables all of
them; the daemon calls it on every exit path. A Watchdog (a separate process, see
watchdog.py) is told about each channel before it is first disabled and re-enables
them all when the daemon's pipe closes - including after SIGKILL.

A batch RM fails (one stale pair fails the whole call) is bisected, and a channel RM
answers alone as naming no live channel is dropped from the batches and probed alone
rarely after (sched/stale.py: the statuses, the search, the probes).
"""

from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence, Sized, runtime_checkable

from gpuslice import abi
from gpuslice.sched import stale
from gpuslice.sched.rm import RmClient, RmError, batches
from gpuslice.sched.sources import Channel

log = logging.getLogger("gpuslice.sched.gate")

# statuses that mean "this channel/client no longer exists" (stale.STALE, with the lines
# of RM's source that answer them): dropped from the batches, probed alone rarely
GONE = set(stale.STALE)
# RM's answer for a channel that is on no runlist: not scheduled yet (every new channel's
# first disable on the H100, kmod/core/core.h: GS_OBJ_SCHEDULED) or freed while its client
# lives on. Such a channel runs nothing, so there is nothing to gate or to re-enable: the
# gate leaves it out of its batches (one refused channel fails a whole batch, and the
# switch would fall back to a call per channel) and tries it alone again at its next
# disable after REFUSED_RETRY_NS. Not longer: a process that takes its TSG off the runlist
# at the moment of a disable and puts it back after runs ungated until that retry (one
# default period at most), and never backs the retries off.
NOT_ON_A_RUNLIST = abi.NV_ERR_INVALID_CHANNEL
REFUSED_RETRY_NS = 50_000_000
# after these a channel has nothing to re-enable and nothing to report
NOTHING_TO_UNDO = GONE | {NOT_ON_A_RUNLIST}


def _rm_status(e: Exception) -> int | None:
    """What stale.bisect bisects on: any RM error (status 0: the ioctl itself failed)."""
    return e.status if isinstance(e, RmError) else None


class Gate(Protocol):
    """What the scheduler gates with (RmGate; tests record instead). ``disabled``: the
    channels it holds disabled now."""

    disabled: set[Channel]

    def apply(self, gpu: int, target: set[Channel]) -> int:
        """Make ``target`` the disabled channels of ``gpu``; return the RM calls made."""

    def enable_all(self, chans: Iterable[Channel]) -> None: ...
    def forget(self, chans: Iterable[Channel]) -> None: ...
    def release_all(self) -> None: ...


# Optional capabilities of a gate (isinstance with each tells whether it has one).

@runtime_checkable
class EnablesFirst(Protocol):
    """After apply(): when the incoming slot's channels were enabled, if before the
    outgoing ones were disabled, else None. Without it a slot is settled from the end of
    its switch."""

    @property
    def incoming_at(self) -> int | None: ...


@runtime_checkable
class OrdersSwitches(Protocol):
    """Takes the order of one switch's calls from the scheduler (``enable_first`` is its
    own default) and says how long the disabling part of its last apply() took
    (``disable_took_ns``, None when it disabled nothing): how the switcher finds a tenant
    that is slow to stop (sched/switcher.py)."""

    enable_first: bool
    disable_took_ns: int | None

    def apply_in_order(self, gpu: int, target: set[Channel], enable_first: bool) -> int: ...


@runtime_checkable
class HasStats(Protocol):
    """Counts its calls (GateStats: call durations, stale drops) for status.json."""

    @property
    def stats(self) -> GateStats: ...


@runtime_checkable
class DropsStale(Protocol):
    """Holds channels RM answered as gone out of its batches (sched/stale.py): how many now."""

    @property
    def dropped(self) -> Sized: ...


class Guard(Protocol):
    def announce(self, chans: Iterable[Channel]) -> None: ...
    def forget(self, chans: Iterable[Channel]) -> None: ...
    def close(self) -> None: ...


@dataclass
class GateStats:
    calls: int = 0
    disabled_total: int = 0
    enabled_total: int = 0
    errors: int = 0
    # wall time of each FIFO_DISABLE_CHANNELS call (one batch of <= 64 channels), ns
    disable_ns: deque[int] = field(default_factory=lambda: deque(maxlen=10000))
    enable_ns: deque[int] = field(default_factory=lambda: deque(maxlen=10000))
    refused: int = 0  # channels RM answered NOT_ON_A_RUNLIST for (each time)
    stale: int = 0  # channels dropped from the batches because RM answered them GONE (each drop)
    probes: int = 0  # calls probing a dropped channel alone


class RmGate:
    """``enable_first``: at a switch, enable the incoming channels before disabling the
    outgoing ones. The default (False) keeps slots exclusive; enable-first leaves the GPU
    no idle gap (the two overlap for about one RM call, under the hardware's own
    time-slicing) - on an H100 each switch idled it ~0.75 ms (docs/h100-scheduler.md)."""

    def __init__(self, rm: RmClient, guard: Guard | None = None, enable_first: bool = False,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.rm = rm
        self.clock = clock
        self.guard = guard
        self.enable_first = enable_first
        # after apply(): when the incoming slot's channels were enabled, if they were
        # enabled before the outgoing ones were disabled (enable-first), else None
        self.incoming_at: int | None = None
        self.disable_took_ns: int | None = None  # the disabling part of the last apply()
        self.disabled: set[Channel] = set()
        self.announced: set[Channel] = set()
        self.stats = GateStats()
        # (process, status) pairs already logged: one line per process and status
        self._warned: set[tuple[int, int]] = set()
        # channels RM said are on no runlist: when to try each alone again
        self.refused: dict[Channel, int] = {}
        # channels RM said name no live channel (GONE) while the source still reports them:
        # out of every batch, probed alone now and then (stale.due)
        self.dropped: dict[Channel, stale.Dropped] = {}
        self._drops = stale.DropReport()

    def _switch(self, gpu: int, chans: set[Channel], disable: bool) -> set[Channel]:
        """Issue the calls; return the channels that failed, refused ones included.

        One call per 64 channels, whoever they belong to. Channels RM refused as on no
        runlist are left out until their retry time, then tried alone; a batch that
        fails is retried one channel at a time, which finds the channel that failed it."""
        if not chans:
            return set()
        now = self.clock()
        waiting = {c for c in chans if c in self.refused and self.refused[c] > now}
        retry = {c for c in chans if c in self.refused} - waiting
        probes = {c for c in chans if c in self.dropped}  # apply() let through only those due
        batch = chans - waiting - retry - probes
        before = self.rm.calls
        failed: set[Channel] = set()
        if batch:
            failed = self._batch(gpu, batch, disable, now)
        for c in sorted(probes):  # one call each
            self.stats.probes += 1
            try:
                self.rm.disable_channels(gpu, [c.pair], disable)
                del self.dropped[c]  # a live channel under that pair again: gated as any other
            except RmError as e:
                if e.status in GONE:
                    self._drop({c: e.status}, now)
                else:  # refused for another reason: back in the batches, reported as those are
                    del self.dropped[c]
                    self.stats.errors += 1
                    self._warn_once(c, e, disable, 1)
                failed.add(c)
        for c in retry:  # one call each
            try:
                self.rm.disable_channels(gpu, [c.pair], disable)
                del self.refused[c]
            except RmError as e:
                if e.status in GONE:
                    self._drop({c: e.status}, now)
                    failed.add(c)
                    continue
                if e.status == NOT_ON_A_RUNLIST:
                    self.refused[c] = now + REFUSED_RETRY_NS
                    self.stats.refused += 1
                else:  # refused for another reason: back in the batches, reported as those are
                    del self.refused[c]
                    self.stats.errors += 1
                    self._warn_once(c, e, disable, 1)
                failed.add(c)
        self.stats.calls += self.rm.calls - before
        # an enable RM refused keeps the channel among the disabled: it is tried again
        # (alone, after REFUSED_RETRY_NS) until RM takes it or the channel is gone
        return failed | waiting

    def _warn_once(self, c: Channel, e: RmError, disable: bool, n: int) -> None:
        key = (c.pid or c.client, e.status)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s of %d channel(s) of %s %d (first 0x%x/0x%x): %s",
                        "disable" if disable else "enable", n, "pid" if c.pid else "client", key[0],
                        c.client, c.handle, e)

    def _batch(self, gpu: int, chans: set[Channel], disable: bool, now: int) -> set[Channel]:
        """One call per 64 channels; a call RM fails is bisected (stale.bisect) down to the
        channels that fail alone, so that every other channel of it is still switched."""
        by_pair = {c.pair: c for c in chans}
        bad: list[tuple[tuple[int, int], RmError]] = []
        ns = self.stats.disable_ns if disable else self.stats.enable_ns

        def call(part: Sequence[tuple[int, int]]) -> None:
            self.rm.disable_channels(gpu, part, disable)

        for chunk in batches(by_pair):
            try:
                t0 = time.perf_counter_ns()
                call(chunk)
                ns.append(time.perf_counter_ns() - t0)
                continue
            except RmError as exc:
                first = exc
            for p, err in stale.bisect(chunk, call, _rm_status, first):
                assert isinstance(err, RmError)
                bad.append((p, err))
        if not bad:
            return set()
        failed = {by_pair[p] for p, _e in bad}
        refused = {by_pair[p] for p, e in bad if e.status == NOT_ON_A_RUNLIST}
        for c in refused:
            self.refused[c] = now + REFUSED_RETRY_NS
        if refused:
            self.stats.refused += len(refused)
            log.debug("%d channel(s) on no runlist (NV_ERR_INVALID_CHANNEL), left out of the batches",
                      len(refused))
        # other refusals by process (its pid, else its RM client) and status, in order
        by_who: dict[tuple[int, int], list[tuple[Channel, RmError]]] = {}
        for p, e in bad:
            if e.status not in NOTHING_TO_UNDO:
                c = by_pair[p]
                by_who.setdefault((c.pid or c.client, e.status), []).append((c, e))
        for others in by_who.values():
            self._warn_once(others[0][0], others[0][1], disable, len(others))
        gone = {by_pair[p]: e.status for p, e in bad if e.status in GONE}
        self._drop(gone, now)
        self.stats.errors += len(bad) - len(refused) - len(gone)
        return failed

    def _drop(self, gone: dict[Channel, int], now: int) -> None:
        """Channels RM answered alone with a GONE status: out of this gate's sets (nothing
        to re-enable: RM has no live channel under the pair) and of the guard's, out of
        the batches while the source still reports them, and probed alone again at
        stale.due's times. Counted, and logged in one line at most every
        stale.LOG_EVERY_NS."""
        if not gone:
            return
        cs = set(gone)
        fresh = [c for c in sorted(cs) if c not in self.dropped]
        for c, status in gone.items():
            self.dropped[c] = stale.strike(self.dropped.get(c), status, now)
            self.refused.pop(c, None)
        self.disabled -= cs
        was = cs & self.announced
        self.announced -= was
        if was and self.guard is not None:
            self.guard.forget(was)
        if fresh:
            self.stats.stale += len(fresh)
            c = fresh[0]
            what = (f"0x{c.client:x}/0x{c.handle:x} of {'pid' if c.pid else 'client'} {c.pid or c.client} "
                    f"on GPU {c.gpu}: {abi.STATUS_NAMES.get(gone[c], hex(gone[c]))}")
            line = self._drops.note(len(fresh), what, now)
            if line:
                log.warning("%s", line)

    def apply(self, gpu: int, target: set[Channel]) -> int:
        """Make exactly ``target`` disabled among this GPU's channels: incoming channels
        are enabled before outgoing ones are disabled if ``enable_first``, else after.
        Returns RM calls issued."""
        return self.apply_in_order(gpu, target, self.enable_first)

    def apply_in_order(self, gpu: int, target: set[Channel], enable_first: bool) -> int:
        """apply(), enabling first or not as told for this switch."""
        before = self.stats.calls
        cur = {c for c in self.disabled if c.gpu == gpu}
        to_disable = {c for c in target if c.gpu == gpu} - cur
        to_enable = cur - target
        held = {c: self.dropped[c] for c in to_disable if c in self.dropped}
        if held:  # dropped ones stay out, but for the few due a probe
            now = self.clock()
            probe: list[Channel] = stale.due(held, now)
            to_disable -= set(held) - set(probe)
            line = self._drops.flush(now)
            if line:
                log.warning("%s", line)
        self.incoming_at = None
        if enable_first:
            self._enable(gpu, to_enable)
            # the incoming channels may run from here on if nothing else runs
            self.incoming_at = self.clock()
            t0 = self.clock()
            self._disable(gpu, to_disable)
            self.disable_took_ns = self.clock() - t0 if to_disable else None
        else:
            t0 = self.clock()
            self._disable(gpu, to_disable)
            self.disable_took_ns = self.clock() - t0 if to_disable else None
            self._enable(gpu, to_enable)
        return self.stats.calls - before

    def _disable(self, gpu: int, chans: set[Channel]) -> None:
        if not chans:
            return
        new = chans - self.announced
        if new and self.guard is not None:
            self.guard.announce(new)  # the watchdog knows before RM does
        self.announced |= new
        self.disabled |= chans  # before the call: an interruption can only over-report
        self.disabled -= self._switch(gpu, chans, True)
        self.stats.disabled_total += len(chans)

    def _enable(self, gpu: int, chans: set[Channel]) -> None:
        if not chans:
            return
        failed = self._switch(gpu, chans, False)
        self.disabled -= chans - failed
        self.stats.enabled_total += len(chans)

    def enable_all(self, chans: Iterable[Channel]) -> None:
        """Re-enable ``chans`` whatever we think their state is (daemon start)."""
        by_gpu: dict[int, set[Channel]] = {}
        for c in chans:
            by_gpu.setdefault(c.gpu, set()).add(c)
        for gpu, cs in by_gpu.items():
            bad = self.rm.disable_channels_each(gpu, [c.pair for c in cs], False)
            for p, e in bad:
                if e.status not in NOTHING_TO_UNDO:
                    log.warning("start re-enable of 0x%x/0x%x: %s", p[0], p[1], e)
            self.disabled -= cs

    def forget(self, chans: Iterable[Channel]) -> None:
        """Channels the source no longer reports. Those we hold disabled are re-enabled
        first (best effort): a channel that is still alive, whatever made the source drop
        it (a report a container could forge, in the user-space build), must never stay
        disabled with nobody to re-enable it. For a channel that is gone RM answers with
        a status of GONE, which is fine."""
        cs = set(chans)
        if not cs:
            return
        self._reenable(cs & self.disabled, "re-enable of forgotten channels", log.warning)
        self.disabled -= cs
        for c in cs:
            self.refused.pop(c, None)
            self.dropped.pop(c, None)
        gone = cs & self.announced
        self.announced -= gone
        if gone and self.guard is not None:
            self.guard.forget(gone)

    def _reenable(self, chans: Iterable[Channel], what: str, report: Callable[..., None]) -> None:
        """Re-enable ``chans``, a call per GPU; RM errors are reported (GONE: the channel is
        gone, which is fine), never raised."""
        by_gpu: dict[int, list[Channel]] = {}
        for c in chans:
            by_gpu.setdefault(c.gpu, []).append(c)
        for gpu, cs in by_gpu.items():
            try:
                bad = self.rm.disable_channels_each(gpu, [c.pair for c in cs], False)
            except OSError as e:
                report("%s on GPU %d failed: %s", what, gpu, e)
                continue
            for p, err in bad:
                # gone, or on no runlist (freed while its client lives on): nothing to re-enable
                if err.status not in NOTHING_TO_UNDO:
                    report("%s of 0x%x/0x%x failed: %s", what, p[0], p[1], err)

    def release_all(self) -> None:
        """Re-enable everything this gate disabled. Never raises for RM errors."""
        self._reenable(self.disabled, "re-enable", log.error)
        self.disabled.clear()


class Watchdog:
    """Client side of the watchdog process (python -m gpuslice.sched.watchdog)."""

    def __init__(self, ctl_path: str, python: str = sys.executable, ready_timeout: float = 60.0) -> None:
        self.ctl_path = ctl_path
        self.python = python
        self.ready_timeout = ready_timeout
        self.known: set[Channel] = set()
        self.proc: subprocess.Popen[bytes] | None = None
        self._spawn()

    def _spawn(self) -> None:
        """Start the watchdog. It prints "ready" once it has its own RM client open, so
        that it can act at once however soon the daemon dies; that is awaited before the
        first channel is announced (:meth:`_await_ready`), not here: the daemon's start
        (its source, probe and RM client) goes on meanwhile, and a restarted daemon
        schedules its workloads that much sooner."""
        self.proc = subprocess.Popen(
            [self.python, "-m", "gpuslice.sched.watchdog", "--ctl", self.ctl_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
        self._ready = False
        if self.known:
            self._write("add", self.known)

    def _await_ready(self) -> None:
        if self._ready or self.proc is None:
            return
        self._ready = True
        assert self.proc.stdout is not None
        ready = select.select([self.proc.stdout], [], [], self.ready_timeout)[0]
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            log.warning("watchdog %d not ready (%r); going on without waiting", self.proc.pid, line)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def _write(self, op: str, chans: Iterable[Channel]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        data = "".join(json.dumps({"op": op, "gpu": c.gpu, "client": c.client, "handle": c.handle}) + "\n"
                       for c in chans).encode()
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            log.warning("watchdog %d died; starting a new one", self.pid)
            self._spawn()
            self._await_ready()

    def announce(self, chans: Iterable[Channel]) -> None:
        self._await_ready()  # before RM disables any of them
        cs = set(chans)
        self.known |= cs
        self._write("add", cs)

    def forget(self, chans: Iterable[Channel]) -> None:
        cs = set(chans)
        self.known -= cs
        self._write("del", cs)

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("watchdog %d did not exit", self.proc.pid)
        self.proc = None

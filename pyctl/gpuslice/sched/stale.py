"""Stale channels in a batched FIFO_DISABLE_CHANNELS: find them, drop them, probe them rarely.

RM fails the WHOLE NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS call when one listed
(hClient, hChannel) pair does not name a live channel. The control itself is forwarded to
GSP-RM (open-gpu-kernel-modules 595.45.04, src/nvidia/src/kernel/gpu/fifo/kernel_fifo_ctrl.c:731,
NV_RM_RPC_CONTROL); its open twin that walks the same lists,
kfifoDisableChannelsForKeyRotation_GH100 (kernel/gpu/fifo/arch/hopper/kernel_fifo_gh100.c:669-681),
looks each pair up and makes a failed lookup the status of the whole call. The lookups answer:

* NV_ERR_INVALID_CLIENT - hClient is gone (serverGetClientUnderLock, kernel_fifo_gh100.c:669);
* NV_ERR_OBJECT_NOT_FOUND - hChannel is not in the client (clientGetResourceRef_IMPL,
  src/nvidia/src/libraries/resserv/src/rs_client.c:392, through CliGetKernelChannel,
  kernel/gpu/fifo/kernel_channel.c:1616);
* NV_ERR_INVALID_CHANNEL - hChannel names an object that is not a channel
  (kernel_channel.c:1623-1625), and on the H100 a channel on no runlist (not scheduled yet,
  or freed while its client lives on: gate.NOT_ON_A_RUNLIST);
* NV_ERR_RESOURCE_LOST - the object was invalidated because one it depended on was freed
  (``bInvalidated``, resserv/src/rs_server.c:1556-1558).

So a tenant that makes one of its channels stale in the daemon's lists (frees it, or its VA
space or subcontext, in a way the source has not reported yet) would fail every batch
that names it. The gate therefore (gate.RmGate):

* on a failed batch, bisects it (:func:`bisect`) - the channels of the halves that RM takes
  are disabled, and each channel that fails alone is found with its own status - in at
  most 2n - 1 calls for n channels, about 2 log2(n) + 1 for one stale channel among n;
* drops a channel whose own status is :data:`STALE` from its sets and keeps it out of
  every batch while the source still reports it, so each stale channel costs that search
  once, not at every switch;
* probes it alone again after :func:`probe_after_ns` (doubling, capped at
  :data:`PROBE_MAX_NS`), at most :data:`PROBE_BUDGET` a switch, the most overdue first
  (:func:`due`): RM lets a client choose its handles, so a freed channel's
  (hClient, hChannel) may name a new, live channel that the source reports under the same
  key; such a channel answers the probe and is gated again.

Everything here but :func:`bisect` (which takes the call to make) is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence, TypeVar

from gpuslice import abi

# the statuses that say "this pair names no live channel": drop it from the batches
STALE: frozenset[int] = frozenset({
    abi.NV_ERR_INVALID_CLIENT,
    abi.NV_ERR_INVALID_OBJECT_HANDLE,
    abi.NV_ERR_OBJECT_NOT_FOUND,
    abi.NV_ERR_INVALID_OBJECT,
    abi.NV_ERR_RESOURCE_LOST,
})

PROBE_FIRST_NS = 100_000_000  # the first probe of a dropped channel, after its drop
PROBE_MAX_NS = 2_000_000_000  # the longest wait between two probes of one channel
PROBE_BUDGET = 4  # dropped channels probed per switch at most (RM calls, one each)
LOG_EVERY_NS = 10_000_000_000  # one log line at most this often about dropped channels

K = TypeVar("K", bound=Hashable)
P = TypeVar("P")


def is_stale(status: int) -> bool:
    """Does RM's answer for one channel alone say that it names no live channel?"""
    return status in STALE


def probe_after_ns(strikes: int) -> int:
    """How long after its ``strikes``-th stale answer (1 = the drop) a channel is probed:
    PROBE_FIRST_NS doubling each time, at most PROBE_MAX_NS."""
    if strikes <= 1:
        return min(PROBE_FIRST_NS, PROBE_MAX_NS)
    return min(PROBE_MAX_NS, PROBE_FIRST_NS << min(strikes - 1, 32))


@dataclass(frozen=True)
class Dropped:
    """A channel the gate dropped: RM's last status for it, how many stale answers in a
    row, and when it may be probed again (ns, the gate's clock)."""

    status: int
    strikes: int
    probe_at: int


def strike(prev: Dropped | None, status: int, now: int) -> Dropped:
    """The entry after another stale answer ``status`` at ``now``."""
    n = 1 if prev is None else prev.strikes + 1
    return Dropped(status, n, now + probe_after_ns(n))


def due(dropped: Mapping[K, Dropped], now: int, budget: int = PROBE_BUDGET) -> list[K]:
    """The dropped channels to probe now: those whose time has come, the most overdue
    first, at most ``budget``."""
    ready = sorted((kv for kv in dropped.items() if kv[1].probe_at <= now), key=lambda kv: kv[1].probe_at)
    return [k for k, _d in ready[:max(0, budget)]]


def bisect(items: Sequence[P], call: Callable[[Sequence[P]], None],
           status_of: Callable[[Exception], int | None],
           first: Exception | None = None) -> list[tuple[P, Exception]]:
    """Make ``call`` on ``items`` and, when it fails, on each half, recursively, until each
    failing item stands alone. Returns the items that fail alone, each with its error.

    ``first``: the error the call on all of ``items`` already raised (not made again).
    ``status_of(e)`` says whether ``e`` is an answer to bisect on (a number, RM's status)
    or one to raise at once (None). Every item is in some call that succeeded unless it
    is returned; at most 2n - 1 calls for n items, and for k failing ones among n at most
    about 2k log2(n/k) + 1."""
    out: list[tuple[P, Exception]] = []
    stack: list[Sequence[P]] = [items] if items else []
    err = first
    while stack:
        part = stack.pop()
        if err is None:
            try:
                call(part)
                continue
            except Exception as e:  # noqa: BLE001 - status_of decides
                err = e
        if status_of(err) is None:
            raise err
        if len(part) == 1:
            out.append((part[0], err))
        else:
            mid = len(part) // 2
            stack.append(part[mid:])
            stack.append(part[:mid])  # the first half first: calls in the order of the list
        err = None
    return out


@dataclass
class DropReport:
    """One log line about dropped channels at most every LOG_EVERY_NS (pure: the caller
    logs the line :meth:`note` returns, if any)."""

    every_ns: int = LOG_EVERY_NS
    pending: int = 0
    total: int = 0
    first: str = ""
    last_at: int | None = None

    def note(self, n: int, what: str, now: int) -> str | None:
        """``n`` more channels dropped at ``now``, ``what`` describing the first of them;
        the line to log now, or None (counted for the next line)."""
        if n <= 0:
            return None
        self.total += n
        if not self.pending:
            self.first = what
        self.pending += n
        if self.last_at is not None and now - self.last_at < self.every_ns:
            return None
        line = (f"dropped {self.pending} stale channel(s) from the gate's batches "
                f"(RM: no live channel), first {self.first}; {self.total} since start")
        self.pending, self.first, self.last_at = 0, "", now
        return line

    def flush(self, now: int) -> str | None:
        """The line for what is still pending, once its time has come."""
        if not self.pending or (self.last_at is not None and now - self.last_at < self.every_ns):
            return None
        self.total -= self.pending
        n, what, self.pending = self.pending, self.first, 0
        return self.note(n, what, now)

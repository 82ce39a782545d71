"""Where the daemon learns which channels belong to which instance: one `source` abstraction.

Every source yields the same thing, ``{instance name: {Channel, ...}}``, and consumes the
same event records (dicts with the fields event, name, pid, client, handle, parent,
class, engine, gpu, obj_kind - as the module's netlink EVENT / OBJECT_GET and the
LD_PRELOAD library's JSON lines carry them), so the scheduler does not care who
reported a channel:

* NetlinkSource - OBJECT_GET dump at start (and every ``resync_s``), EVENT multicast after;
* PreloadSource - a unix stream socket (default /run/gpuslice/preload.sock) on which
  preloaded processes write newline-delimited JSON events; a closed connection drops
  that connection's objects (the process is gone, or it reconnects). Each connection
  starts with the process's live TSGs and channels as TSG_NEW / CHANNEL_NEW, so a
  daemon (re)started after its workloads learns them; a NEW may repeat a known object.
  ``gpu`` is the device instance of the object's RM device (0 on one GPU), not 255;
* StaticSource  - a fixed table (host tests, benchmarks).

`gpuctl daemon --source MODULE:CLASS` takes any other class with the methods of
:class:`Source`, constructed with no arguments (how tests plug in their own).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from . import netlink as nl

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Channel:
    gpu: int
    client: int
    handle: int
    pid: int = field(default=0, compare=False)

    @property
    def pair(self) -> tuple[int, int]:
        return (self.client, self.handle)


class Source(Protocol):
    def refresh(self) -> None:
        """Take in what changed since the last call (never blocks long)."""

    def channels(self) -> dict[str, set[Channel]]:
        """Current channels per instance."""

    def close(self) -> None: ...


_EVENT_BY_NAME = {v: k for k, v in nl.EVENT_NAMES.items()}
_KIND_BY_NAME = {v: k for k, v in nl.OBJ_KIND_NAMES.items()}


def _num(v: Any) -> int:
    """A record's number: an int or a numeric string, 0 to 2^32 - 1 (every field is a u32:
    kmod/uapi/gpuslice.h); anything else is a ValueError."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"not a number: {v!r}")
    n = int(v, 0) if isinstance(v, str) else v
    if not 0 <= n <= 0xFFFFFFFF:
        raise ValueError(f"out of range: {n}")
    return n


def normalise_event(ev: Mapping[str, Any]) -> dict[str, Any]:
    """Event or object record with ints for event/obj_kind whichever way they came."""
    out = dict(ev)
    if "event" in out and isinstance(out["event"], str):
        out["event"] = _EVENT_BY_NAME.get(out["event"].lower(), 0)
    kind = out.get("obj_kind")
    if isinstance(kind, str):
        out["obj_kind"] = _KIND_BY_NAME.get(kind.lower(), -1)
    for k in ("pid", "client", "handle", "parent", "class", "engine", "gpu", "event", "obj_kind"):
        if k in out and out[k] is not None:
            out[k] = _num(out[k])
    return out


class EventTracker:
    """Channel table kept from object records and events (shared by every source)."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._chans: dict[tuple[int, int], tuple[str, Channel]] = {}  # (client, handle) -> (instance, channel)
        # (client, handle) -> when its last CHANNEL_WORK arrived (this process's monotonic ns)
        self._work: dict[tuple[int, int], int] = {}
        self._clock = clock

    def clear(self) -> None:
        self._chans.clear()

    def work_seen(self) -> dict[tuple[int, int], int]:
        """When each known channel last reported submitted work (CHANNEL_WORK), in
        time.monotonic_ns() of this process: the time it arrived, not a clock of the
        sender's."""
        return {k: v for k, v in self._work.items() if k in self._chans}

    def add_object(self, rec: Mapping[str, Any]) -> None:
        r = normalise_event(rec)
        if r.get("obj_kind") != nl.OBJ_CHANNEL or not r.get("name"):
            return
        ch = Channel(r.get("gpu", 0), r["client"], r["handle"], r.get("pid", 0))
        self._chans[ch.pair] = (str(r["name"]), ch)

    def apply(self, ev: Mapping[str, Any]) -> None:
        r = normalise_event(ev)
        e = r.get("event")
        if e == nl.EVENTS["GPUSLICE_EV_CHANNEL_NEW"]:
            self.add_object({**r, "obj_kind": nl.OBJ_CHANNEL})
        elif e == nl.EVENTS["GPUSLICE_EV_CHANNEL_DEL"]:
            self._chans.pop((r.get("client", 0), r.get("handle", 0)), None)
            self._work.pop((r.get("client", 0), r.get("handle", 0)), None)
        elif e == nl.EVENTS["GPUSLICE_EV_CHANNEL_WORK"]:
            key = (r.get("client", 0), r.get("handle", 0))
            known = self._chans.get(key)
            # a report counts for the channel of that instance only
            if known is not None and (not r.get("name") or str(r["name"]) == known[0]):
                self._work[key] = self._clock()
        elif e == nl.EVENTS["GPUSLICE_EV_TSG_DEL"]:
            pass  # its channels are deleted first (RM frees children before the parent)
        elif e == nl.EVENTS["GPUSLICE_EV_PROC_DETACH"]:
            self.drop_pid(r.get("pid", 0))

    def drop_pid(self, pid: int) -> None:
        for key in [k for k, (_n, c) in self._chans.items() if c.pid == pid]:
            del self._chans[key]
            self._work.pop(key, None)

    def channels(self) -> dict[str, set[Channel]]:
        out: dict[str, set[Channel]] = {}
        for name, ch in self._chans.values():
            out.setdefault(name, set()).add(ch)
        return out


USERD_SAMPLE_PARAM = "/sys/module/gpuslice/parameters/userd_sample_ms"


def module_reports_work(param: str = USERD_SAMPLE_PARAM) -> bool:
    """Does the loaded module send CHANNEL_WORK (it samples its channels' USERD,
    kmod/activity.c)? False for a module without the sampler or with it off."""
    try:
        with open(param) as f:
            return int(f.read().strip() or 0) > 0
    except (OSError, ValueError):
        return False


MODULE_REPORT_GAP_NS = 50_000_000  # kmod/activity.c GS_ACT_REPEAT_NS: an instance's reports at most this often


class NetlinkSource(EventTracker):
    """Channels from the module: an object dump, then its events. The dumps go through a
    socket of their own, so a burst of events cannot overrun a dump's reply."""

    poll_limit = 256  # events a refresh reads: the scheduler's loop gets control back

    def __init__(self, client: nl.GpusliceNetlink | None = None, resync_s: float = 10.0) -> None:
        super().__init__()
        self.nl = client or nl.GpusliceNetlink()
        self.dumps = nl.GpusliceNetlink()
        self.resync_s = resync_s
        self._last_dump = 0.0
        self.nl.subscribe()  # before the dump: no event falls between the two
        self._dump()

    @property
    def report_gap_ns(self) -> int:
        """The longest gap between two reports of an instance whose work goes on: the
        module's per-instance limit plus one look of its sampler (userd_sample_ms)."""
        try:
            with open(USERD_SAMPLE_PARAM) as f:
                ms = int(f.read().strip() or 0)
        except (OSError, ValueError):
            ms = 5
        return MODULE_REPORT_GAP_NS + 2 * ms * 1_000_000

    def _dump(self) -> None:
        self.clear()
        for rec in self.dumps.objects():
            self.add_object(rec)
        self._last_dump = time.monotonic()

    def refresh(self) -> None:
        try:
            evs = self.nl.poll_events(0.0, limit=self.poll_limit)  # the rest at the next refresh
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
            self._dump()  # events were dropped (the socket overran): start again from a dump
            return
        for ev in evs:
            self.apply(ev)
        if time.monotonic() - self._last_dump > self.resync_s:
            self._dump()

    def filenos(self) -> list[int]:
        """The events socket: the scheduler wakes on a CHANNEL_WORK while it watches
        online instances (the module's USERD sampler sends them)."""
        return [self.nl.fileno()]

    def close(self) -> None:
        self.nl.close()
        self.dumps.close()


@dataclass
class _Conn:
    """One preloaded process's connection: what it sent that is not a line yet, the pids
    and instance it reported, and what it was last asked to sample at."""
    buf: bytes = b""
    pids: set[int] = field(default_factory=set)
    keys: set[tuple[int, int]] = field(default_factory=set)  # the channels it registered (owns)
    name: str = ""
    told: tuple[int, int] = (0, 0)  # (sample_us, repeat_us); the library starts from its own (0)
    partial: bytes = b""  # the rest of a line whose start was written
    pending: bytes = b""  # a whole line not begun (a newer request replaces it)


class PreloadSource(EventTracker):
    """Unix stream socket server for the LD_PRELOAD library's JSON-line events.

    It writes back one kind of line, ``{"sample_us":N,"repeat_us":M}``, to the processes
    of the instances the scheduler must see work of at once (:meth:`set_fast`): their
    library then looks at its channels at least every N us and reports a channel that
    keeps submitting every M us; 0 gives back the process's own setting
    (preload/report.c)."""

    def __init__(self, path: str = "/run/gpuslice/preload.sock") -> None:
        super().__init__()
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)  # containers connect as any user
        self.sock.listen(64)
        self.sock.setblocking(False)
        self._conns: dict[socket.socket, _Conn] = {}
        self._owner: dict[tuple[int, int], _Conn] = {}  # channel -> the connection that registered it
        self.bad_lines = 0
        self._fast: frozenset[str] = frozenset()
        self._fast_us = (0, 0)

    def set_fast(self, names: Iterable[str], sample_us: int, repeat_us: int = 0) -> None:
        """Ask the processes of instances ``names`` to sample every ``sample_us`` and to
        report a channel that keeps submitting every ``repeat_us`` (0: the library's 10 ms)
        (sample_us 0 or no names: nobody); the others get their own setting back. Sent at
        the next refresh, and to each process that connects later once its instance is
        known."""
        self._fast = frozenset(names) if sample_us > 0 or repeat_us > 0 else frozenset()
        self._fast_us = (sample_us, repeat_us) if self._fast else (0, 0)

    # what one connection may cost a refresh: the scheduler's loop gets control back, and
    # a line that never ends closes its connection
    reads_per_refresh = 16
    max_line = 1 << 20

    def refresh(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except BlockingIOError:
                break
            except OSError as e:  # out of fds (EMFILE, ENFILE): the others are served
                if not getattr(self, "_accept_failed", False):
                    log.warning("preload socket: accept: %s", e)
                self._accept_failed = True
                break
            c.setblocking(False)
            self._conns[c] = _Conn()
        for c in list(self._conns):
            conn = self._conns[c]
            closed = False
            for _ in range(self.reads_per_refresh):
                try:
                    data = c.recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    closed = True
                    break
                conn.buf += data
            *lines, conn.buf = conn.buf.split(b"\n")
            for line in lines:
                self._line(line, conn)
            if len(conn.buf) > self.max_line:
                self.bad_lines += 1
                closed = True
            if not closed:
                closed = not self._tell(c, conn)
            if closed:
                c.close()
                del self._conns[c]
                self._drop_conn(conn)

    def _drop_conn(self, conn: _Conn, keys: Iterable[tuple[int, int]] | None = None) -> None:
        """The process is gone (or it reconnects, or it said one of its processes exited):
        so are the channels it registered (``keys``: those of them; default all), and only
        those (pids are the container's own: another's may be the same)."""
        for key in list(conn.keys if keys is None else keys):
            if self._owner.get(key) is conn:
                del self._owner[key]
                self._chans.pop(key, None)
                self._work.pop(key, None)
            conn.keys.discard(key)

    def _tell(self, c: socket.socket, conn: _Conn) -> bool:
        """Write the sampling request this connection should have (never blocks: what the
        socket does not take now is written at a later refresh). False: the peer is gone."""
        want = self._fast_us if conn.name in self._fast else (0, 0)
        if want != conn.told and conn.name:
            conn.pending = b'{"sample_us":%d,"repeat_us":%d}\n' % want
            conn.told = want
        data = conn.partial + conn.pending  # a line begun is finished first: whole lines only
        if not data:
            return True
        try:
            n = c.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if n <= len(conn.partial):
            conn.partial = conn.partial[n:]
        else:
            conn.partial, conn.pending = conn.pending[n - len(conn.partial):], b""
        return True

    def filenos(self) -> list[int]:
        """What to wait on for new lines (the daemon wakes at once for online work)."""
        return [self.sock.fileno()] + [c.fileno() for c in self._conns]

    def _line(self, line: bytes, conn: _Conn) -> None:
        if not line.strip():
            return
        try:
            ev = json.loads(line)
            if not isinstance(ev, dict):
                raise ValueError
            r = normalise_event(ev)
        except Exception:  # whatever a container writes (deep nesting, huge numbers): one bad line
            self.bad_lines += 1
            return
        if r.get("pid"):
            conn.pids.add(r["pid"])
        if r.get("name"):
            conn.name = str(r["name"])  # one process, one instance (GPUSLICE_INSTANCE)
        e = r.get("event")
        key = (r.get("client", 0), r.get("handle", 0))
        owner = self._owner.get(key)
        if e == nl.EVENTS["GPUSLICE_EV_PROC_DETACH"]:
            self._drop_conn(conn, {k for k in conn.keys if k in self._chans and self._chans[k][1].pid == r.get("pid")})
            return
        new_chan = e == nl.EVENTS["GPUSLICE_EV_CHANNEL_NEW"] or (not e and r.get("obj_kind") == nl.OBJ_CHANNEL)
        if owner is not None and owner is not conn and (new_chan or e in (
                nl.EVENTS["GPUSLICE_EV_CHANNEL_DEL"], nl.EVENTS["GPUSLICE_EV_CHANNEL_WORK"])):
            self.bad_lines += 1  # another process's channel: the first to register it keeps it
            return
        if e:
            self.apply(r)
        else:
            self.add_object(r)
        if new_chan and key in self._chans:
            self._owner[key] = conn
            conn.keys.add(key)
        elif e == nl.EVENTS["GPUSLICE_EV_CHANNEL_DEL"] and owner is conn:
            del self._owner[key]
            conn.keys.discard(key)

    def close(self) -> None:
        for c in self._conns:
            c.close()
        self._conns.clear()
        self._owner.clear()
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class StaticSource:
    """A fixed table (host tests, benchmarks)."""

    def __init__(self, table: Mapping[str, Iterable[Channel]]) -> None:
        self.table = {k: set(v) for k, v in table.items()}

    def refresh(self) -> None:
        pass

    def channels(self) -> dict[str, set[Channel]]:
        return {k: set(v) for k, v in self.table.items()}

    def close(self) -> None:
        pass

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
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from . import netlink as nl
from .rm import owns_channel

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
    bound: str | None = None  # the instance of the socket it came in on; None: the host's socket
    fds: list[int] = field(default_factory=list)  # files it passed, for its next "proof" lines


class FdCloser:
    """Closes the files containers pass us, on a thread of its own: a close flushes, and
    the flush of a file from a container's own FUSE mount waits on its server. Past
    ``limit`` files not closed yet, :attr:`full` is true and the caller takes no more."""

    limit = 256

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._backlog = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def full(self) -> bool:
        return self._backlog >= self.limit

    def close(self, fds: Iterable[int]) -> None:
        for fd in fds:
            with self._lock:
                self._backlog += 1
            self._q.put(fd)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpuslice-fd-closer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            fd = self._q.get()
            with contextlib.suppress(OSError):
                os.close(fd)
            with self._lock:
                self._backlog -= 1


class PreloadSource(EventTracker):
    """Unix stream socket server for the LD_PRELOAD library's JSON-line events.

    Two kinds of socket (docs/threat-model.md, "The user-space build"):

    * ``path`` (default /run/gpuslice/preload.sock, mode 0600): the host's. A process
      connected there is of the instance it names (GPUSLICE_INSTANCE). Never mount it
      into a container.
    * ``instance_dir``/NAME/preload.sock (mode 0666), one per instance the scheduler
      knows (:meth:`set_instances`): a container gets its instance's directory mounted
      at /run/gpuslice, where the library looks. A process connected there is of that
      instance whatever it names; a line naming another is a bad line.

    A channel counts only with a proof that the process owns it: the library sends its
    CHANNEL_NEW lines with ``"proof":1`` and, in the same message (SCM_RIGHTS), the RM
    file the channel's client was made through; ``verify(fd, client, handle)``
    (default :func:`gpuslice.rm.owns_channel`) asks RM through that file.

    It writes back one kind of line, ``{"sample_us":N,"repeat_us":M}``, to the processes
    of the instances the scheduler must see work of at once (:meth:`set_fast`): their
    library then looks at its channels at least every N us and reports a channel that
    keeps submitting every M us; 0 gives back the process's own setting
    (preload/report.c)."""

    def __init__(self, path: str = "/run/gpuslice/preload.sock", instance_dir: str | None = None,
                 verify: Callable[[int, int, int], bool] | None = None) -> None:
        super().__init__()
        self.path = path
        self.instance_dir = instance_dir
        self.verify: Callable[[int, int, int], bool] = verify or owns_channel
        self._listeners: dict[socket.socket, str] = {}  # listening socket -> its instance ("": the host's)
        self._by_name: dict[str, socket.socket] = {}
        self.sock = self._listen(path, 0o600)
        self._listeners[self.sock] = ""
        self._conns: dict[socket.socket, _Conn] = {}
        self._owner: dict[tuple[int, int], _Conn] = {}  # channel -> the connection that registered it
        self._closer = FdCloser()
        self.bad_lines = 0
        self.unproven = 0  # channels refused: no file passed, or RM says it is not the sender's
        self._fast: frozenset[str] = frozenset()
        self._fast_us = (0, 0)

    @staticmethod
    def _listen(path: str, mode: int) -> socket.socket:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(path)
            os.chmod(path, mode)
            s.listen(64)
        except BaseException:
            s.close()
            raise
        s.setblocking(False)
        return s

    def instance_socket(self, name: str) -> str | None:
        """Where instance ``name``'s processes connect (None: no instance_dir)."""
        return os.path.join(self.instance_dir, name, "preload.sock") if self.instance_dir else None

    def set_instances(self, names: Iterable[str]) -> None:
        """Listen on a socket of its own for each instance in ``names`` and on none for the
        others (their connections stay, bound to the name, until they close)."""
        if not self.instance_dir:
            return
        want = {n for n in names if n not in (".", "..") and "/" not in n}
        for name in set(self._by_name) - want:
            s = self._by_name.pop(name)
            del self._listeners[s]
            s.close()
            path = self.instance_socket(name) or ""
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(path))
        for name in sorted(want - set(self._by_name)):
            path = self.instance_socket(name) or ""
            try:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                s = self._listen(path, 0o666)  # containers connect as any user
            except OSError as e:
                log.warning("preload socket of instance %s: %s", name, e)
                continue
            self._by_name[name] = s
            self._listeners[s] = name

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
    max_fds = 4  # files a connection may have passed and not used yet

    def _accept(self, lsock: socket.socket, name: str) -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except BlockingIOError:
                return
            except OSError as e:  # out of fds (EMFILE, ENFILE): the others are served
                if not getattr(self, "_accept_failed", False):
                    log.warning("preload socket: accept: %s", e)
                self._accept_failed = True
                return
            c.setblocking(False)
            self._conns[c] = _Conn(bound=name or None)
            if name:
                self._conns[c].name = name

    def _recv(self, c: socket.socket, conn: _Conn) -> bytes | None:
        """Some bytes (b"": the peer closed; None: nothing now), and the files passed with
        them. While the closer is behind, files are not taken (the kernel drops them
        without a flush)."""
        try:
            if self._closer.full:
                return c.recv(65536)
            data, fds, _flags, _addr = socket.recv_fds(c, 65536, self.max_fds, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return None
        except OSError:
            return b""
        if fds:
            room = max(0, self.max_fds - len(conn.fds))
            conn.fds.extend(fds[:room])
            if len(fds) > room:
                self.bad_lines += 1
                self._closer.close(fds[room:])
        return data

    def refresh(self) -> None:
        for lsock, name in list(self._listeners.items()):
            self._accept(lsock, name)
        for c in list(self._conns):
            conn = self._conns[c]
            closed = False
            for _ in range(self.reads_per_refresh):
                data = self._recv(c, conn)
                if data is None:
                    break
                if not data:
                    closed = True
                    break
                conn.buf += data
                *lines, conn.buf = conn.buf.split(b"\n")
                for line in lines:  # each as it comes: a line uses the file passed with it
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
                self._closer.close(conn.fds)
                conn.fds.clear()

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
        return [s.fileno() for s in self._listeners] + [c.fileno() for c in self._conns]

    def _proven(self, r: Mapping[str, Any], conn: _Conn) -> bool:
        """Did the sender pass, with this line, the file that holds the channel's client?"""
        if r.get("proof") != 1 or not conn.fds:
            return False
        fd = conn.fds.pop(0)
        try:
            return bool(self.verify(fd, r.get("client", 0), r.get("handle", 0)))
        except Exception:  # whatever the file is: not a proof
            return False
        finally:
            self._closer.close([fd])

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
        if conn.bound is not None:  # the socket says which instance, not the line
            if r.get("name") and str(r["name"]) != conn.bound:
                self.bad_lines += 1
                return
            r["name"] = conn.bound
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
        if new_chan and not self._proven(r, conn):
            self.unproven += 1  # not shown to be the sender's: another's, or a guess
            return
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
        for c, conn in self._conns.items():
            c.close()
            self._closer.close(conn.fds)
        self._conns.clear()
        self._owner.clear()
        for s, name in self._listeners.items():
            s.close()
            path = self.instance_socket(name) if name else self.path
            with contextlib.suppress(OSError):
                os.unlink(path or "")
            if name:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(path or ""))
        self._listeners.clear()
        self._by_name.clear()


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

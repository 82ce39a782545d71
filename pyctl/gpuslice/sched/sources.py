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
:class:`Source`, constructed with no arguments (how tests plug in their own). What a
source can do beyond that is declared by the optional protocols below (ReportsGap,
KnowsInstances, SamplesFast, SetsTimeslices, SeesWork, Waitable): the scheduler uses a
capability only where the source has it, and a source without any of them is scheduled
from refresh() and channels() alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

from gpuslice import netlink as nl
from gpuslice.sched.rm import owns_channel
from gpuslice.state import valid_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Channel:
    gpu: int
    client: int
    handle: int
    pid: int = field(default=0, compare=False)
    engine: int = field(default=0, compare=False)  # NV2080_ENGINE_TYPE_* (abi.engine_name)

    @property
    def pair(self) -> tuple[int, int]:
        return (self.client, self.handle)


class Source(Protocol):
    def refresh(self) -> None:
        """Take in what changed since the last call (never blocks long)."""

    def channels(self) -> dict[str, set[Channel]]:
        """Current channels per instance."""

    def close(self) -> None: ...


# Optional capabilities of a source (isinstance with each tells whether it has one).

@runtime_checkable
class ReportsGap(Protocol):
    """Says the longest gap it leaves between two reports of work that goes on (ns); the
    online hold is never shorter. Without it: no floor (0)."""

    @property
    def report_gap_ns(self) -> int: ...


@runtime_checkable
class KnowsInstances(Protocol):
    """Listens per instance (PreloadSource: a socket each): told the configured names
    whenever the configuration changes."""

    def set_instances(self, names: Iterable[str]) -> None: ...


@runtime_checkable
class SamplesFast(Protocol):
    """Can ask the processes of some instances to sample every ``sample_us`` and repeat a
    report of ongoing work every ``repeat_us``: told the online instances of GPUs with
    offline ones whenever the configuration changes."""

    def set_fast(self, names: Iterable[str], sample_us: int, repeat_us: int = 0) -> None: ...


@runtime_checkable
class SetsTimeslices(Protocol):
    """Sets the hardware timeslice of each instance's TSGs itself (the user-space build's
    library, as the module does for its own): told them whenever the configuration changes."""

    def set_timeslices(self, us: Mapping[str, int]) -> None: ...


@runtime_checkable
class SeesWork(Protocol):
    """Knows when each channel's latest submission was reported: {(client, handle): ns
    on the scheduler's clock}. Without it a preemption is timed from when the probe saw
    the work."""

    def work_seen(self) -> dict[tuple[int, int], int]: ...


@runtime_checkable
class Waitable(Protocol):
    """Has file descriptors that become readable when new reports arrive: while a GPU
    watches its online instances, the loop's sleep ends on them."""

    def filenos(self) -> list[int]: ...


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
        ch = Channel(r.get("gpu", 0), r["client"], r["handle"], r.get("pid", 0), r.get("engine", 0))
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

    def __init__(self, client: nl.GpusliceNetlink | None = None, resync_s: float = 10.0,
                 requests: nl.GpusliceNetlink | None = None) -> None:
        super().__init__()
        self.nl = client or nl.GpusliceNetlink()
        self.dumps = requests or nl.GpusliceNetlink()
        self.resync_s = resync_s
        self._last_dump = 0.0
        self._fast: dict[str, tuple[int, int]] = {}  # instance -> (SAMPLE_US, REPEAT_US) asked
        self._fast_us = (0, 0)
        self._want_fast: dict[str, tuple[int, int]] = {}
        self.nl.subscribe()  # before the dump: no event falls between the two
        self._dump()

    @property
    def report_gap_ns(self) -> int:
        """The longest gap between two reports of an instance whose work goes on: the
        module's per-instance limit plus one look of its sampler (userd_sample_ms), or,
        for the instances asked to report sooner (:meth:`set_fast`), their REPEAT_US
        plus two looks."""
        sample_us, repeat_us = self._fast_us
        if self._fast and sample_us and repeat_us:
            return (repeat_us + 2 * sample_us) * 1000
        try:
            with open(USERD_SAMPLE_PARAM) as f:
                ms = int(f.read().strip() or 0)
        except (OSError, ValueError):
            ms = 5
        return MODULE_REPORT_GAP_NS + 2 * ms * 1_000_000

    def set_module_sampling(self, names: Iterable[str], sample_us: int, repeat_us: int = 0) -> None:
        """Have the module sample instances ``names`` every ``sample_us`` and report them
        every ``repeat_us`` while they keep submitting (INSTANCE_SET SAMPLE_US and
        REPEAT_US; kmod/activity.c); the others go back to the module's defaults. Both
        values are needed (either 0: nobody is asked). The scheduler asks it of the
        online instances of each GPU with offline ones (:meth:`set_fast`)."""
        fast = (sample_us, max(nl.REPEAT_US_MIN, min(nl.REPEAT_US_MAX, repeat_us)))
        want = {n: fast for n in names} if sample_us > 0 and repeat_us > 0 else {}
        self._fast_us = fast if want else (0, 0)
        for name in set(self._fast) - set(want):
            if self._ask(name, (0, 0)):
                del self._fast[name]
        for name, v in want.items():
            if self._fast.get(name) != v and self._ask(name, v):
                self._fast[name] = v
        self._want_fast = want

    set_fast = set_module_sampling  # the scheduler's name for it (config.Config.tell_source)

    def _ask(self, name: str, v: tuple[int, int]) -> bool:
        try:
            self.dumps.instance_set(name, sample_us=v[0], repeat_us=v[1])
            return True
        except OSError as e:  # not created in the module (yet): asked again at the next resync
            log.info("instance %s: sampling %s us not set: %s", name, v, e)
            return False

    def _dump(self) -> None:
        self.clear()
        for rec in self.dumps.objects():
            self.add_object(rec)
        self._last_dump = time.monotonic()
        for name, v in self._want_fast.items():  # an instance made (or made again) since
            if self._ask(name, v):
                self._fast[name] = v

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
        """The instances asked to sample sooner go back to the module's defaults (a
        daemon killed with SIGKILL leaves them: its successor asks again, and the module
        samples only while someone listens)."""
        for name in list(self._fast):
            self._ask(name, (0, 0))
        self._fast.clear()
        self.nl.close()
        self.dumps.close()


@dataclass
class _Conn:
    """One preloaded process's connection: what it sent that is not a line yet, the pids
    and instance it reported, and what it was last asked to sample at."""
    lane: str = ""  # the instance of the socket it came in on; "": the host's socket
    buf: bytes = b""
    base: int = 0  # where buf starts in the stream
    fds_at: dict[int, list[int]] = field(default_factory=dict)  # line start in the stream -> files passed with it
    files: list[int] = field(default_factory=list)  # its RM files ({"proof_file":1}), newest last
    pids: set[int] = field(default_factory=set)
    keys: set[tuple[int, int]] = field(default_factory=set)  # the channels it registered (owns)
    name: str = ""
    told: tuple[int, ...] = (0, 0, 0)  # (sample_us, repeat_us, timeslice_us); the library starts from its own (0)
    partial: bytes = b""  # the rest of a line whose start was written
    pending: bytes = b""  # a whole line not begun (a newer request replaces it)


class Closer:
    """Closes what a container handed us (passed files, its connections with what is
    still queued on them) on a thread of its own, one per instance: the last close of a
    file runs its release, and a container can make that wait (a FUSE file's flush, a
    TCP socket's SO_LINGER). Past ``limit`` closes not done, :attr:`full` is true and the
    source stops reading that instance's connections: only its own reports wait."""

    limit = 512

    def __init__(self, name: str) -> None:
        self.name = name
        self._q: queue.SimpleQueue[int | socket.socket] = queue.SimpleQueue()
        self.backlog = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def full(self) -> bool:
        return self.backlog >= self.limit

    def close(self, items: Iterable[int | socket.socket]) -> None:
        for it in items:
            with self._lock:
                self.backlog += 1
            self._q.put(it)
        if self._thread is None and self.backlog:
            self._thread = threading.Thread(target=self._run, name=f"gpuslice-close-{self.name or 'host'}",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            it = self._q.get()
            with contextlib.suppress(OSError):
                if isinstance(it, socket.socket):
                    it.close()
                else:
                    os.close(it)
            with self._lock:
                self.backlog -= 1


_SCM_MAX_FD = 253  # the most files one message carries (include/net/scm.h): none is dropped on our thread


def _last_line_start(buf: bytes) -> int:
    """Where the last line of ``buf`` begins (complete or not)."""
    return buf.rfind(b"\n", 0, len(buf) - 1) + 1


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

    A channel counts only with a proof that the process owns it: before its CHANNEL_NEW
    lines (``"proof":1``) the library sends ``{"proof_file":1}`` with, in the same
    message (SCM_RIGHTS), the RM file their client was made through, and
    ``verify(fd, client, handle)`` (default :func:`gpuslice.sched.rm.owns_channel`) asks RM
    through that file; it asks again every ``reverify_s`` while the channel is known.

    It writes back one kind of line, ``{"sample_us":N,"repeat_us":M}``, to the processes
    of the instances the scheduler must see work of at once (:meth:`set_fast`): their
    library then looks at its channels at least every N us and reports a channel that
    keeps submitting every M us; 0 gives back the process's own setting
    (preload/report.c)."""

    # what one connection may cost a refresh: the scheduler's loop gets control back, and
    # a line that never ends closes its connection
    reads_per_refresh = 16
    max_line = 1 << 20
    max_files = 4  # RM files a connection keeps for its proofs (the oldest goes)
    max_conns = 256  # connections per instance; past it, its socket is not accepted on
    reverify_s = 1.0

    def __init__(self, path: str = "/run/gpuslice/preload.sock", instance_dir: str | None = None,
                 verify: Callable[[int, int, int], bool] | None = None) -> None:
        super().__init__()
        self.path = path
        self.instance_dir = instance_dir
        self.verify: Callable[[int, int, int], bool] = verify or owns_channel
        self._listeners: dict[socket.socket, str] = {}  # listening socket -> its instance ("": the host's)
        self._by_name: dict[str, socket.socket] = {}
        self._closers: dict[str, Closer] = {}
        self._tmp: dict[str, str] = {}  # directory -> a private one in it, where sockets are made
        self._made: dict[str, tuple[int, int]] = {}  # socket path -> (st_dev, st_ino) of the socket we put there
        self.sock = self._listen(path, 0o600, os.path.dirname(os.path.abspath(path)))
        self._listeners[self.sock] = ""
        self._conns: dict[socket.socket, _Conn] = {}
        self._owner: dict[tuple[int, int], _Conn] = {}  # channel -> the connection that registered it
        self._proof: dict[tuple[int, int], int] = {}  # channel -> the file it was proven through
        self._verified_at = time.monotonic()
        self.bad_lines = 0
        self.unproven = 0  # channels refused: no file passed, or RM says it is not the sender's
        self._fast: frozenset[str] = frozenset()
        self._fast_us = (0, 0)
        self._timeslice: dict[str, int] = {}
        self._accept_failed = False  # an accept failed (out of fds): logged once

    def _listen(self, path: str, mode: int, private_in: str) -> socket.socket:
        """A socket at ``path`` with ``mode``, made in a private directory in
        ``private_in`` (which no container sees, on the same filesystem) and renamed into
        place: a container that can write the directory it is mounted from cannot have us
        chmod what a symlink points to (rename replaces a symlink, it does not follow it)."""
        os.makedirs(private_in, exist_ok=True)
        if private_in not in self._tmp:
            # "+" is in no instance name (state.valid_name): no instance's directory
            self._tmp[private_in] = tempfile.mkdtemp(prefix="+gpuslice-", dir=private_in)
        tmp = os.path.join(self._tmp[private_in], "s")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            s.bind(tmp)
            os.chmod(tmp, mode)  # ours alone: the directory is 0700 and seen by no container
            st = os.stat(tmp)
            os.rename(tmp, path)
            self._made[path] = (st.st_dev, st.st_ino)
            s.listen(64)
        except BaseException:
            s.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        s.setblocking(False)
        return s

    def _unlink_own(self, path: str) -> None:
        """Remove the socket at ``path`` if it is still the one we put there: another
        daemon that bound the path since (a restart that overlapped our stop) keeps its."""
        made = self._made.pop(path, None)
        try:
            st = os.lstat(path)
        except OSError:
            return
        if made == (st.st_dev, st.st_ino):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _closer(self, lane: str) -> Closer:
        c = self._closers.get(lane)
        if c is None:
            c = self._closers[lane] = Closer(lane)
        return c

    def instance_socket(self, name: str) -> str | None:
        """Where instance ``name``'s processes connect (None: no instance_dir)."""
        return os.path.join(self.instance_dir, name, "preload.sock") if self.instance_dir else None

    def set_instances(self, names: Iterable[str]) -> None:
        """Listen on a socket of its own for each instance in ``names`` and on none for the
        others (their connections stay, bound to the name, until they close). Directories
        stay: a running container's mount of one sees the socket of the next daemon."""
        if not self.instance_dir:
            return
        want = {n for n in names if valid_name(n)}  # the state file's names pass; a path's never
        for name in set(self._by_name) - want:
            s = self._by_name.pop(name)
            del self._listeners[s]
            self._closer(name).close([s])  # connections not accepted go with it, and what they hold
            self._unlink_own(self.instance_socket(name) or "")
        for name in sorted(want - set(self._by_name)):
            path = self.instance_socket(name) or ""
            try:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                s = self._listen(path, 0o666, self.instance_dir)  # containers connect as any user
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

    def set_timeslices(self, us: Mapping[str, int]) -> None:
        """Ask the processes of each instance to give their TSGs this hardware timeslice
        (us; 0: leave them as they are), at the next refresh and to each process that
        connects later (preload/report.c applies it to the live TSGs and the new ones)."""
        self._timeslice = {n: int(v) for n, v in us.items() if v}

    def _lane_open(self, lane: str) -> bool:
        """Are this instance's connections read (its closes are not behind)?"""
        c = self._closers.get(lane)
        return c is None or not c.full

    def _accept(self, lsock: socket.socket, lane: str) -> None:
        while sum(1 for x in self._conns.values() if x.lane == lane) < self.max_conns:
            try:
                c, _ = lsock.accept()
            except BlockingIOError:
                return
            except OSError as e:  # out of fds (EMFILE, ENFILE): the others are served
                if not self._accept_failed:
                    log.warning("preload socket: accept: %s", e)
                self._accept_failed = True
                return
            c.setblocking(False)
            self._conns[c] = _Conn(lane=lane, name=lane)

    def _recv(self, c: socket.socket, conn: _Conn) -> bytes | None:
        """Some bytes (b"": the peer closed; None: nothing now). Files passed with them
        belong to the line that begins last in them (the library sends one per message);
        there is room for every file a message can carry, so the kernel drops none here."""
        try:
            data, anc, _flags, _addr = c.recvmsg(65536, socket.CMSG_SPACE(_SCM_MAX_FD * 4),
                                                 socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return None
        except OSError:
            return b""
        fds: list[int] = []
        for level, typ, payload in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
        if fds:
            start = _last_line_start(conn.buf + data)
            if data and start >= len(conn.buf):
                conn.fds_at.setdefault(conn.base + start, []).extend(fds)
            else:
                self.bad_lines += 1
                self._closer(conn.lane).close(fds)
        return data

    def _retire(self, c: socket.socket, conn: _Conn) -> None:
        """The connection is over: its channels go; it and every file it passed are
        closed on its instance's closer (what is queued on it is released there)."""
        del self._conns[c]
        self._drop_conn(conn)
        closer = self._closer(conn.lane)
        closer.close([fd for fds in conn.fds_at.values() for fd in fds] + conn.files + [c])
        conn.fds_at.clear()
        conn.files.clear()

    def refresh(self) -> None:
        for lsock, lane in list(self._listeners.items()):
            if self._lane_open(lane):
                self._accept(lsock, lane)
        for c in list(self._conns):
            conn = self._conns[c]
            if not self._lane_open(conn.lane):
                continue
            closed = False
            for _ in range(self.reads_per_refresh):
                data = self._recv(c, conn)
                if data is None:
                    break
                if not data:
                    closed = True
                    break
                conn.buf += data
                *lines, rest = conn.buf.split(b"\n")
                at = conn.base
                for line in lines:  # each as it comes: a proof_file line keeps its file
                    self._line(line, conn, conn.fds_at.pop(at, []))
                    at += len(line) + 1
                conn.base, conn.buf = at, rest
                for k in [k for k in conn.fds_at if k < conn.base]:
                    self._closer(conn.lane).close(conn.fds_at.pop(k))
            if len(conn.buf) > self.max_line:
                self.bad_lines += 1
                closed = True
            if not closed:
                closed = not self._tell(c, conn)
            if closed:
                self._retire(c, conn)
        if time.monotonic() - self._verified_at >= self.reverify_s:
            self._reverify()

    def _reverify(self) -> None:
        """Each known channel still the sender's? (It may have freed its client, whose
        handle RM could give to another process.) Those that are not are forgotten."""
        self._verified_at = time.monotonic()
        for key, fd in list(self._proof.items()):
            conn = self._owner.get(key)
            if conn is None or fd not in conn.files or self._ask(fd, key):
                continue
            self.unproven += 1
            self._drop_conn(conn, {key})

    def _ask(self, fd: int, key: tuple[int, int]) -> bool:
        try:
            return bool(self.verify(fd, key[0], key[1]))
        except Exception:  # whatever the file is: not a proof
            return False

    def _drop_conn(self, conn: _Conn, keys: Iterable[tuple[int, int]] | None = None) -> None:
        """The process is gone (or it reconnects, or it said one of its processes exited):
        so are the channels it registered (``keys``: those of them; default all), and only
        those (pids are the container's own: another's may be the same)."""
        for key in list(conn.keys if keys is None else keys):
            if self._owner.get(key) is conn:
                del self._owner[key]
                self._chans.pop(key, None)
                self._work.pop(key, None)
                self._proof.pop(key, None)
            conn.keys.discard(key)

    def _tell(self, c: socket.socket, conn: _Conn) -> bool:
        """Write the sampling request this connection should have (never blocks: what the
        socket does not take now is written at a later refresh). False: the peer is gone."""
        fast = self._fast_us if conn.name in self._fast else (0, 0)
        want = (*fast, self._timeslice.get(conn.name, 0))
        if want != conn.told and conn.name:
            line = b'{"sample_us":%d,"repeat_us":%d' % fast
            if want[2]:
                line += b',"timeslice_us":%d' % want[2]
            conn.pending = line + b"}\n"
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
        """What to wait on for new lines (the daemon wakes at once for online work); an
        instance whose closes are behind is not waited on."""
        per_lane: dict[str, int] = {}
        for conn in self._conns.values():
            per_lane[conn.lane] = per_lane.get(conn.lane, 0) + 1
        return ([s.fileno() for s, lane in self._listeners.items()
                 if self._lane_open(lane) and per_lane.get(lane, 0) < self.max_conns]
                + [c.fileno() for c, conn in self._conns.items() if self._lane_open(conn.lane)])

    def _keep_file(self, conn: _Conn, fds: list[int]) -> None:
        """{"proof_file":1}: the file passed with it proves the channels that follow."""
        closer = self._closer(conn.lane)
        if not fds:
            return
        closer.close(fds[1:])
        conn.files.append(fds[0])
        if len(conn.files) > self.max_files:
            old = conn.files.pop(0)
            for key in [k for k, fd in self._proof.items() if fd == old]:
                self._proof.pop(key)  # proven once; not asked again
            closer.close([old])

    def _line(self, line: bytes, conn: _Conn, fds: list[int]) -> None:
        try:
            self._parse(line, conn, fds)
        finally:
            if fds and not (conn.files and conn.files[-1] == fds[0]):
                self._closer(conn.lane).close(fds)

    def _parse(self, line: bytes, conn: _Conn, fds: list[int]) -> None:
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
        if r.get("proof_file") == 1:
            self._keep_file(conn, fds)
            return
        if conn.lane:  # the socket says which instance, not the line
            if r.get("name") and str(r["name"]) != conn.lane:
                self.bad_lines += 1
                return
            r["name"] = conn.lane
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
        if new_chan:
            fd = conn.files[-1] if conn.files and r.get("proof") == 1 else -1
            if fd < 0 or not self._ask(fd, key):
                self.unproven += 1  # not shown to be the sender's: another's, or a guess
                return
        if e:
            self.apply(r)
        else:
            self.add_object(r)
        if new_chan and key in self._chans:
            self._owner[key] = conn
            self._proof[key] = fd
            conn.keys.add(key)
        elif e == nl.EVENTS["GPUSLICE_EV_CHANNEL_DEL"] and owner is conn:
            del self._owner[key]
            self._proof.pop(key, None)
            conn.keys.discard(key)

    def close(self) -> None:
        """Every connection, with the files it passed, is closed on its instance's closer
        (a daemon that exits does not wait on a container's close); the sockets go, the
        directories stay."""
        for c, conn in list(self._conns.items()):
            self._retire(c, conn)
        self._owner.clear()
        self._proof.clear()
        for s, name in self._listeners.items():
            self._closer(name).close([s])
            self._unlink_own((self.instance_socket(name) if name else self.path) or "")
        self._listeners.clear()
        self._by_name.clear()
        for d in self._tmp.values():
            with contextlib.suppress(OSError):
                os.rmdir(d)
        self._tmp.clear()


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

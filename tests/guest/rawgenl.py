"""A generic netlink client built on the standard library alone.

Tests use it where pyroute2 hides what they check (the size of the receive buffer, the
split of a dump into messages, the errno of a refused request), and where the client
runs in a process that cannot read the checkout: the whole module is self-contained,
so its source can be handed to ``python3 -I -c`` (see :func:`source`) by a process
running as an unprivileged user, wherever root cloned the repository.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct

NETLINK_GENERIC = 16
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
CTRL_ATTR_MCAST_GROUPS = 7
CTRL_ATTR_MCAST_GRP_NAME = 1
CTRL_ATTR_MCAST_GRP_ID = 2
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
SO_RCVBUFFORCE = 33
NLA_TYPE_MASK = 0x3FFF
# GPUSLICE_GENL_VERSION of kmod/uapi/gpuslice.h: the module refuses requests of another
# version (-EPROTO). Kept here as a literal, this file being self-contained;
# tests/test_uapi.py checks it against the header.
GPUSLICE_GENL_VERSION = 5
CTRL_VERSION = 1

Attrs = list[tuple[int, bytes]]


def attr(typ: int, payload: bytes) -> bytes:
    a = struct.pack("<HH", 4 + len(payload), typ) + payload
    return a + b"\0" * (-len(a) % 4)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def string(s: str) -> bytes:
    return s.encode() + b"\0"


def parse(raw: bytes) -> Attrs:
    """Attributes of a message body or a nest, in order (repeated types kept)."""
    out: Attrs = []
    while len(raw) >= 4:
        ln, typ = struct.unpack_from("<HH", raw)
        if ln < 4:
            break
        out.append((typ & NLA_TYPE_MASK, raw[4:ln]))
        raw = raw[(ln + 3) & ~3:]
    return out


def get_u32(a: Attrs, typ: int) -> int | None:
    for t, p in a:
        if t == typ:
            return int(struct.unpack("<I", p[:4])[0])
    return None


def get_str(a: Attrs, typ: int) -> str | None:
    for t, p in a:
        if t == typ:
            return p.rstrip(b"\0").decode()
    return None


class Genl:
    """One NETLINK_GENERIC socket talking to one family. ``recv_size`` is the buffer
    handed to recv(): the kernel sizes a dump's messages to the largest one seen."""

    def __init__(self, family: str, rcvbuf: int | None = None, recv_size: int = 65536) -> None:
        self.sk = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        if rcvbuf is not None:
            self.sk.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        self.recv_size = recv_size
        self.seq = 0
        self.sizes: list[int] = []  # length of every reply message received
        err, replies = self.request_raw(GENL_ID_CTRL, CTRL_CMD_GETFAMILY,
                                        attr(CTRL_ATTR_FAMILY_NAME, string(family)))
        if err:
            raise OSError(err, f"family {family!r}: {os.strerror(err)}")
        a = replies[0]
        fid = [p for t, p in a if t == CTRL_ATTR_FAMILY_ID][0]
        self.family = int(struct.unpack("<H", fid[:2])[0])
        self.groups: dict[str, int] = {}
        for t, p in a:
            if t == CTRL_ATTR_MCAST_GROUPS:
                for _i, g in parse(p):
                    ga = parse(g)
                    name, gid = get_str(ga, CTRL_ATTR_MCAST_GRP_NAME), get_u32(ga, CTRL_ATTR_MCAST_GRP_ID)
                    if name is not None and gid is not None:
                        self.groups[name] = gid
        self.sizes.clear()

    def close(self) -> None:
        self.sk.close()

    def __enter__(self) -> "Genl":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv(self) -> bytes:
        data, _anc, flags, _addr = self.sk.recvmsg(self.recv_size)
        if flags & socket.MSG_TRUNC:
            raise OSError(errno.EMSGSIZE, f"netlink message truncated to {self.recv_size} bytes")
        return data

    def request_raw(self, family: int, cmd: int, body: bytes, dump: bool = False,
                    version: int | None = None) -> tuple[int, list[Attrs]]:
        """(errno, attributes of each reply message); errno 0 when the request worked.
        ``version``: of the genetlink header (default: the controller's for GENL_ID_CTRL,
        else gpuslice's)."""
        self.seq += 1
        if version is None:
            version = CTRL_VERSION if family == GENL_ID_CTRL else GPUSLICE_GENL_VERSION
        msg = struct.pack("<BBH", cmd, version, 0) + body
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        self.sk.send(struct.pack("<IHHII", 16 + len(msg), family, flags, self.seq, 0) + msg)
        replies: list[Attrs] = []
        while True:
            data = self._recv()
            while len(data) >= 16:
                ln, typ, _fl, seq = struct.unpack_from("<IHHI", data)
                if seq == self.seq:
                    if typ in (NLMSG_ERROR, NLMSG_DONE):
                        err = -struct.unpack_from("<i", data, 16)[0] if ln >= 20 else 0
                        return err, replies
                    self.sizes.append(ln)
                    replies.append(parse(data[20:ln]))
                data = data[(ln + 3) & ~3:]

    def request(self, cmd: int, attrs: Attrs, dump: bool = False) -> tuple[int, list[Attrs]]:
        return self.request_raw(self.family, cmd, b"".join(attr(t, p) for t, p in attrs), dump)

    def join(self, group: str) -> int:
        """Joins a multicast group; returns the errno (0 = joined)."""
        try:
            self.sk.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, self.groups[group])
        except OSError as e:
            return e.errno or errno.EIO
        return 0

    def events(self, timeout: float = 0.0) -> tuple[list[Attrs], int]:
        """Multicast messages waiting on the socket (waits up to ``timeout`` s for the
        first), and how many times the kernel said it dropped some (ENOBUFS)."""
        out: list[Attrs] = []
        overruns = 0
        while select.select([self.sk], [], [], timeout)[0]:
            timeout = 0.0
            try:
                data = self._recv()
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                overruns += 1
                continue
            while len(data) >= 16:
                ln, typ = struct.unpack_from("<IH", data)
                if typ == self.family:
                    out.append(parse(data[20:ln]))
                data = data[(ln + 3) & ~3:]
        return out, overruns


def source() -> str:
    """This module's source, to run in a process that cannot import it."""
    with open(__file__) as f:
        return f.read()

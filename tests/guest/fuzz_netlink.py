"""Netlink fuzzer for the "gpuslice" generic netlink family (issue 11), for the guest.

`fuzz(seed, seconds)` sends hand-built messages on a raw NETLINK_GENERIC socket:
unknown and reserved commands, unknown attribute types (and the NESTED /
NET_BYTEORDER type bits), attributes of the wrong length, truncated, oversized (to
64 KiB) or running past the message, strings without their NUL or too long, headers
whose length disagrees with the datagram, several messages in one datagram, requests
without NLM_F_REQUEST or NLM_F_ACK, dumps with filters. Names are drawn from a pool
of the fuzzer's own ("nlf0".."nlf3", "nlfz<random>") and invalid ones, so no other
instance is touched. Every request that carries NLM_F_REQUEST | NLM_F_ACK must be
answered within `reply_s` (an error or an ACK, or a dump's messages and DONE); after
the others, a valid dump must still be answered. The instances that the ACKs say
were created and not deleted must be exactly the ones listed at the end.

`churn(name, procs, seconds)` runs NEW / DEL / SET / GET of one name from several
processes at once (and, with `opens`, opens of its nodes): each call gets a clear
answer in time (NEW: 0 or EEXIST; DEL: 0, ENOENT or EBUSY; SET/GET: 0 or ENOENT),
and at the end the name exists exactly when the successful NEWs outnumber the
successful DELs, with its nodes present.

Run as `python tests/guest/fuzz_netlink.py --seconds N [--unpriv]`: --unpriv checks
that no mutation passes for a caller without CAP_SYS_ADMIN.
"""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import random
import select
import socket
import stat
import struct
import time
from pathlib import Path

from gpuslice import netlink as gnl

NETLINK_GENERIC = 16
NLMSG_ERROR, NLMSG_DONE = 2, 3
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
F_REQUEST, F_MULTI, F_ACK, F_DUMP = 0x1, 0x2, 0x4, 0x300
NLA_F_NESTED, NLA_F_NET_BYTEORDER = 0x8000, 0x4000
MIB = 1 << 20
POOL = ("nlf0", "nlf1", "nlf2", "nlf3")
MUTATIONS = (gnl.CMD_INSTANCE_NEW, gnl.CMD_INSTANCE_DEL, gnl.CMD_INSTANCE_SET)
A = gnl.ATTR_IDS


def attr(typ: int, payload: bytes, nla_len: int | None = None) -> bytes:
    n = 4 + len(payload) if nla_len is None else nla_len
    a = struct.pack("<HH", n & 0xFFFF, typ & 0xFFFF) + payload
    return a + b"\0" * (-len(a) % 4)


def message(fam: int, cmd: int, attrs: bytes, flags: int = F_REQUEST | F_ACK, seq: int = 1,
            version: int = gnl.VERSION, nlmsg_len: int | None = None) -> bytes:
    body = struct.pack("<BBH", cmd & 0xFF, version & 0xFF, 0) + attrs
    n = 16 + len(body) if nlmsg_len is None else nlmsg_len
    return struct.pack("<IHHII", n & 0xFFFFFFFF, fam, flags & 0xFFFF, seq, 0) + body


class Sock:
    """A raw generic netlink socket that reads replies by sequence number."""

    def __init__(self) -> None:
        self.sk = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sk.bind((0, 0))
        self.seq = random.randrange(1 << 20)
        self.fam = self._family()

    def close(self) -> None:
        self.sk.close()

    def _family(self) -> int:
        msg = message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, attr(CTRL_ATTR_FAMILY_NAME, gnl.FAMILY.encode() + b"\0"),
                      seq=self.next_seq(), version=1)
        self.sk.send(msg)
        for typ, _fl, payload in self.replies(self.seq, 10.0):
            if typ == NLMSG_ERROR:
                err = -struct.unpack_from("<i", payload)[0]
                if err:
                    raise OSError(err, "no gpuslice family")
                continue
            off = 4
            while off + 4 <= len(payload):
                n, t = struct.unpack_from("<HH", payload, off)
                if t == CTRL_ATTR_FAMILY_ID:
                    return struct.unpack_from("<H", payload, off + 4)[0]
                off += (n + 3) & ~3
        raise OSError(errno.ENOENT, "no gpuslice family")

    def next_seq(self) -> int:
        self.seq = (self.seq + 1) & 0x7FFFFFFF
        return self.seq

    def drain(self) -> None:
        while select.select([self.sk], [], [], 0)[0]:
            self.sk.recv(1 << 17)

    def replies(self, seq: int, timeout: float) -> list[tuple[int, int, bytes]] | None:
        """Messages answering seq up to its ERROR/DONE; None if none came in time."""
        out: list[tuple[int, int, bytes]] = []
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.sk], [], [], left)[0]:
                return None
            data = self.sk.recv(1 << 17)
            off = 0
            while off + 16 <= len(data):
                n, typ, fl, s, _pid = struct.unpack_from("<IHHII", data, off)
                if n < 16:
                    break
                if s == seq:
                    out.append((typ, fl, data[off + 16: off + n]))
                    if typ in (NLMSG_ERROR, NLMSG_DONE) or not fl & F_MULTI:
                        return out
                off += (n + 3) & ~3

    def request(self, cmd: int, attrs: bytes, flags: int = F_REQUEST | F_ACK,
                timeout: float = 10.0) -> tuple[int | None, list]:
        """(errno or None if no answer in time, the data messages)."""
        seq = self.next_seq()
        self.sk.send(message(self.fam, cmd, attrs, flags=flags, seq=seq))
        rep = self.replies(seq, timeout)
        if rep is None:
            return None, []
        data = [p for t, _f, p in rep if t not in (NLMSG_ERROR, NLMSG_DONE)]
        errs = [-struct.unpack_from("<i", p)[0] for t, _f, p in rep if t == NLMSG_ERROR]
        return (errs[-1] if errs else 0), data


def u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & ((1 << 64) - 1))


def name_attr(name: str) -> bytes:
    return attr(A["GPUSLICE_A_NAME"], name.encode() + b"\0")


def parse_names(data: list[bytes]) -> list[str]:
    out = []
    for p in data:
        off = 4
        while off + 4 <= len(p):
            n, t = struct.unpack_from("<HH", p, off)
            if n < 4:
                break
            if t & ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER) == A["GPUSLICE_A_NAME"]:  # the kernel masks the flags
                out.append(p[off + 4: off + n].split(b"\0")[0].decode(errors="replace"))
            off += (n + 3) & ~3
    return out


def list_names(sk: Sock) -> list[str]:
    err, data = sk.request(gnl.CMD_INSTANCE_GET, b"", flags=F_REQUEST | F_DUMP)
    if err is None:
        raise TimeoutError("INSTANCE_GET dump not answered")
    return parse_names(data)


# ---- the random generator ---------------------------------------------------------------


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def name(self) -> bytes:
        r = self.rng
        k = r.randrange(10)
        if k < 5:
            return r.choice(POOL).encode() + b"\0"
        if k == 5:
            return ("nlfz" + "".join(r.choice("abcdefghij0123456789_.-") for _ in range(r.randrange(1, 27)))).encode() + b"\0"
        if k == 6:
            return r.choice(POOL).encode()  # no NUL
        if k == 7:
            return b"nlf" + b"x" * r.choice((28, 29, 30, 31, 40, 300)) + b"\0"  # too long around the limit
        if k == 8:
            return r.choice((b"\0", b".\0", b"..\0", b"nlf/0\0", b"nlf 0\0", b"nlf\xff\0", b"nlf0\0junk\0",
                             b"\0nlf0\0"))
        return r.randbytes(r.randrange(0, 40))

    def value(self, typ: int) -> bytes:
        """A payload for attribute typ: mostly the right width, sometimes not."""
        r = self.rng
        kind = gnl.ATTRS[typ][1] if 0 <= typ < len(gnl.ATTRS) else "none"
        wrong = r.random() < 0.25
        if kind == "asciiz" and not wrong:
            return self.name()
        if kind == "uint32" and not wrong:
            if typ == A["GPUSLICE_A_GPU_MASK"]:
                return u32(r.choice((1, 1, 1, 0, 2, 3, 0x80000000, 0xFFFFFFFF)))
            if typ == A["GPUSLICE_A_MODE"]:
                return u32(r.choice((0o600, 0o666, 0o777, 0o1000, 0xFFFFFFFF, 0)))
            if typ in (A["GPUSLICE_A_UID"], A["GPUSLICE_A_GID"]):
                return u32(r.choice((0, 1000, 65534, 0xFFFFFFFF, 0x7FFFFFFF)))
            if typ == A["GPUSLICE_A_WEIGHT"]:
                return u32(r.choice((0, 1, 100, 10000, 10001, 0xFFFFFFFF)))
            if typ == A["GPUSLICE_A_SHARE"]:
                return u32(r.choice((0, 5000, 10000, 10001, 0xFFFFFFFF)))
            return u32(r.getrandbits(32))
        if kind == "uint64" and not wrong:
            if typ == A["GPUSLICE_A_MEM_LIMIT"]:
                return u64(r.choice((0, 1, MIB, 64 * MIB, (1 << 64) - 1, 1 << 63)))
            return u64(r.choice((0, 1, 1000, 1 << 40, (1 << 64) - 1)))
        n = r.choice((0, 1, 2, 3, 5, 7, 9, 12, 16, 31, 32, 33, 255, 1024, 4096, 65000))
        return r.randbytes(n) if r.random() < 0.5 else b"\0" * n

    def attrs(self, cmd: int) -> bytes:
        r = self.rng
        out = b""
        if r.random() < 0.85:
            out += attr(A["GPUSLICE_A_NAME"], self.name())
        if cmd == gnl.CMD_INSTANCE_NEW and r.random() < 0.7:
            out += attr(A["GPUSLICE_A_GPU_MASK"], u32(1)) + attr(A["GPUSLICE_A_MEM_LIMIT"], u64(r.choice((MIB, 16 * MIB))))
        for _ in range(r.choice((0, 0, 1, 2, 3, 6, 20))):
            typ = r.choice((r.randrange(0, len(gnl.ATTRS)), r.randrange(0, len(gnl.ATTRS)),
                            r.randrange(len(gnl.ATTRS), 64), r.getrandbits(14)))
            if r.random() < 0.05:
                typ |= r.choice((NLA_F_NESTED, NLA_F_NET_BYTEORDER))
            payload = self.value(typ & 0x3FFF)
            if typ & 0x3FFF == A["GPUSLICE_A_PIDS"] and r.random() < 0.5:
                payload = attr(A["GPUSLICE_A_PID"], u32(1)) + attr(r.randrange(40), self.value(1))
                typ |= NLA_F_NESTED
            nla_len = None
            if r.random() < 0.05:
                nla_len = r.choice((0, 1, 3, 4, len(payload) + 8, 0xFFFF))  # bad lengths
            out += attr(typ, payload, nla_len)
        if r.random() < 0.02:
            out += attr(r.randrange(1, 12), b"\0" * 65000)  # oversized
        return out


def fuzz(seed: int, seconds: float, reply_s: float = 10.0, unpriv: bool = False, log=print) -> dict:
    rng = random.Random(seed)
    g = Gen(rng)
    sk = Sock()
    probe = Sock()
    before = set(list_names(probe))
    expected = {n for n in before if n.startswith("nlf")}
    errs: dict[str, int] = {}
    problems: list[str] = []
    sent = answered = unanswered_ok = probes = resyncs = 0
    per_cmd: dict[int, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(problems) < 10:
        cmd = rng.choice((1, 2, 3, 4, 5, 1, 2, 3, 4, 0, 6, rng.randrange(7, 256)))
        attrs = g.attrs(cmd)
        flags = F_REQUEST | F_ACK
        k = rng.random()
        if k < 0.1:
            flags |= F_DUMP
        elif k < 0.13:
            flags = rng.choice((0, F_ACK, F_REQUEST, F_REQUEST | F_ACK | F_MULTI | 0x10, rng.getrandbits(16)))
        seq = sk.next_seq()
        msg = message(sk.fam, cmd, attrs, flags=flags, seq=seq, version=rng.choice((gnl.VERSION,) * 3 + (0, gnl.VERSION - 1, gnl.VERSION + 1, 255)))
        broken = False
        k = rng.random()
        if k < 0.04:  # the header claims less than the datagram holds
            msg = struct.pack("<I", rng.randrange(0, len(msg))) + msg[4:]
            broken = True
        elif k < 0.08:  # more
            msg = struct.pack("<I", len(msg) + rng.randrange(1, 4096)) + msg[4:]
            broken = True
        elif k < 0.11:  # truncated datagram
            msg = msg[: rng.randrange(0, len(msg))]
            broken = True
        elif k < 0.13:  # two messages in one datagram, the second with its own seq
            seq2 = sk.next_seq()
            msg = msg + b"\0" * (-len(msg) % 4) + message(sk.fam, rng.choice((1, 2, 3, 4)), g.attrs(1), seq=seq2)
            broken = True
        per_cmd[cmd] = per_cmd.get(cmd, 0) + 1
        try:
            sk.sk.send(msg)
        except OSError as ex:
            k = f"send:{errno.errorcode.get(ex.errno or 0, ex.errno)}"
            errs[k] = errs.get(k, 0) + 1
            continue
        sent += 1
        must = not broken and flags & F_REQUEST and flags & F_ACK and not flags & ~(F_REQUEST | F_ACK | F_DUMP)
        rep = sk.replies(seq, reply_s if must else 0.3)
        if rep is None:
            if must:
                problems.append(f"no answer in {reply_s}s to cmd {cmd} flags {flags:#x}: {msg[:96].hex()}")
            else:
                unanswered_ok += 1
            sk.drain()
        else:
            answered += 1
            err_msgs = [-struct.unpack_from("<i", p)[0] for t, _f, p in rep if t == NLMSG_ERROR and len(p) >= 4]
            e = err_msgs[-1] if err_msgs else 0
            key = f"cmd{cmd if cmd <= 6 else 'X'}:{errno.errorcode.get(e, e) if e else 'ok'}"
            errs[key] = errs.get(key, 0) + 1
            # without NLM_F_REQUEST the kernel only ACKs (netlink_rcv_skb): nothing ran
            if not broken and e == 0 and cmd in MUTATIONS and flags & F_REQUEST and not flags & F_DUMP:
                if unpriv:
                    problems.append(f"unprivileged cmd {cmd} succeeded: {msg[:96].hex()}")
                names = parse_names([b"\0" * 4 + attrs])
                name = names[-1] if names else None
                if name is not None:
                    if cmd == gnl.CMD_INSTANCE_NEW:
                        expected.add(name)
                    elif cmd == gnl.CMD_INSTANCE_DEL:
                        expected.discard(name)
            if broken:
                sk.drain()
        if broken or rng.random() < 0.02:
            probes += 1
            try:
                names = list_names(probe)
            except TimeoutError:
                problems.append("a valid INSTANCE_GET dump was not answered after a broken message")
                continue
            if broken:
                # what a broken datagram did is not known from its ACKs (a shortened header
                # leaves the rest to be read as further messages, a second message has its own
                # ACK): start again from what is listed. The kernel ran the whole datagram
                # before send() returned.
                expected = {n for n in names if n.startswith("nlf")}
                resyncs += 1
    sk.drain()
    after = set(list_names(probe))
    ours = {n for n in after if n.startswith("nlf")}
    if ours != expected:
        problems.append(f"instances after the fuzz: {sorted(ours)}, expected from the ACKs: {sorted(expected)}")
    if (after - ours) != (before - {n for n in before if n.startswith('nlf')}):
        problems.append(f"other instances changed: before {sorted(before)}, after {sorted(after)}")
    if unpriv and after != before:
        problems.append(f"instances changed without privilege: before {sorted(before)}, after {sorted(after)}")
    for n in ours:  # every listed instance has its nodes
        leaves = {x.name for x in Path(f"/dev/gpuslice/{n}").glob("*")} if Path(f"/dev/gpuslice/{n}").is_dir() else set()
        if not {"nvidiactl", "nvidia0"} <= leaves:
            problems.append(f"instance {n} is listed but /dev/gpuslice/{n} holds {sorted(leaves)}")
    sk.close()
    probe.close()
    return {"seed": seed, "sent": sent, "answered": answered, "unanswered_allowed": unanswered_ok,
            "probes": probes, "resyncs": resyncs, "per_cmd": per_cmd, "results": dict(sorted(errs.items())),
            "created_left": sorted(ours), "problems": problems}


def cleanup(prefix: str = "nlf") -> list[str]:
    """Deletes the fuzzer's instances; returns the names still there."""
    sk = Sock()
    try:
        for n in list_names(sk):
            if n.startswith(prefix):
                sk.request(gnl.CMD_INSTANCE_DEL, name_attr(n))
        left = [n for n in list_names(sk) if n.startswith(prefix)]
        time.sleep(0.2)  # devtmpfs removes the nodes from its own thread
        for d in Path("/dev/gpuslice").glob(prefix + "*"):
            if d.name not in left and any(d.iterdir()):
                left.append(f"{d.name} (nodes without an instance: {sorted(x.name for x in d.iterdir())})")
        return left
    finally:
        sk.close()


# ---- one name, several processes ----------------------------------------------------------------

ALLOWED = {
    "new": {0, errno.EEXIST},
    "del": {0, errno.ENOENT, errno.EBUSY},
    "set": {0, errno.ENOENT},
    "get": {0, errno.ENOENT},
    "open": {0, errno.ENOENT, errno.ENODEV, errno.ENXIO},
}


def _churner(name: str, seed: int, seconds: float, opens: bool, out, reply_s: float) -> None:
    rng = random.Random(seed)
    sk = Sock()
    counts: dict[str, int] = {}
    bad: list[str] = []
    end = time.monotonic() + seconds
    ops = ["new", "new", "del", "del", "set", "get"] + (["open", "open"] if opens else [])
    while time.monotonic() < end:
        op = rng.choice(ops)
        t0 = time.monotonic()
        if op == "open":
            e = 0
            try:
                fd = os.open(f"/dev/gpuslice/{name}/{rng.choice(('nvidiactl', 'nvidia0', 'nvidia-uvm'))}", os.O_RDWR)
                time.sleep(rng.random() * 0.01)
                os.close(fd)
            except OSError as ex:
                e = ex.errno
        else:
            cmd = {"new": gnl.CMD_INSTANCE_NEW, "del": gnl.CMD_INSTANCE_DEL, "set": gnl.CMD_INSTANCE_SET,
                   "get": gnl.CMD_INSTANCE_GET}[op]
            a = name_attr(name)
            if op == "new":
                a += attr(A["GPUSLICE_A_GPU_MASK"], u32(1)) + attr(A["GPUSLICE_A_MEM_LIMIT"], u64(16 * MIB)) \
                    + attr(A["GPUSLICE_A_MODE"], u32(0o666))
            elif op == "set":
                a += attr(A["GPUSLICE_A_WEIGHT"], u32(rng.randrange(1, 100)))
                if rng.random() < 0.3:
                    a += attr(A["GPUSLICE_A_MODE"], u32(rng.choice((0o600, 0o666))))
            e, _ = sk.request(cmd, a, timeout=reply_s)
            if e is None:
                bad.append(f"{op}: no answer in {reply_s}s")
                break
        dt = time.monotonic() - t0
        key = f"{op}:{errno.errorcode.get(e, e) if e else 'ok'}"
        counts[key] = counts.get(key, 0) + 1
        if e not in ALLOWED[op]:
            bad.append(f"{op}: {errno.errorcode.get(e, e)}")
        if dt > reply_s:
            bad.append(f"{op}: took {dt:.1f}s")
    sk.close()
    out.put({"counts": counts, "bad": bad[:10]})


def churn(name: str, procs: int, seconds: float, opens: bool, seed: int, reply_s: float = 10.0) -> dict:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_churner, args=(name, seed + i, seconds, opens, q, reply_s)) for i in range(procs)]
    for p in ps:
        p.start()
    import queue

    res = []
    bad: list[str] = []
    deadline = time.monotonic() + seconds + 4 * reply_s + 60
    for _ in ps:
        try:
            res.append(q.get(timeout=max(1.0, deadline - time.monotonic())))
        except queue.Empty:
            bad.append("a churning process never finished (hang)")
            break
    for p in ps:
        p.join(10)
        if p.is_alive():
            try:
                stack = Path(f"/proc/{p.pid}/stack").read_text()[:800]
            except OSError:
                stack = "?"
            bad.append(f"churning process {p.pid} still alive: {stack}")
            p.kill()
            p.join(5)
    counts: dict[str, int] = {}
    for r in res:
        bad += r["bad"]
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
    problems = list(bad)
    sk = Sock()
    try:
        exists = name in list_names(sk)
        net = counts.get("new:ok", 0) - counts.get("del:ok", 0)
        if net != (1 if exists else 0):
            problems.append(f"{counts.get('new:ok', 0)} NEW and {counts.get('del:ok', 0)} DEL succeeded, "
                            f"but the instance {'exists' if exists else 'does not exist'}")
        nodes = {}
        if exists:
            for leaf in ("nvidiactl", "nvidia0", "nvidia-uvm"):
                node = Path(f"/dev/gpuslice/{name}/{leaf}")
                try:
                    st = node.stat()
                    nodes[leaf] = stat.S_ISCHR(st.st_mode)
                except OSError:
                    nodes[leaf] = False
            if not all(nodes.values()):
                problems.append(f"the instance exists but its nodes are {nodes}")
            e, _ = sk.request(gnl.CMD_INSTANCE_DEL, name_attr(name))
            if e:
                problems.append(f"final DEL: {errno.errorcode.get(e, e)}")
        time.sleep(0.2)
        if name in list_names(sk):
            problems.append("the instance is still listed after its DEL")
        if Path(f"/dev/gpuslice/{name}").exists() and any(Path(f"/dev/gpuslice/{name}").iterdir()):
            problems.append(f"/dev/gpuslice/{name} still has nodes after the DEL: "
                            f"{sorted(x.name for x in Path(f'/dev/gpuslice/{name}').iterdir())}")
    finally:
        sk.close()
    return {"name": name, "procs": procs, "seconds": seconds, "opens": opens, "calls": sum(counts.values()),
            "counts": dict(sorted(counts.items())), "problems": problems}


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--unpriv", action="store_true")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    rep = fuzz(seed, a.seconds, unpriv=a.unpriv)
    print("RESULT " + json.dumps(rep), flush=True)
    raise SystemExit(1 if rep["problems"] else 0)

"""netlink.py mirrors kmod/uapi/gpuslice.h, and encodes messages the way the kernel reads them."""

import os
import re
import struct

import pytest

from gpuslice import netlink as N

HEADER = os.path.join(os.path.dirname(__file__), "..", "kmod", "uapi", "gpuslice.h")


def parse_enums(text: str) -> dict[str, list[tuple[str, int]]]:
    """enum name -> [(member, value)] with C's implicit numbering."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = {}
    for m in re.finditer(r"enum\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        members, val = [], -1
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                name, expr = (s.strip() for s in item.split("=", 1))
                val = int(expr, 0)
            else:
                name, val = item, val + 1
            members.append((name, val))
        out[m.group(1)] = members
    return out


def parse_defines(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#define\s+(GPUSLICE_\w+)\s+(\S+)", text, flags=re.M))


@pytest.fixture(scope="module")
def header() -> str:
    with open(HEADER) as f:
        return f.read()


def test_commands_mirror(header: str) -> None:
    cmds = [(n, v) for n, v in parse_enums(header)["gpuslice_cmd"] if not n.startswith("__")]
    assert dict(cmds) == N.CMDS


def test_attributes_mirror(header: str) -> None:
    attrs = [(n, v) for n, v in parse_enums(header)["gpuslice_attr"] if not n.startswith("__")]
    assert [n for n, _ in attrs] == [n for n, _ in N.ATTRS]
    assert all(N.ATTR_IDS[n] == v for n, v in attrs)


def test_attribute_types_follow_comments(header: str) -> None:
    """u32/u64/string as the header's comment on each attribute says."""
    for name, comment in re.findall(r"(GPUSLICE_A_\w+),\s*/\*\s*(\w+\[?)", header):
        typ = dict(N.ATTRS)[name]
        want = {"u32": "uint32", "u64": "uint64", "NUL": "asciiz", "nest": "pids",
                "u64[": "array(uint64)"}.get(comment)
        if want:
            assert typ == want, name


def test_kinds_events_and_defines(header: str) -> None:
    enums = parse_enums(header)
    assert dict(enums["gpuslice_obj_kind"]) == N.OBJ_KINDS
    assert dict(enums["gpuslice_event"]) == N.EVENTS
    d = parse_defines(header)
    assert d["GPUSLICE_GENL_NAME"].strip('"') == N.FAMILY
    assert int(d["GPUSLICE_GENL_VERSION"]) == N.VERSION
    # the guest's self-contained netlink client carries its own copy
    raw = open(os.path.join(os.path.dirname(__file__), "guest", "rawgenl.py")).read()
    assert re.search(r"^GPUSLICE_GENL_VERSION = (\d+)$", raw, re.M).group(1) == d["GPUSLICE_GENL_VERSION"]
    assert d["GPUSLICE_MCGRP_EVENTS"].strip('"') == N.MCGRP_EVENTS
    assert int(d["GPUSLICE_NAME_MAX"]) == N.NAME_MAX
    assert int(d["GPUSLICE_SHARE_FULL"]) == N.SHARE_FULL
    assert int(d["GPUSLICE_WEIGHT_MAX"]) == N.WEIGHT_MAX
    assert int(d["GPUSLICE_LOCK_HIST_BUCKETS"]) == N.LOCK_HIST_BUCKETS
    assert int(d["GPUSLICE_MAX_GPUS"]) == N.MAX_GPUS
    assert (int(d["GPUSLICE_SAMPLE_US_MIN"]), int(d["GPUSLICE_SAMPLE_US_MAX"])) == (N.SAMPLE_US_MIN, N.SAMPLE_US_MAX)
    assert (int(d["GPUSLICE_REPEAT_US_MIN"]), int(d["GPUSLICE_REPEAT_US_MAX"])) == (N.REPEAT_US_MIN, N.REPEAT_US_MAX)
    assert {n: int(d["GPUSLICE_CAP_" + n.upper()], 16) for n in N.CAPS} == N.CAPS
    assert int(d["GPUSLICE_CAPS_ALL"], 16) == N.CAPS_ALL == sum(N.CAPS.values())


def nla(typ: int, payload: bytes) -> bytes:
    raw = struct.pack("<HH", 4 + len(payload), typ) + payload
    return raw + b"\0" * (-len(raw) % 4)


def test_instance_new_encoding_matches_hand_built() -> None:
    msg = N.build(N.CMD_INSTANCE_NEW, {"name": "web", "gpu_mask": 0b101, "mem_limit": 8 << 30, "weight": 3,
                                       "share": 2500, "timeslice_us": None})
    msg["header"].update({"type": 0x1F, "flags": 5, "sequence_number": 9, "pid": 0})
    msg.encode()
    attrs = (nla(N.ATTR_IDS["GPUSLICE_A_NAME"], b"web\0") + nla(N.ATTR_IDS["GPUSLICE_A_GPU_MASK"], struct.pack("<I", 5))
             + nla(N.ATTR_IDS["GPUSLICE_A_MEM_LIMIT"], struct.pack("<Q", 8 << 30))
             + nla(N.ATTR_IDS["GPUSLICE_A_WEIGHT"], struct.pack("<I", 3))
             + nla(N.ATTR_IDS["GPUSLICE_A_SHARE"], struct.pack("<I", 2500)))
    body = struct.pack("<BBH", N.CMD_INSTANCE_NEW, N.VERSION, 0) + attrs
    want = struct.pack("<IHHII", 16 + len(body), 0x1F, 5, 9, 0) + body
    assert bytes(msg.data) == want


def test_decode_kernel_style_reply_with_pids_and_pad() -> None:
    """What the module sends for INSTANCE_GET: u64 after a PAD attribute, a PIDS nest."""
    pids = nla(N.ATTR_IDS["GPUSLICE_A_PID"], struct.pack("<I", 100)) + nla(N.ATTR_IDS["GPUSLICE_A_PID"], struct.pack("<I", 200))
    attrs = (nla(N.ATTR_IDS["GPUSLICE_A_NAME"], b"web\0") + nla(N.ATTR_IDS["GPUSLICE_A_PAD"], b"")
             + nla(N.ATTR_IDS["GPUSLICE_A_MEM_USED"], struct.pack("<Q", 12345))
             + nla(N.ATTR_IDS["GPUSLICE_A_PIDS"] | 0x8000, pids)  # NLA_F_NESTED
             + nla(N.ATTR_IDS["GPUSLICE_A_OBJ_KIND"], struct.pack("<I", N.OBJ_CHANNEL)))
    body = struct.pack("<BBH", N.CMD_INSTANCE_GET, N.VERSION, 0) + attrs
    raw = struct.pack("<IHHII", 16 + len(body), 0x1F, 2, 1, 0) + body
    msg = N.GsMsg(raw)
    msg.decode()
    assert msg["cmd"] == N.CMD_INSTANCE_GET
    assert N.to_dict(msg) == {"name": "web", "mem_used": 12345, "pids": [100, 200], "obj_kind": N.OBJ_CHANNEL}


def test_unknown_attribute_rejected() -> None:
    with pytest.raises(KeyError):
        N.build(N.CMD_INSTANCE_SET, {"bogus": 1})
    assert N.mask_of([0, 3]) == 9


def _instance_get_msg(attrs: bytes) -> dict:
    body = struct.pack("<BBH", N.CMD_INSTANCE_GET, N.VERSION, 0) + attrs
    msg = N.GsMsg(struct.pack("<IHHII", 16 + len(body), 0x1F, 2, 1, 0) + body)
    msg.decode()
    return N.to_dict(msg)


def _pids_nest(pids: list[int]) -> bytes:
    inner = b"".join(nla(N.ATTR_IDS["GPUSLICE_A_PID"], struct.pack("<I", p)) for p in pids)
    return nla(N.ATTR_IDS["GPUSLICE_A_PIDS"] | 0x8000, inner)


def test_pids_in_several_nests_are_joined() -> None:
    """The module puts at most 4096 pids in one PIDS nest (an attribute holds < 64 KiB)."""
    first, second = list(range(1, 4097)), [5000, 5001]
    d = _instance_get_msg(nla(N.ATTR_IDS["GPUSLICE_A_NAME"], b"big\0") + _pids_nest(first) + _pids_nest(second)
                          + nla(N.ATTR_IDS["GPUSLICE_A_NR_EVENTS_SUPPRESSED"], struct.pack("<Q", 7)))
    assert d["pids"] == first + second and d["nr_events_suppressed"] == 7


def test_dump_continuations_fold_into_their_instance() -> None:
    """A dump continues an instance's PIDS in messages carrying NAME, ID and PIDS only."""
    def msg(name: bytes, iid: int, pids: list[int], full: bool) -> dict:
        a = nla(N.ATTR_IDS["GPUSLICE_A_NAME"], name + b"\0") + nla(N.ATTR_IDS["GPUSLICE_A_ID"], struct.pack("<I", iid))
        if full:
            a += nla(N.ATTR_IDS["GPUSLICE_A_WEIGHT"], struct.pack("<I", 3))
        return _instance_get_msg(a + _pids_nest(pids))

    got = N.merge_instances([msg(b"a", 1, [10, 11], True), msg(b"a", 1, [12], False), msg(b"a", 1, [13], False),
                             msg(b"b", 2, [], True)])
    assert got == [{"name": "a", "id": 1, "weight": 3, "pids": [10, 11, 12, 13]},
                   {"name": "b", "id": 2, "weight": 3, "pids": []}]


def test_lock_figures_decode_and_quantiles() -> None:
    """LOCK_*_HIST travel as u64 arrays after a PAD (nla_put_64bit); p99 is the high end
    of its log2 bucket, capped by the measured maximum."""
    hist = [0] * N.LOCK_HIST_BUCKETS
    hist[11], hist[12], hist[20] = 980, 19, 1  # [1024, 2048) ns, [2048, 4096), [512 KiB ns, 1 Mi ns)
    a = (nla(N.ATTR_IDS["GPUSLICE_A_NAME"], b"web\0")
         + nla(N.ATTR_IDS["GPUSLICE_A_LOCK_ACQUIRED"], struct.pack("<Q", 1000))
         + nla(N.ATTR_IDS["GPUSLICE_A_LOCK_HOLD_NS"], struct.pack("<Q", 2_000_000))
         + nla(N.ATTR_IDS["GPUSLICE_A_LOCK_HOLD_MAX_NS"], struct.pack("<Q", 600_000))
         + nla(N.ATTR_IDS["GPUSLICE_A_PAD"], b"")
         + nla(N.ATTR_IDS["GPUSLICE_A_LOCK_HOLD_HIST"], struct.pack(f"<{N.LOCK_HIST_BUCKETS}Q", *hist)))
    d = _instance_get_msg(a)
    assert d["lock_hold_hist"] == hist and d["lock_acquired"] == 1000
    assert N.hist_quantile_ns(hist, 0.5) == 2048
    assert N.hist_quantile_ns(hist, 0.99) == 4096
    assert N.hist_quantile_ns(hist, 1.0) == 1 << 20
    assert N.hist_quantile_ns(hist, 1.0, 600_000) == 600_000
    s = N.lock_summary(d)
    assert s["hold_p99_ns"] == 4096 and s["hold_max_ns"] == 600_000 and s["hold_mean_ns"] == 2000
    assert s["wait_p99_ns"] == 0 and N.lock_summary({}) == {}
    assert N.hist_bucket_ns(0) == (0, 1) and N.hist_bucket_ns(1) == (1, 2)
    assert N.hist_bucket_ns(N.LOCK_HIST_BUCKETS - 1) == (1 << (N.LOCK_HIST_BUCKETS - 2), None)
    top = [0] * (N.LOCK_HIST_BUCKETS - 1) + [3]
    assert N.hist_quantile_ns(top, 0.99, 5 << 30) == 5 << 30

"""The core's reading of a channel's USERD (kmod/core/activity.c), which both samplers use:
the module's (kmod/activity.c) and the user-space build's (preload/userd.c); and where a
channel's USERD is, as the core records it from the channel's allocation parameters."""

from __future__ import annotations

import ctypes
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import coreshim as cs
from gpuslice import abi
from test_core import DEV, Proc, env, so  # noqa: F401  (fixtures)

GPGET, SIZE, REPEAT_NS = 0x88, 0x90, 10_000_000
U64 = st.integers(0, 2**64 - 1)


def _lib(so):
    lib = ctypes.CDLL(str(so))
    lib.t_userd_locate.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                   ctypes.POINTER(ctypes.c_uint64)]
    lib.t_userd_seen.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64]
    lib.t_userd_seen_size.restype = ctypes.c_size_t
    return lib


@pytest.fixture(scope="module")
def lib(so):  # noqa: F811
    return _lib(so)


def word(get: int, put: int) -> int:
    return get | put << 32


class Seen:
    def __init__(self, lib) -> None:
        self.lib = lib
        self.buf = ctypes.create_string_buffer(lib.t_userd_seen_size())

    def __call__(self, w: int, entries: int = 1024, now: int = 1) -> bool:
        return bool(self.lib.t_userd_seen(self.buf, w, entries, now))


@settings(max_examples=400, deadline=None)
@given(ch_off=U64, map_off=U64, map_len=U64)
def test_locate_only_inside_the_mapping(lib, ch_off, map_off, map_len):
    """GPGet's 8 bytes (and the whole USERD head) lie inside the mapping, whatever the
    offsets, with no wrap-around: a sampler never reads outside what was mapped."""
    at = ctypes.c_uint64()
    ok = lib.t_userd_locate(ch_off, map_off, map_len, ctypes.byref(at))
    inside = ch_off >= map_off and ch_off - map_off + SIZE <= map_len
    assert bool(ok) == inside
    if ok:
        assert at.value == ch_off - map_off + GPGET and at.value + 8 <= map_len


def test_seen_reports_submissions_not_quiet(lib):
    s = Seen(lib)
    assert not s(word(3, 3), now=1)  # the first look only learns where GPPut is
    assert not s(word(3, 3), now=2)  # quiet
    assert s(word(3, 4), now=3)  # GPPut moved: submitted
    assert not s(word(4, 5), now=4)  # still submitting, within GS_WORK_REPEAT_NS
    assert s(word(5, 6), now=4 + REPEAT_NS)
    assert not s(word(6, 6), now=5 + REPEAT_NS)  # fetched, nothing new: quiet again
    assert s(word(6, 7), now=6 + REPEAT_NS)  # a quiet channel's submission: at once


def test_seen_pending_entries_are_work(lib):
    """GPGet != GPPut (entries not yet fetched, e.g. while the channel is disabled) is
    work even though GPPut did not move."""
    s = Seen(lib)
    assert not s(word(1, 5), now=1)
    assert s(word(1, 5), now=2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=30),
       st.integers(2, 4096))
def test_seen_out_of_range_is_no_evidence(lib, words, entries):
    """A word that is not a USERD's (GPGet or GPPut at or past gpFifoEntries) never
    reports, whatever came before: a process that maps something else there gets
    nothing from it."""
    s = Seen(lib)
    now = 1
    for get, put in words:
        now += REPEAT_NS
        got = s(word(get, put), entries, now)
        if get >= entries or put >= entries:
            assert not got


def _chan_params(entries: int, userd_mem: int, userd_off: int, engine: int = 0):
    b = ctypes.create_string_buffer(0x200)
    struct.pack_into("<I", b, 16, entries)
    struct.pack_into("<I", b, 32, userd_mem)
    struct.pack_into("<Q", b, 64, userd_off)
    struct.pack_into("<I", b, 128, engine)
    return b


def test_channel_records_where_its_userd_is(env):  # noqa: F811
    """Client-allocated USERD (CUDA's: hUserdMemory[0] + userdOffset[0]) and RM's own
    (hUserdMemory[0] == 0: mapped through the channel, offset 0)."""
    core, rm = env
    p = Proc(core, rm)
    p.alloc(DEV, abi.KEPLER_CHANNEL_GROUP_A, 0x700)
    p.alloc(0x700, abi.HOPPER_CHANNEL_GPFIFO_A, 0x701, params=_chan_params(1024, 0x5C000017, 0x5000, 1))
    p.alloc(0x700, abi.HOPPER_CHANNEL_GPFIFO_A, 0x702, params=_chan_params(512, 0, 0x5000))
    chans = {o["handle"]: o for o in core.objects() if o["kind"] == cs.OBJ_CHANNEL}
    assert (chans[0x701]["userd_mem"], chans[0x701]["userd_off"], chans[0x701]["gp_entries"]) == (0x5C000017, 0x5000, 1024)
    assert (chans[0x702]["userd_mem"], chans[0x702]["userd_off"], chans[0x702]["gp_entries"]) == (0x702, 0, 512)
    assert chans[0x701]["engine"] == 1

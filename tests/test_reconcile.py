"""The guard's policy (pyctl/gpuslice/sched/reconcile.py): who is past their limit in RM's own
count, and who gets stopped."""

from __future__ import annotations

import subprocess
import time

from hypothesis import given
from hypothesis import strategies as st

from gpuslice.sched import reconcile as R

MIB = 1 << 20


def sl(name: str, limit: int, used: int, pids: set[int]) -> R.Slice:
    return R.Slice(name, limit, used, frozenset(pids))


slices_st = st.lists(
    st.tuples(st.integers(1, 64), st.integers(0, 64), st.sets(st.integers(1, 40), max_size=5)),
    max_size=5,
).map(lambda xs: [sl(f"i{k}", lim * MIB, used * MIB, pids) for k, (lim, used, pids) in enumerate(xs)])
usage_st = st.dictionaries(st.integers(1, 40), st.integers(0, 128 * MIB), max_size=40)


@given(slices_st, usage_st)
def test_a_breach_is_over_its_limit_and_over_what_was_charged(slices, usage):
    by_name = {s.name: s for s in slices}
    for b in R.breaches(slices, usage):
        s = by_name[b.name]
        assert b.rm_bytes > s.limit and b.rm_bytes > s.used
        assert b.pid in s.pids and usage[b.pid] == b.pid_bytes
        # the largest holder, as the OOM killer picks
        assert all(usage.get(p, 0) <= b.pid_bytes for p in s.pids
                   if sum(p in o.pids for o in slices) == 1)


@given(slices_st, usage_st)
def test_no_breach_while_every_instance_is_within_its_limit(slices, usage):
    for s in slices:
        for p in s.pids:
            usage.pop(p, None)
        # give each instance exactly its limit, spread over its own pids
        own = [p for p in s.pids if sum(p in o.pids for o in slices) == 1]
        if own:
            usage[own[0]] = s.limit
    assert R.breaches(slices, usage) == []


def test_a_limit_lowered_below_use_is_no_breach():
    # the operator lowered the limit: RM holds what the module charged, nothing more
    assert R.breaches([sl("a", 8 * MIB, 32 * MIB, {10})], {10: 32 * MIB}) == []
    # a byte more than charged is
    (b,) = R.breaches([sl("a", 8 * MIB, 32 * MIB, {10})], {10: 32 * MIB + 1})
    assert (b.name, b.pid) == ("a", 10)


def test_a_pid_in_two_instances_counts_for_neither():
    s = [sl("a", MIB, 0, {1, 2}), sl("b", MIB, 0, {2, 3})]
    assert R.breaches(s, {2: 100 * MIB}) == []
    assert [b.pid for b in R.breaches(s, {1: 2 * MIB, 2: 100 * MIB})] == [1]


class FakeRm:
    def __init__(self, per_gpu: dict[int, dict[int, int]]) -> None:
        self.per_gpu = per_gpu
        self.asked: list[int] = []

    def pid_vidmem(self, minor: int) -> dict[int, int]:
        self.asked.append(minor)
        return self.per_gpu.get(minor, {})


def test_reconciler_sums_gpus_and_kills_once_per_breach():
    rm = FakeRm({0: {7: 3 * MIB, 8: MIB}, 1: {7: 2 * MIB}})
    killed: list[int] = []
    s = [R.Slice("a", 4 * MIB, 4 * MIB, frozenset({7, 8}), frozenset({0, 1}))]
    rec = R.Reconciler(rm, lambda: s, kill=lambda pid, _t: killed.append(pid) or True)
    (k,) = rec.poll()
    assert killed == [7] and k.breach.rm_bytes == 6 * MIB and sorted(set(rm.asked)) == [0, 1]
    assert rec.summary()["kills"] == 1 and rec.summary()["last"]["pid"] == 7
    rm.per_gpu = {0: {8: MIB}}
    assert rec.poll() == [] and killed == [7]


def test_kill_refuses_a_pid_that_started_after_it_was_listed():
    p = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        before = R._boot_ticks_now() - 1000  # "first listed" long before this process started
        assert not R.kill_process(p.pid, before)
        assert p.poll() is None
        assert R.kill_process(p.pid, R._boot_ticks_now())
        assert p.wait(timeout=5) == -9
    finally:
        p.kill()
        p.wait()


def test_environ_slices_read_the_limit_as_the_library_does(tmp_path) -> None:
    """GPUSLICE_MEM_LIMIT=4G is 4GiB to the preload library (preload/report.c): the guard
    must hold that limit, not gpuctl's --memory 4G (4*10^9), nor skip a bare 4096."""
    import subprocess
    import sys

    from gpuslice.sched.reconcile import environ_slices

    lib = tmp_path / "libgpuslice.so"  # not loadable: ld.so says so and goes on
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stderr=subprocess.DEVNULL,
                              env={"LD_PRELOAD": str(lib), "GPUSLICE_MEM_LIMIT": limit,
                                   "GPUSLICE_INSTANCE": f"t{i}-{tmp_path.name}"})
             for i, limit in enumerate(("4G", "4096", "0=8G,1=4M"))]
    try:
        import time

        time.sleep(0.3)
        got = {s.name.split("/")[0]: s.limit for s in environ_slices([0])()
               if s.name.endswith(tuple(f"/{p.pid}" for p in procs))}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert got == {f"t0-{tmp_path.name}": 4 << 30, f"t1-{tmp_path.name}": 4096, f"t2-{tmp_path.name}": 8 << 30}

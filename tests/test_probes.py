"""Activity probes (pyctl/gpuslice/sched/probes.py): the CPU probe's decisions on scripted CPU
clocks and NVML samples, and on real processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpuslice.sched.probes import CpuProbe, process_cpu_ns
from gpuslice.sched.sources import Channel

PERIOD = 0.05


class FakeNvml:
    """The two NvmlProbe methods CpuProbe uses, fed by the test."""

    hold_s = 2.5

    def __init__(self) -> None:
        self.samples: list[tuple[int, float]] = []

    def watch(self, chans) -> None:
        pass

    def busy_samples(self, since: float) -> list[tuple[int, float]]:
        return [(p, t) for p, t in self.samples if t > since]

    def busy_pids(self, now: float) -> set[int]:
        return {p for p, t in self.samples if now - t <= self.hold_s}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.cpu: dict[int, int] = {}
        self.rate: dict[int, float] = {}  # fraction of a CPU each pid uses

    def advance(self, dt: float = PERIOD) -> None:
        self.now += dt
        for pid, r in self.rate.items():
            self.cpu[pid] = self.cpu.get(pid, 0) + int(r * dt * 1e9)

    def read(self, pid: int) -> int | None:
        return self.cpu.get(pid)


def chans(**pids: int) -> dict[str, set[Channel]]:
    return {n: {Channel(0, 0xC1000000 + pid, 0x5C000000, pid)} for n, pid in pids.items()}


def run(probe: CpuProbe, clk: Clock, periods: int, ch) -> set[str]:
    got: set[str] = set()
    for _ in range(periods):
        clk.advance()
        got = probe.active(ch)
    return got


def make(nvml=None) -> tuple[CpuProbe, Clock]:
    clk = Clock()
    return CpuProbe(threshold=0.25, nvml=nvml, read_cpu=clk.read, clock=lambda: clk.now), clk


def test_new_process_is_active_then_judged_by_its_cpu() -> None:
    probe, clk = make()
    clk.rate = {1: 1.0, 2: 0.01}
    ch = chans(a=1, b=2)
    clk.advance()
    assert probe.active(ch) == {"a", "b"}  # first sight: both get a slot
    assert run(probe, clk, 1, ch) == {"a"}  # one period later: b sleeps


def test_reacts_within_one_period_both_ways() -> None:
    probe, clk = make()
    clk.rate = {1: 1.0, 2: 1.0}
    ch = chans(a=1, b=2)
    assert run(probe, clk, 3, ch) == {"a", "b"}
    clk.rate[2] = 0.02  # b goes idle
    assert run(probe, clk, 1, ch) == {"a"}
    clk.rate[2] = 0.9  # and busy again
    assert run(probe, clk, 1, ch) == {"a", "b"}


def test_threshold_is_a_fraction_of_one_cpu_summed_over_threads() -> None:
    probe, clk = make()
    clk.rate = {1: 0.24, 2: 0.26, 3: 3.0}
    assert run(probe, clk, 2, chans(a=1, b=2, c=3)) == {"b", "c"}


def test_instance_is_active_if_any_of_its_processes_is() -> None:
    probe, clk = make()
    clk.rate = {1: 0.0, 2: 0.5}
    ch = {"a": {Channel(0, 1, 10, 1), Channel(0, 2, 20, 2)}, "b": {Channel(0, 3, 30, 3)}}
    clk.rate[3] = 0.0
    assert run(probe, clk, 2, ch) == {"a"}


def test_gone_process_is_not_active_and_forgotten() -> None:
    probe, clk = make()
    clk.rate = {1: 1.0}
    ch = chans(a=1)
    assert run(probe, clk, 2, ch) == {"a"}
    del clk.cpu[1], clk.rate[1]
    assert run(probe, clk, 1, ch) == set()
    assert probe._procs == {}


def test_busy_process_without_nvml_samples_stays_active() -> None:
    """NVML's per-process samples alias with the slot rotation (on the H100 they named the
    same gated workload for seconds): a process on the CPU stays active however long NVML
    has no GPU sample of it."""
    nv = FakeNvml()
    probe, clk = make(nv)
    clk.rate = {1: 1.0, 2: 1.0}
    ch = chans(seen=1, unseen=2)
    for _ in range(int(3 * nv.hold_s / PERIOD)):
        clk.advance()
        nv.samples.append((1, clk.now - 0.01))
        got = probe.active(ch)
    assert got == {"seen", "unseen"}


def test_blocking_sync_process_is_judged_by_nvml() -> None:
    nv = FakeNvml()
    probe, clk = make(nv)
    clk.rate = {1: 0.01}  # off the CPU while its GPU work runs
    ch = chans(a=1)
    assert run(probe, clk, 2, ch) == set()
    run(probe, clk, int(2.0 / PERIOD) + 1, ch)  # off the CPU for two seconds
    nv.samples.append((1, clk.now))  # ... yet NVML sees it on the GPU
    assert run(probe, clk, 1, ch) == {"a"}
    clk.advance(nv.hold_s + 0.1)  # no sample within the hold: idle
    assert probe.active(ch) == set()


def test_late_nvml_sample_of_a_process_that_just_paused_does_not_flag_it() -> None:
    """NVML reports a busy sample some time after the fact: a process that paused less than
    two seconds before the sample stays CPU-judged (else a paused workload would be held
    active for the whole NVML hold)."""
    nv = FakeNvml()
    probe, clk = make(nv)
    clk.rate = {1: 1.0}
    ch = chans(a=1)
    assert run(probe, clk, 4, ch) == {"a"}
    clk.rate[1] = 0.0
    assert run(probe, clk, 1, ch) == set()
    nv.samples.append((1, clk.now))  # stale busy sample 1 period after the pause
    assert run(probe, clk, 1, ch) == set()
    assert not probe._procs[1].low_cpu_gpu


def test_process_cpu_ns_of_real_processes() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        a0, b0 = process_cpu_ns(spin.pid), process_cpu_ns(sleep.pid)
        time.sleep(0.5)
        a1, b1 = process_cpu_ns(spin.pid), process_cpu_ns(sleep.pid)
        assert a0 is not None and a1 is not None and b0 is not None and b1 is not None
        assert a1 - a0 > 10 * (b1 - b0 + 1_000_000)  # the spinner ran, the sleeper did not
        probe = CpuProbe(threshold=0.05)
        ch = chans(spin=spin.pid, sleep=sleep.pid)
        probe.active(ch)
        time.sleep(0.5)
        assert probe.active(ch) == {"spin"}
    finally:
        spin.kill()
        sleep.kill()
        spin.wait()
        sleep.wait()
    assert process_cpu_ns(spin.pid) is None


def test_cli_accepts_the_cpu_probe() -> None:
    from click.testing import CliRunner

    from gpuslice.cli import main

    r = CliRunner().invoke(main, ["daemon", "--help"])
    assert r.exit_code == 0 and "cpu" in r.output
    r = CliRunner().invoke(main, ["daemon", "--probe", "gpu-magic"])
    assert r.exit_code != 0


@pytest.mark.parametrize("kind", ["cpu", "auto"])
def test_make_probe_cpu_without_nvml(kind: str) -> None:
    from gpuslice import cli

    p = cli._make_probe(kind)
    assert isinstance(p, CpuProbe)


def _tracker_with(chans: dict[str, list[Channel]], clock):
    from gpuslice.sched.sources import EventTracker

    tr = EventTracker(clock=clock)
    for name, cs in chans.items():
        for c in cs:
            tr.apply({"event": 3, "name": name, "pid": c.pid, "client": c.client, "handle": c.handle, "gpu": c.gpu})
    return tr


def test_submit_probe_is_busy_for_the_hold_after_each_report() -> None:
    from gpuslice.sched.probes import SubmitProbe

    now = [0]
    a1, a2, b1 = Channel(0, 1, 10, 100), Channel(0, 1, 11, 100), Channel(0, 2, 20, 200)
    tr = _tracker_with({"a": [a1, a2], "b": [b1]}, lambda: now[0])
    p = SubmitProbe(tr, hold_s=0.3, clock=lambda: now[0])
    chans = tr.channels()
    assert p.active(chans) == {"a", "b"}  # first seen: a slot before the first report
    now[0] = 400_000_000
    assert p.active(chans) == set()  # nothing submitted since
    tr.apply({"event": 9, "client": 1, "handle": 11, "pid": 100})  # a's second channel submits
    tr.apply({"event": 9, "client": 9, "handle": 99, "pid": 900})  # unknown channel: ignored
    assert p.active(chans) == {"a"}
    now[0] = 700_000_000
    assert p.active(chans) == {"a"}  # exactly the hold later: still
    now[0] = 700_000_001
    assert p.active(chans) == set()
    tr.apply({"event": 4, "client": 1, "handle": 11})  # deleted: its report goes with it
    assert (1, 11) not in tr.work_seen()


def test_make_probe_submit_needs_the_preload_source(tmp_path) -> None:
    from gpuslice import cli
    from gpuslice.cli import GpuctlError
    from gpuslice.sched.probes import AnyOf, SubmitProbe
    from gpuslice.sched.sources import PreloadSource

    with pytest.raises(GpuctlError):
        cli._make_probe("submit", None)
    src = PreloadSource(str(tmp_path / "p.sock"))
    try:
        assert isinstance(cli._make_probe("submit", src), SubmitProbe)
        auto = cli._make_probe("auto", src)
        assert isinstance(auto, AnyOf) and isinstance(auto.probes[0], SubmitProbe)
    finally:
        src.close()


def test_a_work_report_counts_only_for_its_own_instance() -> None:
    """CHANNEL_WORK names its instance (netlink NAME): a report naming another instance
    than the channel's is not credited to the channel."""
    now = [0]
    a1 = Channel(0, 1, 10, 100)
    tr = _tracker_with({"a": [a1]}, lambda: now[0])
    tr.apply({"event": 9, "name": "b", "client": 1, "handle": 10})
    assert (1, 10) not in tr.work_seen()
    now[0] = 5
    tr.apply({"event": 9, "name": "a", "client": 1, "handle": 10})
    assert tr.work_seen()[(1, 10)] == 5


def test_make_probe_submit_with_netlink_needs_the_modules_sampler(tmp_path, monkeypatch) -> None:
    """--source netlink reports submissions only when the module samples USERD
    (userd_sample_ms > 0): submit is refused otherwise, auto falls back to cpu."""
    from gpuslice import cli
    from gpuslice.sched import sources
    from gpuslice.cli import GpuctlError
    from gpuslice.sched.probes import AnyOf, SubmitProbe

    class FakeNetlink(sources.NetlinkSource):
        def __init__(self) -> None:  # no socket: only its type matters here
            sources.EventTracker.__init__(self)

    param = tmp_path / "userd_sample_ms"
    monkeypatch.setattr(sources, "USERD_SAMPLE_PARAM", str(param))
    monkeypatch.setattr(sources.module_reports_work, "__defaults__", (str(param),))
    src = FakeNetlink()
    with pytest.raises(GpuctlError):
        cli._make_probe("submit", src)  # no module parameter: an older module
    param.write_text("0\n")
    assert not isinstance(cli._make_probe("auto", src), AnyOf)
    param.write_text("5\n")
    assert isinstance(cli._make_probe("submit", src), SubmitProbe)
    auto = cli._make_probe("auto", src)
    assert isinstance(auto, AnyOf) and isinstance(auto.probes[0], SubmitProbe)


class _FakeGenl:
    """The calls a NetlinkSource makes of its two sockets, and an instance table that
    INSTANCE_SET fails on (ENOENT) for names it does not hold."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.sets: list[tuple[str, int, int]] = []

    def subscribe(self) -> None:
        pass

    def objects(self) -> list[dict]:
        return []

    def poll_events(self, _timeout: float, limit: int = 0) -> list[dict]:
        return []

    def instance_set(self, name: str, **attrs: int) -> None:
        import errno

        if name not in self.names:
            raise OSError(errno.ENOENT, "no such instance")
        self.sets.append((name, attrs["sample_us"], attrs["repeat_us"]))

    def close(self) -> None:
        pass


def test_the_module_is_asked_to_sample_online_instances_sooner(monkeypatch) -> None:
    """NetlinkSource.set_module_sampling (the scheduler's set_fast): INSTANCE_SET SAMPLE_US / REPEAT_US for the named instances
    (REPEAT_US held to the module's range), (0, 0) for those that leave the set, nothing
    for what is unchanged; an instance the module does not hold yet is asked again at the
    next resync; the hold the scheduler keeps follows the module's gap for those
    instances; on close the module's defaults come back."""
    from gpuslice.sched import sources

    genl = _FakeGenl({"svc", "web"})
    src = sources.NetlinkSource(_FakeGenl(set()), requests=genl)  # type: ignore[arg-type]
    slow_gap = src.report_gap_ns
    assert slow_gap >= sources.MODULE_REPORT_GAP_NS
    src.set_module_sampling({"svc", "late"}, 200, 100)
    assert genl.sets == [("svc", 200, 500)]  # repeat raised to REPEAT_US_MIN
    assert src.report_gap_ns == (500 + 2 * 200) * 1000
    src.set_module_sampling({"svc", "late"}, 200, 100)
    assert genl.sets == [("svc", 200, 500)]  # nothing new to ask
    genl.names.add("late")
    src._dump()  # the resync asks what could not be asked
    assert ("late", 200, 500) in genl.sets
    genl.sets.clear()
    src.set_module_sampling({"web"}, 200, 2500)
    assert sorted(genl.sets) == [("late", 0, 0), ("svc", 0, 0), ("web", 200, 2500)]
    genl.sets.clear()
    src.set_module_sampling({"web"}, 0, 2500)  # --online-sample 0: nobody is asked
    assert genl.sets == [("web", 0, 0)] and src.report_gap_ns == slow_gap
    src.set_fast({"svc"}, 200, 2500)  # what the scheduler calls (sched/config.py Config.tell_source)
    assert genl.sets[-1] == ("svc", 200, 2500)
    genl.sets.clear()
    src.close()
    assert genl.sets == [("svc", 0, 0)]

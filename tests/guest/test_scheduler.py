"""gpuctl daemon against the nvstub stand-in's simulated engine (guest only).

Workloads are separate processes (tests/guest/workload.py) that keep their channel busy
with NVSTUB submits; the daemon runs as its own process (`gpuctl daemon --source
nvstub_sched:NvstubSource --probe nvstub_sched:NvstubProbe`, tests/guest/nvstub_sched.py),
gating them with FIFO_DISABLE_CHANNELS from its own RM client.
Achieved share = executed_ns delta over 10 whole periods / what the engine delivers in
that time with nobody gating (measured before the daemon starts; under QEMU/TCG the
stand-in's engine executes 96-100% of wall time ungated, tests/standin/README.md).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from workload import Daemon, Workload, engine, measure, native_utilisation, next_boundary, sleep_until

from gpuslice import state as S
from gpuslice.policy import Claim, compute_shares

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/nvstub/engine"), reason="nvstub stand-in not loaded")

# What these tests assert is that the daemon gates by its policy: every scenario below is
# 17 points or more from its target when nothing gates or idle time is not handed on
# (all busy workloads then share the engine equally). How close it gets is accuracy, and
# under QEMU/TCG on a shared machine that is timing: the guest's CPU stalls for tens of ms
# now and then (CI saw 5 points in a window). Accuracy is measured and printed by
# scripts/bench-scheduler.py (docs/scheduler-bench.md), not asserted here.
TOL = 0.08
PERIOD_MS = 50


def write_state(path: Path, policy: str, insts: list[tuple[str, int, float | None]], period_ms: int = PERIOD_MS) -> None:
    st = S.State(instances={n: S.Instance(n, [0], 1 << 30, weight=w, share=f) for n, w, f in insts},
                 gpus={0: S.GpuPolicy(policy, period_ms * 1_000_000)})
    S.save(st, str(path))


def target(policy: str, insts: list[tuple[str, int, float | None]], busy: set[str]) -> dict[str, float]:
    """What each workload should execute: its share, or 0 when it has no work (under fixed
    and weight its slot then stays idle, which the other workloads' shares show)."""
    shares = compute_shares(policy, [Claim(n, w, f) for n, w, f in insts], busy)
    return {n: (s if n in busy else 0.0) for n, s in shares.items()}


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state.json"
        self.loads: list[Workload] = []
        self.daemons: list[Daemon] = []
        self.u0 = 1.0

    def start_loads(self, names: list[str], idle: set[str] = frozenset()) -> list[Workload]:  # type: ignore[assignment]
        self.loads = [Workload.start(n, busy=n not in idle) for n in names]
        return self.loads

    def native(self) -> float:
        """The engine's ungated utilisation with the busy workloads (before any daemon)."""
        self.u0 = max(0.05, native_utilisation(self.loads))
        return self.u0

    def measure(self, d: Daemon) -> dict[str, float]:
        got, _total = measure(d, self.loads)
        return {n: v / self.u0 for n, v in got.items()}

    def daemon(self, *extra: str) -> Daemon:
        d = Daemon(str(self.state), str(self.tmp / "status.json"), *extra)
        self.daemons.append(d)
        return d

    def close(self) -> None:
        for d in self.daemons:
            d.stop()
        for w in self.loads:
            w.stop()
        # nothing of ours may stay disabled
        left = [r for r in engine().values() if r.get("disabled")]
        assert not left, left


@pytest.fixture()
def rig(tmp_path: Path):
    r = Rig(tmp_path)
    yield r
    r.close()


def off(got: dict[str, float], want: dict[str, float]) -> dict[str, tuple[float, float]]:
    return {n: (round(got[n], 3), round(want[n], 3)) for n in want if abs(got[n] - want[n]) > TOL}


def assert_shares(got: dict[str, float], want: dict[str, float]) -> None:
    bad = off(got, want)
    assert not bad, f"achieved vs target beyond {TOL:.0%}: {bad} (all: {got})"


def assert_steady_shares(rig: "Rig", d: Daemon, want: dict[str, float]) -> None:
    """Steady state: within TOL over a window of 10 periods. The emulated CPU of the
    guest stalls now and then for 10-20 ms (4 points of such a window, a stall the
    correction pays back only in the next period), so a window that misses is followed by
    one more and the better one counts; both are reported when both miss."""
    first = rig.measure(d)
    if not off(first, want):
        return
    second = rig.measure(d)
    assert not off(second, want), f"achieved vs target beyond {TOL:.0%} in two windows: {off(first, want)}, " \
                                  f"then {off(second, want)} (all: {first}, {second})"


SCENARIOS = [
    ("fixed", [("a", 1, 0.3), ("b", 1, 0.5)], {"a", "b"}),
    ("fixed", [("a", 1, 0.2), ("b", 1, 0.3), ("c", 1, 0.4)], {"a", "c"}),  # b idle: its 30% stays idle
    ("weight", [("a", 1, None), ("b", 3, None)], {"a", "b"}),
    ("weight", [("a", 1, None), ("b", 2, None), ("c", 3, None)], {"a", "b"}),  # c idle: stays idle
    ("equal", [("a", 1, None), ("b", 1, None), ("c", 1, None)], {"a", "b", "c"}),
    ("equal", [("a", 1, None), ("b", 1, None), ("c", 1, None), ("d", 1, None)], {"a", "b", "d"}),
    ("burst", [("a", 1, None), ("b", 3, None)], {"a", "b"}),
    ("burst", [("a", 1, None), ("b", 2, None), ("c", 1, None)], {"a", "b"}),  # c idle: a, b share 1:2
]


@pytest.mark.parametrize("policy,insts,busy", SCENARIOS, ids=[f"{p}-{len(i)}-{''.join(sorted(b))}" for p, i, b in SCENARIOS])
def test_achieved_shares(rig: Rig, policy, insts, busy) -> None:
    write_state(rig.state, policy, insts)
    rig.start_loads([n for n, _w, _f in insts], idle={n for n, _w, _f in insts} - busy)
    rig.native()
    d = rig.daemon()
    d.wait_periods(min_periods=10)
    assert_steady_shares(rig, d, target(policy, insts, busy))


@pytest.mark.parametrize("policy", ["equal", "burst"])
def test_idle_periods_are_redistributed(rig: Rig, policy: str) -> None:
    """A workload going idle hands its time to the others (and takes it back) within two periods."""
    insts = [("a", 1, None), ("b", 3, None), ("c", 2, None)]
    write_state(rig.state, policy, insts)
    loads = rig.start_loads(["a", "b", "c"])
    rig.native()
    d = rig.daemon()
    d.wait_periods(min_periods=10)
    assert_steady_shares(rig, d, target(policy, insts, {"a", "b", "c"}))
    loads[1].stop()  # b goes idle: its process ends, a new one that submits nothing takes its place
    loads[1] = Workload.start("b", busy=False)
    time.sleep(3 * PERIOD_MS / 1000)
    assert_steady_shares(rig, d, target(policy, insts, {"a", "c"}))
    loads[1].busy(True)  # and has work again: a slot within two periods
    while engine()[loads[1].key]["pending_ns"] == 0:  # its submit lands 100+ ms later under TCG
        time.sleep(0.001)
    time.sleep(2 * PERIOD_MS / 1000)
    assert_steady_shares(rig, d, target(policy, insts, {"a", "b", "c"}))


def reaction_ns(d: Daemon, since_ns: int, want, periods: int = 20) -> tuple[int, int]:
    """Wait ``periods`` periods of the daemon's, then: how long after ``since_ns`` the
    daemon's plan first had an active set satisfying ``want`` (status.json's
    active_changes), and the period. The plan must still have it then."""
    st = d.status()
    period = st["gpus"]["0"]["period_ns"]
    sleep_until(since_ns + periods * period)
    # the daemon's own clock: a daemon starved of CPU (TCG, a loaded guest) plans late,
    # and what is asserted is which plan it made, not when the test looked
    end = time.monotonic() + 60
    while True:
        g = d.status()["gpus"]["0"]
        if g["period_start_ns"] >= since_ns + periods * period or time.monotonic() > end:
            break
        time.sleep(0.1)
    changes = g["active_changes"]
    hits = [t for t, act in changes if t > since_ns and want(set(act))]
    assert hits and want(set(changes[-1][1])), (
        f"the plan did not reach and keep the expected active set after the change at {since_ns}: "
        f"{changes}; period start {g['period_start_ns']}, instances {g['instances']}")
    return hits[0] - since_ns, period


def test_activity_reaches_the_plan(rig: Rig) -> None:
    """Under equal, a workload going idle leaves the plan's active set, and one getting work
    joins it, through the stand-in's own signal (its engine, read by the daemon's probe).
    How soon is the daemon's cadence (the probe is read once per period for the next one),
    asserted exactly with a fake clock by tests/test_scheduler.py::
    test_activity_change_reaches_the_plan; here it is timing under TCG, where a stalled
    vCPU delays the test's own view of the change by periods (this test failed 1 run in 3
    alone on a 2-period bound), so the reaction is printed, not asserted."""
    insts = [("a", 1, None), ("b", 1, None), ("c", 1, None)]
    write_state(rig.state, "equal", insts)
    loads = rig.start_loads(["a", "b", "c"])
    d = rig.daemon()
    d.wait_periods(min_periods=5)
    assert set(d.status()["gpus"]["0"]["active_changes"][-1][1]) == {"a", "b", "c"}
    gone = loads[1].key
    loads[1].proc.terminate()  # b's work ends with its process, when that closes its channel:
    t_idle = time.monotonic_ns()  # from the last moment the engine still had it
    while gone in engine():
        t_idle = time.monotonic_ns()
        time.sleep(0.001)
    loads[1].stop()
    dt_idle, period = reaction_ns(d, t_idle, lambda act: act == {"a", "c"})
    loads[1] = Workload.start("b", busy=False)  # a process with a channel and no work
    time.sleep(3 * period / 1e9)
    g = d.status()["gpus"]["0"]
    assert "b" not in {n for n, i in g["instances"].items() if i["active"]}, g["active_changes"]
    loads[1].busy(True)
    # the work arrives when the workload's submit lands (under TCG 100+ ms after the
    # signal): from the last moment the engine showed none (the earliest it can have come)
    t_busy = time.monotonic_ns()
    while engine()[loads[1].key]["pending_ns"] == 0:
        t_busy = time.monotonic_ns()
        time.sleep(0.001)
    dt_busy, _ = reaction_ns(d, t_busy, lambda act: act == {"a", "b", "c"})
    print(f"reaction in periods of {period / 1e6:.0f} ms: idle {dt_idle / period:.2f}, busy {dt_busy / period:.2f}")


def test_live_weight_and_policy_change_within_one_period(rig: Rig) -> None:
    insts = [("a", 1, None), ("b", 1, None)]
    write_state(rig.state, "weight", insts)
    loads = rig.start_loads(["a", "b"])
    u0 = rig.native()
    d = rig.daemon()
    d.wait_periods(min_periods=10)
    assert_steady_shares(rig, d, {"a": 0.5, "b": 0.5})
    # change the weight just after a period start: the next start (< 1 period later) applies it
    for policy, new, want in [("weight", [("a", 1, None), ("b", 3, None)], {"a": 0.25, "b": 0.75}),
                              ("fixed", [("a", 1, 0.6), ("b", 1, 0.2)], {"a": 0.6, "b": 0.2})]:
        b, period = next_boundary(d.status())
        sleep_until(b + period // 10)
        write_state(rig.state, policy, new)
        sleep_until(b + period)  # the very next period start
        t0 = time.monotonic_ns()
        e0 = {w.name: w.executed() for w in loads}
        sleep_until(b + 11 * period)
        wall = time.monotonic_ns() - t0
        got = {w.name: (w.executed() - e0[w.name]) / wall / u0 for w in loads}
        assert_shares(got, want)


def progressed_within(loads: list[Workload], seconds: float = 1.0) -> dict[str, bool]:
    """Did every workload execute something within ``seconds`` from now?"""
    e0 = {w.name: w.executed() for w in loads}
    end = time.monotonic() + seconds
    done = {w.name: False for w in loads}
    while time.monotonic() < end and not all(done.values()):
        for w in loads:
            if not done[w.name] and w.executed() > e0[w.name]:
                done[w.name] = True
        time.sleep(0.01)
    return done


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_daemon_never_stalls_workloads(rig: Rig, sig: int) -> None:
    """5 kills at random moments while the daemon gates two workloads (1:3, so most of the
    time one of them is disabled): each workload progresses within 1 s after the kill.
    (Each trial starts a daemon: 12 s under TCG. The H100 benchmark kills 20 of each.)"""
    write_state(rig.state, "fixed", [("a", 1, 0.2), ("b", 1, 0.3)])  # 50% idle: both gated half the time
    loads = rig.start_loads(["a", "b"])
    rng = random.Random(sig)
    failures = []
    for trial in range(5):
        d = rig.daemon()
        d.wait_periods(min_periods=1)
        time.sleep(rng.uniform(0, 3 * PERIOD_MS / 1000))
        disabled_before = sum(1 for r in engine().values() if r.get("disabled"))
        d.proc.send_signal(sig)
        ok = progressed_within(loads, 1.0)
        d.proc.wait(10)
        if not all(ok.values()):
            failures.append((trial, disabled_before, ok))
    assert not failures, failures
    time.sleep(0.5)  # the watchdog of the last SIGKILLed daemon has long re-enabled everything
    assert not [r for r in engine().values() if r.get("disabled")]


def test_restart_reenables_what_a_sigkilled_daemon_left(rig: Rig) -> None:
    """Without the watchdog a SIGKILLed daemon can leave channels disabled (the stand-in,
    unlike what docs/h100-findings.md saw on the H100, keeps them): the next daemon re-enables them
    at start, before gating again."""
    write_state(rig.state, "fixed", [("a", 1, 0.2), ("b", 1, 0.2)])
    loads = rig.start_loads(["a", "b"])
    stuck = 0
    for _ in range(5):
        d = rig.daemon("--no-watchdog")
        d.wait_periods(min_periods=2)
        # kill in the idle 60% of the period: both are disabled then
        b, period = next_boundary(d.status())
        sleep_until(b + int(period * 0.7))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        time.sleep(0.2)
        stuck += sum(1 for r in engine().values() if r.get("disabled"))
    assert stuck > 0, "expected the stand-in to keep a dead client's disables (else this test proves nothing)"
    # now with both stuck: a new daemon re-enables at start (both progress soon after it starts)
    assert any(r.get("disabled") for r in engine().values())
    write_state(rig.state, "weight", [("a", 1, None), ("b", 1, None)])
    d = rig.daemon()
    d.wait_periods(min_periods=1)
    assert all(progressed_within(loads, 1.0).values())
    d.stop(signal.SIGTERM)
    assert all(progressed_within(loads, 1.0).values())


def test_a_switch_costs_one_call_each_way_and_logs_nothing(rig: Rig) -> None:
    """Six instances under weight 1..6: whatever the number of instances, a slot switch
    is one FIFO_DISABLE_CHANNELS to disable the outgoing channels and one to enable the
    incoming ones (up to 64 channels a call), and a clean run logs no warning or error
    (the daemon logs at WARNING by default). tests/test_scheduler.py checks the same
    with a channel RM refuses (NV_ERR_INVALID_CHANNEL) and with more than 64 channels."""
    names = [f"w{k}" for k in range(6)]
    write_state(rig.state, "weight", [(n, k + 1, None) for k, n in enumerate(names)])
    rig.start_loads(names)
    d = rig.daemon()
    st = d.wait_periods(min_periods=12)
    assert st["switches"] >= 6 * 5, st["switches"]
    assert st["rm_calls"] <= 2 * st["switches"], (st["rm_calls"], st["switches"])
    d.stop()
    bad = [ln for ln in d.log_tail(500).splitlines() if any(w in ln.lower() for w in ("warning", "error", "failed"))]
    assert not bad, bad


def test_online_work_preempts_offline_work(rig: Rig) -> None:
    """Issue 14 on the stand-in's engine: an offline instance has the engine while the
    online one is idle; the online one's work is seen by the daemon's watch (every 5 ms)
    and preempts the offline one before the period ends (period 500 ms: the periodic
    plan cannot be what reacted); while it works the offline one executes nothing (no
    floor); once it is idle again the offline one gets the engine back."""
    period_ms = 500
    st = S.State(instances={"svc": S.Instance("svc", [0], 1 << 30),
                            "batch": S.Instance("batch", [0], 1 << 30, priority="offline")},
                 gpus={0: S.GpuPolicy("burst", period_ms * 1_000_000)})
    S.save(st, str(rig.state))
    svc, batch = rig.start_loads(["svc", "batch"], idle={"svc"})
    rig.native()
    d = rig.daemon("--preempt-poll", "5ms")
    d.wait_periods(min_periods=2)
    assert d.status()["gpus"]["0"]["preemptions"] == 0
    svc.busy(True)
    while engine()[svc.key]["pending_ns"] == 0:  # its submit lands 100+ ms later under TCG
        time.sleep(0.001)
    end = time.monotonic() + 30
    while d.status()["gpus"]["0"]["preemptions"] == 0 and time.monotonic() < end:
        time.sleep(0.05)
    g = d.status()["gpus"]["0"]
    assert g["preemptions"] >= 1, g
    time.sleep(0.2)
    e0 = {w.name: w.executed() for w in (svc, batch)}
    t0 = time.monotonic_ns()
    time.sleep(2.0)
    wall = time.monotonic_ns() - t0
    got = {w.name: (w.executed() - e0[w.name]) / wall / rig.u0 for w in (svc, batch)}
    assert got["batch"] <= TOL and got["svc"] >= 1 - TOL, (got, g)
    svc.stop()  # its work ends with its process; an idle one takes its place
    rig.loads[0] = svc = Workload.start("svc", busy=False)
    end = time.monotonic() + 60
    while d.status()["gpus"]["0"]["instances"]["svc"]["active"] and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(period_ms / 1000)
    e0 = batch.executed()
    t0 = time.monotonic_ns()
    time.sleep(2.0)
    back = (batch.executed() - e0) / (time.monotonic_ns() - t0) / rig.u0
    assert back >= 1 - TOL, (back, d.status()["gpus"]["0"])

"""gpuctl's command line: parsing, tables, JSON and one-line errors (no kernel needed)."""

from __future__ import annotations

import json

import pytest

from gpuslice import state as S
from gpuslice.cli import main
from gpuctl_cli import ok, runner


@pytest.fixture()
def run(tmp_path):
    return runner(tmp_path)


def one_line_error(res, needle: str) -> None:
    assert res.exit_code != 0
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("gpuctl: "), err
    assert needle in err, err
    assert res.stdout == ""


def test_create_list_show_delete(run) -> None:
    out = ok(run("instance", "create", "web", "--gpu", "0", "--memory", "8GiB", "--weight", "3"))
    assert "created web" in out and "8GiB" in out
    ok(run("instance", "create", "batch", "--memory", "512MiB", "--ceiling", "50%"))
    lst = ok(run("instance", "list"))
    lines = lst.splitlines()
    assert lines[0].split()[:4] == ["NAME", "GPUS", "MEMORY", "WEIGHT"]
    assert [ln.split()[0] for ln in lines[1:]] == ["batch", "web"]
    js = json.loads(ok(run("instance", "list", "--json")))
    assert {i["name"]: i["memory"] for i in js} == {"web": 8 << 30, "batch": 512 << 20}
    show = json.loads(ok(run("instance", "show", "web", "--json")))
    # default policy burst, weights 3 and 1 -> 75% when both busy
    assert show["share_when_all_busy"]["0"] == pytest.approx(0.75)
    assert "gpu0 share (all busy)  75.0%" in ok(run("instance", "show", "web"))
    ok(run("instance", "delete", "batch"))
    assert list(S.load(run.path).instances) == ["web"]


def test_set_and_policy(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1GiB", "--share", "30%"))
    ok(run("instance", "create", "b", "--memory", "1GiB", "--share", "50%"))
    out = ok(run("policy", "set", "fixed", "--period", "20ms", "--gpu", "0"))
    assert out.strip() == "gpu 0: fixed, period 20ms"
    st = S.load(run.path)
    assert st.policy_of(0) == S.GpuPolicy("fixed", 20_000_000)
    shown = json.loads(ok(run("policy", "show", "--json")))
    assert shown["0"]["shares_all_busy"] == pytest.approx({"a": 0.3, "b": 0.5})
    # over 100% is refused at set time, and nothing changes
    one_line_error(run("instance", "set", "b", "--share", "80%"), "110.0% > 100%")
    assert S.load(run.path).instances["b"].share == 0.5
    ok(run("instance", "set", "b", "--no-share", "--weight", "7"))
    assert S.load(run.path).instances["b"].share is None and S.load(run.path).instances["b"].weight == 7
    text = ok(run("policy", "show"))
    assert "SHARE(ALL BUSY)" in text and "70.0%" in text  # b takes what a leaves


def test_create_with_policy(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1GiB", "--gpu", "0,1", "--policy", "equal"))
    st = S.load(run.path)
    assert st.policy_of(0).policy == "equal" and st.policy_of(1).policy == "equal"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["instance", "create", "x"], "--memory"),
        (["instance", "create", "x", "--memory", "lots"], "not a size"),
        (["instance", "create", "x", "--memory", "1GiB", "--weight", "0"], "--weight"),
        (["instance", "create", "x", "--memory", "1GiB", "--share", "130%"], "share must be in"),
        (["instance", "create", "x", "--memory", "1GiB", "--weight", "2", "--share", "10%"], "mutually exclusive"),
        (["instance", "create", "x", "--memory", "1GiB", "--gpu", "a"], "not a GPU list"),
        (["instance", "create", "x", "--memory", "1GiB", "--gpu", "40"], "0..31"),
        (["instance", "create", "bad name", "--memory", "1GiB"], "bad instance name"),
        # the module's rule: a name is a directory (run-args once gave /dev/gpuslice/../nvidia0)
        (["instance", "create", "..", "--memory", "1GiB"], "bad instance name"),
        (["instance", "create", ".", "--memory", "1GiB"], "bad instance name"),
        (["instance", "create", "x", "--memory", "1GiB", "--uid", "-1"], "--uid"),
        (["instance", "create", "x", "--memory", "1GiB", "--gid", "4294967295"], "--gid"),
        (["--state", "", "instance", "list"], "empty path"),  # an unset variable, not the host's file
        (["instance", "create", "x", "--memory", "1GiB", "--mode", "999"], "octal"),
        (["instance", "show", "nope"], "no instance 'nope'"),
        (["instance", "delete", "nope"], "no instance"),
        (["instance", "set", "nope", "--weight", "2"], "no instance"),
        (["instance", "set", "nope"], "nothing to change"),
        (["policy", "set", "roundrobin"], "roundrobin"),
        (["policy", "set", "equal", "--period", "5min"], "unknown unit 'min'"),
        (["policy", "set", "equal", "--period", "100us"], "period"),
        (["bogus"], "No such command"),
        (["instance", "create", "x", "--memory", "1GiB", "--bogus"], "--bogus"),
    ],
)
def test_errors_are_one_line(run, args, needle) -> None:
    one_line_error(run(*args), needle)


def test_duplicate_and_invalid_state_file(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1GiB"))
    one_line_error(run("instance", "create", "a", "--memory", "1GiB"), "exists")
    with open(run.path, "w") as f:
        f.write('{"version": 1, "instances": {"a": {"gpus": [0], "memory": -5}}}')
    one_line_error(run("instance", "list"), "invalid state file")
    one_line_error(run("instance", "create", "b", "--memory", "1GiB"), "invalid state file")
    assert "-5" in open(run.path).read()  # never silently replaced


def test_status_and_top_without_daemon(run, tmp_path) -> None:
    ok(run("instance", "create", "a", "--memory", "1GiB"))
    sf = str(tmp_path / "status.json")
    out = ok(run("status", "--status-file", sf))
    assert out.startswith("daemon: not running") and "INSTANCE" in out
    js = json.loads(ok(run("status", "--status-file", sf, "--json")))
    assert js["daemon"] is None and js["instances"][0]["instance"] == "a"
    lines = ok(run("top", "-n", "2", "--interval", "1ms", "--json", "--status-file", sf)).splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["instances"][0]["instance"] == "a"


@pytest.mark.parametrize("content", ["{}", '{"pid": 0}', '{"pid": -1}', '{"pid": true}', '{"pid": "1"}',
                                     '{"pid": 99999999999999999999}', "[1, 2]", "null"])
def test_a_report_that_names_no_live_pid_is_no_daemon(run, tmp_path, content: str) -> None:
    """kill(0) signals our own group and kill(-1) everyone's: {} and {"pid": -1} once read
    as a running daemon (then a KeyError); a list or a huge pid was a traceback."""
    ok(run("instance", "create", "a", "--memory", "1GiB"))
    sf = tmp_path / "status.json"
    sf.write_text(content)
    out = ok(run("status", "--status-file", str(sf), "--guard-file", str(sf)))
    assert out.startswith("daemon: not running"), out
    ok(run("top", "-n", "1", "--status-file", str(sf)))


def test_status_reads_daemon_report(run, tmp_path) -> None:
    import os

    ok(run("instance", "create", "a", "--memory", "1GiB"))
    sf = tmp_path / "status.json"
    sf.write_text(json.dumps({"pid": os.getpid(), "switches": 12, "rm_calls": 30,
                              "switch_latency_ns": {"p50": 300000, "p99": 900000},
                              "gpus": {"0": {"preemptions": 7, "resumes": 6,
                                             "preempt_latency_ns": {"p50": 1200000, "p99": 4000000, "max": 5000000},
                                             "instances": {"a": {"share": 0.5, "active": True, "gated": True,
                                                                 "channels": 20,
                                                                 "engines": {"GR0": 19, "NVDEC2": 1}}}}}}))
    out = ok(run("status", "--status-file", str(sf)))
    assert "running (pid" in out and "p50 300us" in out
    assert "preempted offline instances 7 times" in out and "back 6 times" in out
    row = [ln for ln in out.splitlines() if ln.startswith("0 ")][0].split()
    assert row == ["0", "a", "burst", "online", "50.0%", "yes", "yes", "20", "GR0:19,NVDEC2:1"]


def test_help_mentions_units(run) -> None:
    out = ok(run("instance", "create", "--help"))
    assert "8Gi" in out and "30%" in out
    assert "50ms" in ok(run("policy", "set", "--help"))


def test_trace_registered() -> None:
    import importlib.util

    if importlib.util.find_spec("gpuslice.trace.live") is None:
        pytest.skip("trace.py not there")
    assert "trace" in main.commands


def test_daemon_without_device_fails_cleanly(run, tmp_path) -> None:
    """... and leaves the status file alone: it is the running daemon's (a second daemon
    that failed to start removed it), or not a report at all."""
    sf = tmp_path / "s"
    for content in ('{"pid": 1, "switches": 5}', "not a report\n"):
        sf.write_text(content)
        res = run("daemon", "--ctl", str(tmp_path / "nvidiactl"), "--no-watchdog", "--source", "preload",
                  "--preload-sock", str(tmp_path / "p.sock"), "--probe", "all", "--status-file", str(sf))
        one_line_error(res, "nvidiactl")
        assert sf.read_text() == content


def test_daemon_durations_take_zero_only_where_it_means_off(run, tmp_path) -> None:
    """--preempt-after 0 and --guard-interval 0 are accepted (off): the daemon goes on to
    fail on the missing device; 0 for a period that must run, or a bad unit, is a usage error."""
    base = ["daemon", "--ctl", str(tmp_path / "nvidiactl"), "--no-watchdog", "--source", "preload",
            "--preload-sock", str(tmp_path / "p.sock"), "--probe", "all", "--status-file", str(tmp_path / "s")]
    one_line_error(run(*base, "--preempt-after", "0", "--guard-interval", "0"), "nvidiactl")
    one_line_error(run(*base, "--preempt-after", "10ms"), "nvidiactl")
    one_line_error(run(*base, "--preempt-after", "0ms", "--guard-interval", "0.0s"), "nvidiactl")
    for bad in (["--preempt-after", "10parsecs"], ["--preempt-poll", "0"]):
        res = run(*base, *bad)
        assert res.exit_code == 2 and bad[0] in res.stderr, res.stderr


def test_daemon_online_sample_must_fit_in_the_hold(run, tmp_path) -> None:
    """--online-sample is 0 or 50us up to half of --online-hold: busy online work sampled
    less often would look quiet within the hold and let the offline work back."""
    base = ["daemon", "--ctl", str(tmp_path / "nvidiactl"), "--no-watchdog", "--source", "preload",
            "--preload-sock", str(tmp_path / "p.sock"), "--probe", "all", "--status-file", str(tmp_path / "s")]
    one_line_error(run(*base, "--online-sample", "0"), "nvidiactl")
    one_line_error(run(*base, "--online-sample", "2ms", "--online-hold", "5ms"), "nvidiactl")
    one_line_error(run(*base, "--online-sample", "3ms", "--online-hold", "5ms"), "half the --online-hold")
    one_line_error(run(*base, "--online-sample", "10us"), "--online-sample")


def test_bare_group_prints_help(run) -> None:
    res = run("instance")
    assert res.exit_code == 2 and "create" in res.stdout and res.stderr == ""


def test_guard_child_dies_with_its_parent(tmp_path):
    """The daemon's guard must not outlive a daemon killed with SIGKILL (it would keep an
    RM client open)."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import subprocess, sys, time\n"
            "from gpuslice.cli import _die_with_parent\n"
            "p = subprocess.Popen(['sleep', '60'], preexec_fn=_die_with_parent)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(")")[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the child outlived its parent")


def test_priority_online_offline(run) -> None:
    import json as _json

    ok(run("instance", "create", "svc", "--memory", "1GiB"))
    out = _json.loads(ok(run("instance", "create", "batch", "--memory", "1GiB", "--priority", "offline",
                             "--min-share", "5%", "--json")))
    assert out["priority"] == "offline" and out["min_share"] == pytest.approx(0.05)
    assert "offline (min 5.0%)" in ok(run("instance", "list"))
    one_line_error(run("instance", "create", "x", "--memory", "1GiB", "--min-share", "5%"), "--priority offline")
    one_line_error(run("instance", "set", "svc", "--min-share", "5%"), "offline")
    out = _json.loads(ok(run("instance", "set", "batch", "--priority", "online", "--json")))
    assert out["priority"] == "online" and out["min_share"] is None  # the floor goes with offline
    one_line_error(run("instance", "set", "batch", "--priority", "later"), "later")
    rows = _json.loads(ok(run("instance", "list", "--json")))
    assert {r["name"]: r["priority"] for r in rows} == {"svc": "online", "batch": "online"}


def test_memory_per_gpu(run) -> None:
    out = ok(run("instance", "create", "tp", "--gpu", "0,1", "--memory", "0=8GiB,1=4GiB"))
    assert "0=8GiB,1=4GiB" in out
    js = json.loads(ok(run("instance", "show", "tp", "--json")))
    assert js["gpu_memory"] == {"0": 8 << 30, "1": 4 << 30} and js["memory"] == 8 << 30
    text = ok(run("instance", "show", "tp"))
    assert "gpu0 memory" in text and "gpu1 memory" in text and "4GiB" in text
    ok(run("instance", "create", "even", "--gpu", "0,1", "--memory", "2GiB"))
    assert json.loads(ok(run("instance", "show", "even", "--json")))["gpu_memory"] == {"0": 2 << 30, "1": 2 << 30}
    one_line_error(run("instance", "create", "bad", "--gpu", "0,1", "--memory", "0=8GiB"), "names GPU 0 but")
    one_line_error(run("instance", "create", "bad", "--gpu", "0", "--memory", "0=1GiB,0=2GiB"), "twice")
    one_line_error(run("instance", "set", "tp", "--memory", "0=1GiB,2=1GiB"), "names GPUs 0,2")
    assert S.load(run.path).instances["tp"].gpu_memory == {0: 8 << 30, 1: 4 << 30}  # nothing lost
    ok(run("instance", "set", "tp", "--memory", "0=1GiB,1=3GiB"))
    assert S.load(run.path).instances["tp"].gpu_memory == {0: 1 << 30, 1: 3 << 30}
    ok(run("instance", "set", "tp", "--memory", "6GiB"))
    i = S.load(run.path).instances["tp"]
    assert i.gpu_memory is None and i.memory_of(1) == 6 << 30

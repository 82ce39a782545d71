"""A new user's review of gpuctl, each finding pinned: exit statuses (usage errors 2,
state conflicts 1), messages that say what to do, values refused at the door, tables
and JSON that agree, and warnings for what a command does beyond its instance."""

from __future__ import annotations

import json

import pytest

from gpuslice import state as S
from gpuctl_cli import ok, runner


@pytest.fixture()
def run(tmp_path):
    return runner(tmp_path)


def error(res, code: int, needle: str) -> str:
    assert res.exit_code == code, (res.exit_code, res.stderr)
    err = res.stderr
    assert err.startswith("gpuctl: ") and err.count("\n") == 1, err
    assert needle in err, err
    return err


# ---- 1: exit statuses -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bad/name", "..", "x" * 32])
def test_a_bad_name_is_a_usage_error(run, name: str) -> None:
    error(run("instance", "create", name, "--memory", "8Gi"), 2, f"bad instance name {name!r}")
    assert not S.load(run.path).instances


def test_a_floor_that_leaves_online_nothing_is_a_usage_error(run) -> None:
    error(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", "--min-share", "100%"), 2,
          "--min-share 100%: must leave online work at least 1% (at most 99%)")
    ok(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline"))
    error(run("instance", "set", "a", "--min-share", "99.5%"), 2, "--min-share 99.5%: must leave online work")


def test_floors_over_99_across_instances_stay_a_state_conflict(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", "--min-share", "60%"))
    error(run("instance", "create", "b", "--memory", "1Gi", "--priority", "offline", "--min-share", "60%"), 1,
          "offline floors (min_share) sum to 120.0%")


def test_fixed_shares_over_100_across_instances_stay_a_state_conflict(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi", "--share", "70%"))
    ok(run("instance", "create", "b", "--memory", "1Gi", "--share", "70%"))
    error(run("policy", "set", "fixed", "--gpu", "0"), 1, "gpu 0: fixed shares sum to 140.0% > 100%")
    assert S.load(run.path).policy_of(0).policy == "burst"


def test_the_exit_status_rule_is_written_down() -> None:
    from gpuslice.cli import common

    doc = common.__doc__ or ""
    assert "exit 2" in doc and "exit 1" in doc and "other instances" in doc


# ---- 2: messages ------------------------------------------------------------------------------

def test_per_gpu_memory_for_other_gpus_names_the_instances_gpus(run) -> None:
    error(run("instance", "create", "a", "--memory", "0=8Gi,1=4Gi", "--gpu", "0"), 2,
          "--memory 0=8Gi,1=4Gi: names GPUs 0,1 but the instance is on GPU 0 only (--gpu)")
    error(run("instance", "create", "a", "--memory", "0=8Gi", "--gpu", "0,1"), 2,
          "--memory 0=8Gi: names GPU 0 but the instance is on GPUs 0,1 (--gpu)")


def test_a_bad_period_suggests_periods_that_are_valid(run) -> None:
    err = error(run("policy", "set", "burst", "--period", "abc"), 2, "--period abc: not a duration")
    assert "500us" not in err and "50ms" in err, err


def test_cdi_generate_without_instances_writes_nothing_and_says_so(run, tmp_path) -> None:
    out = str(tmp_path / "nonexistent" / "dir" / "x.yaml")
    res = run("cdi", "generate", "--output", out)
    assert res.exit_code == 0 and res.stdout == "no instances: nothing written\n", (res.stdout, res.stderr)
    assert json.loads(ok(run("cdi", "generate", "--output", out, "--json")))["removed"] is False
    old = tmp_path / "old.yaml"
    ok(run("instance", "create", "a", "--memory", "1Gi"))
    ok(run("cdi", "generate", "--output", str(old)))
    ok(run("instance", "delete", "a"))
    assert ok(run("cdi", "generate", "--output", str(old))) == (
        f"no instances: nothing written; {old} removed (a CDI spec needs a device)\n")
    assert not old.exists()


def test_exporter_port_in_use_names_the_address(run) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = error(run("exporter", "--listen", f"127.0.0.1:{port}", "--no-nvml"), 1,
                    f"cannot listen on 127.0.0.1:{port}: Address already in use")
    assert "--listen" in err and "[Errno" not in err, err


def test_restore_says_it_needs_the_module_whatever_kernel_says(run) -> None:
    error(run("instance", "restore"), 2,
          "instance restore needs the gpuslice module whatever --kernel says: it creates the instances there "
          "(drop --kernel no)")


# ---- 3: values refused at the door ------------------------------------------------------------

@pytest.mark.parametrize("memory", ["1B", "0.1B", "8K", "1023Ki", "0=8Gi,1=4K"])
def test_a_limit_below_1mib_is_refused(run, memory: str) -> None:
    gpus = ["--gpu", "0,1"] if "=" in memory else []
    error(run("instance", "create", "a", "--memory", memory, *gpus), 2,
          "below 1MiB: a CUDA context alone needs more")
    assert not S.load(run.path).instances


@pytest.mark.parametrize("memory", ["99999Ti", "1025Ti", "2PB" if False else "1126TB"])
def test_a_limit_above_1pib_is_refused(run, memory: str) -> None:
    error(run("instance", "create", "a", "--memory", memory), 2, "above 1PiB")


@pytest.mark.parametrize("memory,size", [("1Mi", 1 << 20), ("1024Ti", 1 << 50), ("2M", 2_000_000)])
def test_limits_at_the_bounds_are_taken(run, memory: str, size: int) -> None:
    ok(run("instance", "create", "a", "--memory", memory))
    assert S.load(run.path).instances["a"].memory == size


def test_set_refuses_a_tiny_limit_too(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi"))
    error(run("instance", "set", "a", "--memory", "8K"), 2, "--memory 8K: below 1MiB")


@pytest.mark.parametrize("mode", ["0700", "0770", "0661", "0777", "0100", "7"])
def test_a_mode_with_execute_bits_is_refused(run, mode: str) -> None:
    error(run("instance", "create", "a", "--memory", "1Gi", "--mode", mode), 2,
          f"--mode {mode}: has execute bits")


@pytest.mark.parametrize("mode", ["0000", "0400", "0200", "0060", "0466"])
def test_a_mode_that_gives_the_owner_no_read_and_write_is_refused(run, mode: str) -> None:
    error(run("instance", "create", "a", "--memory", "1Gi", "--mode", mode), 2,
          f"--mode {mode}: gives the owner no read and write")


@pytest.mark.parametrize("mode", ["0666", "0606", "0664"])
def test_a_mode_for_others_is_taken_with_a_warning(run, mode: str) -> None:
    res = run("instance", "create", "a", "--memory", "1Gi", "--mode", mode)
    assert res.exit_code == 0, res.stderr
    assert (f"gpuctl: warning: --mode {mode} lets other users open the nodes: only the module's "
            "require_device_cgroup=Y then keeps host processes out") in res.stderr, res.stderr
    assert S.load(run.path).instances["a"].mode == int(mode, 8)


def test_mode_help_tells_the_new_rule(run) -> None:
    text = " ".join(ok(run("instance", "create", "--help")).split())
    assert "require_device_cgroup" in text and "execute" in text


# ---- 4: tables and --json agree -----------------------------------------------------------------

def test_list_json_has_the_per_gpu_limits(run) -> None:
    ok(run("instance", "create", "a", "--memory", "0=8GiB,1=4GiB", "--gpu", "0,1"))
    (a,) = json.loads(ok(run("instance", "list", "--json")))
    assert a["memory"] == 8 << 30  # kept: the largest, as before
    assert a["memory_per_gpu"] == {"0": 8 << 30, "1": 4 << 30}


def test_show_json_rounds_shares(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi", "--share", "99%", "--policy", "fixed"))
    ok(run("instance", "create", "b", "--memory", "1Gi"))
    out = ok(run("instance", "show", "b", "--json"))
    assert "0.010000000000000009" not in out
    assert json.loads(out)["share_when_all_busy"] == {"0": 0.01}
    shown = ok(run("policy", "show", "--json"))
    assert json.loads(shown)["0"]["shares_all_busy"] == {"a": 0.99, "b": 0.01}, shown


@pytest.mark.parametrize("n,text", [(16 * 10**9, "16GB"), (2 * 10**6, "2MB"), (10**12, "1TB"), (8 << 30, "8GiB"),
                                    (1536 << 20, "1.5GiB"), (1000 << 20, "1000MiB"), (4096, "4KiB"),
                                    (2 * 10**9 + 1, "1.9GiB")])
def test_sizes_show_decimal_units_where_exact(n: int, text: str) -> None:
    from gpuslice import units

    assert units.format_size(n) == text


def test_a_decimal_limit_shows_as_written(run) -> None:
    out = ok(run("instance", "create", "a", "--memory", "16G"))
    assert "16GB" in out and "14.9GiB" not in out
    assert "16GB" in ok(run("instance", "list"))


def test_set_says_what_it_did(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi"))
    out = ok(run("instance", "set", "a", "--weight", "3"))
    lines = out.splitlines()
    assert lines[0] == "updated a" and lines[1].split()[:4] == ["NAME", "GPUS", "MEMORY", "WEIGHT"], out
    assert lines[2].split()[:4] == ["a", "0", "1GiB", "3"], out


# ---- 5: policy set --help ---------------------------------------------------------------------

def test_period_help_says_the_gpus_period_is_kept(run) -> None:
    text = " ".join(ok(run("policy", "set", "--help")).split())
    assert "default: keep the GPU's period (50ms for a new GPU)" in text, text
    ok(run("policy", "set", "burst", "--period", "20ms", "--gpu", "0"))
    ok(run("policy", "set", "equal", "--gpu", "0"))
    assert S.load(run.path).policy_of(0).period_ns == 20_000_000


# ---- 6: no driver files -----------------------------------------------------------------------

NO_DRIVER = ("gpuctl: warning: no NVIDIA driver files found on this host: containers will get no libcuda "
             "(is the driver installed?)")


def test_cdi_generate_without_driver_files_warns(run, tmp_path, monkeypatch) -> None:
    from gpuslice.ops import cdi

    monkeypatch.setattr(cdi, "scan_host", lambda *a, **k: [])
    ok(run("instance", "create", "a", "--memory", "1Gi"))
    res = run("cdi", "generate")
    assert res.exit_code == 0 and NO_DRIVER in res.stderr.splitlines(), res.stderr
    res = run("cdi", "generate", "--output", str(tmp_path / "x.yaml"))
    assert res.exit_code == 0 and NO_DRIVER in res.stderr.splitlines(), res.stderr


def test_cdi_generate_with_driver_files_does_not_warn(run, monkeypatch) -> None:
    from gpuslice.ops import cdi

    monkeypatch.setattr(cdi, "scan_host", lambda *a, **k: ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"])
    monkeypatch.setattr(cdi, "driver_files", lambda listing: list(listing))
    ok(run("instance", "create", "a", "--memory", "1Gi"))
    res = run("cdi", "generate")
    assert res.exit_code == 0 and "no NVIDIA driver files" not in res.stderr, res.stderr


def test_doctor_warns_for_a_spec_without_driver_files(tmp_path) -> None:
    from gpuslice.ops import cdi
    from gpuslice.ops import doctor as D

    path = str(tmp_path / "gpuslice.yaml")
    spec = cdi.build_spec([cdi.Instance("web", (0,))], [])
    cdi.write_spec(path, cdi.render(spec))
    c = D.check_cdi(path, lambda: spec)
    assert c.status == D.WARN and "no NVIDIA driver files" in c.message and "libcuda" in c.message, c


# ---- 7: instance create --policy changes the GPU's --------------------------------------------

def test_create_with_a_new_policy_is_refused_for_the_other_instances_unless_forced(run) -> None:
    """A policy is the GPU's: `instance create --policy` switches it only where no other
    instance runs under it, or with --force (warned); `policy set` is the command for it."""
    ok(run("instance", "create", "a", "--memory", "1Gi"))
    ok(run("instance", "create", "b", "--memory", "1Gi", "--gpu", "0,1"))
    error(run("instance", "create", "c", "--memory", "1Gi", "--policy", "equal"), 1,
          "gpu 0: --policy equal would switch a, b from burst to equal: set the GPU's policy with "
          "`gpuctl policy set equal --gpu 0`, or add --force")
    assert S.load(run.path).policy_of(0).policy == "burst" and "c" not in S.load(run.path).instances
    res = run("instance", "create", "c", "--memory", "1Gi", "--policy", "equal", "--force")
    assert res.exit_code == 0, res.stderr
    assert ("gpuctl: warning: gpu 0: --policy equal replaces burst for every instance of the GPU, also a, b "
            "(--force)" in res.stderr.splitlines()), res.stderr
    assert S.load(run.path).policy_of(0).policy == "equal"


def test_create_with_the_same_policy_or_on_an_empty_gpu_does_not_warn(run) -> None:
    res = run("instance", "create", "a", "--memory", "1Gi", "--policy", "equal")
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    res = run("instance", "create", "b", "--memory", "1Gi", "--policy", "equal")
    assert res.exit_code == 0 and res.stderr == "", res.stderr

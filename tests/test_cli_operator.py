"""gpuctl's surprises for an operator, each found once and pinned here: units that mean
something else than in Kubernetes, shares and durations, node attributes lost at a
restore, contradictory settings accepted without a word, an offline share of 0% with
no reason shown, an instance recorded but never made."""

from __future__ import annotations

import json

import pytest

from gpuslice import state as S
from gpuctl_cli import ok, runner


class FakeNetlink:
    """The part of GpusliceNetlink that instance create, set, delete and restore use."""

    def __init__(self) -> None:
        self.made: dict[str, dict[str, object]] = {}

    def instance_new(self, name: str, gpu_mask: int, mem_limit: int, **attrs: object) -> None:
        self.made[name] = {"gpu_mask": gpu_mask, "mem_limit": mem_limit, **attrs}

    def instance_set(self, name: str, **attrs: object) -> None:
        self.made[name].update(attrs)

    def instance_del(self, name: str) -> None:
        del self.made[name]

    def instances(self, name: str | None = None) -> list[dict[str, object]]:
        return [{"name": n} for n in self.made]


@pytest.fixture()
def run(tmp_path):
    return runner(tmp_path)


def usage_error(res, message: str) -> None:
    """Exit status 2 (a usage error, as click's own) and exactly ``message``, one line."""
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert res.stderr == f"gpuctl: {message}\n"
    assert res.stdout == ""


def warnings(res) -> list[str]:
    return [ln.removeprefix("gpuctl: warning: ") for ln in res.stderr.splitlines()]


# ---- 1: sizes are Kubernetes quantities ---------------------------------------------------

def test_memory_without_a_unit_is_refused(run) -> None:
    usage_error(run("instance", "create", "a", "--memory", "8"),
                "--memory 8: no unit; write 8Gi, 8GiB or 8GB (bytes: 8B)")
    assert not S.load(run.path).instances


@pytest.mark.parametrize("memory,size", [("8Gi", 8 << 30), ("8GiB", 8 << 30), ("8G", 8 * 10**9), ("8GB", 8 * 10**9),
                                         ("512Mi", 512 << 20), ("1048576B", 1 << 20)])
def test_memory_is_a_kubernetes_quantity(run, memory: str, size: int) -> None:
    ok(run("instance", "create", "a", "--memory", memory))
    assert S.load(run.path).instances["a"].memory == size


def test_per_gpu_memory_takes_quantities(run) -> None:
    ok(run("instance", "create", "tp", "--gpu", "0,1", "--memory", "0=8Gi,1=4Gi"))
    assert S.load(run.path).instances["tp"].gpu_memory == {0: 8 << 30, 1: 4 << 30}
    usage_error(run("instance", "create", "x", "--gpu", "0,1", "--memory", "0=8Gi,1=4"),
                "--memory 0=8Gi,1=4: GPU 1: no unit; write 4Gi, 4GiB or 4GB (bytes: 4B)")


def test_an_unknown_unit_lists_every_unit(run) -> None:
    res = run("instance", "create", "a", "--memory", "8X")
    assert res.exit_code == 2
    for unit in ("B", "Ki", "Mi", "Gi", "Ti", "KiB", "MiB", "GiB", "TiB", "k", "K", "M", "G", "T",
                 "kB", "KB", "MB", "GB", "TB"):
        assert f" {unit}," in res.stderr or f" {unit} " in res.stderr or f" {unit})" in res.stderr, (unit, res.stderr)


# ---- 2: shares are percent; durations have a human range and exit 2 ------------------------

@pytest.mark.parametrize("opt", ["--share", "--ceiling"])
def test_a_bare_share_is_percent(run, opt: str) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi", opt, "30"))
    got = S.load(run.path).instances["a"]
    assert (got.share if opt == "--share" else got.ceiling) == pytest.approx(0.3)


@pytest.mark.parametrize("opt", ["--share", "--ceiling", "--min-share"])
def test_a_bare_fraction_is_refused(run, opt: str) -> None:
    usage_error(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", opt, "0.3"),
                f"{opt} 0.3: ambiguous; write 30% (or 0.3%)")


def test_min_share_is_percent_too(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", "--min-share", "5"))
    assert S.load(run.path).instances["a"].min_share == pytest.approx(0.05)


def test_period_out_of_range_is_a_usage_error_in_words(run) -> None:
    usage_error(run("policy", "set", "fixed", "--period", "20s"), "--period 20s: must be between 1ms and 10s")
    usage_error(run("policy", "set", "fixed", "--period", "500us"), "--period 500us: must be between 1ms and 10s")
    usage_error(run("policy", "set", "fixed", "--period", "50", "--gpu", "0"), "--period 50: must be between 1ms and 10s")
    ok(run("policy", "set", "fixed", "--period", "0.05", "--gpu", "0"))
    assert S.load(run.path).policy_of(0).period_ns == 50_000_000  # a bare number is seconds ...
    assert "bare number is seconds" in " ".join(ok(run("policy", "set", "--help")).split())  # ... and said so


def test_duration_errors_name_the_option_and_exit_2(run, tmp_path) -> None:
    usage_error(run("top", "--interval", "0"), "--interval 0: must be more than 0")
    usage_error(run("top", "--interval", "5min"), "--interval 5min: unknown unit 'min'; write ns, us, ms, s, m "
                "(minutes) or h; a bare number is seconds")
    base = ["daemon", "--ctl", str(tmp_path / "nvidiactl"), "--no-watchdog", "--source", "preload",
            "--preload-sock", str(tmp_path / "p.sock"), "--probe", "all", "--status-file", str(tmp_path / "s")]
    res = run(*base, "--online-sample", "3ms", "--online-hold", "5ms")
    assert res.exit_code == 2 and res.stderr.startswith("gpuctl: --online-sample 3ms: "), res.stderr


# ---- 3: node owner, group and mode ------------------------------------------------------------

def test_uid_gid_mode_survive_a_restore(run) -> None:
    nl = FakeNetlink()
    ok(run("instance", "create", "a", "--memory", "1Gi", "--uid", "1000", "--gid", "44", "--mode", "0640",
           kernel="yes", nl=nl))
    assert {k: nl.made["a"][k] for k in ("uid", "gid", "mode")} == {"uid": 1000, "gid": 44, "mode": 0o640}
    a = S.load(run.path).instances["a"]
    assert (a.uid, a.gid, a.mode) == (1000, 44, 0o640)
    after_reboot = FakeNetlink()
    ok(run("instance", "restore", kernel="yes", nl=after_reboot))
    assert {k: after_reboot.made["a"][k] for k in ("uid", "gid", "mode")} == {"uid": 1000, "gid": 44, "mode": 0o640}
    assert "0640" in ok(run("instance", "show", "a"))


def test_the_schedulers_recreate_applies_them_too() -> None:
    from gpuslice import instances

    nl = FakeNetlink()
    instances.create_in_module(nl, S.Instance("a", [0], 1 << 30, uid=7, gid=8, mode=0o600), weight=1, share=None,
                               timeslice_us=0)
    assert {k: nl.made["a"][k] for k in ("uid", "gid", "mode")} == {"uid": 7, "gid": 8, "mode": 0o600}


@pytest.mark.parametrize("mode", ["0777", "0661", "7"])
def test_a_mode_with_execute_bits_is_refused(run, mode: str) -> None:
    usage_error(run("instance", "create", "a", "--memory", "1Gi", "--mode", mode),
                f"--mode {mode}: has execute bits: a device node is opened, never run (write e.g. 0660)")


@pytest.mark.parametrize("mode", ["0666", "0604"])
def test_a_mode_that_gives_others_the_gpu_is_warned(run, mode: str) -> None:
    """As the Kubernetes plugins' nodes (S.OWNED_NODE_MODE): the module's
    require_device_cgroup keeps host processes out, nothing else does."""
    res = run("instance", "create", "a", "--memory", "1Gi", "--mode", mode)
    assert res.exit_code == 0, res.stderr
    assert [w for w in warnings(res) if w.startswith(f"--mode {mode} lets other users open the nodes: only the "
                                                     "module's require_device_cgroup=Y")], res.stderr


@pytest.mark.parametrize("mode", ["0o660", "rw", "8", "0x1b0", "+660", "6_60", "", "01660", "4660"])
def test_a_mode_that_is_not_octal_0_to_0777_is_refused(run, mode: str) -> None:
    res = run("instance", "create", "a", "--memory", "1Gi", "--mode", mode)
    assert res.exit_code == 2 and res.stderr.startswith(f"gpuctl: --mode {mode}: "), res.stderr


def test_mode_help_says_why(run) -> None:
    assert "cgroup" in ok(run("instance", "create", "--help"))


# ---- 4: contradictory settings are warned about ---------------------------------------------

def test_min_share_above_the_ceiling_is_refused(run) -> None:
    usage_error(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", "--ceiling", "50%",
                    "--min-share", "60%"),
                "--min-share 60% is above --ceiling 50%: the floor is given in full beside online work, "
                "the ceiling caps it without")
    ok(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", "--ceiling", "50%"))
    usage_error(run("instance", "set", "a", "--min-share", "60%"),
                "--min-share 60% is above --ceiling 50%: the floor is given in full beside online work, "
                "the ceiling caps it without")


def test_a_share_ignored_by_the_policy_is_warned(run) -> None:
    res = run("instance", "create", "a", "--memory", "1Gi", "--share", "30%")
    assert res.exit_code == 0
    assert warnings(res) == ["gpu 0: a: share 30.0% is ignored under burst (only the fixed policy uses it)"]
    res = run("instance", "create", "b", "--memory", "1Gi", "--policy", "fixed", "--ceiling", "50%", "--force")
    assert res.exit_code == 0
    assert warnings(res) == ["gpu 0: --policy fixed replaces burst for every instance of the GPU, also a (--force)",
                             "gpu 0: b: ceiling 50.0% is ignored under fixed (only equal and burst cap)"]


def test_fixed_without_a_share_left_nothing_is_warned(run) -> None:
    ok(run("policy", "set", "fixed", "--gpu", "0"))
    ok(run("instance", "create", "a", "--memory", "1Gi", "--share", "100%"))
    res = run("instance", "create", "b", "--memory", "1Gi")
    assert res.exit_code == 0
    assert warnings(res) == ["gpu 0: b: gets 0% under fixed: the fixed shares of the online instances take the "
                             "whole GPU (give it a --share)"]
    res = run("instance", "set", "a", "--share", "60%")  # b gets 40% now: no warning
    assert res.exit_code == 0 and res.stderr == ""


def test_policy_set_warns_for_the_instances_of_its_gpu(run) -> None:
    ok(run("policy", "set", "fixed", "--gpu", "0,1"))
    ok(run("instance", "create", "a", "--memory", "1Gi", "--share", "30%"))
    ok(run("instance", "create", "c", "--gpu", "1", "--memory", "1Gi", "--share", "30%"))
    res = run("policy", "set", "weight", "--gpu", "0")
    assert res.exit_code == 0
    assert warnings(res) == ["gpu 0: a: share 30.0% is ignored under weight (only the fixed policy uses it)"]


def test_priority_online_dropping_the_floor_is_warned(run) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi", "--priority", "offline", "--min-share", "5%"))
    res = run("instance", "set", "a", "--priority", "online")
    assert res.exit_code == 0
    assert warnings(res) == ["a: min-share 5.0% dropped: a floor is for offline instances only"]


# ---- 5: priority is shown, and why an offline share is 0 -------------------------------------

def test_show_has_the_priority_and_why_an_offline_share_is_0(run) -> None:
    ok(run("instance", "create", "web", "--memory", "1Gi"))
    ok(run("instance", "create", "batch", "--memory", "1Gi", "--priority", "offline"))
    text = ok(run("policy", "show"))
    head = text.splitlines()[0].split()
    assert "PRIORITY" in head
    row = [ln for ln in text.splitlines() if " batch " in f" {ln} "][0]
    assert "offline" in row and "0.0% (offline: 100.0% while online is idle)" in row
    js = json.loads(ok(run("policy", "show", "--json")))
    assert js["0"]["priorities"] == {"batch": "offline", "web": "online"}
    assert js["0"]["shares_online_idle"] == {"batch": pytest.approx(1.0), "web": 0.0}
    show = ok(run("instance", "show", "batch"))
    assert "priority" in show and "offline" in show
    assert "0.0% (offline: 100.0% while online is idle)" in show
    assert json.loads(ok(run("instance", "show", "batch", "--json")))["share_when_online_idle"] == {"0": 1.0}


# ---- 6: no module, no instance (unless --kernel no) -------------------------------------------

@pytest.fixture()
def no_module(monkeypatch):
    from gpuslice import netlink

    monkeypatch.setattr(netlink, "module_loaded", lambda *a: False)


@pytest.mark.parametrize("kernel", ["auto", "yes"])
def test_create_without_the_module_fails_and_records_nothing(run, no_module, kernel: str) -> None:
    res = run("instance", "create", "a", "--memory", "1Gi", kernel=kernel)
    assert res.exit_code == 1
    assert res.stderr == ("gpuctl: gpuslice module not loaded (modprobe gpuslice), or pass --kernel no to only "
                          "record the instance\n")
    assert not S.load(run.path).instances


def test_set_and_delete_without_the_module_fail(run, no_module) -> None:
    ok(run("instance", "create", "a", "--memory", "1Gi"))  # --kernel no: only recorded
    before = open(run.path).read()
    for args in (["instance", "set", "a", "--weight", "2"], ["instance", "delete", "a"]):
        res = run(*args, kernel="auto")
        assert res.exit_code == 1 and "gpuslice module not loaded (modprobe gpuslice)" in res.stderr, res.stderr
    assert open(run.path).read() == before
    ok(run("instance", "list", kernel="auto"))  # reading needs no module
    ok(run("instance", "delete", "a"))


# ---- instance handover ------------------------------------------------------------------------

class HandoverNetlink(FakeNetlink):
    """INSTANCE_HANDOVER's replies: the figures, or the errno of a refusal."""

    def __init__(self, refuse: dict[str, int] | None = None) -> None:
        super().__init__()
        self.refuse = refuse or {}
        self.handed: list[str] = []

    def instance_handover(self, name: str) -> dict[str, int]:
        if name in self.refuse:
            raise OSError(self.refuse[name], "refused")
        self.handed.append(name)
        return {"handover_ns": 250_000, "handover_drain_ns": 6_000, "snapshot_bytes": 4096}


def test_handover_names_each_instance_and_prints_the_pause(run) -> None:
    import errno

    nl = HandoverNetlink()
    for n in ("a", "b"):
        ok(run("instance", "create", n, "--memory", "1Gi", kernel="yes", nl=nl))
    out = ok(run("instance", "handover", "a", kernel="yes", nl=nl))
    assert nl.handed == ["a"]
    assert out.splitlines()[0].split() == ["NAME", "PAUSE", "DRAIN", "STATE", "RESULT"]
    assert out.splitlines()[1].split()[:3] == ["a", "0.25", "ms"] and "handed over" in out
    res = run("instance", "handover", "--all", "--json", kernel="yes", nl=nl)
    assert res.exit_code == 0, res.stderr
    assert [(r["name"], r["ok"], r["snapshot_bytes"]) for r in json.loads(res.stdout)] == [("a", True, 4096),
                                                                                         ("b", True, 4096)]
    # a busy instance keeps its core: named on stderr, exit 1, the others still handed over
    nl = HandoverNetlink(refuse={"a": errno.EBUSY})
    nl.made = {"a": {}, "b": {}}
    res = run("instance", "handover", "--all", kernel="yes", nl=nl)
    assert res.exit_code == 1 and nl.handed == ["b"]
    assert "not handed over: a: calls in flight did not finish within 100 ms" in res.stderr
    assert res.stderr.splitlines()[-1] == "gpuctl: 1 instance(s) not handed over: a"


def test_handover_usage(run) -> None:
    nl = HandoverNetlink()
    usage_error(run("instance", "handover", kernel="yes", nl=nl), "name one or more instances, or --all")
    usage_error(run("instance", "handover", "a", "--all", kernel="yes", nl=nl), "name one or more instances, or --all")
    usage_error(run("instance", "handover", "a"),
                "instance handover needs the gpuslice module whatever --kernel says (drop --kernel no)")
    res = run("instance", "handover", "zz", kernel="yes", nl=nl)
    assert res.exit_code == 1 and res.stderr == "gpuctl: no instance 'zz' in the module (instances: none)\n"
    assert nl.handed == []

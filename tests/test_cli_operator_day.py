"""An operator's day with gpuctl: a host that comes back after a reboot with a GPU gone,
commands that change only what they name, one name rule (CDI's, whatever the case), one
CDI spec kept current, and a guard that looks before it kills.

The host is tests/conftest.py's: GPUs 0-3 (``instances.DEV``), no /etc/cdi unless a test
makes one."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from gpuslice import instances
from gpuslice import state as S
from gpuslice.cli import main
from gpuslice.netlink import NetlinkError, gpus_of
from gpuslice.ops import cdi
from gpuslice.ops import doctor as D


class FakeModule:
    """The module's netlink as `instance create`, `delete`, `restore`, `cdi generate`
    and `guard` use it: INSTANCE_NEW refuses a GPU of ``missing`` with ENODEV, as
    kmod/instance.c does for a GPU without its /dev/nvidia<N>."""

    def __init__(self, missing: tuple[int, ...] = ()) -> None:
        self.missing = set(missing)
        self.made: dict[str, dict[str, Any]] = {}

    def instance_new(self, name: str, gpu_mask: int, mem_limit: int, **attrs: Any) -> None:
        if set(gpus_of(gpu_mask)) & self.missing:
            raise NetlinkError(errno.ENODEV, "gpuslice netlink cmd 1: ENODEV")
        self.made[name] = {"name": name, "gpu_mask": gpu_mask, "mem_limit": mem_limit, **attrs}

    def instance_del(self, name: str) -> None:
        del self.made[name]

    def instances(self, name: str | None = None) -> list[dict[str, Any]]:
        return [dict(d) for n, d in self.made.items() if name in (None, n)]

    def close(self) -> None:
        pass


@pytest.fixture()
def state(tmp_path: Path) -> str:
    return str(tmp_path / "state.json")


def gpuctl(state: str, *args: str, kernel: str = "no", nl: Any = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--state", state, "--kernel", kernel, *args],
                              obj={"nl": nl} if nl is not None else None,
                              env={"GPUSLICE_CDI_SPEC": None, **(env or {})})  # type: ignore[dict-item]


def record(state: str, *insts: S.Instance) -> None:
    """Instances in the state file only, as after a reboot (the module forgets them)."""
    with S.locked(state) as st:
        for i in insts:
            st.instances[i.name] = i


# ---- 1: a reboot with a GPU gone --------------------------------------------------------------

def test_restore_makes_every_instance_it_can_and_names_the_one_it_cannot(state: str, tmp_path: Path) -> None:
    """GPU 9 is gone (renumbered, removed): its instance is named with the reason in words,
    the others are made, the CDI spec lists them, and the exit status lets the daemon's
    unit (ExecStartPre) go on to start the daemon."""
    record(state, S.Instance("a", [0], 1 << 30), S.Instance("b1", [9], 1 << 30), S.Instance("c", [1], 1 << 30))
    nl = FakeModule(missing=(9,))
    spec = tmp_path / "gpuslice.yaml"
    res = gpuctl(state, "--cdi-spec", str(spec), "instance", "restore", kernel="yes", nl=nl)
    assert res.exit_code == 0, res.stderr
    assert sorted(nl.made) == ["a", "c"]
    assert res.stdout == "created a, c\nnot restored: b1\n"
    assert res.stderr == (f"gpuctl: warning: instance b1 (GPU 9) not restored: this host has no GPU 9 (no "
                          f"{instances.DEV}/nvidia9); it stays in the state file (`gpuctl instance delete b1` "
                          "forgets it)\n")
    assert "Errno" not in res.stderr and "ENODEV" not in res.stderr
    assert [d["name"] for d in yaml.safe_load(spec.read_text())["devices"]] == ["a", "c"]
    assert sorted(S.load(state).instances) == ["a", "b1", "c"]  # nothing lost
    # again: nothing more to make, b1 named again; --strict makes it an error; --json lists it
    res = gpuctl(state, "instance", "restore", "--json", kernel="yes", nl=nl)
    assert res.exit_code == 0
    assert json.loads(res.stdout) == {"created": [], "failed": [
        {"name": "b1", "gpus": [9], "reason": f"this host has no GPU 9 (no {instances.DEV}/nvidia9)"}]}
    res = gpuctl(state, "instance", "restore", "--strict", kernel="yes", nl=nl)
    assert res.exit_code == 1 and res.stderr.splitlines()[-1] == "gpuctl: 1 instance(s) not restored: b1"


def test_the_daemon_unit_runs_restore_so_that_a_refusal_does_not_stop_it() -> None:
    unit = (Path(__file__).resolve().parents[1] / "deploy/systemd/gpuslice-daemon.service").read_text()
    (line,) = [ln for ln in unit.splitlines() if ln.startswith("ExecStartPre=") and " instance restore" in ln]
    assert "--strict" not in line


def test_doctor_names_the_instances_restore_left_out(state: str, tmp_path: Path) -> None:
    record(state, S.Instance("a", [0], 1 << 30), S.Instance("b1", [9], 1 << 30))
    nl = FakeModule(missing=(9,))
    assert gpuctl(state, "instance", "restore", kernel="yes", nl=nl).exit_code == 0
    sys_module = tmp_path / "sys-module"
    sys_module.mkdir()
    c = D.check_instances(state, str(sys_module), lambda: nl, instances.DEV)
    assert c.status == D.FAIL
    assert c.message == f"1 of 2 instance(s) of {state} not in the module: b1 (GPU 9: this host has no GPU 9)"
    assert "gpuctl instance restore" in (c.fix or "") and "gpuctl instance delete NAME" in (c.fix or "")
    nl.made["b1"] = {"name": "b1", "gpu_mask": 1 << 9}
    assert D.check_instances(state, str(sys_module), lambda: nl, instances.DEV).status == D.OK
    assert D.check_instances(state, str(tmp_path / "not-loaded"), lambda: nl, instances.DEV).status == D.SKIP


def test_create_on_a_gpu_this_host_lacks_is_refused_in_one_line(state: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    res = gpuctl(state, "instance", "create", "b1", "--gpu", "9", "--memory", "1Gi")
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr == f"gpuctl: this host has no GPU 9 (GPUs: 0,1,2,3; no {instances.DEV}/nvidia9)\n"
    res = gpuctl(state, "instance", "create", "b1", "--gpu", "0,5,6", "--memory", "1Gi")
    assert res.exit_code == 1 and res.stderr.startswith("gpuctl: this host has no GPUs 5,6 (")
    assert not S.load(state).instances
    # the module's own refusal (ENODEV) is said in words too
    res = gpuctl(state, "instance", "create", "b1", "--gpu", "9", "--memory", "1Gi", kernel="yes",
                 nl=FakeModule(missing=(9,)))
    assert res.exit_code == 1
    assert res.stderr == f"gpuctl: cannot create b1 on GPU 9: this host has no GPU 9 (no {instances.DEV}/nvidia9)\n"
    assert not S.load(state).instances
    # no GPU list at all (no driver): taken, and said
    empty = tmp_path / "dev"
    empty.mkdir()
    monkeypatch.setattr(instances, "DEV", str(empty))
    res = gpuctl(state, "instance", "create", "b1", "--gpu", "9", "--memory", "1Gi")
    assert res.exit_code == 0
    assert res.stderr == (f"gpuctl: warning: GPU 9 not checked: no NVIDIA GPU nodes in {empty} (no driver loaded?); "
                          "`instance restore` will say if the host lacks it\n")
    assert list(S.load(state).instances) == ["b1"]


# ---- 2: a command changes what it names -------------------------------------------------------

def test_create_does_not_switch_the_policy_of_other_instances(state: str) -> None:
    assert gpuctl(state, "instance", "create", "c1", "--gpu", "0", "--memory", "1Gi").exit_code == 0
    res = gpuctl(state, "instance", "create", "c2", "--gpu", "0", "--memory", "1Gi", "--policy", "fixed",
                 "--share", "20%")
    assert res.exit_code == 1
    assert res.stderr == ("gpuctl: gpu 0: --policy fixed would switch c1 from burst to fixed: set the GPU's policy "
                          "with `gpuctl policy set fixed --gpu 0`, or add --force\n")
    st = S.load(state)
    assert st.policy_of(0).policy == "burst" and list(st.instances) == ["c1"]
    # on a GPU nobody else uses, --policy is the instance's own business
    assert gpuctl(state, "instance", "create", "c3", "--gpu", "1", "--memory", "1Gi", "--policy", "fixed",
                  "--share", "20%").exit_code == 0
    assert S.load(state).policy_of(1).policy == "fixed"


def test_policy_set_names_its_gpu_or_says_all(state: str) -> None:
    res = gpuctl(state, "policy", "set", "equal")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == ("gpuctl: a policy is a GPU's: name it with --gpu (e.g. --gpu 0), or give --all for every "
                          "GPU\n")
    assert not S.load(state).gpus
    res = gpuctl(state, "policy", "set", "equal", "--gpu", "1", "--all")
    assert res.exit_code == 2 and res.stderr == "gpuctl: --gpu and --all are mutually exclusive\n"
    assert gpuctl(state, "policy", "set", "weight", "--gpu", "1").exit_code == 0
    assert sorted(S.load(state).gpus) == [1]
    res = gpuctl(state, "policy", "set", "equal", "--all", "--json")
    assert res.exit_code == 0, res.stderr
    assert sorted(json.loads(res.stdout)) == ["0", "1", "2", "3"]  # the host's GPUs
    assert {g: p.policy for g, p in S.load(state).gpus.items()} == {0: "equal", 1: "equal", 2: "equal", 3: "equal"}


# ---- 3: one name rule, CDI's, whatever the case -----------------------------------------------

@pytest.mark.parametrize("name", [".x", "x-", "_x", "x.", "a:b", "-", "é"])
def test_a_name_that_is_no_cdi_device_name_is_refused(state: str, name: str) -> None:
    res = gpuctl(state, "instance", "create", name, "--memory", "1Gi")
    assert res.exit_code == 2 and res.stderr.startswith(f"gpuctl: bad instance name {name!r} (")
    assert "starting and ending with a letter or digit" in res.stderr
    assert not S.load(state).instances


def test_names_are_unique_whatever_their_case(state: str) -> None:
    assert gpuctl(state, "instance", "create", "web", "--memory", "1Gi").exit_code == 0
    for other in ("Web", "WEB"):
        res = gpuctl(state, "instance", "create", other, "--memory", "1Gi")
        assert res.exit_code == 1
        assert res.stderr == "gpuctl: instance 'web' exists: names are unique whatever their case\n"
    assert list(S.load(state).instances) == ["web"]
    assert gpuctl(state, "instance", "create", "web-1.a_B", "--memory", "1Gi").exit_code == 0


def test_a_state_file_with_old_names_still_loads(state: str) -> None:
    Path(state).write_text(json.dumps({"version": 1, "gpus": {}, "instances": {
        n: {"gpus": [0], "memory": 1 << 30, "weight": 1, "share": None, "ceiling": None}
        for n in (".x", "x-", "Web", "web")}}))
    res = gpuctl(state, "instance", "list", "--json")
    assert res.exit_code == 0, res.stderr
    assert sorted(i["name"] for i in json.loads(res.stdout)) == [".x", "Web", "web", "x-"]
    assert gpuctl(state, "instance", "delete", "x-").exit_code == 0
    assert sorted(S.load(state).instances) == [".x", "Web", "web"]


# ---- 4: one CDI spec, kept current --------------------------------------------------------------

def test_the_default_cdi_spec_is_kept_current_where_its_directory_exists(state: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    etc_cdi = tmp_path / "etc-cdi"
    default = etc_cdi / "gpuslice.yaml"
    monkeypatch.setattr(cdi, "DEFAULT_OUTPUT", str(default))
    assert gpuctl(state, "instance", "create", "web", "--memory", "1Gi").exit_code == 0
    assert not default.exists() and not etc_cdi.exists()  # no /etc/cdi: nothing written, no error
    etc_cdi.mkdir()
    assert gpuctl(state, "instance", "create", "batch", "--memory", "1Gi").exit_code == 0
    assert [d["name"] for d in yaml.safe_load(default.read_text())["devices"]] == ["batch", "web"]
    assert gpuctl(state, "instance", "delete", "web").exit_code == 0
    assert [d["name"] for d in yaml.safe_load(default.read_text())["devices"]] == ["batch"]
    # --cdi-spec (or GPUSLICE_CDI_SPEC) elsewhere: that one, the default left alone
    other = tmp_path / "other.yaml"
    assert gpuctl(state, "--cdi-spec", str(other), "instance", "create", "db", "--memory", "1Gi").exit_code == 0
    assert [d["name"] for d in yaml.safe_load(other.read_text())["devices"]] == ["batch", "db"]
    assert [d["name"] for d in yaml.safe_load(default.read_text())["devices"]] == ["batch"]
    # '' for none
    assert gpuctl(state, "--cdi-spec", "", "instance", "delete", "batch").exit_code == 0
    assert [d["name"] for d in yaml.safe_load(default.read_text())["devices"]] == ["batch"]
    assert gpuctl(state, "instance", "delete", "db").exit_code == 0
    assert not default.exists()  # no instance left: CDI refuses a spec without devices
    # what doctor checks is what the commands keep
    assert gpuctl(state, "instance", "create", "web", "--memory", "1Gi").exit_code == 0
    got = D.check_cdi(str(default), lambda: yaml.safe_load(default.read_text()))
    assert got.status in (D.OK, D.WARN) and "current" in got.message
    # a default spec that cannot be written (read-only /etc, not root): said, the change made
    default.unlink()
    default.mkdir()
    res = gpuctl(state, "instance", "create", "db", "--memory", "1Gi")
    assert res.exit_code == 0 and sorted(S.load(state).instances) == ["db", "web"]
    assert res.stderr.startswith("gpuctl: warning: ") and str(default) in res.stderr
    assert res.stderr.endswith(" (the default spec; --cdi-spec '' for none)\n") and res.stderr.count("\n") == 1
    res = gpuctl(state, "--cdi-spec", str(default), "instance", "delete", "db")  # asked for: an error
    assert res.exit_code == 1 and res.stderr.startswith("gpuctl: deleted db, but ") and str(default) in res.stderr


# ---- 5: guard --once looks, and kills only when told ----------------------------------------------

class FakeRm:
    """RM's per-process video memory: ``usage`` bytes for each pid on GPU 0."""

    def __init__(self, usage: dict[int, int]) -> None:
        self.usage = usage

    def open(self) -> "FakeRm":
        return self

    def pid_vidmem(self, minor: int) -> dict[int, int]:
        return dict(self.usage) if minor == 0 else {}

    def close(self) -> None:
        pass


def test_guard_once_is_a_dry_run_unless_told_to_kill(state: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import signal as signal_mod

    from gpuslice.sched import rm as rm_mod

    daemon_cli = importlib.import_module("gpuslice.cli.daemon")  # gpuslice.cli.daemon is also the command

    victim = subprocess.Popen(["sleep", "60"])
    try:
        nl = FakeModule()
        nl.made["a"] = {"name": "a", "gpu_mask": 1, "mem_limit": 1 << 30, "mem_used": 1 << 30, "pids": [victim.pid]}
        monkeypatch.setattr(daemon_cli, "_require_driver", lambda ctl: None)
        monkeypatch.setattr(rm_mod, "RmClient", lambda ctl: FakeRm({victim.pid: 2 << 30}))
        monkeypatch.setattr(signal_mod, "signal", lambda *a: None)  # leave pytest's handlers alone
        report = tmp_path / "guard.json"
        res = gpuctl(state, "guard", "--once", "--json", "--status-file", str(report), kernel="yes", nl=nl)
        assert res.exit_code == 0, res.stderr
        assert json.loads(res.stdout) == [{"instance": "a", "pid": victim.pid, "rm_bytes": 2 << 30,
                                           "limit": 1 << 30, "used": 1 << 30, "killed": False, "dry_run": True}]
        assert victim.poll() is None  # alive
        assert not report.exists()  # a look leaves the running guard's report alone
        text = gpuctl(state, "guard", "--once", "--status-file", str(report), kernel="yes", nl=nl)
        assert "no (dry run)" in text.stdout and victim.poll() is None
        res = gpuctl(state, "guard", "--once", "--kill", "--json", "--status-file", str(report), kernel="yes", nl=nl)
        assert res.exit_code == 0, res.stderr
        assert [r["killed"] for r in json.loads(res.stdout)] == [True]
        assert victim.wait(timeout=10) == -signal_mod.SIGKILL
        assert json.loads(report.read_text())["kills"] == 1
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()

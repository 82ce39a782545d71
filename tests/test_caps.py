"""An instance's capability set (NVIDIA_DRIVER_CAPABILITIES' names) in gpuctl: --caps on
create and set, the state file (a file without it: all), the module's CAPS attribute on
create, set and restore, `instance list`/`show`, and NVIDIA_DRIVER_CAPABILITIES in the CDI
spec."""

from __future__ import annotations

import json

import pytest

from gpuslice import netlink as N
from gpuslice import state as S
from gpuslice.ops import cdi
from gpuctl_cli import ok, runner
from test_cli_operator import FakeNetlink


@pytest.fixture()
def run(tmp_path):
    return runner(tmp_path)


def test_parse_and_text() -> None:
    assert N.parse_caps("compute,utility") == 0x3
    assert N.parse_caps("all") == N.CAPS_ALL == N.parse_caps("video,graphics,utility,compute")
    assert N.caps_text(0x5) == "compute,graphics" and N.caps_text(0xF) == "all"
    for bad in ("", "display", "compute,,x"):
        with pytest.raises(ValueError):
            N.parse_caps(bad)


def test_create_set_restore_and_list(run) -> None:
    nl = FakeNetlink()
    ok(run("instance", "create", "a", "--memory", "1Gi", "--caps", "compute,utility", kernel="yes", nl=nl))
    assert nl.made["a"]["caps"] == 0x3
    assert S.load(run.path).instances["a"].caps == 0x3
    raw = json.load(open(run.path))
    assert raw["instances"]["a"]["caps"] == "compute,utility"
    ok(run("instance", "create", "b", "--memory", "1Gi", kernel="yes", nl=nl))
    assert "caps" not in nl.made["b"]  # left out: the module gives all
    assert "caps" not in json.load(open(run.path))["instances"]["b"]  # files read the same as before
    rows = {r["name"]: r for r in json.loads(ok(run("instance", "list", "--json")))}
    assert rows["a"]["caps"] == ["compute", "utility"]
    assert rows["b"]["caps"] == ["compute", "utility", "graphics", "video"]
    table = ok(run("instance", "list"))
    assert "CAPS" in table and "compute,utility" in table
    ok(run("instance", "set", "a", "--caps", "compute,utility,video", kernel="yes", nl=nl))
    assert nl.made["a"]["caps"] == 0xB and S.load(run.path).instances["a"].caps == 0xB
    after = FakeNetlink()
    ok(run("instance", "restore", kernel="yes", nl=after))
    assert after.made["a"]["caps"] == 0xB and "caps" not in after.made["b"]
    assert "compute,utility,video" in ok(run("instance", "show", "a"))
    ok(run("instance", "set", "a", "--caps", "all"))
    assert S.load(run.path).instances["a"].caps is None


def test_a_bad_set_is_a_usage_error(run) -> None:
    res = run("instance", "create", "a", "--memory", "1Gi", "--caps", "display")
    assert res.exit_code == 2 and "unknown capability" in res.stderr
    assert not S.load(run.path).instances


def test_state_file_checks_caps(tmp_path) -> None:
    p = tmp_path / "state.json"
    p.write_text(json.dumps({"version": 1, "gpus": {}, "instances": {
        "a": {"gpus": [0], "memory": 1 << 30, "caps": "graphics"}}}))
    assert S.load(str(p)).instances["a"].caps == 0x4
    p.write_text(json.dumps({"version": 1, "gpus": {}, "instances": {
        "a": {"gpus": [0], "memory": 1 << 30, "caps": "warp"}}}))
    with pytest.raises(S.StateError):
        S.load(str(p))


def test_cdi_spec_sets_nvidia_driver_capabilities() -> None:
    spec = cdi.build_spec([cdi.Instance("a", (0,), 0x3), cdi.Instance("b", (1,))], [])
    env = {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]}
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env["a"]
    assert "NVIDIA_DRIVER_CAPABILITIES=all" in env["b"]
    assert cdi.instances_from_netlink([{"name": "a", "gpu_mask": 1, "caps": 4}]) == [cdi.Instance("a", (0,), 4)]

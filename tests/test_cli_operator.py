"""gpuctl's surprises for an operator, each found once and pinned here: units that mean
something else than in Kubernetes, shares and durations, node attributes lost at a
restore, contradictory settings accepted without a word, an offline share of 0% with
no reason shown, an instance recorded but never made."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuslice import state as S
from gpuslice.cli import main


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
    path = str(tmp_path / "state.json")

    def _run(*args: str, kernel: str = "no", nl: FakeNetlink | None = None):
        return CliRunner().invoke(main, ["--state", path, "--kernel", kernel, *args],
                                  obj={"nl": nl} if nl is not None else None)

    _run.path = path  # type: ignore[attr-defined]
    return _run


def ok(res) -> str:
    assert res.exit_code == 0, res.stderr
    return res.stdout


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
                                         ("512Mi", 512 << 20), ("4096B", 4096)])
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

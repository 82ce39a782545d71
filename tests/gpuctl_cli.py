"""Running gpuctl in-process for the CLI tests (test_cli, test_cli_operator, test_cli_review):
one state file per test, the module left out unless a test says otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from click.testing import CliRunner, Result

from gpuslice.cli import main


def runner(tmp_path: Path) -> Callable[..., Result]:
    """``run(*args, kernel="no", nl=None)``: gpuctl on ``tmp_path``'s state file
    (``run.path``); ``nl`` stands in for the module's netlink (``ctx.obj["nl"]``)."""
    path = str(tmp_path / "state.json")

    def _run(*args: str, kernel: str = "no", nl: Any = None) -> Result:
        return CliRunner().invoke(main, ["--state", path, "--kernel", kernel, *args],
                                  obj={"nl": nl} if nl is not None else None)

    _run.path = path  # type: ignore[attr-defined]
    return _run


def ok(res: Result) -> str:
    assert res.exit_code == 0, res.stderr
    return res.stdout

"""Every command's --help is what an operator needs: short (each option a line or two)
and without measurements (figures and their explanations are in docs/, e.g.
docs/policies.md, "Daemon options")."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from gpuslice.cli import main

MEASURED = re.compile(r"measured|\bH100\b|\bH200\b|\bmet \d", re.I)


def commands(group: click.Group = main, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            out += commands(cmd, (*path, name))
        else:
            out.append((*path, name))
    return out


def help_of(*path: str) -> str:
    res = CliRunner().invoke(main, [*path, "--help"], terminal_width=78)  # as on an 80-column terminal
    assert res.exit_code == 0, res.output
    return res.output


def test_daemon_help_is_short_and_has_no_figures() -> None:
    text = help_of("daemon")
    assert text.count("\n") <= 45, text
    assert not re.search(r"\d\s*%", text), text
    assert not MEASURED.search(text), text
    assert "docs/policies.md" in text  # where the rest went


@pytest.mark.parametrize("path", commands(), ids=lambda p: " ".join(p) or "gpuctl")
def test_every_help_is_short_and_has_no_measurements(path: tuple[str, ...]) -> None:
    text = help_of(*path)
    assert text.count("\n") <= 45, f"{len(text.splitlines())} lines"
    assert not MEASURED.search(text), MEASURED.search(text)

"""What the docs and the help texts say, checked against the code where a machine can:
each default a help text or the daemon's option list names is click's, the probe the
docs call the default is the daemon's, every count of supported driver releases is
nvrm_versions', the exporter's error quoted in docs/operations.md is the one it prints,
`--json` says what it replaces, and README's account of `--mode` is what `instance
create` does."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import click
import pytest
from click.testing import CliRunner

from gpuslice import nvrm_versions
from gpuslice.cli import main

REPO = Path(__file__).resolve().parent.parent
UNSET = (None, getattr(click.core, "UNSET", None))


def options() -> Iterator[tuple[str, click.Option]]:
    def walk(cmd: Any, path: str) -> Iterator[tuple[str, click.Option]]:
        for p in getattr(cmd, "params", []):
            if isinstance(p, click.Option):
                yield path, p
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}".strip())

    yield from walk(main, "")


def _has_default(p: click.Option) -> bool:
    return not (p.default in UNSET or repr(p.default).endswith("UNSET"))


def _conv(p: click.Option, text: str) -> Any:
    if p.is_flag:
        return {"on": True, "off": False}.get(text, text)
    return p.type.convert(text, p, None)


def test_every_default_a_help_text_names_is_clicks() -> None:
    """`X (default)` in a choice's help, or `(default X)` / `default: X`, where click has a
    default: the same value (a help that says 0660 while click gives 0644 would lie)."""
    checked, wrong = 0, []
    for path, p in options():
        if not p.help or not _has_default(p):
            continue
        said = re.findall(r"(\S+) \(default\)", p.help) + re.findall(r"\(default:? ([^);,]+)[);,]", p.help)
        for word in said:
            word = word.strip("`'\"")
            checked += 1
            try:
                want = _conv(p, p.default) if isinstance(p.default, str) else p.default
                if _conv(p, word) != want:
                    wrong.append(f"{path} {max(p.opts, key=len)}: help says {word}, click's default {p.default!r}")
            except click.BadParameter:
                wrong.append(f"{path} {max(p.opts, key=len)}: help's default {word!r} is not a value")
    assert wrong == [] and checked >= 1


def _daemon_doc_options() -> list[tuple[str, str]]:
    text = (REPO / "docs/policies.md").read_text()
    section = text.split("## Daemon options", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `(--[a-z-]+)(?:/--[a-z-]+)?[^`]*` \(([^)]*)\)", section, re.M)


def test_the_daemon_option_list_gives_clicks_defaults() -> None:
    """docs/policies.md, "Daemon options": each `--option` (DEFAULT; ...) against click."""
    daemon = main.commands["daemon"]
    by = {max(p.opts, key=len): p for p in daemon.params if isinstance(p, click.Option)}
    doc = _daemon_doc_options()
    assert len(doc) >= 10
    wrong = []
    for opt, paren in doc:
        p = by.get(opt)
        assert p is not None, f"docs/policies.md lists {opt}, which `gpuctl daemon` does not have"
        first = re.split(r"[;,]", paren, maxsplit=1)[0].strip().strip("`")
        if first == "none":
            if _has_default(p):
                wrong.append(f"{opt}: docs say none, click's default {p.default!r}")
            continue
        default = p.default if _has_default(p) else (False if p.is_flag else None)
        want = _conv(p, default) if isinstance(default, str) else default
        if _conv(p, first) != want:
            wrong.append(f"{opt}: docs say {first}, click's default {p.default!r}")
    assert wrong == []


def test_the_probe_the_docs_call_the_default_is_the_daemons() -> None:
    text = (REPO / "docs/policies.md").read_text().split("## Activity", 1)[1].split("\n## ", 1)[0]
    default = next(p for p in main.commands["daemon"].params if p.name == "probe").default
    called = set(re.findall(r"`(\w+)` \((?:the )?default[^)]*\)", text))
    assert called == {default}, called


def test_every_count_of_supported_releases_is_the_tables() -> None:
    n = len(nvrm_versions.supported())
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for m in re.finditer(r"\b(\d+) releases\b", doc.read_text()):
            found.append((doc.name, int(m.group(1))))
    assert found and all(c == n for _, c in found), (n, found)
    k8s = (REPO / "docs/kubernetes.md").read_text()
    assert f"{n} releases" in k8s and "driver-versions.md" in k8s


def test_the_exporter_error_in_operations_is_the_one_it_prints(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "gpuslice", "--kernel", "no", "--state", str(tmp_path / "s"),
                              "exporter", "--listen", f"127.0.0.1:{port}", "--no-nvml"],
                             capture_output=True, text=True, timeout=60,
                             env={"PYTHONPATH": str(REPO / "pyctl"), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 1, res.stderr
    line = res.stderr.strip().replace(f":{port}:", ":9410:")
    assert "Address already in use" in line
    assert f"`{line}`" in (REPO / "docs/operations.md").read_text(), line


@pytest.mark.parametrize("cmd,instead", [(["cdi", "generate"], "YAML"), (["run-args"], "one shell-quoted line")])
def test_json_help_says_what_it_replaces(cmd: list[str], instead: str) -> None:
    text = " ".join(CliRunner().invoke(main, [*cmd, "--help"]).output.split())
    assert f"Print JSON instead of {instead}" in text and "instead of a table" not in text


def test_readme_says_what_mode_does(tmp_path) -> None:
    res = CliRunner().invoke(main, ["--kernel", "no", "--state", str(tmp_path / "s"), "--cdi-spec", "",
                                    "instance", "create", "w", "--gpu", "0", "--memory", "1Gi", "--mode", "0666"])
    assert res.exit_code == 0 and "warning: --mode 0666 lets other users open the nodes" in res.output
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "refuses world-accessible bits" not in readme
    assert "bits for others (0666, as the Kubernetes plugins make their nodes) are taken with a warning" in readme

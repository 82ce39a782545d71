"""Every relative link in README.md and docs/**/*.md names a file or folder of the repository.

Markdown links `[text](target)` and reference definitions `[label]: target` outside fenced
code blocks and code spans; web, mail and in-page (`#...`) targets are not checked, and a
`#fragment` after a path is dropped before the path is looked up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODESPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of each link outside code."""
    out = []
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is not None:
            continue
        line = CODESPAN.sub("", line)
        out += [(n, t) for t in INLINE.findall(line)]
        m = REFDEF.match(line)
        if m:
            out.append((n, m.group(1)))
    return out


def broken(page: Path) -> list[str]:
    bad = []
    for n, target in links(page.read_text()):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not path:
            continue
        where = (REPO / path.lstrip("/")) if path.startswith("/") else (page.parent / path)
        if not where.exists():
            bad.append(f"{page.relative_to(REPO)}:{n}: {target}")
    return bad


def test_the_link_finder_sees_links_and_skips_code() -> None:
    text = "\n".join([
        "see [a](a.md) and [b](docs/b.md#part) and ![img](x.png \"title\")",
        "`[not](code.md)` [web](https://example.com) [here](#top)",
        "```",
        "[fenced](nope.md)",
        "```",
        "[ref]: ref/target.md",
    ])
    assert [t for _, t in links(text)] == [
        "a.md", "docs/b.md#part", "x.png", "https://example.com", "#top", "ref/target.md"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    bad = broken(page)
    assert not bad, "broken links:\n" + "\n".join(bad)

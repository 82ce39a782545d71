"""The decision core's files are layered (kmod/core/core_int.h): each file calls into its own
layer and the layers below it, never above, so the registry knows nothing of charges or
nvidia-uvm and quota nothing of the dispatch. Checked from the sources: every non-static
function or variable a core file defines, and every other core file that names it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "kmod" / "core"

# lowest first; the same as the comment at the top of core_int.h
LAYERS = [
    ("base", ["event.c", "abi.c", "nvrm_tables.c", "names.c", "activity.c"]),
    ("registry", ["registry.c"]),
    ("quota", ["quota.c"]),
    ("uvm", ["uvm.c"]),
    ("dispatch", ["core.c", "filter.c", "legacy.c", "osevent.c", "export.c", "engines.c", "virt.c"]),
    ("snapshot", ["snapshot.c"]),
    ("call", ["call.c"]),
]
LAYER = {f: i for i, (_, files) in enumerate(LAYERS) for f in files}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
# at the start of a line (kernel style: bodies are indented), not static
_FUNC = re.compile(r"^(?!static\b|extern\b|typedef\b)(?:[A-Za-z_][\w \t*]*?[\s*])?([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{",
                   re.M)
_DATA = re.compile(r"^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*=",
                   re.M)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def strip(text: str) -> str:
    """C without comments, string and character literals."""
    return _LITERAL.sub('""', _COMMENT.sub(" ", text))


def _depth0(text: str, pos: int) -> bool:
    return text.count("{", 0, pos) == text.count("}", 0, pos)


def definitions(text: str) -> set[str]:
    """The names a file defines for other files: its non-static functions and variables."""
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", text, flags=re.M)  # no macros
    return {m.group(1) for rx in (_FUNC, _DATA) for m in rx.finditer(text)
            if _depth0(text, m.start()) and not _static_above(text, m.start())}


def _static_above(text: str, pos: int) -> bool:
    """A definition whose type is on the line above: static there?"""
    above = text[:pos].rstrip("\n").rsplit("\n", 1)[-1]
    return bool(re.match(r"static\b[^;{}()=]*$", above))


def uses(sources: dict[str, str]) -> dict[tuple[str, str], set[str]]:
    """(user, definer) -> the names user takes from definer, over the stripped sources."""
    defs = {f: definitions(t) for f, t in sources.items()}
    owner = {}
    for f, names in defs.items():
        for n in names:
            owner.setdefault(n, f)
    out: dict[tuple[str, str], set[str]] = {}
    for f, t in sources.items():
        for n in set(_IDENT.findall(t)) - defs[f]:
            d = owner.get(n)
            if d and d != f:
                out.setdefault((f, d), set()).add(n)
    return out


def violations(sources: dict[str, str], layer: dict[str, int]) -> list[str]:
    return [f"{u} ({LAYERS[layer[u]][0]}) uses {d} ({LAYERS[layer[d]][0]}): {', '.join(sorted(n))}"
            for (u, d), n in sorted(uses(sources).items()) if layer[d] > layer[u]]


def core_sources() -> dict[str, str]:
    return {p.name: strip(p.read_text()) for p in sorted(CORE.glob("*.c")) if p.name in LAYER}


def test_every_core_file_has_a_layer():
    files = {p.name for p in CORE.glob("*.c")}
    assert not files - LAYER.keys(), f"kmod/core files with no layer in LAYERS (and core_int.h): {sorted(files - LAYER.keys())}"
    assert sum(len(f) for _, f in LAYERS) == len(LAYER), "a file in two layers"


def test_no_file_calls_a_layer_above_it():
    assert violations(core_sources(), LAYER) == []


def test_the_scan_sees_the_core():
    """The scan is not vacuous: it finds the definitions and the calls across files it must."""
    src = core_sources()
    defs = {f: definitions(t) for f, t in src.items()}
    assert {"gs_obj_find", "gs_obj_free_tree", "gs_busy_conflict"} <= defs["registry.c"]
    assert {"gs_mem_put", "gs_orphan_put", "gs_quota_check"} <= defs["quota.c"]
    assert {"gs_uvm_channel_freed", "gs_uvm_pre"} <= defs["uvm.c"]
    assert {"gs_evq_push", "gs_evq_flush"} <= defs["event.c"]
    assert {"gs_pre", "gs_post", "gs_inst_new"} <= defs["core.c"]
    assert "gs_export_handler" in defs["export.c"]  # a variable another file's table names
    assert not any(n.startswith("gs_list_") for n in defs["registry.c"])  # static stays out
    u = uses(src)
    assert "gs_evq_push" in u[("registry.c", "event.c")]
    assert "gs_obj_find" in u[("quota.c", "registry.c")]
    assert "gs_mem_put" in u[("uvm.c", "quota.c")]
    assert "gs_uvm_channel_freed" in u[("core.c", "uvm.c")]
    assert "gs_export_handler" in u[("filter.c", "export.c")]


def test_a_call_upwards_is_found():
    """A registry that called quota again fails, whatever lines the definition takes."""
    src = {
        "registry.c": strip("/* gs_mem_put() */\nstatic void gs_obj_release(struct gs_inst *in)\n"
                            "{\n\tgs_mem_put(in, NULL);\n}\n"),
        "quota.c": strip("void\ngs_mem_put(struct gs_inst *in,\n\t\tstruct gs_mem *mem)\n{\n"
                         "\tgs_obj_find(in, 0, 0);\n}\n"),
        "core.c": strip('static const char *s = "gs_obj_find";\n'),
    }
    src["registry.c"] += "\nstruct gs_obj *gs_obj_find(struct gs_inst *in, nv_handle c, nv_handle h)\n{\n}\n"
    src["core.c"] += strip("static nv_u32\ngs_mem_put(void)\n{\n}\n")  # its own, not quota's
    got = violations(src, {"registry.c": 1, "quota.c": 2, "core.c": 4})
    assert got == ["registry.c (registry) uses quota.c (quota): gs_mem_put"]
    assert "gs_mem_put" not in definitions(src["core.c"])
    # a name only in a comment or a string is no use
    assert ("core.c", "registry.c") not in uses(src)


def test_the_header_names_the_same_layers():
    """core_int.h's comment lists, per layer, the files LAYERS has."""
    head = next(c for c in (CORE / "core_int.h").read_text().split("*/") if "The files are layered" in c)
    names = [n for n, _ in LAYERS]
    found: dict[str, set[str]] = {}
    cur = None
    for line in head.splitlines():
        m = re.match(r"\s*\*\s{3}(\w+)\s{2,}(.*)", line)
        if m and m.group(1) in names:
            cur = m.group(1)
            found[cur] = set()
            line = m.group(2)
        elif not re.match(r"\s*\*\s{5,}\S", line):
            cur = None
        if cur:
            found[cur] |= set(re.findall(r"\b\w+\.c\b", line))
    assert list(found) == names[::-1], "core_int.h lists the layers highest first"
    assert found == {n: set(f) for n, f in LAYERS}

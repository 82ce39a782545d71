#!/usr/bin/env python3
"""The NVIDIA driver ABI gpuslice decodes, per driver version: extracted from the tagged
source of NVIDIA's open-gpu-kernel-modules, kept as data in abi/, checked against the C.

abi/manifest.tsv names every value gpuslice reads or writes: a key, the C expression
that computes it from NVIDIA's headers, and the one that computes it from ours
(kmod/core/nvrm_abi.h; `T->field` for a value that differs between versions, read from
the version's row of kmod/core/nvrm_tables.c). abi/versions/<version>.tsv holds each
key's value for that version, "absent" where the version's headers lack it.

  extract TAG [--mirror DIR]   print a tag's values (compiles a probe against its headers)
  extract --source DIR [--compare VERSION]
                               the same from an unpacked tree (a driver's /usr/src/nvidia-*),
                               or its differences from VERSION's layout
  update [--mirror DIR]        rewrite abi/versions/*.tsv for every tagged version listed
  check [--mirror DIR]         re-extract each tagged version and compare with abi/versions
  ours                         compare kmod/core (defines and each version's table row)
                               with abi/versions
  gen                          write kmod/core/nvrm_tables.c and pyctl/gpuslice/nvrm_versions.py
                               from abi/versions.tsv and abi/versions/ (--check: exit 1 if stale)
  diff A B                     the keys whose values differ between two versions

The mirror is a clone (bare or not) of github.com/NVIDIA/open-gpu-kernel-modules;
default $NVIDIA_OGKM or /work/.mirror/NVIDIA+open-gpu-kernel-modules/repo.
Exit 0 when everything agrees, 1 with one line per difference, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ABI = REPO / "abi"
MANIFEST = ABI / "manifest.tsv"
VERSIONS = ABI / "versions.tsv"
LAYOUTS = ABI / "layouts"
CORE = REPO / "kmod" / "core"
TABLES_C = CORE / "nvrm_tables.c"
TABLES_PY = REPO / "pyctl" / "gpuslice" / "nvrm_versions.py"
DEFAULT_MIRROR = "/work/.mirror/NVIDIA+open-gpu-kernel-modules/repo"

# What of a tag the probe needs: the SDK headers, the ioctl headers, nvidia-uvm's.
TAG_PATHS = [
    "src/common/sdk/nvidia/inc",
    "src/common/inc",
    "kernel-open/common/inc",
    "src/nvidia/arch/nvalloc/unix/include",
    "kernel-open/nvidia-uvm/uvm_ioctl.h",
    "kernel-open/nvidia-uvm/uvm_linux_ioctl.h",
    "kernel-open/nvidia-uvm/uvm_types.h",
]
INCLUDE_DIRS = [
    "src/common/sdk/nvidia/inc",
    "kernel-open/common/inc",
    "src/nvidia/arch/nvalloc/unix/include",
    "kernel-open/nvidia-uvm",
    "src/common/inc",
]
NV_HEADERS = [
    "nvtypes.h", "nvstatus.h", "nvos.h", "nv-ioctl.h", "nv-ioctl-numbers.h", "nv-ioctl-numa.h",
    "nvmisc.h", "nv_escape.h", "nv-unix-nvos-params-wrappers.h", "nv-chardev-numbers.h", "uvm_ioctl.h", "uvm_linux_ioctl.h",
    "alloc/alloc_channel.h",
]
ABSENT = "absent"

# struct nvrm_table's fields (kmod/core/nvrm_abi.h) and the manifest key each one holds
TABLE_FIELDS = [
    ("wait_open_complete", "NV_ESC_WAIT_OPEN_COMPLETE"),
    ("nvos46_size", "NVOS46_PARAMS_SIZE"),
    ("nvos46_status", "NVOS46_OFF_STATUS"),
    ("nvos47_size", "NVOS47_PARAMS_SIZE"),
    ("nvos47_status", "NVOS47_OFF_STATUS"),
    ("channel_alloc_size", "NV_CHANNEL_ALLOC_PARAMS_SIZE"),
    ("memory_alloc_size", "sizeof nv_memory_allocation_params"),
    ("memory_mapper_alloc_size", "sizeof nv_memory_mapper_alloc_params"),
    ("export_object_info_size", "sizeof nv0000_get_export_object_info_params"),
    ("uvm_gpus", "UVM_MAX_GPUS"),
    ("uvm_map_external_size", "sizeof uvm_map_external_allocation_params"),
    ("uvm_map_external_tail", "uvm_map_external_allocation_params.gpu_attributes_count"),
    ("uvm_semaphore_pool_size", "sizeof uvm_alloc_semaphore_pool_params"),
    ("uvm_semaphore_pool_tail", "uvm_alloc_semaphore_pool_params.gpu_attributes_count"),
]


class Row:
    def __init__(self, key: str, nvidia: str, ours: str) -> None:
        self.key, self.nvidia, self.ours = key, nvidia, ours

    @property
    def per_version(self) -> bool:
        return "T->" in self.ours


def manifest() -> list[Row]:
    rows = []
    for n, line in enumerate(MANIFEST.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise SystemExit(f"{MANIFEST}:{n}: want key<TAB>nvidia<TAB>ours, got {line!r}")
        if any(r.key == parts[0] for r in rows):
            raise SystemExit(f"{MANIFEST}:{n}: {parts[0]} twice")
        rows.append(Row(*parts))
    return rows


class Version:
    """A row of abi/versions.tsv: a driver release, the layout file holding its values,
    and whether that is the release's own tag ('tag') or another's (why, for a release
    the open-source repository has no tag for)."""

    def __init__(self, version: str, layout: str, source: str) -> None:
        self.version, self.layout, self.source = version, layout, source

    @property
    def tagged(self) -> bool:
        return self.source == "tag"

    @property
    def branch(self) -> str:
        return self.version.split(".")[0]


def supported() -> list[Version]:
    out = []
    for n, line in enumerate(VERSIONS.read_text().splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            parts = line.split("\t")
            if len(parts) != 3:
                raise SystemExit(f"{VERSIONS}:{n}: want version<TAB>layout<TAB>source, got {line!r}")
            out.append(Version(*parts))
    return out


def vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def read_values(layout: str) -> dict[str, str]:
    vals = {}
    for line in (LAYOUTS / f"{layout}.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("\t")
            vals[k] = v
    return vals


def run_probe(rows: list[Row], exprs: list[str], prelude: str, flags: list[str], cwd: Path) -> list[str]:
    """Compile and run a program printing each expression; an expression that does not
    compile gives ABSENT (recompiled without it, until the rest compiles)."""
    absent: set[int] = set()
    for _ in range(len(rows) + 1):
        body = [prelude, "int main(void)", "{"]
        first = len(body) + prelude.count("\n") + 1
        for i, e in enumerate(exprs):
            body.append(f'\tprintf("%llu\\n", (unsigned long long)({e}));' if i not in absent
                        else '\tprintf("' + ABSENT + '\\n");')
        body += ["\treturn 0;", "}", ""]
        src = cwd / "probe.c"
        src.write_text("\n".join(body))
        p = subprocess.run(["gcc", "-w", "-o", str(cwd / "probe"), str(src), *flags], capture_output=True,
                           text=True)
        if p.returncode == 0:
            out = subprocess.run([str(cwd / "probe")], capture_output=True, text=True, check=True).stdout
            return out.splitlines()
        bad = {int(m.group(1)) - first for m in re.finditer(r"probe\.c:(\d+):\d+:", p.stderr)}
        bad = {b for b in bad if 0 <= b < len(exprs)} - absent
        if not bad:
            raise SystemExit("probe does not compile:\n" + p.stderr[-3000:])
        absent |= bad
    raise SystemExit("probe does not converge")


def mirror_dir(arg: str | None) -> Path:
    d = Path(arg or os.environ.get("NVIDIA_OGKM") or DEFAULT_MIRROR)
    if not d.exists():
        raise SystemExit(f"no mirror of open-gpu-kernel-modules at {d} (--mirror DIR or $NVIDIA_OGKM)")
    return d


def extract(tag: str, mirror: Path) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        arch = subprocess.run(["git", f"--git-dir={git_dir(mirror)}", "archive", tag, *TAG_PATHS],
                              capture_output=True)
        if arch.returncode:
            raise SystemExit(f"git archive {tag}: {arch.stderr.decode().strip()}")
        (t / "src").mkdir()
        subprocess.run(["tar", "-x", "-C", str(t / "src")], input=arch.stdout, check=True)
        return extract_tree(t / "src", [t / "src" / d for d in INCLUDE_DIRS], t)


def extract_tree(root: Path, include_dirs: list[Path], tmp: Path) -> dict[str, str]:
    """The manifest's values from the headers under include_dirs (the class and control
    headers from the directory that holds class/cl0000.h)."""
    rows = manifest()
    sdk = next((d for d in include_dirs if (d / "class" / "cl0000.h").exists()), None)
    incs = (sorted(sdk.glob("class/*.h")) + sorted(sdk.glob("ctrl/**/*.h"))) if sdk else []
    have = [h for h in NV_HEADERS if any((d / h).exists() for d in include_dirs)]
    prelude = "\n".join(["#include <stddef.h>", "#include <stdio.h>"]
                        + [f'#include "{h}"' for h in have]
                        + [f'#include "{p.relative_to(sdk)}"' for p in incs if sdk])
    out = run_probe(rows, [r.nvidia for r in rows], prelude, [f"-I{d}" for d in include_dirs], tmp)
    return {r.key: v for r, v in zip(rows, out)}


def extract_source(root: Path) -> dict[str, str]:
    """The values from an unpacked tree: a checkout of open-gpu-kernel-modules, or the
    kernel-open part a driver installs as /usr/src/nvidia-<version> (its ioctl, RM
    parameter and nvidia-uvm headers, no class or control headers: those values come
    out absent)."""
    if (root / INCLUDE_DIRS[0]).is_dir():
        dirs = [root / d for d in INCLUDE_DIRS]
    else:
        dirs = [root / d for d in ("common/inc", "nvidia-uvm", "nvidia") if (root / d).is_dir()]
    if not dirs:
        raise SystemExit(f"{root}: neither open-gpu-kernel-modules nor a kernel-open tree")
    with tempfile.TemporaryDirectory() as tmp:
        return extract_tree(root, dirs, Path(tmp))


def git_dir(mirror: Path) -> Path:
    return mirror / ".git" if (mirror / ".git").exists() else mirror


def write_versions(rows: list[Version]) -> None:
    head = [l for l in VERSIONS.read_text().splitlines() if l.startswith("#")]
    rows = sorted(rows, key=lambda r: vkey(r.version))
    VERSIONS.write_text("\n".join(head + [f"{r.version}\t{r.layout}\t{r.source}" for r in rows]) + "\n")


def cmd_extract(a: argparse.Namespace) -> int:
    vals = extract_source(Path(a.source)) if a.source else extract(a.tag, mirror_dir(a.mirror))
    if a.compare:
        by = {r.version: r.layout for r in supported()}
        if a.compare not in by:
            raise SystemExit(f"{a.compare} is not in {VERSIONS}")
        want = read_values(by[a.compare])
        found = [k for k in vals if vals[k] != ABSENT]
        bad = [k for k in found if vals[k] != want.get(k)]
        for k in bad:
            print(f"{k}: this source {vals[k]}, abi/layouts/{by[a.compare]}.tsv {want.get(k)}")
        print(f"{len(found)} of {len(vals)} values in this source, {len(bad)} differ from "
              f"{a.compare}'s (abi/layouts/{by[a.compare]}.tsv)")
        return 1 if bad else 0
    for k, v in vals.items():
        print(f"{k}\t{v}")
    return 0


def cmd_update(a: argparse.Namespace) -> int:
    """Extract every tagged version of abi/versions.tsv (and any --add TAG), group those
    whose values are the same, and write one layout file per group, named by its newest
    version; the untagged rows keep the layout they name."""
    m = mirror_dir(a.mirror)
    rows = supported()
    have = {r.version for r in rows}
    rows += [Version(t, "", "tag") for t in a.add or [] if t not in have]
    groups: dict[tuple[tuple[str, str], ...], list[Version]] = {}
    for r in rows:
        if r.tagged:
            vals = extract(r.version, m)
            groups.setdefault(tuple(vals.items()), []).append(r)
    renamed = {}
    for f in LAYOUTS.glob("*.tsv"):
        f.unlink()
    LAYOUTS.mkdir(exist_ok=True)
    for vals, members in groups.items():
        name = max((r.version for r in members), key=vkey)
        for r in members:
            renamed[r.layout] = name
            r.layout = name
        lines = [f"# the values of {', '.join(sorted((r.version for r in members), key=vkey))}: "
                 "extracted by scripts/nvrm-abi.py update from each tag of open-gpu-kernel-modules"]
        (LAYOUTS / f"{name}.tsv").write_text("\n".join(lines + [f"{k}\t{v}" for k, v in vals]) + "\n")
    for r in rows:
        if not r.tagged:
            r.layout = renamed.get(r.layout, r.layout)
            if not (LAYOUTS / f"{r.layout}.tsv").exists():
                raise SystemExit(f"{r.version}: its layout {r.layout} is no tagged version's")
    write_versions(rows)
    print(f"{len(rows)} versions, {len(groups)} layouts")
    return 0


def cmd_check(a: argparse.Namespace) -> int:
    m = mirror_dir(a.mirror)
    bad = 0
    everywhere_absent: set[str] | None = None
    rows = [r for r in supported() if r.tagged]
    for r in rows:
        got = extract(r.version, m)
        have = read_values(r.layout)
        for k in sorted(set(got) | set(have)):
            if got.get(k) != have.get(k):
                print(f"{r.version}: {k}: abi/layouts/{r.layout}.tsv has {have.get(k)}, the tag {got.get(k)}")
                bad += 1
        absent = {k for k, x in got.items() if x == ABSENT}
        everywhere_absent = absent if everywhere_absent is None else everywhere_absent & absent
    for k in sorted(everywhere_absent or ()):
        print(f"{k}: absent from every tagged version (a manifest error)")
        bad += 1
    print(f"{len(rows)} tagged versions, {len(manifest())} values each: {bad} differences")
    return 1 if bad else 0


def table_rows() -> list[tuple[tuple[int, ...], list[Version]]]:
    """struct nvrm_table's rows: the versions whose table fields are the same, oldest first."""
    groups: dict[tuple[int, ...], list[Version]] = {}
    for r in supported():
        vals = read_values(r.layout)
        key = tuple(int(vals[k] != ABSENT) if f == "wait_open_complete" else int(vals[k])
                    for f, k in TABLE_FIELDS)
        groups.setdefault((int(r.branch),) + key, []).append(r)
    return sorted(((k[1:], v) for k, v in groups.items()), key=lambda g: vkey(g[1][0].version))


def ours_values() -> list[dict[str, str]]:
    """What kmod/core says for each row of nvrm_tables[] (in order)."""
    rows = [r for r in manifest() if r.ours != "-"]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        body = ["#include <stddef.h>", "#include <stdio.h>", '#include "nvrm_abi.h"', "int main(void)", "{",
                "\tunsigned int i;", "\tfor (i = 0; i < nvrm_nr_tables; i++) {",
                "\t\tconst struct nvrm_table *T = &nvrm_tables[i];", "\t\t(void)T;"]
        body += [f'\t\tprintf("%llu\\n", (unsigned long long)({r.ours}));' for r in rows]
        body += ["\t}", "\treturn 0;", "}", ""]
        (t / "ours.c").write_text("\n".join(body))
        p = subprocess.run(["gcc", "-Wall", "-o", str(t / "ours"), str(t / "ours.c"), str(TABLES_C), f"-I{CORE}"],
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("kmod/core probe does not compile:\n" + p.stderr[-3000:])
        out = subprocess.run([str(t / "ours")], capture_output=True, text=True, check=True).stdout.split()
    n = len(rows)
    return [{r.key: v for r, v in zip(rows, out[i * n:(i + 1) * n])} for i in range(len(out) // n)]


def cmd_ours(a: argparse.Namespace) -> int:
    """Every supported version's values, as kmod/core gives them (its defines, its row of
    nvrm_tables[]), against its layout; a value absent from a version is not checked."""
    bad = 0
    ours = ours_values()
    rows = table_rows()
    if len(ours) != len(rows):
        print(f"kmod/core/nvrm_tables.c has {len(ours)} rows, abi/ makes {len(rows)}: run gen")
        return 1
    for (_, versions), vals in zip(rows, ours):
        for r in versions:
            want = read_values(r.layout)
            for k, v in vals.items():
                if want[k] != ABSENT and v != want[k]:
                    print(f"{r.version}: {k}: kmod/core gives {v}, abi/layouts/{r.layout}.tsv {want[k]}")
                    bad += 1
    print(f"{len(supported())} versions, {len(ours)} table rows: {bad} differences between kmod/core and abi/")
    return 1 if bad else 0


def gen_c() -> str:
    out = ["// SPDX-License-Identifier: GPL-2.0 OR MIT",
           "/*",
           " * nvrm_tables.c - what differs between the supported NVIDIA driver versions",
           " * (struct nvrm_table, nvrm_abi.h). Generated by scripts/nvrm-abi.py gen from",
           " * abi/versions.tsv and abi/layouts/ (values extracted from each tagged release",
           " * of open-gpu-kernel-modules); do not edit: edit abi/ and run gen.",
           " */",
           '#include "nvrm_abi.h"',
           "",
           "#ifdef __KERNEL__",
           "#include <linux/string.h>",
           "#else",
           "#include <string.h>",
           "#endif",
           ""]
    rows = table_rows()
    for i, (_, versions) in enumerate(rows):
        out.append(f"static const char *const nvrm_versions_{i}[] = {{")
        line = "\t"
        for r in sorted(versions, key=lambda r: vkey(r.version)):
            item = f'"{r.version}", '
            if len(line.expandtabs()) + len(item) > 80:
                out.append(line.rstrip())
                line = "\t"
            line += item
        out.append(line + "NULL")
        out.append("};")
        out.append("")
    out.append("const struct nvrm_table nvrm_tables[] = {")
    for i, (vals, versions) in enumerate(rows):
        out.append("\t{")
        out.append(f'\t\t.branch = "{versions[0].branch}",')
        out.append(f"\t\t.versions = nvrm_versions_{i},")
        for (f, _), v in zip(TABLE_FIELDS, vals):
            out.append(f"\t\t.{f} = {v},")
        out.append("\t},")
    out += ["};", "", "const unsigned int nvrm_nr_tables = sizeof(nvrm_tables) / sizeof(nvrm_tables[0]);", "",
            "const struct nvrm_table *nvrm_table_find(const char *version)",
            "{",
            "\tunsigned int i, j;",
            "",
            "\tfor (i = 0; i < nvrm_nr_tables; i++)",
            "\t\tfor (j = 0; nvrm_tables[i].versions[j]; j++)",
            "\t\t\tif (!strcmp(nvrm_tables[i].versions[j], version))",
            "\t\t\t\treturn &nvrm_tables[i];",
            "\treturn NULL;",
            "}", ""]
    return "\n".join(out)


def gen_py() -> str:
    rows = table_rows()
    out = ['"""The NVIDIA driver versions gpuslice has an ABI table for, and what differs between',
           "them (kmod/core/nvrm_abi.h struct nvrm_table). Generated by scripts/nvrm-abi.py gen",
           'from abi/; do not edit."""', "", "from __future__ import annotations", "",
           "FIELDS = (" + ", ".join(f'"{f}"' for f, _ in TABLE_FIELDS) + ",)", "",
           "# one row per layout: (branch, versions, values in FIELDS' order)",
           "TABLES: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = ("]
    for vals, versions in rows:
        vs = ", ".join(f'"{r.version}"' for r in sorted(versions, key=lambda r: vkey(r.version)))
        out.append(f'    ("{versions[0].branch}", ({vs},), {vals!r}),')
    out += [")", "", "",
            "def table(version: str) -> dict[str, int] | None:",
            '    """The table row serving a driver version string, None if none does."""',
            "    for _, versions, vals in TABLES:",
            "        if version in versions:",
            "            return dict(zip(FIELDS, vals))",
            "    return None", "", "",
            "def branch_of(version: str) -> str:",
            '    return version.split(".")[0]', "", "",
            "def supported() -> list[str]:",
            "    return [v for _, versions, _ in TABLES for v in versions]", "", "",
            "def supported_summary() -> str:",
            '    """The supported versions in one line: each branch\'s oldest to newest."""',
            "    by: dict[str, list[str]] = {}",
            "    for v in supported():",
            "        by.setdefault(branch_of(v), []).append(v)",
            '    key = lambda v: tuple(int(x) for x in v.split("."))',
            '    return ", ".join(f"{min(vs, key=key)}..{max(vs, key=key)}" if len(vs) > 1 else vs[0]',
            "                     for _, vs in sorted(by.items()))", ""]
    return "\n".join(out)


def cmd_gen(a: argparse.Namespace) -> int:
    stale = []
    for path, text in ((TABLES_C, gen_c()), (TABLES_PY, gen_py())):
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not a.check:
                path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(REPO)}: {'stale: run scripts/nvrm-abi.py gen' if a.check else 'written'}")
    return 1 if stale and a.check else 0


def layout_columns() -> list[tuple[str, list[str]]]:
    """(layout, its versions) oldest first."""
    by: dict[str, list[str]] = {}
    for r in supported():
        by.setdefault(r.layout, []).append(r.version)
    return sorted(((k, sorted(v, key=vkey)) for k, v in by.items()), key=lambda c: vkey(c[1][0]))


def doc_table() -> str:
    """The values that differ between layouts, as a Markdown table (docs/driver-versions.md)."""
    cols = layout_columns()
    vals = [read_values(layout) for layout, _ in cols]
    rows = manifest()
    out = ["| value | " + " | ".join(f"{vs[0]}..{vs[-1]}" if len(vs) > 1 else vs[0] for _, vs in cols)
           + " | gpuslice |", "|---" * (len(cols) + 2) + "|"]
    for r in rows:
        seen = [v[r.key] for v in vals]
        if len(set(seen)) == 1:
            continue
        how = "table" if r.per_version else "not read" if r.ours == "-" else "define"
        out.append(f"| `{r.key}` | " + " | ".join("-" if x == ABSENT else x for x in seen) + f" | {how} |")
    return "\n".join(out) + "\n"


def cmd_doc(a: argparse.Namespace) -> int:
    sys.stdout.write(doc_table())
    return 0


def cmd_diff(a: argparse.Namespace) -> int:
    by = {r.version: r.layout for r in supported()}
    x, y = read_values(by[a.a]), read_values(by[a.b])
    for k in x:
        if x[k] != y.get(k):
            print(f"{k}\t{x[k]}\t{y.get(k)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("extract")
    p.add_argument("tag", nargs="?")
    p.add_argument("--mirror")
    p.add_argument("--source", help="an unpacked source tree instead of a tag")
    p.add_argument("--compare", metavar="VERSION", help="compare with the layout VERSION uses")
    p.set_defaults(fn=cmd_extract)
    p = sub.add_parser("update")
    p.add_argument("--mirror")
    p.add_argument("--add", action="append", metavar="TAG", help="a tagged release to support too")
    p.set_defaults(fn=cmd_update)
    p = sub.add_parser("check")
    p.add_argument("--mirror")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("gen")
    p.add_argument("--check", action="store_true")
    p.set_defaults(fn=cmd_gen)
    p = sub.add_parser("doc")
    p.set_defaults(fn=cmd_doc)
    p = sub.add_parser("ours")
    p.set_defaults(fn=cmd_ours)
    p = sub.add_parser("diff")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(fn=cmd_diff)
    a = ap.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())

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
  check --vendored             the same, no mirror: each layout's values from the headers of
                               its tag in abi/nvidia/headers.tar.xz (what `vendor` keeps)
  ours [--vendored]            compare kmod/core (defines and each version's table row)
                               with abi/versions (--vendored: with the values abi/nvidia/
                               gives, evaluated anew, for the versions of each vendored layout)
  vendor [--mirror DIR] [LAYOUT...]
                               (re)write abi/nvidia/headers.tar.xz: <tag>/<NVIDIA's path>
                               for the headers the probe includes (transitively), one tag
                               per layout (abi/nvidia/tags.tsv), each checked to give the
                               tag's values; and abi/nvidia/COPYING (NVIDIA's license)
  vendor --unpack DIR          the vendored trees as files, DIR/<tag>/ (to read them, or
                               for extract --source DIR/<tag>)
  gen                          write kmod/core/nvrm_tables.c and pyctl/gpuslice/nvrm_versions.py
                               from abi/versions.tsv and abi/versions/ (--check: exit 1 if stale)
  diff A B                     the keys whose values differ between two versions
  standin [--check]            write the stand-in's ABI from abi/nvidia/ alone (no mirror, nothing
                               of kmod/core): tests/standin/nvstub_abi.h, every NVIDIA value it
                               names and every struct it names as NVIDIA's newest vendored tag
                               lays it out (explicit padding, static asserts of each size and
                               offset), and tests/standin/nvstub_tables.c, what differs between
                               releases, one row per layout from its own tag (--check: exit 1
                               if stale)

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
VENDORED = ABI / "nvidia"
VENDORED_TAGS = VENDORED / "tags.tsv"
VENDORED_TAR = VENDORED / "headers.tar.xz"

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


def unpack_tag(tag: str, mirror: Path, src: Path) -> None:
    """NVIDIA's TAG_PATHS at tag, from the mirror, into src (made here)."""
    arch = subprocess.run(["git", f"--git-dir={git_dir(mirror)}", "archive", tag, *TAG_PATHS],
                          capture_output=True)
    if arch.returncode:
        raise SystemExit(f"git archive {tag}: {arch.stderr.decode().strip()}")
    src.mkdir()
    subprocess.run(["tar", "-x", "-C", str(src)], input=arch.stdout, check=True)


def extract(tag: str, mirror: Path) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        unpack_tag(tag, mirror, t / "src")
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


# --- the vendored extract (abi/nvidia/): NVIDIA's headers, enough to evaluate the manifest
# without a mirror. One tag per layout (the layout's name: its newest tagged release), with
# only the headers a probe of the manifest's expressions includes, verbatim, under NVIDIA's
# own paths: abi/nvidia/headers.tar.xz holds <tag>/<path in open-gpu-kernel-modules> (one
# archive: the tags' copies differ little and xz keeps them all in ~0.5 MiB, where the
# files themselves are ~25 MiB); abi/nvidia/tags.tsv names each layout's tag and commit.

def vendored_tags() -> dict[str, tuple[str, str]]:
    """layout -> (tag, commit) from abi/nvidia/tags.tsv."""
    out = {}
    if VENDORED_TAGS.exists():
        for line in VENDORED_TAGS.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                layout, tag, commit = line.split("\t")
                out[layout] = (tag, commit)
    return out


def unpack_vendored(dest: Path, tags: list[str] | None = None) -> None:
    """abi/nvidia/headers.tar.xz's trees (or those of tags) into dest/<tag>/."""
    import tarfile
    if not VENDORED_TAR.exists():
        raise SystemExit(f"no {VENDORED_TAR.relative_to(REPO)}: run scripts/nvrm-abi.py vendor")
    with tarfile.open(VENDORED_TAR, "r:xz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and ".." not in Path(m.name).parts
                   and not m.name.startswith("/") and (tags is None or m.name.split("/")[0] in tags)]
        for m in members:
            out = dest / m.name
            out.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(m)
            if data is None:
                raise SystemExit(f"{VENDORED_TAR.relative_to(REPO)}: {m.name} unreadable")
            out.write_bytes(data.read())


def pack_vendored(src: Path) -> None:
    """src/<tag>/... into abi/nvidia/headers.tar.xz, the same bytes for the same files."""
    import io
    import lzma
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for f in sorted(x for x in src.rglob("*") if x.is_file()):
            data = f.read_bytes()
            info = tarfile.TarInfo(f.relative_to(src).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    VENDORED_TAR.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))


def vendored_values(layouts: list[str], jobs: int | None = None) -> dict[str, dict[str, str]]:
    """Each layout's values from its vendored headers (the probe extract_tree compiles),
    the layouts compiled in parallel."""
    from concurrent.futures import ThreadPoolExecutor
    tags = vendored_tags()
    for lay in layouts:
        if lay not in tags:
            raise SystemExit(f"{lay}: not vendored (abi/nvidia/tags.tsv); run scripts/nvrm-abi.py vendor")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        unpack_vendored(t / "nvidia", [tags[lay][0] for lay in layouts])

        def one(lay: str) -> dict[str, str]:
            root = t / "nvidia" / tags[lay][0]
            if not (root / INCLUDE_DIRS[0]).is_dir():
                raise SystemExit(f"{lay}: {tags[lay][0]} is not in {VENDORED_TAR.relative_to(REPO)}")
            work = t / "probe" / lay
            work.mkdir(parents=True)
            return extract_tree(root, [root / d for d in INCLUDE_DIRS], work)

        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as ex:
            return dict(zip(layouts, ex.map(one, layouts)))


def _defining_files(src: str, flags: list[str], cwd: Path) -> tuple[dict[str, str], list[str]]:
    """Preprocess src (-dD): the file that first defines each macro, type, struct, union
    or enum tag and enumerator, and the lines of src itself (the expressions, expanded)."""
    (cwd / "pp.c").write_text(src)
    p = subprocess.run(["gcc", "-E", "-dD", str(cwd / "pp.c"), *flags], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit("probe does not preprocess:\n" + p.stderr[-3000:])
    where: dict[str, str] = {}
    own: list[str] = []
    cur = ""
    decl = re.compile(r"(?:\b(?:struct|union|enum)\s+(\w+))|(?:}\s*(\w+)\s*[;,])"
                      r"|(?:\btypedef\b[^;{}]*?\b(\w+)\s*(?:\[[^]]*\]\s*)*;)"
                      r"|(?:^\s*(\w+)\s*(?:=[^,]*)?,?\s*$)")
    in_enum = False
    for line in p.stdout.splitlines():
        m = re.match(r'# \d+ "([^"]*)"', line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"#define (\w+)", line)
        if m:
            where.setdefault(m.group(1), cur)
            continue
        if line.startswith("#"):
            continue
        if cur.endswith("pp.c"):
            own.append(line)
            continue
        if re.search(r"\benum\b", line):
            in_enum = True
        for m in decl.finditer(line):
            name = m.group(1) or m.group(2) or m.group(3) or (m.group(4) if in_enum else None)
            if name:
                where.setdefault(name, cur)
        if in_enum and "}" in line:
            in_enum = False
    return where, own


def vendor_tag(tag: str, mirror: Path, dest: Path) -> int:
    """Write dest/<NVIDIA's path> for the headers a probe of the manifest needs at tag:
    the NV_HEADERS, and the class and control headers that define what the expressions
    name (after macro expansion), with everything they include. Checks that the probe
    extract_tree compiles against dest gives the values the whole tag gives."""
    rows = manifest()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        src = t / "src"
        unpack_tag(tag, mirror, src)
        dirs = [src / d for d in INCLUDE_DIRS]
        flags = [f"-I{d}" for d in dirs]
        full = extract_tree(src, dirs, t)
        sdk = src / INCLUDE_DIRS[0]
        have = [h for h in NV_HEADERS if any((d / h).exists() for d in dirs)]
        every = (sorted(sdk.glob("class/*.h")) + sorted(sdk.glob("ctrl/**/*.h")))
        prelude = ["#include <stddef.h>", "#include <stdio.h>"] + [f'#include "{h}"' for h in have]
        # what each expression names, before and after expansion, and where that is defined
        mark = "\n".join(f"__gs_expr_{i} ({r.nvidia})" for i, r in enumerate(rows))
        where, own = _defining_files("\n".join(prelude + [f'#include "{p.relative_to(sdk)}"' for p in every])
                                     + "\n" + mark + "\n", flags, t)
        # NVIDIA's classes, controls and their types are named in capitals: the rest are
        # fields (whose names other headers' enumerators and tags may share)
        names = set(re.findall(r"\b[A-Z_][A-Z0-9_]*\b", mark + "\n" + "\n".join(own)))
        top = {sdk / "class" / "cl0000.h"}
        for n in names:
            f = where.get(n, "")
            if f.startswith(str(sdk / "class")) or f.startswith(str(sdk / "ctrl")):
                top.add(Path(f))
        chosen = [p for p in every if p in top]
        # everything the chosen headers include
        (t / "dep.c").write_text("\n".join(prelude + [f'#include "{p.relative_to(sdk)}"' for p in chosen]) + "\n")
        p = subprocess.run(["gcc", "-M", str(t / "dep.c"), *flags], capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"{tag}: the chosen headers do not compile:\n" + p.stderr[-3000:])
        deps = sorted({Path(os.path.normpath(w)) for w in p.stdout.replace("\\\n", " ").split()[1:]
                       if os.path.normpath(w).startswith(str(src) + os.sep)})
        if dest.exists():
            import shutil
            shutil.rmtree(dest)
        for d in deps:
            out = dest / d.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(d.read_bytes())
        got = extract_tree(dest, [dest / d for d in INCLUDE_DIRS], t)
    bad = [k for k in full if got.get(k) != full[k]]
    for k in bad:
        print(f"{tag}: {k}: the tag gives {full[k]}, the vendored extract {got.get(k)}")
    return len(deps) if not bad else -1


def cmd_vendor(a: argparse.Namespace) -> int:
    if a.unpack:
        unpack_vendored(Path(a.unpack), [t for t, _ in vendored_tags().values()])
        print(f"{a.unpack}: {', '.join(t for t, _ in vendored_tags().values())}")
        return 0
    import shutil
    m = mirror_dir(a.mirror)
    layouts = sorted({r.layout for r in supported()}, key=vkey)
    want = a.layouts or layouts
    for lay in want:
        if lay not in layouts:
            raise SystemExit(f"{lay}: no such layout in {VERSIONS}")
    tags = {k: v for k, v in vendored_tags().items() if k in layouts}
    VENDORED.mkdir(exist_ok=True)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "nvidia"
        stage.mkdir()
        if VENDORED_TAR.exists():  # the layouts not redone keep their headers
            unpack_vendored(stage, [t for lay, (t, _) in tags.items() if lay not in want])
        for lay in want:
            tag = lay  # a layout is named by its newest tagged release
            commit = subprocess.run(["git", f"--git-dir={git_dir(m)}", "rev-parse", f"refs/tags/{tag}^{{commit}}"],
                                    capture_output=True, text=True, check=True).stdout.strip()
            n = vendor_tag(tag, m, stage / tag)
            if n < 0:
                bad += 1
                shutil.rmtree(stage / tag, ignore_errors=True)
                tags.pop(lay, None)
                continue
            tags[lay] = (tag, commit)
            size = sum(f.stat().st_size for f in (stage / tag).rglob("*") if f.is_file())
            print(f"{lay}: {tag} ({commit[:12]}): {n} headers, {size // 1024} KiB")
        files = [f for f in stage.rglob("*") if f.is_file()]
        unpacked = sum(f.stat().st_size for f in files)
        pack_vendored(stage)
    lic = subprocess.run(["git", f"--git-dir={git_dir(m)}", "show", f"{layouts[-1]}:COPYING"],
                         capture_output=True, check=True).stdout
    (VENDORED / "COPYING").write_bytes(lic)
    head = ["# The tag of open-gpu-kernel-modules whose headers abi/nvidia/headers.tar.xz holds",
            "# (under <tag>/), per layout of abi/layouts/: layout<TAB>tag<TAB>commit.",
            "# Written by scripts/nvrm-abi.py vendor."]
    VENDORED_TAGS.write_text("\n".join(head + [f"{k}\t{t}\t{c}" for k, (t, c) in
                                               sorted(tags.items(), key=lambda x: vkey(x[0]))]) + "\n")
    print(f"{VENDORED_TAR.relative_to(REPO)}: {len(tags)} tags, {len(files)} headers, "
          f"{unpacked // 1024} KiB unpacked, "
          f"{VENDORED_TAR.stat().st_size // 1024} KiB")
    return 1 if bad else 0


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
    if a.vendored:
        return check_vendored()
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


def layouts_against(found: dict[str, dict[str, str]], where: dict[str, str]) -> list[str]:
    """The differences between each layout's values as found (where[layout] names the
    source) and abi/layouts/, and the keys absent from every one of them."""
    out = []
    everywhere_absent: set[str] | None = None
    for lay, got in found.items():
        have = read_values(lay)
        for k in sorted(set(got) | set(have)):
            if got.get(k) != have.get(k):
                out.append(f"{lay}: {k}: abi/layouts/{lay}.tsv has {have.get(k)}, {where[lay]} {got.get(k)}")
        absent = {k for k, x in got.items() if x == ABSENT}
        everywhere_absent = absent if everywhere_absent is None else everywhere_absent & absent
    out += [f"{k}: absent from every layout found (a manifest error)" for k in sorted(everywhere_absent or ())]
    return out


def missing_vendored() -> list[str]:
    tags = vendored_tags()
    return [lay for lay in sorted({r.layout for r in supported()}, key=vkey) if lay not in tags]


def check_vendored() -> int:
    """Each layout's values, evaluated from its vendored tag (abi/nvidia/), against
    abi/layouts/: no mirror needed. A layout without a vendored tag is a difference."""
    tags = vendored_tags()
    missing = missing_vendored()
    bad = [f"{lay}: no vendored tag in abi/nvidia/tags.tsv (run scripts/nvrm-abi.py vendor)" for lay in missing]
    layouts = sorted({r.layout for r in supported()} - set(missing), key=vkey)
    found = vendored_values(layouts)
    bad += layouts_against(found, {lay: f"abi/nvidia/{tags[lay][0]}" for lay in layouts})
    for line in bad:
        print(line)
    print(f"{len(found)} vendored layouts, {len(manifest())} values each: {len(bad)} differences")
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


def ours_against(ours: list[dict[str, str]], values: dict[str, dict[str, str]] | None = None,
                 where: dict[str, str] | None = None) -> tuple[list[str], int]:
    """The differences between kmod/core's values (ours_values()) and each supported
    version's: its layout's in values (versions of a layout not there are skipped), or
    abi/layouts/'s when values is None. A value absent from a version is not checked.
    Also the number of versions checked."""
    rows = table_rows()
    if len(ours) != len(rows):
        return [f"kmod/core/nvrm_tables.c has {len(ours)} rows, abi/ makes {len(rows)}: run gen"], 0
    bad = []
    checked = 0
    for (_, versions), vals in zip(rows, ours):
        for r in versions:
            if values is not None and r.layout not in values:
                continue
            want = values[r.layout] if values is not None else read_values(r.layout)
            src = where[r.layout] if where else f"abi/layouts/{r.layout}.tsv"
            checked += 1
            for k, v in vals.items():
                if want[k] != ABSENT and v != want[k]:
                    bad.append(f"{r.version}: {k}: kmod/core gives {v}, {src} {want[k]}")
    return bad, checked


def cmd_ours(a: argparse.Namespace) -> int:
    """Every supported version's values, as kmod/core gives them (its defines, its row of
    nvrm_tables[]), against its layout; a value absent from a version is not checked.
    With --vendored the layout's values are evaluated from abi/nvidia/ (NVIDIA's headers)
    instead of read from abi/layouts/."""
    ours = ours_values()
    if a is not None and getattr(a, "vendored", False):
        tags = vendored_tags()
        missing = missing_vendored()
        values = vendored_values(sorted({r.layout for r in supported()} - set(missing), key=vkey))
        bad, checked = ours_against(ours, values, {lay: f"abi/nvidia/{tags[lay][0]}" for lay in values})
        bad += [f"{lay}: no vendored tag in abi/nvidia/tags.tsv (run scripts/nvrm-abi.py vendor)"
                for lay in missing]
        what = f"NVIDIA's headers ({len(values)} vendored layouts)"
    else:
        bad, checked = ours_against(ours)
        what = "abi/"
    for line in bad:
        print(line)
    print(f"{checked} versions, {len(ours)} table rows: {len(bad)} differences between kmod/core and {what}")
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


# --- the stand-in's ABI (tests/standin/nvstub_abi.h, nvstub_tables.c), from abi/nvidia/ only.
# The manifest gives the names (its keys: the stand-in's names for NVIDIA's values, structs and
# fields, and NVIDIA's expression for each); every number comes from NVIDIA's headers: the
# defines the stand-in uses, and its structs, each field typed and placed as the probe finds
# NVIDIA's (size, signedness, array length, the struct it is), with explicit padding.

STANDIN = REPO / "tests" / "standin"
STANDIN_ABI_H = STANDIN / "nvstub_abi.h"
STANDIN_TABLES_C = STANDIN / "nvstub_tables.c"
STANDIN_GENERATED = ("nvstub_abi.h", "nvstub_tables.c", "nvstub.mod.c")
# NVIDIA names the stand-in uses that the manifest does not list (evaluated as themselves)
STANDIN_EXTRA = [
    "NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE",
    "NV_ERR_GPU_UUID_NOT_FOUND", "NV_ERR_INVALID_OFFSET", "NV_ERR_RESOURCE_LOST",
    "NV2080_CTRL_CMD_GPU_GET_GID_INFO",
]
# aggregates the stand-in reads as an array of one integer type: (struct, field) -> (type, its size)
STANDIN_AS = {
    ("nv2080_ctrl_gpu_pid_info", "data"): ("nv_u64", 8),  # a union of six NvU64 (vidMemUsage)
}
# The stand-in's own copies of NVIDIA's blocks and values (nvstub.h: the deprecated escapes'
# blocks, NVOS32's union, the GID-info control, allocation sizes): (its expression, NVIDIA's
# expression on the newest vendored tag, or "KEY@LAYOUT" for a manifest key on one layout),
# asserted in nvstub_tables.c's kernel build.
_OS32 = "NVOS32_PARAMETERS"
STANDIN_OWN = [
    ("NVSTUB_GID_MAX_LENGTH", "NV2080_GPU_MAX_GID_LENGTH"),
    ("NVSTUB_GID_FLAGS_FORMAT_MASK", "DRF_SHIFTMASK(NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT)"),
    ("NVSTUB_GID_FLAGS_FORMAT_BINARY", "NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY"
                                       " << DRF_SHIFT(NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT)"),
    ("NVSTUB_GID_FLAGS_TYPE_MASK", "DRF_SHIFTMASK(NV2080_GPU_CMD_GPU_GET_GID_FLAGS_TYPE)"),
    ("sizeof(struct nvstub_gid_info_params)", "sizeof(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS)"),
    ("offsetof(struct nvstub_gid_info_params, flags)", "offsetof(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, flags)"),
    ("offsetof(struct nvstub_gid_info_params, length)", "offsetof(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, length)"),
    ("offsetof(struct nvstub_gid_info_params, data)", "offsetof(NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, data)"),
    ("NVSTUB_TSG_PARAMS_SIZE", "sizeof(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS)"),
    ("NVSTUB_CTXSHARE_PARAMS_SIZE", "sizeof(NV_CTXSHARE_ALLOCATION_PARAMETERS)"),
    ("NVSTUB_CONTEXT_DMA_PARAMS_SIZE", "sizeof(NV_CONTEXT_DMA_ALLOCATION_PARAMS)"),
    ("NVSTUB_SEMAPHORE_SURFACE_PARAMS_SIZE", "sizeof(NV_SEMAPHORE_SURFACE_ALLOC_PARAMETERS)"),
    ("NVSTUB_MEMORY_MAPPER_PARAMS_SIZE", "sizeof(NV_MEMORY_MAPPER_ALLOCATION_PARAMS)"),
    ("NVSTUB_GR_ALLOC_PARAMS_SIZE", "sizeof(NV_GR_ALLOCATION_PARAMETERS)"),
    ("NVSTUB_MEMORY_VIRTUAL_PARAMS_SIZE", "sizeof(NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS)"),
    ("NVSTUB_SYSMEM_DYNAMIC_HVASPACE", "NV_MEMORY_VIRTUAL_SYSMEM_DYNAMIC_HVASPACE"),
    ("sizeof(struct nvstub_memory_virtual_params)", "sizeof(NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS)"),
    ("offsetof(struct nvstub_memory_virtual_params, limit)", "offsetof(NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS, limit)"),
    ("offsetof(struct nvstub_memory_virtual_params, h_va_space)",
     "offsetof(NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS, hVASpace)"),
    ("NVSTUB_A06F_SCHEDULE_PARAMS_SIZE", "sizeof(NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS)"),
    ("RS_SHARE_TYPE_ALL", "RS_SHARE_TYPE_ALL"),
    ("RS_SHARE_TYPE_CLIENT", "RS_SHARE_TYPE_CLIENT"),
    ("RS_SHARE_TYPE_PID", "RS_SHARE_TYPE_PID"),
    ("RS_SHARE_TYPE_MAX", "RS_SHARE_TYPE_MAX"),
    ("RS_SHARE_ACTION_FLAG_REVOKE", "RS_SHARE_ACTION_FLAG_REVOKE"),
    ("NVSTUB_OS32_ALLOC_SIZE", "NVOS32_FUNCTION_ALLOC_SIZE"),
    ("NVSTUB_OS32_FREE", "NVOS32_FUNCTION_FREE"),
    ("NVSTUB_OS32_INFO", "NVOS32_FUNCTION_INFO"),
    ("NVSTUB_OS32_ALLOC_TILED_PITCH_HEIGHT", "NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT"),
    ("NVSTUB_OS32_ALLOC_SIZE_RANGE", "NVOS32_FUNCTION_ALLOC_SIZE_RANGE"),
    ("NVSTUB_OS32_GET_MEM_ALIGNMENT", "NVOS32_FUNCTION_GET_MEM_ALIGNMENT"),
    ("NVSTUB_OS32_IVC_HEAP_DONT_ALLOCATE", "NVOS32_IVC_HEAP_NUMBER_DONT_ALLOCATE_ON_IVC_HEAP"),
    ("NVSTUB_OS32_FLAGS_HANDLE_PROVIDED", "NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED"),
    ("NVSTUB_OS32_FLAGS_USE_BEGIN_END", "NVOS32_ALLOC_FLAGS_USE_BEGIN_END"),
    ("NVSTUB_OS32_FLAGS_VIRTUAL", "NVOS32_ALLOC_FLAGS_VIRTUAL"),
    ("NVSTUB_OS32_FREE_HANDLE_PROVIDED", "NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED"),
    ("NVSTUB_OS32_ATTR2_USE_EGM", "DRF_SHIFTMASK(NVOS32_ATTR2_USE_EGM)"),
    ("sizeof(struct nvstub_os32)", f"sizeof({_OS32})"),
] + [(f"offsetof(struct nvstub_os32, {a})", f"offsetof({_OS32}, {b})") for a, b in (
    ("h_object_parent", "hObjectParent"), ("function", "function"), ("h_va_space", "hVASpace"),
    ("ivc_heap_number", "ivcHeapNumber"), ("status", "status"), ("total", "total"), ("free", "free"),
    ("data", "data"), ("data.free.owner", "data.Free.owner"), ("data.free.h_memory", "data.Free.hMemory"),
    ("data.free.flags", "data.Free.flags"), ("data.info.attr", "data.Info.attr"),
    ("data.info.offset", "data.Info.offset"), ("data.info.size", "data.Info.size"),
    ("data.info.base", "data.Info.base"))] + [
    (f"offsetof(struct nvstub_os32, data.size.{a})", f"offsetof({_OS32}, data.AllocSize.{b})") for a, b in (
        ("owner", "owner"), ("h_memory", "hMemory"), ("type", "type"), ("flags", "flags"), ("attr", "attr"),
        ("format", "format"), ("compr_covg", "comprCovg"), ("zcull_covg", "zcullCovg"),
        ("partition_stride", "partitionStride"), ("width", "width"), ("height", "height"), ("size", "size"),
        ("alignment", "alignment"), ("offset", "offset"), ("limit", "limit"), ("address", "address"),
        ("range_begin", "rangeBegin"), ("range_end", "rangeEnd"), ("attr2", "attr2"),
        ("ctag_offset", "ctagOffset"), ("numa_node", "numaNode"))] + [
    (f"offsetof(struct nvstub_os32, data.size.{a})", f"offsetof({_OS32}, data.AllocTiledPitchHeight.{b})")
    for a, b in (("attr", "height"), ("format", "pitch"), ("compr_covg", "attr"), ("zcull_covg", "width"),
                 ("partition_stride", "format"), ("width", "comprCovg"), ("height", "zcullCovg"),
                 ("pad", "partitionStride"))] + [
    (f"offsetof(struct nvstub_os32, data.range.{a})", f"offsetof({_OS32}, data.AllocSizeRange.{b})") for a, b in (
        ("owner", "owner"), ("h_memory", "hMemory"), ("type", "type"), ("flags", "flags"), ("attr", "attr"),
        ("format", "format"), ("compr_covg", "comprCovg"), ("zcull_covg", "zcullCovg"),
        ("partition_stride", "partitionStride"), ("size", "size"), ("alignment", "alignment"),
        ("offset", "offset"), ("limit", "limit"), ("range_begin", "rangeBegin"), ("range_end", "rangeEnd"),
        ("address", "address"), ("attr2", "attr2"), ("ctag_offset", "ctagOffset"), ("numa_node", "numaNode"))] + [
    (f"offsetof(struct nvstub_os32, data.align.{a})", f"offsetof({_OS32}, data.AllocHintAlignment.{b})")
    for a, b in (("type", "alignType"), ("attr", "alignAttr"), ("input_flags", "alignInputFlags"),
                 ("size", "alignSize"), ("height", "alignHeight"), ("width", "alignWidth"),
                 ("pitch", "alignPitch"), ("mask", "alignMask"), ("kind", "alignKind"),
                 ("adjust", "alignAdjust"), ("attr2", "alignAttr2"))] + [
    (f"{w}(struct nvstub_os{n}{', ' + a if a else ''})",
     f"{w}(NVOS{n}_PARAMETERS{', ' + b if b else ''})") for n, w, a, b in (
        ("30", "sizeof", "", ""), ("30", "offsetof", "h_device", "hDevice"),
        ("30", "offsetof", "h_channel", "hChannel"), ("30", "offsetof", "num_channels", "numChannels"),
        ("30", "offsetof", "ph_clients", "phClients"), ("30", "offsetof", "ph_devices", "phDevices"),
        ("30", "offsetof", "ph_channels", "phChannels"), ("30", "offsetof", "flags", "flags"),
        ("30", "offsetof", "timeout", "timeout"), ("30", "offsetof", "status", "status"),
        ("39", "sizeof", "", ""), ("39", "offsetof", "h_subdevice", "hSubDevice"),
        ("39", "offsetof", "h_object_new", "hObjectNew"), ("39", "offsetof", "h_class", "hClass"),
        ("39", "offsetof", "flags", "flags"), ("39", "offsetof", "selector", "selector"),
        ("39", "offsetof", "h_memory", "hMemory"), ("39", "offsetof", "offset", "offset"),
        ("39", "offsetof", "limit", "limit"), ("39", "offsetof", "status", "status"),
        ("46", "sizeof", "", ""), ("46", "offsetof", "h_device", "hDevice"), ("46", "offsetof", "h_dma", "hDma"),
        ("46", "offsetof", "h_memory", "hMemory"), ("46", "offsetof", "offset", "offset"),
        ("46", "offsetof", "length", "length"), ("46", "offsetof", "flags", "flags"),
        ("46", "offsetof", "flags2", "flags2"), ("46", "offsetof", "kind_override", "kindOverride"),
        ("46", "offsetof", "dma_offset", "dmaOffset"), ("46", "offsetof", "status", "status"),
        ("47", "sizeof", "", ""), ("47", "offsetof", "h_device", "hDevice"), ("47", "offsetof", "h_dma", "hDma"),
        ("47", "offsetof", "h_memory", "hMemory"), ("47", "offsetof", "flags", "flags"),
        ("47", "offsetof", "dma_offset", "dmaOffset"), ("47", "offsetof", "size", "size"),
        ("47", "offsetof", "status", "status"))] + [
    ("sizeof(struct nvstub_export_info_535)", "sizeof nv0000_get_export_object_info_params@535.288.01"),
    ("offsetof(struct nvstub_export_info_535, max_objects)",
     "nv0000_get_export_object_info_params.max_objects@535.288.01"),
    ("offsetof(struct nvstub_export_info_535, metadata)",
     "nv0000_get_export_object_info_params.metadata@535.288.01"),
]
# C types by (size, signed) for NVIDIA's integer fields; 'char' for a signed byte array
STANDIN_INT = {(1, 0): "nv_u8", (1, 1): "char", (2, 0): "nv_u16", (2, 1): "nv_s16", (4, 0): "nv_u32",
               (4, 1): "nv_s32", (8, 0): "nv_u64", (8, 1): "nv_s64"}


def standin_idents() -> tuple[set[str], set[str]]:
    """The identifiers and the struct tags the stand-in's own sources use."""
    ids: set[str] = set()
    tags: set[str] = set()
    own: set[str] = set()
    for p in sorted(STANDIN.glob("*.[ch]")):
        if p.name in STANDIN_GENERATED:
            continue
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", p.read_text(), flags=re.S)
        ids |= set(re.findall(r"\b[A-Za-z_]\w*\b", text))
        tags |= set(re.findall(r"\bstruct\s+(\w+)", text))
        own |= set(re.findall(r"\bstruct\s+(\w+)\s*\{", text)) | set(re.findall(r"#define\s+(\w+)", text))
    return ids - own, tags - own


class SField:
    def __init__(self, path: str, ntype: str, npath: str, key: str) -> None:
        self.path, self.ntype, self.npath, self.key = path, ntype, npath, key
        self.off = self.size = self.cls = self.esize = self.ecls = self.sign = self.esign = None
        self.isptr = None
        self.nested: str | None = None


def standin_structs(rows: list[Row]) -> tuple[dict[str, str], dict[str, str], dict[str, list[SField]],
                                                dict[str, tuple[str, str]]]:
    """From the manifest: our struct -> NVIDIA's type (its sizeof row), our struct -> the key of
    its size, our struct -> its fields (our path, NVIDIA's type and path), and the tails
    (tail struct -> (whole struct, the key of the tail's first field))."""
    ntype: dict[str, str] = {}
    size_key: dict[str, str] = {}
    fields: dict[str, list[SField]] = {}
    tails: dict[str, tuple[str, str]] = {}
    bases: dict[str, str] = {}
    for r in rows:
        m = re.fullmatch(r"sizeof (\w+)", r.key)
        if m:
            n = re.fullmatch(r"sizeof\((\w+)\)", r.nvidia.strip())
            if n:
                ntype[m.group(1)] = n.group(1)
                size_key[m.group(1)] = r.key
            continue
        m = re.fullmatch(r"(\w+)\.(\w+)", r.key)
        n = re.fullmatch(r"offsetof\((\w+),\s*([\w.]+)\)", r.nvidia.strip())
        if not m or not n:
            continue
        st, path = m.group(1), m.group(2)
        o = re.search(r"offsetof\(struct " + st + r",\s*([\w.]+)\)", r.ours)
        if o:
            path = o.group(1)
        ntype.setdefault(st, n.group(1))
        fields.setdefault(st, []).append(SField(path, n.group(1), n.group(2), r.key))
        t = re.fullmatch(r"T->(\w+_tail)", r.ours.strip())
        if t:
            bases[t.group(1)] = r.key
        t = re.fullmatch(r"T->(\w+_tail) \+ offsetof\(struct (\w+), \w+\)", r.ours.strip())
        if t:
            tails[t.group(2)] = (st, t.group(1))
    tails = {k: (st, bases[b]) for k, (st, b) in tails.items()}
    return ntype, size_key, fields, tails


def standin_probe(root: Path, exprs: list[str], tmp: Path) -> list[str]:
    """exprs evaluated against a vendored tree, as extract_tree's probe (ABSENT: no compile)."""
    include_dirs = [root / d for d in INCLUDE_DIRS]
    sdk = include_dirs[0]
    incs = sorted(sdk.glob("class/*.h")) + sorted(sdk.glob("ctrl/**/*.h"))
    have = [h for h in NV_HEADERS if any((d / h).exists() for d in include_dirs)]
    prelude = "\n".join(["#include <stddef.h>", "#include <stdio.h>"] + [f'#include "{h}"' for h in have]
                        + [f'#include "{p.relative_to(sdk)}"' for p in incs])
    return run_probe([Row("", "", "")] * len(exprs), exprs, prelude, [f"-I{d}" for d in include_dirs], tmp)


def standin_cint(v: int) -> str:
    if v < 10:
        return str(v)
    if v > 0xFFFFFFFF:
        return f"0x{v:x}ULL"
    return f"0x{v:x}" + ("U" if v > 0x7FFFFFFF else "")


def standin_files() -> tuple[str, str]:
    """tests/standin/nvstub_abi.h and nvstub_tables.c, from the vendored headers alone:
    every NVIDIA value the stand-in names (its defines as the newest vendored layout that
    has them gives them), every struct it names laid out as NVIDIA's newest lays it out
    (explicit padding, _Static_assert of each size and offset), and one row per layout of
    what differs between releases (struct nvstub_table), each from its own tag."""
    missing = missing_vendored()
    if missing:
        raise SystemExit(f"not vendored: {', '.join(missing)} (run scripts/nvrm-abi.py vendor)")
    tags = vendored_tags()
    layouts = sorted({r.layout for r in supported()}, key=vkey)
    newest = layouts[-1]
    values = vendored_values(layouts)
    rows = manifest()
    ids, used_tags = standin_idents()

    def value(key: str) -> str:
        for lay in reversed(layouts):
            if values[lay][key] != ABSENT:
                return values[lay][key]
        raise SystemExit(f"{key}: absent from every vendored layout")

    ntype, size_key, fields, tails = standin_structs(rows)
    want = sorted((used_tags & (set(fields) | set(tails))))
    # the defines: manifest keys that are names the stand-in uses, and the extras
    defines: dict[str, str] = {}
    for r in rows:
        if re.fullmatch(r"[A-Z_][A-Z0-9_]*", r.key) and r.key in ids:
            defines[r.key] = value(r.key)
    extra = [n for n in STANDIN_EXTRA if n not in defines]
    # what the newest tag says of each field, and of the extras
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        tag = tags[newest][0]
        unpack_vendored(t / "nvidia", [tag])
        root = t / "nvidia" / tag
        flist = [f for st in sorted(fields) for f in fields[st]]
        own_n = [n for _, n in STANDIN_OWN if "@" not in n]
        exprs = list(extra) + own_n
        for f in flist:
            fe = f"((({f.ntype} *)0)->{f.npath})"
            exprs += [f"__builtin_classify_type({fe})", f"sizeof({fe})",
                      f"__builtin_types_compatible_p(__typeof__({fe}), __typeof__(&({fe})[0]))",
                      f"sizeof(({fe})[0])", f"__builtin_classify_type(({fe})[0])",
                      f"(__typeof__({fe}))-1 < 0", f"(__typeof__(({fe})[0]))-1 < 0",
                      f"__alignof__({f.ntype})"]
        out = standin_probe(root, exprs, t)
        for n, v in zip(extra, out):
            if v == ABSENT:
                raise SystemExit(f"{n}: not in NVIDIA's headers ({tag})")
            defines[n] = v
        k = len(extra)
        own_v = dict(zip(own_n, out[k:k + len(own_n)]))
        k += len(own_n)
        for n, v in own_v.items():
            if v == ABSENT:
                raise SystemExit(f"{n}: does not compile against NVIDIA's headers ({tag})")
        for _, n in STANDIN_OWN:
            if "@" in n:
                key, lay = n.split("@")
                own_v[n] = values[lay][key]
        align: dict[str, int] = {}
        for f in flist:
            cls, size, isptr, esize, ecls, sign, esign, al = out[k:k + 8]
            k += 8
            f.cls, f.size = int(cls), int(size)
            f.isptr = isptr != ABSENT and int(isptr) == 1
            f.esize = None if esize == ABSENT else int(esize)
            f.ecls = None if ecls == ABSENT else int(ecls)
            f.sign = None if sign == ABSENT else int(sign)
            f.esign = None if esign == ABSENT else int(esign)
            f.off = int(values[newest][f.key])
            align[f.ntype] = int(al)
        # aggregates: which of our structs each is (the type NVIDIA gives it)
        aggs = [f for f in flist if f.cls in (12, 13) or (f.cls == 5 and not f.isptr and f.ecls in (12, 13))]
        cands = [st for st in ntype if st in size_key]
        cexprs = []
        for f in aggs:
            fe = f"((({f.ntype} *)0)->{f.npath})" + ("[0]" if f.cls == 5 else "")
            cexprs += [f"__builtin_types_compatible_p(__typeof__({fe}), {ntype[st]})" for st in cands]
        cout = standin_probe(root, cexprs, t) if cexprs else []
        for i, f in enumerate(aggs):
            hit = [st for j, st in enumerate(cands) if cout[i * len(cands) + j] == "1"]
            f.nested = hit[0] if hit else None
    # every struct the chosen ones hold
    order: list[str] = []

    def need(st: str) -> None:
        if st in order:
            return
        for f in fields.get(st, []):
            if f.nested and f.nested != st:
                need(f.nested)
        order.append(st)

    for st in want:
        if st in tails:
            need(tails[st][0])
        else:
            need(st)
    for st in want:
        if st in tails and st not in order:
            order.append(st)

    def ctype(st: str, f: SField) -> tuple[str, str]:
        """(type, suffix) of a field."""
        if (st, f.path) in STANDIN_AS:
            ty, n = STANDIN_AS[(st, f.path)]
            if f.size % n:
                raise SystemExit(f"{st}.{f.path}: {f.size} bytes, not a multiple of {n}")
            return ty, f"[{f.size // n}]"
        if f.cls in (12, 13):
            if not f.nested:
                return "nv_u8", f"[{f.size}]"
            return f"struct {f.nested}", ""
        if f.cls == 5 and f.isptr:
            return "nv_u64", ""
        if f.cls == 5:
            n = f.size // f.esize
            if f.ecls in (12, 13):
                return (f"struct {f.nested}", f"[{n}]") if f.nested else ("nv_u8", f"[{f.size}]")
            return STANDIN_INT[(f.esize, f.esign or 0)], f"[{n}]"
        return STANDIN_INT[(f.size, f.sign or 0)], ""

    def emit(st: str, flds: list[SField], base: int, total: int | None, al: int, nt: str) -> list[str]:
        lines = [f"struct {st} {{\t/* {nt}" + (f", from its offset {base}" if base else "") + " */"]
        asserts = []
        pos = 0
        groups: dict[str, list[SField]] = {}
        items: list[tuple[int, str, list[SField]]] = []
        for f in sorted(flds, key=lambda f: (f.off, f.path)):
            if "." in f.path:
                g = f.path.split(".")[0]
                if g not in groups:
                    groups[g] = []
                    items.append((f.off - base, g, groups[g]))
                groups[g].append(f)
            else:
                items.append((f.off - base, f.path, [f]))
        for off, name, fl in items:
            if off < pos:
                raise SystemExit(f"{st}.{name}: at {off}, overlaps the field before it (ends at {pos})")
            if off > pos:
                lines.append(f"\tnv_u8 pad_{pos}[{off - pos}];")
            if len(fl) == 1 and "." not in fl[0].path:
                ty, suf = ctype(st, fl[0])
                lines.append(f"\t{ty} {name}{suf};\t/* {fl[0].npath} */")
                end = off + fl[0].size
                asserts.append((f"offsetof(struct {st}, {name})", off))
                asserts.append((f"sizeof(((struct {st} *)0)->{name})", fl[0].size))
            else:
                if any(x.off != fl[0].off for x in fl):
                    raise SystemExit(f"{st}.{name}: members at different offsets")
                lines.append("\tunion {")
                for x in fl:
                    ty, suf = ctype(st, x)
                    member = x.path.split(".", 1)[1]
                    lines.append(f"\t\t{ty} {member}{suf};\t/* {x.npath} */")
                    asserts.append((f"offsetof(struct {st}, {x.path})", off))
                    asserts.append((f"sizeof(((struct {st} *)0)->{x.path})", x.size))
                lines.append(f"\t}} {name};")
                end = off + max(x.size for x in fl)
            pos = end
        if total is not None and total > pos:
            lines.append(f"\tnv_u8 pad_{pos}[{total - pos}];")
        lines.append(f"}} __attribute__((aligned({al})));" if al > 1 else "};")
        if total is not None:
            asserts.append((f"sizeof(struct {st})", total))
        lines += [f"NVSTUB_ABI({e}, {v});" for e, v in asserts]
        return lines + [""]

    body: list[str] = []
    for st in order:
        if st in tails:
            whole, first = tails[st]
            base = int(values[newest][first])
            flds = [f for f in fields[whole] if f.off >= base]
            tot = int(values[newest][size_key[whole]]) - base if whole in size_key else None
            body += emit(st, flds, base, tot, align[ntype[whole]], ntype[whole])
            continue
        tot = int(values[newest][size_key[st]]) if st in size_key else None
        body += emit(st, fields[st], 0, tot, align.get(ntype[st], 1), ntype[st])

    head = ["/* SPDX-License-Identifier: GPL-2.0 OR MIT */",
            "/*",
            " * nvstub_abi.h - the NVIDIA RM user ABI the stand-in answers: NVIDIA's values and",
            " * layouts, generated by scripts/nvrm-abi.py standin from NVIDIA's headers vendored",
            " * in abi/nvidia/headers.tar.xz (open-gpu-kernel-modules, MIT; abi/nvidia/COPYING)",
            f" * alone; the structs as tag {tags[newest][0]} lays them out, every define as the newest",
            " * vendored tag that has it gives it. What differs between releases is in struct",
            " * nvstub_table (nvstub_tables.c, one row per vendored tag). Do not edit: run",
            " * scripts/nvrm-abi.py standin.",
            " */",
            "#ifndef NVSTUB_ABI_H",
            "#define NVSTUB_ABI_H",
            "",
            "#ifdef __KERNEL__",
            "#include <linux/types.h>",
            "#include <linux/stddef.h>",
            "#else",
            "#include <stddef.h>",
            "#include <stdint.h>",
            "#endif",
            "",
            "typedef uint8_t nv_u8;",
            "typedef uint16_t nv_u16;",
            "typedef int16_t nv_s16;",
            "typedef uint32_t nv_u32;",
            "typedef int32_t nv_s32;",
            "typedef uint64_t nv_u64;",
            "typedef int64_t nv_s64;",
            "typedef uint32_t nv_handle;",
            "#define NV_ALIGN8 __attribute__((aligned(8)))",
            "",
            "#define NVSTUB_ABI(what, nvidia) \\",
            "\t_Static_assert((what) == (nvidia), #what \" is NVIDIA's \" #nvidia)",
            ""]
    for n in sorted(defines):
        head.append(f"#define {n}\t{standin_cint(int(defines[n]))}")
    head.append("")
    tfields = "".join(f"\tnv_u32 {f};\n" for f, _ in TABLE_FIELDS)
    tail = ["/* what differs between the releases (nvstub_tables.c) */",
            "struct nvstub_table {",
            "\tconst char *branch;",
            "\tconst char *const *versions;\t/* NULL-terminated */",
            tfields.rstrip("\n"),
            "};",
            "",
            "extern const struct nvstub_table nvstub_tables[];",
            "extern const unsigned int nvstub_nr_tables;",
            "const struct nvstub_table *nvstub_table_find(const char *version);",
            "",
            "#endif /* NVSTUB_ABI_H */",
            ""]
    header = "\n".join(head + body + tail)

    # the rows: one per vendored layout, oldest first, from its own tag's values
    c = ["// SPDX-License-Identifier: GPL-2.0 OR MIT",
         "/*",
         " * nvstub_tables.c - what differs between the releases the stand-in answers as, one",
         " * row per layout of abi/layouts/, each from its tag's headers vendored in",
         " * abi/nvidia/headers.tar.xz (the releases of each: abi/versions.tsv). Generated by",
         " * scripts/nvrm-abi.py standin; do not edit.",
         " */",
         '#include "nvstub_abi.h"',
         "",
         "#ifdef __KERNEL__",
         "#include <linux/string.h>",
         "#else",
         "#include <string.h>",
         "#endif",
         ""]
    for i, lay in enumerate(layouts):
        vs = sorted((r.version for r in supported() if r.layout == lay), key=vkey)
        c.append(f"static const char *const nvstub_versions_{i}[] = {{\t/* tag {tags[lay][0]} */")
        line = "\t"
        for v in vs:
            item = f'"{v}", '
            if len(line.expandtabs()) + len(item) > 80:
                c.append(line.rstrip())
                line = "\t"
            line += item
        c += [line + "NULL", "};", ""]
    c += ["#ifdef __KERNEL__",
          "/*",
          " * The stand-in's own copies of NVIDIA's blocks and values (nvstub.h), against",
          f" * NVIDIA's (tag {tags[newest][0]} unless named).",
          " */",
          '#include "nvstub.h"',
          ""]
    for ours, n in STANDIN_OWN:
        where = f"\t/* {n.split('@')[1]} */" if "@" in n else ""
        c.append(f"NVSTUB_ABI({ours}, {standin_cint(int(own_v[n]))});{where}")
    c += ["#endif", ""]
    c.append("const struct nvstub_table nvstub_tables[] = {")
    for i, lay in enumerate(layouts):
        vals = values[lay]
        c += ["\t{", f'\t\t.branch = "{lay.split(".")[0]}",', f"\t\t.versions = nvstub_versions_{i},"]
        for f, key in TABLE_FIELDS:
            v = int(vals[key] != ABSENT) if f == "wait_open_complete" else int(vals[key])
            c.append(f"\t\t.{f} = {v},")
        c.append("\t},")
    c += ["};", "", "const unsigned int nvstub_nr_tables = sizeof(nvstub_tables) / sizeof(nvstub_tables[0]);", "",
          "const struct nvstub_table *nvstub_table_find(const char *version)",
          "{",
          "\tunsigned int i, j;",
          "",
          "\tfor (i = 0; i < nvstub_nr_tables; i++)",
          "\t\tfor (j = 0; nvstub_tables[i].versions[j]; j++)",
          "\t\t\tif (!strcmp(nvstub_tables[i].versions[j], version))",
          "\t\t\t\treturn &nvstub_tables[i];",
          "\treturn NULL;",
          "}", ""]
    return header, "\n".join(c)


def cmd_standin(a: argparse.Namespace) -> int:
    header, tables = standin_files()
    stale = []
    for path, text in ((STANDIN_ABI_H, header), (STANDIN_TABLES_C, tables)):
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not a.check:
                path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(REPO)}: {'stale: run scripts/nvrm-abi.py standin' if a.check else 'written'}")
    return 1 if stale and a.check else 0


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
    p.add_argument("--vendored", action="store_true", help="abi/nvidia/'s headers, no mirror")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("vendor")
    p.add_argument("--mirror")
    p.add_argument("--unpack", metavar="DIR", help="write the vendored trees to DIR/<tag>/ (no mirror)")
    p.add_argument("layouts", nargs="*", metavar="LAYOUT", help="only these layouts (default: all)")
    p.set_defaults(fn=cmd_vendor)
    p = sub.add_parser("gen")
    p.add_argument("--check", action="store_true")
    p.set_defaults(fn=cmd_gen)
    p = sub.add_parser("doc")
    p.set_defaults(fn=cmd_doc)
    p = sub.add_parser("ours")
    p.add_argument("--vendored", action="store_true",
                   help="against the values abi/nvidia/'s headers give, not abi/layouts/")
    p.set_defaults(fn=cmd_ours)
    p = sub.add_parser("standin")
    p.add_argument("--check", action="store_true")
    p.set_defaults(fn=cmd_standin)
    p = sub.add_parser("diff")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(fn=cmd_diff)
    a = ap.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())

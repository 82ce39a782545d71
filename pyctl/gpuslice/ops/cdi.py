"""Container Device Interface (CDI) spec for gpuslice instances (`gpuctl cdi generate`).

One CDI device per instance, kind ``gpuslice.dev/gpu``: ``podman run --device
gpuslice.dev/gpu=web`` gets the instance's nodes at the paths CUDA opens
(``/dev/nvidiactl``, ``/dev/nvidia<N>``, ``/dev/nvidia-uvm``; host paths
``/dev/gpuslice/web/...``) and, for every device, the host's NVIDIA user-space driver
files mounted read-only at their host paths, the way ``nvidia-ctk cdi generate`` does.
The real ``/dev/nvidia*`` nodes are never in the spec.

cdiVersion is 0.5.0: the first spec version with ``hostPath`` on a device node (which
is what puts a gpuslice node at an NVIDIA path), and the last one the CDI library of
podman 4.3 (Debian 12) accepts; a 0.6.0 spec is refused there as an unknown version.

Everything but :func:`scan_host` and :func:`write_spec` is pure.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gpuslice.netlink import CAPS_ALL, caps_text, gpus_of

CDI_VERSION = "0.5.0"
KIND = "gpuslice.dev/gpu"
DEV_ROOT = "/dev/gpuslice"
DEFAULT_OUTPUT = "/etc/cdi/gpuslice.yaml"
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]  # as nvidia-ctk writes them

# The compute and management part of the driver, as nvidia-ctk's "driver" discoverer
# takes it (graphics, video and display libraries are left out: CUDA does not need them).
LIBRARIES = (
    "libcuda", "libcudadebugger", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm",
    "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-allocator", "libnvidia-cfg",
    "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nscq", "libnvidia-compiler",
    "libnvidia-fatbinaryloader",
)
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
# Where scan_host() looks: the multiarch and lib64 directories, and Debian's own
# packaging of the driver (nvidia-alternative puts the libraries in nvidia/current).
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/lib64", "/usr/lib",
            "/lib/x86_64-linux-gnu", "/lib64")
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
FIRMWARE_DIR = "/lib/firmware/nvidia"

_LIB_RE = re.compile(r"(?P<stem>lib[\w+-]+?)\.so\.(?P<ver>[0-9][0-9.]*)$")
_FIRMWARE_RE = re.compile(r"gsp_\w+\.bin$")


@dataclass(frozen=True)
class Instance:
    """What the spec needs of an instance: its name, GPU minors and capability set
    (netlink.CAPS bits; None: all)."""
    name: str
    gpus: tuple[int, ...]
    caps: int | None = None


_CDI_NAME_RE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?")


def is_cdi_name(name: str) -> bool:
    """A CDI device name: alphanumerics, with ``_.:-`` inside only. Instance names may
    also start or end with ``_.-``; such an instance cannot be a CDI device."""
    return bool(_CDI_NAME_RE.fullmatch(name))


def instances_from_netlink(replies: Iterable[Mapping[str, Any]]) -> list[Instance]:
    """INSTANCE_GET replies (netlink.to_dict) -> instances, sorted by name."""
    out = []
    for d in replies:
        if "name" not in d:
            continue
        caps = d.get("caps")
        out.append(Instance(d["name"], tuple(gpus_of(int(d.get("gpu_mask", 0)))), None if caps is None else int(caps)))
    return sorted(out, key=lambda i: i.name)


def driver_files(listing: Iterable[str]) -> list[str]:
    """The NVIDIA user-space driver files among ``listing`` (absolute paths of what
    exists on the host) that a container needs, sorted and without duplicates:

    - the versioned libraries (``libcuda.so.580.159.04``) and their soname links
      (``libcuda.so.1``), never the unversioned development links (``libcuda.so``),
      whose bind mount nvidia-ctk leaves out too;
    - the tools (``nvidia-smi``, ...) in a bin directory;
    - the GSP firmware (``/lib/firmware/nvidia/<version>/gsp_*.bin``).
    """
    libs = set(LIBRARIES)
    out = set()
    for path in listing:
        if not path.startswith("/"):
            continue
        d, base = os.path.split(path)
        m = _LIB_RE.match(base)
        if m and m.group("stem") in libs:
            out.add(path)
        elif base in BINARIES and os.path.basename(d) in ("bin", "sbin"):
            out.add(path)
        elif _FIRMWARE_RE.match(base) and path.startswith(FIRMWARE_DIR + "/"):
            out.add(path)
    return sorted(out)


def device_nodes(inst: Instance, dev_root: str = DEV_ROOT) -> list[dict[str, str]]:
    """The instance's nodes, each at the NVIDIA path a CUDA program opens."""
    names = ["nvidiactl", *(f"nvidia{g}" for g in inst.gpus), "nvidia-uvm"]
    return [{"path": f"/dev/{n}", "hostPath": f"{dev_root}/{inst.name}/{n}"} for n in names]


def mounts(files: Sequence[str]) -> list[dict[str, Any]]:
    """Read-only bind mounts of driver files at their host paths."""
    return [{"hostPath": f, "containerPath": f, "options": list(MOUNT_OPTIONS)} for f in files]


def ldcache_hook(files: Sequence[str], nvidia_ctk: str | None) -> list[dict[str, Any]]:
    """nvidia-ctk's createContainer hook that adds the libraries' directories to the
    container's ld.so cache, when the host has nvidia-ctk (else none: the libraries
    are mounted at their host paths, which Debian and Ubuntu images search anyway)."""
    if nvidia_ctk is None:
        return []
    dirs = sorted({os.path.dirname(f) for f in files if ".so." in os.path.basename(f)})
    if not dirs:
        return []
    args = ["nvidia-ctk", "hook", "update-ldcache"]
    for d in dirs:
        args += ["--folder", d]
    return [{"hookName": "createContainer", "path": nvidia_ctk, "args": args}]


# The environment the spec gives every device (containerEdits at the top): without
# NVIDIA_VISIBLE_DEVICES=void, an NVIDIA runtime or hook in the same container (a host
# whose default runtime is NVIDIA's) adds the real nodes, and the module then refuses the
# instance's nodes to that process.
SHARED_ENV = ("NVIDIA_VISIBLE_DEVICES=void",)


def instance_env(name: str, caps: int | None = None) -> list[str]:
    """The environment of one instance's device: GPUSLICE_INSTANCE names it (the
    daemon's sources and reconcile read it), NVIDIA_DRIVER_CAPABILITIES is its
    capability set (``all``, or e.g. ``compute,utility``: what the module lets it use)."""
    return [f"GPUSLICE_INSTANCE={name}", f"NVIDIA_DRIVER_CAPABILITIES={caps_text(CAPS_ALL if caps is None else caps)}"]


def container_env(name: str, caps: int | None = None) -> list[str]:
    """All the environment the spec gives a container of instance NAME (its device's,
    then the shared): what `gpuctl run-args` passes with --env, so the two cannot drift."""
    return [*instance_env(name, caps), *SHARED_ENV]


def build_spec(instances: Iterable[Instance], files: Sequence[str], nvidia_ctk: str | None = None,
               dev_root: str = DEV_ROOT, kind: str = KIND) -> dict[str, Any]:
    """The CDI spec: one device per instance (its nodes and GPUSLICE_INSTANCE), and
    edits shared by all of them (the driver files, NVIDIA_VISIBLE_DEVICES=void so that
    an NVIDIA runtime hook in the same container adds no real node). An instance whose
    name is not a CDI name (is_cdi_name) is left out."""
    devices = [{"name": i.name,
                "containerEdits": {"env": instance_env(i.name, i.caps),
                                   "deviceNodes": device_nodes(i, dev_root)}}
               for i in sorted(instances, key=lambda i: i.name) if is_cdi_name(i.name)]
    edits: dict[str, Any] = {"env": list(SHARED_ENV)}
    if files:
        edits["mounts"] = mounts(files)
    hooks = ldcache_hook(files, nvidia_ctk)
    if hooks:
        edits["hooks"] = hooks
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices, "containerEdits": edits}


def check_spec(spec: Mapping[str, Any], dev_root: str = DEV_ROOT) -> list[str]:
    """What is wrong with a spec by the rules this module relies on (empty: nothing):
    CDI device names, absolute paths, every node an instance's, never a real one."""
    errs = []
    for dev in spec.get("devices", []):
        if not is_cdi_name(dev.get("name", "")):
            errs.append(f"device name {dev.get('name')!r} is not a CDI name")
        for node in dev.get("containerEdits", {}).get("deviceNodes", []):
            host = node.get("hostPath", node.get("path", ""))
            if re.fullmatch(r"/dev/nvidia[^/]*", host):
                errs.append(f"{dev.get('name')}: the real node {host} in the spec")
            elif not host.startswith(dev_root + "/"):
                errs.append(f"{dev.get('name')}: host path {host!r} is not an instance node")
    for m in spec.get("containerEdits", {}).get("mounts", []):
        if not m["hostPath"].startswith("/") or not m["containerPath"].startswith("/"):
            errs.append(f"mount {m['hostPath']!r}: paths must be absolute")
    return errs


def render(spec: Mapping[str, Any]) -> str:
    """The spec as YAML, in the order CDI documents write it."""
    import yaml

    head = "# generated by `gpuctl cdi generate`; regenerated by `gpuctl instance create/delete`\n"
    return (head if spec.get("kind") == KIND else "# generated by gpuctl\n") + yaml.safe_dump(dict(spec), sort_keys=False, default_flow_style=False)


# ---- the host ------------------------------------------------------------------------

def scan_host(lib_dirs: Sequence[str] = LIB_DIRS, bin_dirs: Sequence[str] = BIN_DIRS,
              firmware_dir: str = FIRMWARE_DIR, root: str = "/") -> list[str]:
    """Every file name in the host's library, bin and firmware directories (one level;
    the firmware's version directories too). A directory that is a symlink to one
    already listed (usrmerge: /lib -> /usr/lib) is skipped. ``root``: where the host's
    root is mounted (a plugin in a container: e.g. /host); the names returned are the
    host's own paths, as the spec needs them."""
    seen: set[str] = set()
    out: list[str] = []
    root = os.path.abspath(root)

    def at_root(d: str) -> str:
        return d if root == "/" else root + d

    def listdir(d: str) -> None:
        here = at_root(d)
        real = os.path.realpath(here)
        if root != "/" and os.path.islink(here):  # a host symlink (usrmerge) names a host path
            target = os.readlink(here)
            real = os.path.realpath(at_root(target if target.startswith("/") else
                                            os.path.join(os.path.dirname(d), target)))
        if real in seen or not os.path.isdir(here):
            return
        seen.add(real)
        try:
            out.extend(os.path.join(d, n) for n in os.listdir(here))
        except OSError:
            pass

    for d in (*lib_dirs, *bin_dirs):
        listdir(d)
    if os.path.isdir(at_root(firmware_dir)):
        for v in sorted(os.listdir(at_root(firmware_dir))):
            listdir(os.path.join(firmware_dir, v))
    return out


def find_nvidia_ctk(bin_dirs: Sequence[str] = BIN_DIRS, root: str = "/") -> str | None:
    """The host path of nvidia-ctk, looked for under ``root`` (see scan_host)."""
    root = os.path.abspath(root)
    for d in bin_dirs:
        p = os.path.join(d, "nvidia-ctk")
        if os.access(p if root == "/" else root + p, os.X_OK):
            return p
    return None


def is_ours(path: str) -> bool:
    """May gpuctl replace or remove the file at ``path``: nothing there, an empty file,
    or a CDI spec of our kind. Another vendor's spec (``-o /etc/cdi/nvidia.yaml``) or any
    other file is not ours to overwrite or delete."""
    import yaml

    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except FileNotFoundError:
        return True
    except IsADirectoryError:
        return False
    if not text.strip():
        return True
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(doc, dict) and doc.get("kind") == KIND


def write_spec(path: str, text: str) -> None:
    """Write atomically (a runtime reading the directory never sees half a spec),
    mode 0644: podman run by a user reads it too."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gpuslice-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

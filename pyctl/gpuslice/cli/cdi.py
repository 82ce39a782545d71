"""`gpuctl cdi generate`, and the CDI spec that `instance create`, `delete` and
`restore` regenerate (--cdi-spec; default /etc/cdi/gpuslice.yaml where /etc/cdi exists)."""

from __future__ import annotations

import os
from typing import Any

import click

from gpuslice import state as S

from .common import GpuctlError, emit, json_option, kernel, table, warn

NO_DRIVER_FILES = ("no NVIDIA driver files found on this host: containers will get no libcuda "
                   "(is the driver installed?)")


def _cdi_instances(ctx: click.Context, st: S.State | None = None) -> list[Any]:
    """The instances for the spec: the module's (their nodes exist), or with no module
    (--kernel no, or not loaded) the state file's."""
    from gpuslice.ops import cdi

    st = st if st is not None else S.load(ctx.obj["state"])
    owned = {i.name for i in st.instances.values() if i.owner is not None}  # in their owners' own specs
    nl = kernel(ctx)
    if nl is not None:
        return [i for i in cdi.instances_from_netlink(nl.instances()) if i.name not in owned]
    return [cdi.Instance(i.name, tuple(i.gpus), i.caps) for i in sorted(st.instances.values(), key=lambda i: i.name)
            if i.name not in owned]


def _cdi_spec(ctx: click.Context, st: S.State | None = None) -> dict[str, Any]:
    from gpuslice.ops import cdi

    insts = _cdi_instances(ctx, st)
    bad = [i.name for i in insts if not cdi.is_cdi_name(i.name)]
    if bad and not ctx.meta.get("gpuslice.warned_cdi_names"):  # once per command, all of them in one line
        ctx.meta["gpuslice.warned_cdi_names"] = True
        warn([f"left out of the CDI spec, as CDI device names start and end with a letter or digit: "
              f"{', '.join(repr(n) for n in bad)} (made before names had to be; recreate under another name)"])
    spec = cdi.build_spec(insts, cdi.driver_files(cdi.scan_host()), cdi.find_nvidia_ctk())
    errs = cdi.check_spec(spec)
    if errs:
        raise GpuctlError(f"CDI spec not written: {errs[0]}")
    return spec


def cdi_spec_path(ctx: click.Context) -> str | None:
    """The spec the instance commands keep current: --cdi-spec (GPUSLICE_CDI_SPEC), else
    /etc/cdi/gpuslice.yaml (the one `gpuctl doctor` checks) where its directory exists;
    None with an empty --cdi-spec, or without the directory."""
    from gpuslice.ops import cdi

    path = ctx.obj.get("cdi_spec")
    if path is None:
        path = cdi.DEFAULT_OUTPUT
        return path if os.path.isdir(os.path.dirname(path)) else None
    return path or None


def _regenerate_cdi(ctx: click.Context, st: S.State) -> str | None:
    """Rewrite the spec (:func:`cdi_spec_path`); what went wrong, or None. Never
    raises: the change it follows is made and saved either way. The default spec that
    cannot be written (a read-only /etc, a user other than root) is a warning: only
    one asked for (--cdi-spec, GPUSLICE_CDI_SPEC) fails the command."""
    path = cdi_spec_path(ctx)
    if not path:
        return None
    try:
        _write_or_remove(path, _cdi_spec(ctx, st))
    except OSError as e:
        err = f"the CDI spec {path} was not written: {e.strerror or e}"
    except GpuctlError as e:
        err = str(e)
    else:
        return None
    if ctx.obj.get("cdi_spec") is None:
        warn([f"{err} (the default spec; --cdi-spec '' for none)"])
        return None
    return err


def _cdi_failed(done: str, err: str | None) -> None:
    if err:
        raise GpuctlError(f"{done}, but {err}")


def _write_or_remove(path: str, spec: dict[str, Any]) -> str:
    """Write the spec, or remove it when there is no instance: CDI refuses a spec
    without devices, and older runtimes then ignore every spec in the directory.
    What was done: "written", "removed" (an old spec), or "nothing" (none was there)."""
    from gpuslice.ops import cdi

    if not cdi.is_ours(path):
        raise GpuctlError(f"{path} is not a CDI spec of kind {cdi.KIND}: left as it is")
    if spec["devices"]:
        cdi.write_spec(path, cdi.render(spec))
        return "written"
    try:
        os.unlink(path)
    except FileNotFoundError:
        return "nothing"
    return "removed"


@click.group("cdi")
def cdi_group() -> None:
    """Container Device Interface: `podman run --device gpuslice.dev/gpu=NAME`."""


@cdi_group.command("generate")
@click.option("--output", "-o", metavar="PATH", help="Write the spec here (e.g. /etc/cdi/gpuslice.yaml) "
              "instead of printing it.")
@json_option(instead="YAML")
@click.pass_context
def cdi_generate(ctx: click.Context, output: str | None) -> None:
    """A CDI spec with one device per instance (kind gpuslice.dev/gpu): the instance's
    nodes at /dev/nvidiactl, /dev/nvidia<N> and /dev/nvidia-uvm, and the host's NVIDIA
    driver files (libcuda, libnvidia-ml, nvidia-smi, ...) mounted read-only. Printed as
    YAML (JSON with --json), or written to --output with a summary (no instance: nothing
    is written, and an old spec there is removed, as CDI refuses a spec without devices)."""
    from gpuslice.ops import cdi

    spec = _cdi_spec(ctx)
    no_driver = [NO_DRIVER_FILES] if spec["devices"] and not spec["containerEdits"].get("mounts") else []
    if output is None:
        emit(ctx, spec, lambda: cdi.render(spec).rstrip("\n"))
        warn(no_driver)
        return
    try:
        written = _write_or_remove(output, spec)
    except OSError as e:
        raise GpuctlError(f"cannot write the CDI spec {output}: {e.strerror or e}") from None
    if written != "written":
        removed = written == "removed"
        emit(ctx, {"output": output, "devices": [], "mounts": 0, "removed": removed},
             lambda: "no instances: nothing written"
             + (f"; {output} removed (a CDI spec needs a device)" if removed else ""))
        return
    rows = [{"device": f"{cdi.KIND}={d['name']}",
             "nodes": ",".join(n["path"] for n in d["containerEdits"]["deviceNodes"])} for d in spec["devices"]]
    warn(no_driver)
    mounts = len(spec["containerEdits"].get("mounts", []))
    emit(ctx, {"output": output, "devices": [d["name"] for d in spec["devices"]], "mounts": mounts},
         lambda: f"wrote {output}: {len(rows)} devices, {mounts} driver files\n"
         + table(rows, [("device", "DEVICE"), ("nodes", "NODES")]))

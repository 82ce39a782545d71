"""gpuctl: configure GPU slices (instances and policies) and run the scheduler daemon.

Units accepted everywhere: sizes in bytes with B/KiB/MiB/GiB/TiB (powers of 1024) or
kB/MB/GB/TB (powers of 1000); shares as a percentage (30%) or a fraction (0.3) of one
GPU; durations with ns/us/ms/s (a bare number is ms). Every command prints a table, or
JSON with --json. Errors are one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import click

from gpuslice import instances
from gpuslice import state as S
from gpuslice import units
from gpuslice.netlink import lock_summary
from gpuslice.policy import POLICIES, compute_shares, validate

STATUS_PATH = S.STATUS_PATH
PRELOAD_SOCK = "/run/gpuslice/preload.sock"
PRELOAD_DIR = "/run/gpuslice/instances"
GUARD_STATUS = "/run/gpuslice/guard.json"


class GpuctlError(Exception):
    """A one-line, user-facing error."""


# ---- click parameter types -----------------------------------------------------------

class _Unit(click.ParamType):  # type: ignore[type-arg]
    def __init__(self, name: str, fn: Callable[[str], Any]) -> None:
        self.name = name
        self.fn = fn

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.fn(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = _Unit("size", units.parse_size)
MEMORY = _Unit("memory", units.parse_memory)
MEMORY_HELP = "Video memory limit of each GPU, e.g. 8GiB, or per GPU, e.g. 0=8GiB,1=4GiB."
SHARE = _Unit("share", units.parse_share)
DURATION = _Unit("duration", units.parse_duration_ns)
# a duration where 0 (0, 0ms, 0.0s, ...) means "off"
DURATION_OR_0 = _Unit("duration", lambda t: 0 if re.fullmatch(r"\s*0*\.?0*\s*(ns|us|ms|s)?\s*", t, re.I)
                      and re.search(r"0", t) else units.parse_duration_ns(t))


def _gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise ValueError(f"not a GPU list: {text!r} (use e.g. 0 or 0,1)") from None
    if not gpus or any(not 0 <= g < S.MAX_GPUS for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"GPUs must be distinct numbers 0..{S.MAX_GPUS - 1}: {text!r}")
    return gpus


GPUS = _Unit("gpus", _gpu_list)


class ChoiceOrClass(click.ParamType):  # type: ignore[type-arg]
    """One of ``choices``, or MODULE:CLASS: a class imported with importlib from the
    process's Python path (PYTHONPATH), which must have the callable attributes ``needs``.
    Converts to the choice (a str) or to the class; :func:`construct` makes the object."""

    def __init__(self, name: str, choices: Sequence[str], needs: Sequence[str]) -> None:
        self.name = name
        self.choices = list(choices)
        self.needs = list(needs)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join([*self.choices, "MODULE:CLASS"]) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, type) or value in self.choices:
            return value
        mod, sep, attr = str(value).partition(":")
        if not (sep and mod and attr):
            self.fail(f"{value!r} is none of {', '.join(self.choices)} and not MODULE:CLASS", param, ctx)
        try:
            obj: Any = importlib.import_module(mod)
        except Exception as e:  # whatever the module raises: still one line
            self.fail(f"{value}: cannot import {mod}: {type(e).__name__}: {e}", param, ctx)
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                self.fail(f"{value}: module {mod} has no {attr}", param, ctx)
        if not isinstance(obj, type):
            self.fail(f"{value}: not a class but a {type(obj).__name__}", param, ctx)
        missing = [m for m in self.needs if not callable(getattr(obj, m, None))]
        if missing:
            self.fail(f"{value}: not a {self.name} (no {', '.join(m + '()' for m in missing)})", param, ctx)
        return obj


def construct(cls: type, option: str) -> Any:
    """``cls()`` for a MODULE:CLASS option value; its failure is the option's error."""
    try:
        return cls()
    except Exception as e:
        raise click.BadParameter(f"{cls.__module__}:{cls.__qualname__}(): {type(e).__name__}: {e}",
                                 param_hint=option) from None


SOURCE = ChoiceOrClass("source", ["auto", "netlink", "preload"], ["refresh", "channels", "close"])
PROBE = ChoiceOrClass("probe", ["auto", "cpu", "nvml", "submit", "all"], ["active"])


# ---- one-line errors -----------------------------------------------------------------

class OneLineGroup(click.Group):
    """A click group whose errors (usage or runtime) are one line on stderr."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            super().main(args, prog_name or "gpuctl", complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            _die("aborted", 130)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as e:  # bare `gpuctl`, `gpuctl instance`
            click.echo(e.ctx.get_help() if e.ctx else str(e))
            sys.exit(2)
        except click.ClickException as e:
            _die(e.format_message().replace("\n", " "), e.exit_code)
        except (GpuctlError, S.StateError) as e:
            _die(str(e), 1)
        except OSError as e:
            _die(str(e), 1)
        except Exception as e:  # a bug: still one line, traceback with GPUSLICE_DEBUG=1
            if os.environ.get("GPUSLICE_DEBUG"):
                raise
            _die(f"internal error: {type(e).__name__}: {e}", 2)
        sys.exit(0)


def _die(msg: str, code: int) -> None:
    click.echo(f"gpuctl: {msg}", err=True)
    sys.exit(code)


# ---- output --------------------------------------------------------------------------

def table(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]]) -> str:
    head = [h for _k, h in cols]
    body = [["-" if r.get(k) is None else str(r.get(k)) for k, _h in cols] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    return "\n".join(lines)


def emit(ctx: click.Context, data: Any, text: Callable[[], str]) -> None:
    if ctx.obj.get("json"):
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(text())


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    def cb(ctx: click.Context, _p: click.Parameter, v: bool) -> None:
        if v:
            ctx.ensure_object(dict)["json"] = True

    return click.option("--json", "as_json", is_flag=True, expose_value=False, callback=cb, is_eager=True,
                        help="Print JSON instead of a table.")(f)


# ---- kernel (netlink) access ---------------------------------------------------------

def kernel(ctx: click.Context) -> Any:
    """The module's netlink client, or None when not wanted / not loaded (mode auto)."""
    mode = ctx.obj["kernel"]
    if mode == "no":
        return None
    if "nl" not in ctx.obj:
        from gpuslice.netlink import GpusliceNetlink, NetlinkError, VersionMismatch, module_loaded

        if mode == "auto" and not module_loaded():
            ctx.obj["nl"] = None
            return None
        try:
            ctx.obj["nl"] = GpusliceNetlink()
        except VersionMismatch as e:  # refused whatever the mode: never talk to another ABI
            raise GpuctlError(str(e)) from None
        except (NetlinkError, OSError, ImportError) as e:
            if mode == "yes":
                raise GpuctlError(str(e)) from None
            ctx.obj["nl"] = None
    return ctx.obj["nl"]


def inst_row(i: S.Instance) -> dict[str, Any]:
    return {"name": i.name, "gpus": ",".join(map(str, i.gpus)), "memory": units.format_memory(i.memory, i.gpu_memory),
            "memory_bytes": i.memory, "weight": i.weight,
            "share": units.format_share(i.share) if i.share is not None else None,
            "ceiling": units.format_share(i.ceiling) if i.ceiling is not None else None,
            "priority": i.priority + (f" (min {units.format_share(i.min_share)})" if i.min_share else "")}


def inst_json(i: S.Instance) -> dict[str, Any]:
    return {"name": i.name, "gpus": i.gpus, "memory": i.memory,
            "gpu_memory": {str(g): i.memory_of(g) for g in i.gpus}, "weight": i.weight, "share": i.share,
            "ceiling": i.ceiling, "priority": i.priority, "min_share": i.min_share}


PRIORITY = click.Choice(["online", "offline"])
PRIORITY_HELP = ("online (default) or offline: while any online instance of the GPU has work, offline ones get "
                 "nothing (or their --min-share) and are preempted as soon as online work appears; with no "
                 "online work they share the GPU by its policy.")


# ---- the command tree ----------------------------------------------------------------

ID_RANGE = click.IntRange(0, 2**32 - 2)  # a kernel uid/gid: u32, (u32)-1 is no id
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT


def _non_empty(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An empty --state (an unset variable in a script) is an error, not the default file."""
    if not value:
        raise click.BadParameter("empty path", ctx=ctx, param=param)
    return value


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state", "state_path", envvar="GPUSLICE_STATE", default=S.DEFAULT_PATH, show_default=True,
              callback=_non_empty, help="State file (env GPUSLICE_STATE).")
@click.option("--kernel", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True,
              help="Apply changes to the gpuslice kernel module too: auto = when it is loaded.")
@click.option("--cdi-spec", envvar="GPUSLICE_CDI_SPEC", metavar="PATH",
              help="CDI spec that `instance create`, `delete` and `restore` regenerate, e.g. "
              "/etc/cdi/gpuslice.yaml (env GPUSLICE_CDI_SPEC; default: none).")
@click.version_option(package_name="gpuslice")
@click.pass_context
def main(ctx: click.Context, state_path: str, kernel: str, cdi_spec: str | None) -> None:
    """Kernel-space GPU sharing: instances (fake NVIDIA device sets with a memory limit)
    and compute policies, enforced by `gpuctl daemon`."""
    ctx.ensure_object(dict)
    ctx.obj.update(state=state_path, kernel=kernel, cdi_spec=cdi_spec)


@main.group()
def instance() -> None:
    """Create, change, inspect and delete instances."""


@instance.command("create")
@click.argument("name")
@click.option("--gpu", "gpus", type=GPUS, default="0", show_default=True, help="GPU minor(s), e.g. 0 or 0,1.")
@click.option("--memory", type=MEMORY, required=True, help=MEMORY_HELP)
@click.option("--policy", type=click.Choice(POLICIES), help="Also set the policy of the instance's GPU(s).")
@click.option("--weight", type=click.IntRange(1, 10000), help="Weight 1..10000 (weight, burst; default 1).")
@click.option("--share", type=SHARE, help="Fixed share of the GPU, e.g. 30% (fixed policy).")
@click.option("--ceiling", type=SHARE, help="At most this share (equal, burst), e.g. 50%.")
@click.option("--priority", type=PRIORITY, default="online", show_default=True, help=PRIORITY_HELP)
@click.option("--min-share", type=SHARE, help="Offline only: the share it keeps while online work runs, e.g. 5%.")
@click.option("--uid", type=ID_RANGE, help="Owner of the device nodes.")
@click.option("--gid", type=ID_RANGE, help="Group of the device nodes.")
@click.option("--mode", type=str, help="Permission bits of the device nodes, octal (default 0660).")
@json_option
@click.pass_context
def instance_create(ctx: click.Context, name: str, gpus: list[int], memory: tuple[int, dict[int, int]],
                    policy: str | None,
                    weight: int | None, share: float | None, ceiling: float | None, priority: str,
                    min_share: float | None, uid: int | None, gid: int | None, mode: str | None) -> None:
    """Create instance NAME on --gpu with a --memory limit."""
    if weight is not None and share is not None:
        raise click.UsageError("--weight and --share are mutually exclusive")
    if min_share is not None and priority != "offline":
        raise click.UsageError("--min-share is for --priority offline")
    mode_bits = _mode(mode)
    size, per_gpu = _memory(memory, gpus)
    with S.locked(ctx.obj["state"]) as st:
        inst = S.Instance(name, gpus, size, weight=weight or 1, share=share, ceiling=ceiling, priority=priority,
                          min_share=min_share, gpu_memory=per_gpu)
        try:
            instances.add(st, inst, kernel(ctx), policy=policy, uid=uid, gid=gid, mode=mode_bits)
        except instances.InstanceError as e:
            raise GpuctlError(str(e)) from None
        cdi_err = _regenerate_cdi(ctx, st)
    _cdi_failed(f"created {name}", cdi_err)
    emit(ctx, inst_json(inst), lambda: f"created {name}\n" + table([inst_row(inst)], INST_COLS))


def _memory(memory: tuple[int, dict[int, int]], gpus: list[int]) -> tuple[int, dict[int, int] | None]:
    """--memory for an instance of ``gpus``: a per-GPU form names each of them."""
    size, per_gpu = memory
    if per_gpu and sorted(per_gpu) != sorted(gpus):
        raise click.BadParameter(f"names GPUs {','.join(map(str, sorted(per_gpu)))} but the instance has "
                                 f"{','.join(map(str, sorted(gpus)))}", param_hint="--memory")
    return size, per_gpu or None


def _mode(mode: str | None) -> int | None:
    if mode is None:
        return None
    try:
        v = int(mode, 8)
    except ValueError:
        raise click.BadParameter(f"not an octal mode: {mode!r}", param_hint="--mode") from None
    if not 0 <= v <= 0o777:
        raise click.BadParameter(f"mode {mode} outside 0..0777", param_hint="--mode")
    return v


INST_COLS = [("name", "NAME"), ("gpus", "GPUS"), ("memory", "MEMORY"), ("weight", "WEIGHT"), ("share", "SHARE"),
             ("ceiling", "CEILING"), ("priority", "PRIORITY")]


def _kernel_info(ctx: click.Context) -> dict[str, dict[str, Any]]:
    nl = kernel(ctx)
    if nl is None:
        return {}
    try:
        return {d["name"]: d for d in nl.instances() if "name" in d}
    except OSError:
        return {}


@instance.command("list")
@json_option
@click.pass_context
def instance_list(ctx: click.Context) -> None:
    """List instances (memory in use and processes when the module is loaded)."""
    st = S.load(ctx.obj["state"])
    kinfo = _kernel_info(ctx)
    rows, js = [], []
    for i in sorted(st.instances.values(), key=lambda i: i.name):
        k = kinfo.get(i.name, {})
        r = inst_row(i)
        r["used"] = units.format_size(k["mem_used"]) if k.get("mem_used") else ("0B" if k else None)
        r["pids"] = len(k.get("pids", [])) if k else None
        rows.append(r)
        js.append({**inst_json(i), "kernel": k or None})
    emit(ctx, js, lambda: table(rows, INST_COLS + [("used", "USED"), ("pids", "PIDS")]))


def _get(st: S.State, name: str) -> S.Instance:
    if name not in st.instances:
        raise GpuctlError(f"no instance {name!r}")
    return st.instances[name]


@instance.command("show")
@click.argument("name")
@json_option
@click.pass_context
def instance_show(ctx: click.Context, name: str) -> None:
    """Show one instance: configuration, computed share and kernel counters."""
    from gpuslice.netlink import gpu_mem

    st = S.load(ctx.obj["state"])
    i = _get(st, name)
    k = _kernel_info(ctx).get(name, {})
    shares = {g: compute_shares(st.policy_of(g).policy, st.claims(g), {c.name for c in st.claims(g)}).get(name, 0.0)
              for g in i.gpus}
    lock = lock_summary(k)
    gm = gpu_mem(k)
    data = {**inst_json(i), "policy": {str(g): st.policy_of(g).policy for g in i.gpus},
            "gpu_mem": {str(g): v for g, v in gm.items()} if k else None,
            "share_when_all_busy": {str(g): s for g, s in shares.items()}, "kernel": k or None,
            "lock": lock or None}

    def text() -> str:
        r = inst_row(i)
        lines = [("name", i.name), ("gpus", r["gpus"]), ("memory", r["memory"]), ("weight", str(i.weight)),
                 ("share", r["share"] or "-"), ("ceiling", r["ceiling"] or "-")]
        for g in i.gpus:
            m = gm.get(g)
            lines.append((f"gpu{g} memory", f"{units.format_size(m['used'])} used of {units.format_size(m['limit'])}"
                          f" (peak {units.format_size(m['peak'])})" if m else units.format_size(i.memory_of(g))))
            lines.append((f"gpu{g} policy", f"{st.policy_of(g).policy}, "
                          f"period {units.format_duration_ns(st.policy_of(g).period_ns)}"))
            lines.append((f"gpu{g} share (all busy)", units.format_share(shares[g])))
        for key in ("mem_used", "mem_peak", "nr_ioctls", "nr_refused_quota", "nr_refused_filter",
                    "nr_events_suppressed", "pids"):
            if key in k:
                v = k[key]
                lines.append((key, units.format_size(v) if key.startswith("mem_") else str(v)))
        if lock:
            dur = units.format_duration_ns
            lines.append(("lock acquired", f"{lock['acquired']} ({lock['contended']} waited)"))
            for what in ("hold", "wait"):
                lines.append((f"lock {what}", f"mean {dur(lock[what + '_mean_ns'])}, "
                              f"p99 <= {dur(lock[what + '_p99_ns'])}, max {dur(lock[what + '_max_ns'])}"))
        w = max(len(a) for a, _ in lines)
        return "\n".join(f"{a.ljust(w)}  {b}" for a, b in lines)

    emit(ctx, data, text)


@instance.command("set")
@click.argument("name")
@click.option("--memory", type=MEMORY, help=MEMORY_HELP + " Lowering it frees nothing.")
@click.option("--weight", type=click.IntRange(1, 10000), help="Weight 1..10000.")
@click.option("--share", type=SHARE, help="Fixed share, e.g. 30%.")
@click.option("--no-share", is_flag=True, help="Remove the fixed share.")
@click.option("--ceiling", type=SHARE, help="Ceiling, e.g. 50%.")
@click.option("--no-ceiling", is_flag=True, help="Remove the ceiling.")
@click.option("--priority", type=PRIORITY, help=PRIORITY_HELP)
@click.option("--min-share", type=SHARE, help="Offline only: the share it keeps while online work runs.")
@click.option("--no-min-share", is_flag=True, help="Remove the offline floor.")
@json_option
@click.pass_context
def instance_set(ctx: click.Context, name: str, memory: tuple[int, dict[int, int]] | None, weight: int | None,
                 share: float | None,
                 no_share: bool, ceiling: float | None, no_ceiling: bool, priority: str | None,
                 min_share: float | None, no_min_share: bool) -> None:
    """Change an instance; the daemon applies it from its next period."""
    if share is not None and no_share:
        raise click.UsageError("--share and --no-share are mutually exclusive")
    if ceiling is not None and no_ceiling:
        raise click.UsageError("--ceiling and --no-ceiling are mutually exclusive")
    if min_share is not None and no_min_share:
        raise click.UsageError("--min-share and --no-min-share are mutually exclusive")
    if all(v is None for v in (memory, weight, share, ceiling, priority, min_share)) and \
            not (no_share or no_ceiling or no_min_share):
        raise click.UsageError("nothing to change (give --memory, --weight, --share, --ceiling, --priority "
                               "or --min-share)")
    with S.locked(ctx.obj["state"]) as st:
        i = _get(st, name)
        size = per_gpu = None
        if memory is not None:
            size, per_gpu = _memory(memory, i.gpus)
            i.memory, i.gpu_memory = size, per_gpu
        if weight is not None:
            i.weight = weight
        if share is not None or no_share:
            i.share = share
        if ceiling is not None or no_ceiling:
            i.ceiling = ceiling
        if priority is not None:
            i.priority = priority
            if priority == "online" and min_share is None:
                i.min_share = None  # a floor means nothing online
        if min_share is not None or no_min_share:
            i.min_share = min_share
        st.check()
        nl = kernel(ctx)
        if nl is not None:
            from gpuslice.netlink import MAX_GPUS, gpu_mem_limits

            nl.instance_set(name, mem_limit=size, weight=weight,
                            gpu_mem_limit=None if memory is None else gpu_mem_limits(per_gpu) or [0] * MAX_GPUS,
                            share=units.share_to_ppt(i.share) if i.share else None)
    emit(ctx, inst_json(i), lambda: table([inst_row(i)], INST_COLS))


@instance.command("delete")
@click.argument("name")
@json_option
@click.pass_context
def instance_delete(ctx: click.Context, name: str) -> None:
    """Delete an instance (the module refuses while its device nodes are open)."""
    with S.locked(ctx.obj["state"]) as st:
        _get(st, name)
        try:
            instances.remove(st, name, kernel(ctx))
        except instances.InstanceError as e:
            raise GpuctlError(str(e)) from None
        cdi_err = _regenerate_cdi(ctx, st)
    _cdi_failed(f"deleted {name}", cdi_err)
    emit(ctx, {"deleted": name}, lambda: f"deleted {name}")


# ---- CDI -----------------------------------------------------------------------------

def _cdi_instances(ctx: click.Context, st: S.State | None = None) -> list[Any]:
    """The instances for the spec: the module's (their nodes exist), or with no module
    (--kernel no, or not loaded) the state file's."""
    from gpuslice.ops import cdi

    st = st if st is not None else S.load(ctx.obj["state"])
    owned = {i.name for i in st.instances.values() if i.owner is not None}  # in their owners' own specs
    nl = kernel(ctx)
    if nl is not None:
        return [i for i in cdi.instances_from_netlink(nl.instances()) if i.name not in owned]
    return [cdi.Instance(i.name, tuple(i.gpus)) for i in sorted(st.instances.values(), key=lambda i: i.name)
            if i.name not in owned]


def _cdi_spec(ctx: click.Context, st: S.State | None = None) -> dict[str, Any]:
    from gpuslice.ops import cdi

    insts = _cdi_instances(ctx, st)
    for i in insts:
        if not cdi.is_cdi_name(i.name):
            click.echo(f"gpuctl: warning: instance {i.name!r} left out of the CDI spec: CDI device names "
                       "start and end with a letter or digit", err=True)
    spec = cdi.build_spec(insts, cdi.driver_files(cdi.scan_host()), cdi.find_nvidia_ctk())
    errs = cdi.check_spec(spec)
    if errs:
        raise GpuctlError(f"CDI spec not written: {errs[0]}")
    return spec


def _regenerate_cdi(ctx: click.Context, st: S.State) -> str | None:
    """Rewrite the configured spec (--cdi-spec); what went wrong, or None. Never
    raises: the change it follows is made and saved either way."""
    path = ctx.obj.get("cdi_spec")
    if not path:
        return None
    try:
        _write_or_remove(path, _cdi_spec(ctx, st))
    except OSError as e:
        return f"the CDI spec {path} was not written: {e.strerror or e}"
    except GpuctlError as e:
        return str(e)
    return None


def _cdi_failed(done: str, err: str | None) -> None:
    if err:
        raise GpuctlError(f"{done}, but {err}")


def _write_or_remove(path: str, spec: dict[str, Any]) -> bool:
    """Write the spec, or remove it when there is no instance: CDI refuses a spec
    without devices, and older runtimes then ignore every spec in the directory."""
    from gpuslice.ops import cdi

    if not cdi.is_ours(path):
        raise GpuctlError(f"{path} is not a CDI spec of kind {cdi.KIND}: left as it is")
    if spec["devices"]:
        cdi.write_spec(path, cdi.render(spec))
        return True
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return False


@main.command("run-args")
@click.argument("name")
@click.option("--driver/--no-driver", default=True, show_default=True,
              help="Also mount the host's NVIDIA driver files read-only (as the CDI spec does).")
@json_option
@click.pass_context
def run_args(ctx: click.Context, name: str, driver: bool) -> None:
    """docker/podman run flags that give a container instance NAME without CDI:
    `docker run $(gpuctl run-args web) IMAGE ...`. One shell-quoted line (JSON: the
    argument list)."""
    import shlex

    from gpuslice.ops import cdi

    inst = next((i for i in _cdi_instances(ctx) if i.name == name), None)
    if inst is None:
        raise GpuctlError(f"no instance {name!r}")
    args = [a for n in cdi.device_nodes(inst) for a in ("--device", f"{n['hostPath']}:{n['path']}")]
    if driver:
        args += [a for f in cdi.driver_files(cdi.scan_host()) for a in ("--volume", f"{f}:{f}:ro")]
    args += ["--env", f"GPUSLICE_INSTANCE={name}"]
    emit(ctx, args, lambda: shlex.join(args))


@main.group("cdi")
def cdi_group() -> None:
    """Container Device Interface: `podman run --device gpuslice.dev/gpu=NAME`."""


@cdi_group.command("generate")
@click.option("--output", "-o", metavar="PATH", help="Write the spec here (e.g. /etc/cdi/gpuslice.yaml) "
              "instead of printing it.")
@json_option
@click.pass_context
def cdi_generate(ctx: click.Context, output: str | None) -> None:
    """A CDI spec with one device per instance (kind gpuslice.dev/gpu): the instance's
    nodes at /dev/nvidiactl, /dev/nvidia<N> and /dev/nvidia-uvm, and the host's NVIDIA
    driver files (libcuda, libnvidia-ml, nvidia-smi, ...) mounted read-only. Printed as
    YAML (JSON with --json), or written to --output with a summary (no instance: the
    file is removed, as CDI refuses a spec without devices)."""
    from gpuslice.ops import cdi

    spec = _cdi_spec(ctx)
    if output is None:
        emit(ctx, spec, lambda: cdi.render(spec).rstrip("\n"))
        return
    try:
        written = _write_or_remove(output, spec)
    except OSError as e:
        raise GpuctlError(f"cannot write the CDI spec {output}: {e.strerror or e}") from None
    if not written:
        emit(ctx, {"output": output, "devices": [], "mounts": 0, "removed": True},
             lambda: f"no instances: {output} removed (a CDI spec needs a device)")
        return
    rows = [{"device": f"{cdi.KIND}={d['name']}",
             "nodes": ",".join(n["path"] for n in d["containerEdits"]["deviceNodes"])} for d in spec["devices"]]
    mounts = len(spec["containerEdits"].get("mounts", []))
    emit(ctx, {"output": output, "devices": [d["name"] for d in spec["devices"]], "mounts": mounts},
         lambda: f"wrote {output}: {len(rows)} devices, {mounts} driver files\n"
         + table(rows, [("device", "DEVICE"), ("nodes", "NODES")]))


@instance.command("restore")
@json_option
@click.pass_context
def instance_restore(ctx: click.Context) -> None:
    """Create in the module every instance of the state file it does not have (after a
    boot or a module reload; the gpuslice-daemon unit runs it before the daemon).
    Node owner, group and mode are not kept in the state file: the module's defaults,
    except the Kubernetes plugins' instances (0666, as they made them)."""
    nl = kernel(ctx)
    if nl is None:
        raise GpuctlError("the gpuslice module is not loaded (modprobe gpuslice)")
    with S.locked(ctx.obj["state"]) as st:
        have = {d["name"] for d in nl.instances() if "name" in d}
        made = []
        for i in sorted(st.instances.values(), key=lambda i: i.name):
            if i.name not in have:
                instances.create_in_module(nl, i)
                made.append(i.name)
        cdi_err = _regenerate_cdi(ctx, st)
    _cdi_failed(f"created {', '.join(made) or 'nothing'}", cdi_err)
    emit(ctx, {"created": made}, lambda: f"created {', '.join(made)}" if made else "nothing to restore")


@main.group()
def policy() -> None:
    """Per-GPU compute policy: fixed, weight, equal or burst (see docs/policies.md)."""


@policy.command("set")
@click.argument("kind", type=click.Choice(POLICIES))
@click.option("--period", type=DURATION, help="Scheduling period, e.g. 50ms (default 50ms; 1ms..10s).")
@click.option("--gpu", "gpus", type=GPUS, default="0", show_default=True, help="GPU minor(s).")
@json_option
@click.pass_context
def policy_set(ctx: click.Context, kind: str, period: int | None, gpus: list[int]) -> None:
    """Set the policy of --gpu. fixed: each instance its --share (sum <= 100%), idle time
    stays idle. weight: weight/sum of weights, idle time stays idle. equal: the busy
    instances split the GPU evenly. burst: weight/sum guaranteed, idle time goes to the
    busy ones by weight, each at most its --ceiling."""
    with S.locked(ctx.obj["state"]) as st:
        for g in gpus:
            st.gpus[g] = S.GpuPolicy(kind, period or st.policy_of(g).period_ns)
            errs = validate(kind, st.claims(g))
            if errs:
                raise GpuctlError(f"gpu {g}: {errs[0]}")
        st.check()
    data = {str(g): {"policy": kind, "period_ns": st.policy_of(g).period_ns} for g in gpus}
    emit(ctx, data, lambda: "\n".join(
        f"gpu {g}: {kind}, period {units.format_duration_ns(st.policy_of(g).period_ns)}" for g in gpus))


@policy.command("show")
@click.option("--gpu", "gpus", type=GPUS, help="GPU minor(s) (default: every configured GPU).")
@json_option
@click.pass_context
def policy_show(ctx: click.Context, gpus: list[int] | None) -> None:
    """Show each GPU's policy and the share each instance gets when all are busy."""
    st = S.load(ctx.obj["state"])
    gpus = gpus or st.used_gpus() or [0]
    rows, data = [], {}
    for g in gpus:
        gp = st.policy_of(g)
        claims = st.claims(g)
        shares = compute_shares(gp.policy, claims, {c.name for c in claims})
        data[str(g)] = {"policy": gp.policy, "period_ns": gp.period_ns, "shares_all_busy": shares}
        if not claims:
            rows.append({"gpu": g, "policy": gp.policy, "period": units.format_duration_ns(gp.period_ns)})
        for c in claims:
            rows.append({"gpu": g, "policy": gp.policy, "period": units.format_duration_ns(gp.period_ns),
                         "instance": c.name, "weight": c.weight,
                         "share": units.format_share(shares[c.name])})
    emit(ctx, data, lambda: table(rows, [("gpu", "GPU"), ("policy", "POLICY"), ("period", "PERIOD"),
                                         ("instance", "INSTANCE"), ("weight", "WEIGHT"),
                                         ("share", "SHARE(ALL BUSY)")]))


def _remove_own_report(path: str) -> None:
    """Remove the report at ``path`` if this process wrote it: a daemon that failed to
    start (a second one, a wrong --ctl) leaves the running daemon's, or any other file."""
    d = _read_status(path)
    if d is not None and d.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(path)


def _read_status(path: str, strict: bool = False) -> dict[str, Any] | None:
    """A report of `gpuctl daemon` or `gpuctl guard` with "running": whether the process
    it names is alive (None: no report). ``strict``: one this user cannot read is an error
    (the daemon writes it 0600), not a daemon that is not running."""
    try:
        with open(path) as f:
            d = json.load(f)
    except PermissionError as e:
        if strict:
            raise GpuctlError(f"cannot read {path}: {e.strerror} (the daemon's reports are root's)") from None
        return None
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict):
        return None
    pid = d.get("pid")
    d["running"] = False
    if type(pid) is int and 0 < pid <= PID_MAX:  # kill(0) or kill(-1) would signal us or everyone
        try:
            os.kill(pid, 0)
            d["running"] = True
        except PermissionError:  # alive, another user's
            d["running"] = True
        except OSError:
            pass
    return d


def _status_rows(st: S.State, d: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for g in st.used_gpus():
        live = (d or {}).get("gpus", {}).get(str(g), {}) if d and d.get("running") else {}
        for i in st.instances_on(g):
            li = live.get("instances", {}).get(i.name, {})
            rows.append({"gpu": g, "instance": i.name, "policy": st.policy_of(g).policy, "priority": i.priority,
                         "share": units.format_share(li["share"]) if "share" in li else None,
                         "active": ("yes" if li.get("active") else "no") if li else None,
                         "gated": ("yes" if li.get("gated") else "no") if li else None,
                         "channels": li.get("channels"),
                         "engines": ",".join(f"{e}:{n}" for e, n in li.get("engines", {}).items()) if li else None})
    return rows


STATUS_COLS = [("gpu", "GPU"), ("instance", "INSTANCE"), ("policy", "POLICY"), ("priority", "PRIORITY"),
               ("share", "SHARE NOW"),
               ("active", "ACTIVE"), ("gated", "GATED"), ("channels", "CHANNELS"),
               ("engines", "ENGINES")]


@main.command()
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@click.option("--guard-file", default=GUARD_STATUS, show_default=True, help="Where the guard reports.")
@json_option
@click.pass_context
def status(ctx: click.Context, status_file: str, guard_file: str) -> None:
    """Daemon state and each instance's current share (shares are fractions of a GPU)."""
    st = S.load(ctx.obj["state"])
    d = _read_status(status_file, strict=True)
    rows = _status_rows(st, d)

    def text() -> str:
        if d and d.get("running"):
            lat = d.get("switch_latency_ns", {})
            head = (f"daemon: running (pid {d['pid']}), {d.get('switches', 0)} slot switches, "
                    f"{d.get('rm_calls', 0)} RM calls, switch latency p50 "
                    f"{_us(lat.get('p50'))} p99 {_us(lat.get('p99'))}")
            calls = d.get("rm_call_ns") or {}
            if calls:
                head += "\n" + "; ".join(
                    f"{k} call p50 {_us((calls.get(k) or {}).get('p50'))} p99 {_us((calls.get(k) or {}).get('p99'))} "
                    f"max {_us((calls.get(k) or {}).get('max'))} (n={(calls.get(k) or {}).get('n', 0)})"
                    for k in ("disable", "enable"))
            for gpu, tl in sorted((d.get("gpus") or {}).items()):
                if tl.get("preemptions") or tl.get("resumes"):
                    pl = tl.get("preempt_latency_ns") or {}
                    head += (f"\ngpu {gpu}: online work preempted offline instances {tl.get('preemptions', 0)} "
                             f"times (latency p50 {_us(pl.get('p50'))} p99 {_us(pl.get('p99'))} max "
                             f"{_us(pl.get('max'))}), gave the GPU back {tl.get('resumes', 0)} times")
        else:
            head = "daemon: not running"
        if g:
            head += (f"\nguard: {g.get('polls', 0)} polls of RM's per-process memory, "
                     f"{g.get('kills', 0)} processes killed over their instance's limit")
        return head + "\n" + table(rows, STATUS_COLS)

    g = _read_status(guard_file, strict=True)
    emit(ctx, {"daemon": d, "guard": g, "instances": rows}, text)


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.0f}us"


@main.command()
@click.option("--interval", type=DURATION, default="1s", show_default=True, help="Refresh interval.")
@click.option("-n", "--iterations", type=click.IntRange(min=1), help="Stop after N refreshes (default: until Ctrl-C).")
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@json_option
@click.pass_context
def top(ctx: click.Context, interval: int, iterations: int | None, status_file: str) -> None:
    """Refreshing view of the daemon's shares (JSON: one object per line per refresh)."""
    n = 0
    try:
        while iterations is None or n < iterations:
            if n:
                time.sleep(interval / 1e9)
            st = S.load(ctx.obj["state"])
            d = _read_status(status_file, strict=True)
            rows = _status_rows(st, d)
            if ctx.obj.get("json"):
                click.echo(json.dumps({"time": time.time(), "daemon": d, "instances": rows}))
            else:
                if sys.stdout.isatty():
                    click.clear()
                click.echo(time.strftime("%H:%M:%S ") + ("daemon running" if d and d.get("running")
                                                         else "daemon not running"))
                click.echo(table(rows, STATUS_COLS))
            n += 1
    except KeyboardInterrupt:
        pass


@main.command()
@click.option("--ctl", default="/dev/nvidiactl", show_default=True, help="RM control node the daemon uses.")
@click.option("--source", type=SOURCE, default="auto", show_default=True,
              help="Where channels come from: the module (netlink) or the LD_PRELOAD library's socket "
              "(preload); auto: netlink when the module is loaded, else preload. MODULE:CLASS: a source "
              "class importable from the daemon's PYTHONPATH, constructed with no arguments, with "
              "refresh(), channels() -> {instance: {Channel}} and close() (pyctl/gpuslice/sched/sources.py).")
@click.option("--preload-sock", default=PRELOAD_SOCK, show_default=True,
              help="The host's socket for --source preload (mode 0600: never mount it into a container).")
@click.option("--preload-dir", default=PRELOAD_DIR, show_default=True,
              help="--source preload: a directory per instance with its socket, to mount at /run/gpuslice in its containers.")
@click.option("--probe", type=PROBE, default="auto", show_default=True,
              help="Activity probe for equal/burst: cpu = the instance's processes used >= 25% of a CPU in the "
              "last period (corrected by NVML when present; reacts within a period); nvml = NVML process "
              "utilisation alone (reacts in seconds); submit = work submitted on the instance's channels in "
              "the last 300 ms, as the LD_PRELOAD library (source preload) or the module (source netlink) reads "
              "it in their USERD; all = every instance with a channel is busy; auto = submit or cpu with a "
              "source that reports submissions, else cpu. "
              "MODULE:CLASS: a probe class importable from the daemon's PYTHONPATH, constructed with "
              "no arguments, with active({instance: {Channel}}) -> {active instances} "
              "(pyctl/gpuslice/sched/probes.py).")
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where to report (every 0.5 s).")
@click.option("--watchdog/--no-watchdog", default=True, show_default=True,
              help="Run a watchdog process that re-enables channels if the daemon dies (even by SIGKILL).")
@click.option("--duration", type=DURATION, help="Exit after this long (default: run until SIGTERM/SIGINT).")
@click.option("--rt-priority", type=click.IntRange(0, 99), default=10, show_default=True,
              help="SCHED_FIFO priority so slot switches happen on time (0 = normal scheduling; "
              "ignored without CAP_SYS_NICE).")
@click.option("--switch-order", type=click.Choice(["disable-first", "enable-first"]), default="enable-first",
              show_default=True, help="At a slot switch: enable the incoming instance first (no idle gap; they "
              "overlap for about one RM call, at each slot's start and end alike, so shares stay unbiased: "
              "met 2 points at 50 ms on the H100) or disable the outgoing one first (slots stay exclusive; "
              "every slot loses one call, ~0.75 ms on the H100).")
@click.option("--preempt-poll", type=DURATION, default="1ms", show_default=True,
              help="While offline instances hold a GPU, how often to look for online work (the probe on the "
              "online instances only); the first seen preempts the offline ones at once.")
@click.option("--online-hold", type=DURATION, default="5ms", show_default=True,
              help="With a probe that sees submissions (submit, or auto with a source that reports them): an online "
              "instance of a GPU with offline ones counts as busy for this long after its last submission; "
              "when all are quiet the offline ones get the GPU back at once. Never shorter than the source's gap "
              "between reports of work that goes on (the module's: 50 ms plus two of its looks).")
@click.option("--preempt-after", type=DURATION_OR_0, default="0", show_default=True,
              help="Disable offline instances' channels only once online work has gone on this long (a "
              "submission counts for the online hold; 0: at its first sight; with a probe that sees "
              "submissions). Shorter online work is left to "
              "the hardware's timeslices (offline TSGs 250 us, online 8 ms), which take the GPU from offline work "
              "within one offline slice without an RM call.")
@click.option("--online-sample", type=DURATION_OR_0, default="200us", show_default=True,
              help="User-space build: ask the library of each online instance's processes on a GPU with offline "
              "ones to look at its channels this often (0: leave each at its own GPUSLICE_SAMPLE_MS, default 5 ms): "
              "the sooner its work is seen, the sooner the offline work is disabled. At most half the online hold; "
              "the library is also asked to report a busy channel again within half the hold.")
@click.option("--guard-interval", type=DURATION_OR_0, default="100ms", show_default=True,
              help="Run `gpuctl guard` beside the scheduler at this interval (0: do not): it kills a process "
              "of an instance that holds more video memory in RM's count than its limit.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv: debug).")
@click.pass_context
def daemon(ctx: click.Context, ctl: str, source: str | type, preload_sock: str, preload_dir: str, probe: str | type, status_file: str,
           watchdog: bool, duration: int | None, rt_priority: int, switch_order: str, preempt_poll: int,
           online_hold: int, preempt_after: int, online_sample: int, guard_interval: int, verbose: int) -> None:
    """Run the scheduler: gate each instance's channels into its slots (FIFO_DISABLE_CHANNELS).
    Every channel is re-enabled on exit (SIGTERM, SIGINT, SIGHUP, errors) and at start."""
    from gpuslice.sched.gate import RmGate, Watchdog
    from gpuslice.sched.rm import RmClient
    from gpuslice.sched.scheduler import Scheduler

    if online_sample and not 50_000 <= online_sample <= online_hold // 2:
        raise GpuctlError("--online-sample must be 0 or from 50us to half the --online-hold "
                          "(busy online work must be seen within the hold)")
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
                        format="gpuctl daemon: %(message)s")
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    stop: dict[str, int] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["sig"] = signum

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.set_wakeup_fd(wfd)

    cleanups: list[Callable[[], None]] = []

    def cleanup() -> None:
        while cleanups:
            fn = cleanups.pop()
            try:
                fn()
            except Exception as e:  # keep going: the re-enable must run
                logging.error("cleanup: %s", e)

    atexit.register(cleanup)
    try:  # connections and the files they pass for their proofs (sources.PreloadSource)
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as e:
        logging.info("RLIMIT_NOFILE stays: %s", e)
    if rt_priority:
        try:  # children (the watchdog) do not inherit it
            os.sched_setscheduler(0, os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0),
                                  os.sched_param(rt_priority))
        except (OSError, AttributeError) as e:
            logging.info("no SCHED_FIFO (%s); running with normal priority", e)
    try:
        t0 = time.monotonic_ns()
        # the inputs first: a source or probe that cannot be had fails before the GPU is touched
        src = _make_source(ctx, source, preload_sock, preload_dir)
        cleanups.append(src.close)
        t_src = time.monotonic_ns()
        prb = _make_probe(probe, src)
        t_prb = time.monotonic_ns()
        wd = Watchdog(ctl) if watchdog else None  # starts while the rest is made; awaited before a disable
        if wd is not None:
            cleanups.append(wd.close)
        if guard_interval and source in ("auto", "netlink"):
            g = _spawn_guard(ctx, ctl, guard_interval)
            if g is not None:
                cleanups.append(lambda: _stop_child(g))
        rm = RmClient(ctl).open()
        cleanups.append(rm.close)
        gate = RmGate(rm, wd, enable_first=switch_order == "enable-first")
        nl = kernel(ctx)
        sched = Scheduler(ctx.obj["state"], src, gate, prb, netlink=nl, status_path=status_file, wake_fd=rfd,
                          preempt_poll_ns=max(100_000, preempt_poll), online_hold_ns=online_hold,
                          preempt_after_ns=preempt_after, online_sample_us=online_sample // 1000)
        cleanups.append(sched.close)  # runs first: re-enable before anything is closed
        until = time.monotonic_ns() + duration if duration else None
        sched.start()
        logging.info("started in %.0f ms (source %.0f, probe %.0f, RM client and scheduler %.0f)",
                     (time.monotonic_ns() - t0) / 1e6, (t_src - t0) / 1e6, (t_prb - t_src) / 1e6,
                     (time.monotonic_ns() - t_prb) / 1e6)
        sched.run(lambda: "sig" in stop, until_ns=until)
    finally:
        cleanup()
        _remove_own_report(status_file)
    if "sig" in stop:
        logging.info("stopped by signal %d; every channel re-enabled", stop["sig"])


@main.command()
@click.option("--ctl", default="/dev/nvidiactl", show_default=True, help="RM control node to query RM through.")
@click.option("--interval", type=DURATION, default="100ms", show_default=True,
              help="How often RM's per-process memory is read.")
@click.option("--source", type=click.Choice(["netlink", "environ"]), default="netlink", show_default=True,
              help="Where instances come from: the module, or (user-space build) every process with "
              "libgpuslice.so preloaded, each its own slice with its GPUSLICE_MEM_LIMIT.")
@click.option("--gpu", "gpus", type=GPUS, default="0", show_default=True, help="GPUs for --source environ.")
@click.option("--once", is_flag=True, help="One poll: print the breaches found and exit (kills them too).")
@click.option("--duration", type=DURATION, help="Exit after this long (default: until SIGTERM/SIGINT).")
@click.option("--status-file", default=GUARD_STATUS, show_default=True, help="Where to report.")
@json_option
@click.pass_context
def guard(ctx: click.Context, ctl: str, interval: int, source: str, gpus: list[int], once: bool,
          duration: int | None, status_file: str) -> None:
    """Hold each instance's memory limit against RM's own count: SIGKILL the largest process
    of an instance whose processes hold more video memory than its limit and than the module
    charged (what a thread racing the module's check can get). `gpuctl daemon` runs it."""
    from gpuslice.sched.reconcile import Reconciler, environ_slices, netlink_slices
    from gpuslice.sched.rm import RmClient, RmError

    logging.basicConfig(level=logging.INFO, format="gpuctl guard: %(message)s")
    stop: dict[str, int] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: stop.setdefault("sig", n))
    slices = netlink_slices(kernel(ctx)) if source == "netlink" else environ_slices(gpus)
    try:
        rm = RmClient(ctl).open()
    except (OSError, RmError) as e:
        raise GpuctlError(f"cannot open an RM client on {ctl}: {e}") from None
    rec = Reconciler(rm, slices)
    until = time.monotonic_ns() + duration if duration else None
    failed = 0
    try:
        while "sig" not in stop and (until is None or time.monotonic_ns() < until):
            t = time.monotonic()
            try:
                found = rec.poll()
                failed = 0
            except (OSError, RmError) as e:
                failed += 1
                if failed == 1:
                    logging.error("poll failed (retrying): %s", e)
                found = []
            _write_json(status_file, {"pid": os.getpid(), "time": time.time(), **rec.summary()})
            if once:
                rows = [{"instance": k.breach.name, "pid": k.breach.pid, "rm_bytes": k.breach.rm_bytes,
                         "limit": k.breach.limit, "used": k.breach.used, "killed": k.killed} for k in found]
                emit(ctx, rows, lambda: table(rows, [("instance", "INSTANCE"), ("pid", "PID"),
                                                     ("rm_bytes", "RM BYTES"), ("limit", "LIMIT"),
                                                     ("used", "CHARGED"), ("killed", "KILLED")]))
                return
            time.sleep(max(0.0, interval / 1e9 - (time.monotonic() - t)))
    finally:
        rm.close()


@main.command()
@click.option("--listen", default="127.0.0.1:9400", show_default=True, metavar="HOST:PORT",
              help="Address to serve /metrics on (port 0: any free port).")
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@click.option("--guard-file", default=GUARD_STATUS, show_default=True, help="Where the guard reports.")
@click.option("--nvml/--no-nvml", default=True, show_default=True,
              help="Per-GPU utilisation and memory from NVML (skipped when NVML finds no GPU).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv: debug).")
@click.pass_context
def exporter(ctx: click.Context, listen: str, status_file: str, guard_file: str, nvml: bool, verbose: int) -> None:
    """Serve Prometheus metrics: per instance memory limit, used and peak, ioctls,
    refusals by reason, processes, core-lock hold and wait times (from the module);
    target share, activity and gating (from the daemon); per GPU NVML utilisation and
    memory. Read on each scrape. Names: docs/metrics.md."""
    from gpuslice.ops import exporter as E

    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
                        format="gpuctl exporter: %(message)s")
    try:
        E.parse_listen(listen)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen") from None
    kernel(ctx)  # a version mismatch stops here, before serving anything

    def instances() -> list[dict[str, Any]] | None:
        nl = ctx.obj.get("nl")
        if nl is None:
            if ctx.obj["kernel"] == "no":
                return None
            ctx.obj.pop("nl", None)
            try:
                nl = kernel(ctx)
            except GpuctlError:
                ctx.obj["nl"] = None
                raise
            if nl is None:
                return None
        try:
            return list(nl.instances())
        except OSError:
            nl.close()
            ctx.obj["nl"] = None  # reconnect at the next scrape (module reloaded)
            raise

    src = E.Sources(instances=instances, status=lambda: _read_status(status_file),
                    guard=lambda: _read_status(guard_file), gpus=E.nvml_gpus if nvml else (lambda: []))
    srv = E.make_server(listen, E.registry_for(src))
    stop = threading.Event()

    def on_signal(_n: int, _f: Any) -> None:
        if not stop.is_set():
            stop.set()
            threading.Thread(target=srv.shutdown, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    host, port = str(srv.server_address[0]), int(srv.server_address[1])
    logging.getLogger(__name__).warning("serving http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        srv.server_close()


@main.command()
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@click.option("--exporter", "exporter_listen", metavar="HOST:PORT",
              help="Where `gpuctl exporter` listens (default: the --listen of the gpuslice-exporter unit, "
              "else 127.0.0.1:9400).")
@json_option
@click.pass_context
def doctor(ctx: click.Context, status_file: str, exporter_listen: str | None) -> None:
    """Check this host: NVIDIA driver version, module and netlink version, daemon, the
    real nodes' modes, require_device_cgroup, vm.mmap_min_addr, the CDI spec (--cdi-spec,
    default /etc/cdi/gpuslice.yaml) against `gpuctl cdi generate`, and the exporter.
    Each says ok, warn, fail or skip, with a one-line fix. Exit status 1 when a check
    fails (warn and skip do not)."""
    from gpuslice.ops import cdi
    from gpuslice.ops import doctor as D
    from gpuslice.ops.exporter import parse_listen

    if exporter_listen is not None:
        try:
            parse_listen(exporter_listen)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--exporter") from None
    checks = D.run_all(status_file, ctx.obj.get("cdi_spec") or cdi.DEFAULT_OUTPUT, lambda: _cdi_spec(ctx),
                       exporter_listen)
    rows: list[dict[str, Any]] = []
    for c in checks:
        rows.append({"check": c.name, "status": c.status, "detail": c.message})
        if c.fix:
            rows.append({"check": "", "status": "", "detail": f"fix: {c.fix}"})
    emit(ctx, [c.to_json() for c in checks],
         lambda: table(rows, [("check", "CHECK"), ("status", "STATUS"), ("detail", "DETAIL")]))
    bad = D.failed(checks)
    if bad:
        raise GpuctlError(f"{len(bad)} of {len(checks)} checks failed: {', '.join(bad)}")


def _write_json(path: str, data: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _spawn_guard(ctx: click.Context, ctl: str, interval_ns: int) -> subprocess.Popen[bytes] | None:
    """`gpuctl guard` as a process of its own (its RM calls never hold up a slot switch)."""
    from gpuslice.netlink import module_loaded

    if not module_loaded():
        return None  # no module: no instances to guard (user-space build: run guard --source environ)
    cmd = [sys.executable, "-m", "gpuslice", "--state", ctx.obj["state"], "guard", "--ctl", ctl,
           "--interval", f"{max(1, interval_ns // 1_000_000)}ms"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In a child: SIGTERM when the daemon dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _stop_child(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _make_source(ctx: click.Context, kind: str | type, preload_sock: str, preload_dir: str | None = None) -> Any:
    """--source: netlink, preload, auto (netlink when the module is loaded, else preload),
    or a class (MODULE:CLASS)."""
    from gpuslice.netlink import GpusliceNetlink, VersionMismatch, module_loaded
    from gpuslice.sched.sources import NetlinkSource, PreloadSource

    if isinstance(kind, type):
        return construct(kind, "--source")
    if kind == "netlink" or (kind == "auto" and module_loaded()):
        try:
            return NetlinkSource(GpusliceNetlink())
        except VersionMismatch as e:
            raise GpuctlError(str(e)) from None
        except OSError as e:
            if kind == "netlink":
                raise GpuctlError(str(e)) from None
    return PreloadSource(preload_sock, preload_dir)


def _make_probe(kind: str | type, src: Any = None) -> Any:
    """--probe: cpu (corrected by NVML when NVML is there), nvml, submit (CHANNEL_WORK:
    the USERD reports of the preload library or of the module), all, or a class
    (MODULE:CLASS); auto: submit or cpu when the source reports submissions, else cpu."""
    from gpuslice.sched.probes import AllActive, AnyOf, CpuProbe, NvmlProbe, SubmitProbe
    from gpuslice.sched.sources import NetlinkSource, PreloadSource, module_reports_work

    if isinstance(kind, type):
        return construct(kind, "--probe")
    submits = isinstance(src, PreloadSource) or (isinstance(src, NetlinkSource) and module_reports_work())
    if kind == "submit":
        if not submits:
            raise GpuctlError("--probe submit needs a source that reports submissions: --source preload, or "
                              "netlink with the module's USERD sampler on (userd_sample_ms > 0)")
        return SubmitProbe(src)
    nvml = None
    if kind in ("nvml", "cpu", "auto"):
        try:
            nvml = NvmlProbe()
        except Exception as e:
            if kind == "nvml":
                raise GpuctlError(f"NVML not available: {e}") from None
    if kind == "nvml":
        return nvml
    if kind == "auto" and submits:
        return AnyOf(SubmitProbe(src), CpuProbe(nvml=nvml))
    if kind in ("cpu", "auto"):
        return CpuProbe(nvml=nvml)
    return AllActive()


try:  # the eBPF tracing command (pyctl/gpuslice/trace/live.py)
    from gpuslice.trace import live as _trace

    main.add_command(_trace.trace)
except ImportError:
    pass


from .kube.cli import register as _register_kube  # noqa: E402 (the commands need main)

_register_kube(main)

"""What gpuctl's commands share: the one-line error, the click parameter types
(sizes, shares, durations, GPU lists, MODULE:CLASS), table/JSON output, the module's
netlink client (:func:`kernel`) and the daemon's and guard's report files.

Errors are one line on stderr, ``gpuctl: ...``, and the exit status says whose fault:

- exit 2, a usage error (click.UsageError, click.BadParameter, :class:`OptionValueError`):
  the command line alone is wrong, whatever the state file holds: a bad value (a name,
  a size, a share, a mode, a floor of 100%), contradictory options, or a new value that
  contradicts the same instance's own settings (``--min-share`` above its ``--ceiling``).
  Checked before anything is read or changed, so a script can tell a typo from a
  refusal.
- exit 1, a runtime error (:class:`GpuctlError`, StateError, OSError): the state, the
  module or I/O: no such instance, a name that exists, the module not loaded or
  refusing, a file that cannot be written, and a state conflict: a valid value that
  the settings of OTHER instances stored in the state file make impossible (fixed shares
  or offline floors summing over 100% across the instances of a GPU, `policy set fixed`
  on a GPU whose instances' shares sum over 100%). The same command succeeds once
  those other instances change.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Callable, Iterable, Sequence

import click

from gpuslice import state as S
from gpuslice import units

STATUS_PATH = S.STATUS_PATH
PRELOAD_SOCK = "/run/gpuslice/preload.sock"
PRELOAD_DIR = "/run/gpuslice/instances"
GUARD_STATUS = "/run/gpuslice/guard.json"


class GpuctlError(Exception):
    """A one-line, user-facing error."""


OptionValueError = units.OptionValueError  # ``--memory 8: no unit; ...`` (exit status 2)


class _Unit(click.ParamType):  # type: ignore[type-arg]
    def __init__(self, name: str, fn: Callable[[str], Any]) -> None:
        self.name = name
        self.fn = fn

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        if ctx is not None and param is not None and param.name:
            ctx.meta[f"gpuslice.given.{param.name}"] = value  # for errors that involve other options: given()
        try:
            return self.fn(value)
        except ValueError as e:
            raise OptionValueError(str(e), value, ctx, param) from None


SIZE = _Unit("size", units.parse_size)
MEMORY = _Unit("memory", units.parse_memory)
MEMORY_HELP = ("Video memory limit of each GPU, e.g. 8Gi, or per GPU, e.g. 0=8Gi,1=4Gi: a Kubernetes quantity, "
               "always with a unit (Ki Mi Gi Ti or KiB MiB GiB TiB: powers of 1024; k M G T or kB MB GB TB: "
               "powers of 1000; B: bytes).")
SHARE = _Unit("share", units.parse_share)


def _min_share(text: str) -> float:
    f = units.parse_share(text)
    if f > 1 - 0.01 + 1e-9:  # policy.validate: the floors of a GPU leave online work 1%
        raise ValueError("must leave online work at least 1% (at most 99%)")
    return f


MIN_SHARE = _Unit("share", _min_share)
SHARE_HELP = "Percent of the GPU: 30% or 30 (0.5% for half a percent; a bare 0.3 is refused)."


def duration(lo_ns: int = 1, hi_ns: int | None = None, zero: bool = False) -> units.Duration:
    """A duration option type (units.Duration: a bare number is seconds) within [lo_ns,
    hi_ns], in nanoseconds; ``zero``: 0 is also taken (it means "off")."""
    return units.Duration(lo_ns, hi_ns, zero)


DURATION = duration()
DURATION_OR_0 = duration(zero=True)  # a duration where 0 (0, 0ms, 0.0s, ...) means "off"
PERIOD = duration(S.PERIOD_MIN_NS, S.PERIOD_MAX_NS)


def given(ctx: click.Context, name: str) -> str | None:
    """The text given for option ``name`` (its Python name) of a unit type, as typed."""
    v = ctx.meta.get(f"gpuslice.given.{name}")
    return v if isinstance(v, str) else None


def bad_option(ctx: click.Context, name: str, value: str, message: str) -> OptionValueError:
    """The usage error of option ``name`` (its Python name) of ``ctx``'s command, for a
    check the option's type cannot make alone (it involves another option)."""
    param = next((p for p in ctx.command.params if p.name == name), None)
    return OptionValueError(message, value, ctx, param)


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


def json_option(f: Callable[..., Any] | None = None, *, instead: str = "a table") -> Any:
    """``--json``: print JSON instead of ``instead``, what the command prints without it
    (``@json_option``: a table; ``@json_option(instead="YAML")``)."""
    def cb(ctx: click.Context, _p: click.Parameter, v: bool) -> None:
        if v:
            ctx.ensure_object(dict)["json"] = True

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        return click.option("--json", "as_json", is_flag=True, expose_value=False, callback=cb, is_eager=True,
                            help=f"Print JSON instead of {instead}.")(fn)

    return deco if f is None else deco(f)


def share_json(share: float | None) -> float | None:
    """A share (a fraction) for JSON: 6 decimals (0.01, not 0.010000000000000009)."""
    return None if share is None else round(share, 6)


def share_text(share: float, idle: float | None) -> str:
    """A share (all busy) for a table; an offline instance's (``idle``: its share while
    online work is idle) says why it is so low: ``0.0% (offline: 100.0% while online is idle)``."""
    text = units.format_share(share)
    return text if idle is None else f"{text} (offline: {units.format_share(idle)} while online is idle)"


def warn(msgs: Iterable[str]) -> None:
    """``gpuctl: warning: ...`` on stderr, a line each (the command still succeeds)."""
    for m in msgs:
        click.echo(f"gpuctl: warning: {m}", err=True)


def gpu_conflicts(st: S.State, gpus: Iterable[int]) -> list[str]:
    """policy.conflicts of each of ``gpus``, as ``gpu N: instance: ...``."""
    from gpuslice.policy import conflicts

    return [f"gpu {g}: {m}" for g in sorted(set(gpus)) for m in conflicts(st.policy_of(g).policy, st.claims(g))]


def new_conflicts(before: Sequence[str], after: Sequence[str], name: str) -> list[str]:
    """What a change to instance ``name`` should warn about: the conflicts it made, and
    every one that names the instance."""
    return [m for m in after if m not in before or m.split(": ", 2)[1] == name]


def kernel(ctx: click.Context, change: str | None = None) -> Any:
    """The module's netlink client, or None: with --kernel no, or (--kernel auto) when
    the module is not loaded. ``change``: the command changes instances (create, set,
    delete), which without the module would only be recorded in the state file: then
    only --kernel no gives None, and a missing module is an error whose fix says what
    --kernel no would do instead, e.g. "record the instance"."""
    mode = ctx.obj["kernel"]
    if mode == "no":
        return None
    if "nl" not in ctx.obj:
        from gpuslice.netlink import GpusliceNetlink, NetlinkError, VersionMismatch, module_loaded

        if mode == "auto" and not module_loaded():
            ctx.obj["nl"] = None
        else:
            try:
                ctx.obj["nl"] = nl = GpusliceNetlink()
                ctx.find_root().call_on_close(nl.close)  # closed when the command ends, not at exit
            except VersionMismatch as e:  # refused whatever the mode: never talk to another ABI
                raise GpuctlError(str(e)) from None
            except (NetlinkError, OSError, ImportError) as e:
                if (mode == "yes" or change) and module_loaded():
                    raise GpuctlError(str(e)) from None
                ctx.obj["nl"] = None
    if ctx.obj["nl"] is None and (mode == "yes" or change):
        raise GpuctlError(f"gpuslice module not loaded (modprobe gpuslice)"
                          + (f", or pass --kernel no to only {change}" if change else ""))
    return ctx.obj["nl"]


ID_RANGE = click.IntRange(0, 2**32 - 2)  # a kernel uid/gid: u32, (u32)-1 is no id
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT


def _non_empty(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An empty --state (an unset variable in a script) is an error, not the default file."""
    if not value:
        raise click.BadParameter("empty path", ctx=ctx, param=param)
    return value


def _write_json(path: str, data: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


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

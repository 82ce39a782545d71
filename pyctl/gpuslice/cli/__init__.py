"""gpuctl: configure GPU slices (instances and policies) and run the scheduler daemon.

Units accepted everywhere: sizes as Kubernetes quantities, always with a unit (Ki, Mi,
Gi, Ti or KiB, MiB, GiB, TiB: powers of 1024; k, M, G, T or kB, MB, GB, TB: powers of
1000; B: bytes); shares in percent of one GPU (30% or 30; a bare 0.3 is refused as
ambiguous); durations with ns/us/ms/s/m (a bare number is seconds). Every command prints a table, or
JSON with --json. Errors are one line on stderr and a non-zero exit status.

A module per command group: common (errors, parameter types, output, :func:`kernel`),
instance, policy, status (status, top), daemon (daemon, guard), cdi (cdi generate and
the spec the instance commands regenerate), ops (run-args, exporter, doctor); the
trace command (gpuslice.trace.live) and the Kubernetes plugins (gpuslice.kube.cli)
are registered here.
"""

from __future__ import annotations

import click

from gpuslice import state as S

from .cdi import cdi_group
from .common import GpuctlError, OneLineGroup, _non_empty, kernel
from .daemon import _die_with_parent, _make_probe, _make_source, _spawn_guard, daemon, guard
from .instance import instance
from .ops import doctor, exporter, run_args
from .policy import policy
from .status import status, top

__all__ = ["main", "GpuctlError", "kernel", "_make_probe", "_make_source", "_spawn_guard", "_die_with_parent"]


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from gpuslice.version import version_line

        click.echo(version_line())
        ctx.exit()


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state", "state_path", envvar="GPUSLICE_STATE", default=S.DEFAULT_PATH, show_default=True,
              callback=_non_empty, help="State file (env GPUSLICE_STATE).")
@click.option("--kernel", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True,
              help="The gpuslice module: auto = use it where it is loaded, but instance create, set and delete "
              "fail without it; yes = every command needs it; no = never (create, set and delete only change "
              "the state file).")
@click.option("--cdi-spec", envvar="GPUSLICE_CDI_SPEC", metavar="PATH",
              help="CDI spec that `instance create`, `delete` and `restore` keep current and `doctor` checks "
              "(env GPUSLICE_CDI_SPEC; default: /etc/cdi/gpuslice.yaml where /etc/cdi exists; '' for none).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="gpuctl's version, the netlink ABI it speaks and the checkout it was built from, then exit.")
@click.pass_context
def main(ctx: click.Context, state_path: str, kernel: str, cdi_spec: str | None) -> None:
    """Kernel-space GPU sharing: instances (fake NVIDIA device sets with a memory limit)
    and compute policies, enforced by `gpuctl daemon`."""
    ctx.ensure_object(dict)
    ctx.obj.update(state=state_path, kernel=kernel, cdi_spec=cdi_spec)


for _cmd in (instance, policy, status, top, daemon, guard, exporter, doctor, run_args, cdi_group):
    main.add_command(_cmd)

try:  # the eBPF tracing command (pyctl/gpuslice/trace/live.py)
    from gpuslice.trace import live as _trace

    main.add_command(_trace.trace)
except ImportError:
    pass


from gpuslice.kube.cli import register as _register_kube  # noqa: E402 (the commands need main)

_register_kube(main)

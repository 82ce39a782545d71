"""Operations: `gpuctl run-args` (docker/podman flags without CDI), `gpuctl exporter`
(Prometheus metrics) and `gpuctl doctor` (host checks)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import click

from gpuslice.ops.listen import DEFAULT_LISTEN, parse_listen

from .cdi import _cdi_instances, _cdi_spec
from .common import GUARD_STATUS, STATUS_PATH, GpuctlError, _read_status, emit, json_option, kernel, table


@click.command("run-args")
@click.argument("name")
@click.option("--driver/--no-driver", default=True, show_default=True,
              help="Also mount the host's NVIDIA driver files read-only (as the CDI spec does).")
@json_option(instead="one shell-quoted line (a list of the arguments)")
@click.pass_context
def run_args(ctx: click.Context, name: str, driver: bool) -> None:
    """docker/podman run flags that give a container instance NAME without CDI:
    `docker run $(gpuctl run-args web) IMAGE ...`: its nodes, the driver files and the
    CDI spec's environment (GPUSLICE_INSTANCE, NVIDIA_VISIBLE_DEVICES=void). One
    shell-quoted line (JSON: the argument list)."""
    import shlex

    from gpuslice.ops import cdi

    inst = next((i for i in _cdi_instances(ctx) if i.name == name), None)
    if inst is None:
        raise GpuctlError(f"no instance {name!r}")
    args = [a for n in cdi.device_nodes(inst) for a in ("--device", f"{n['hostPath']}:{n['path']}")]
    if driver:
        args += [a for f in cdi.driver_files(cdi.scan_host()) for a in ("--volume", f"{f}:{f}:ro")]
    args += [a for e in cdi.container_env(name, inst.caps) for a in ("--env", e)]  # the CDI spec's, from one place
    emit(ctx, args, lambda: shlex.join(args))


@click.command()
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
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
        parse_listen(listen)
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
    try:
        srv = E.make_server(listen, E.registry_for(src))
    except OSError as e:
        host, port = parse_listen(listen)
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise GpuctlError(f"cannot listen on {addr}: {e.strerror or e} (another exporter? pass --listen "
                          "HOST:PORT, e.g. 127.0.0.1:9411, or 127.0.0.1:0 for any free port)") from None
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


@click.command()
@click.option("--status-file", default=STATUS_PATH, show_default=True, help="Where the daemon reports.")
@click.option("--exporter", "exporter_listen", metavar="HOST:PORT",
              help="Where `gpuctl exporter` listens (default: the --listen of the gpuslice-exporter unit, "
              f"else {DEFAULT_LISTEN}).")
@json_option
@click.pass_context
def doctor(ctx: click.Context, status_file: str, exporter_listen: str | None) -> None:
    """Check this host: NVIDIA driver version, module and netlink version, the state
    file's instances in the module (those `instance restore` could not make), daemon, the
    real nodes' modes, require_device_cgroup, vm.mmap_min_addr, the CDI spec (--cdi-spec,
    default /etc/cdi/gpuslice.yaml) against `gpuctl cdi generate`, and the exporter.
    Each says ok, warn, fail or skip, with a one-line fix. Exit status 1 when a check
    fails (warn and skip do not)."""
    from gpuslice.ops import cdi
    from gpuslice.ops import doctor as D

    if exporter_listen is not None:
        try:
            parse_listen(exporter_listen)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--exporter") from None
    checks = D.run_all(status_file, ctx.obj.get("cdi_spec") or cdi.DEFAULT_OUTPUT, lambda: _cdi_spec(ctx),
                       exporter_listen,
                       state_file=None if ctx.obj["kernel"] == "no" else ctx.obj["state"])
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

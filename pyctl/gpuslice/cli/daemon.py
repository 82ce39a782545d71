"""`gpuctl daemon` (the scheduler) and `gpuctl guard` (RM's memory count against the
limits), with what they are made of: the source, the probe, the guard process."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import click

from gpuslice import units

from . import daemonlock
from .daemonlock import LOCK_PATH
from .common import (DURATION, DURATION_OR_0, GPUS, GUARD_STATUS, PRELOAD_DIR, PRELOAD_SOCK, PROBE, SOURCE,
                     STATUS_PATH, GpuctlError, _read_status, _write_json, bad_option, construct, duration, emit,
                     json_option, kernel, table)


def _remove_own_report(path: str) -> None:
    """Remove the report at ``path`` if this process wrote it: a daemon that failed to
    start (a second one, a wrong --ctl) leaves the running daemon's, or any other file.
    The file unlinked is the one read (same inode): one another daemon put in its place
    since stays."""
    import json

    try:
        with open(path) as f:
            st = os.fstat(f.fileno())
            d = json.load(f)
        now = os.lstat(path)
    except (OSError, ValueError):
        return
    if isinstance(d, dict) and d.get("pid") == os.getpid() and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
        with contextlib.suppress(OSError):
            os.unlink(path)


@click.command()
@click.option("--ctl", default="/dev/nvidiactl", show_default=True, metavar="PATH", help="RM control node.")
@click.option("--source", type=SOURCE, default="auto", show_default=True,
              help="Where channels come from: the module (netlink) or the library's socket (preload); "
              "auto: netlink if the module is loaded.")
@click.option("--preload-sock", default=PRELOAD_SOCK, show_default=True, metavar="PATH",
              help="Host-only socket of --source preload.")
@click.option("--preload-dir", default=PRELOAD_DIR, show_default=True, metavar="DIR",
              help="--source preload: instance socket dirs.")
@click.option("--probe", type=PROBE, default="auto", show_default=True,
              help="Activity probe for equal/burst; auto: submit and cpu where the source reports "
              "submissions, else cpu.")
@click.option("--status-file", default=STATUS_PATH, show_default=True, metavar="PATH", help="Where to report.")
@click.option("--watchdog/--no-watchdog", default=True, show_default=True,
              help="A process that re-enables the channels if the daemon dies.")
@click.option("--duration", type=DURATION, help="Exit after this long (default: at SIGTERM).")
@click.option("--rt-priority", type=click.IntRange(0, 99), default=10, show_default=True, metavar="N",
              help="SCHED_FIFO priority for slot switches on time (0: normal).")
@click.option("--switch-order", type=click.Choice(["disable-first", "enable-first"]), default="enable-first",
              show_default=True, metavar="ORDER",
              help="enable-first (no idle gap) or disable-first (exclusive slots).")
@click.option("--preempt-poll", type=duration(100_000), default="1ms", show_default=True,
              help="How often to look for online work while offline instances run (a bare number: seconds).")
@click.option("--online-hold", type=DURATION, default="5ms", show_default=True,
              help="An online instance counts as busy this long after its last submission.")
@click.option("--preempt-after", type=DURATION_OR_0, default="0", show_default=True,
              help="Preempt offline instances once online work has gone on this long (0: at once).")
@click.option("--online-sample", type=DURATION_OR_0, default="200us", show_default=True,
              help="User-space build: how often online instances' libraries look at their channels "
              "(0: their own).")
@click.option("--guard-interval", type=DURATION_OR_0, default="100ms", show_default=True,
              help="Run `gpuctl guard` at this interval (0: do not).")
@click.option("--lock-file", default=LOCK_PATH, show_default=True, metavar="PATH", hidden=True,
              help="Locked (flock) for the daemon's life: a second daemon refuses to start, naming the first's PID.")
@click.option("--replace", is_flag=True, help="Stop the running daemon first (SIGTERM).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv: debug).")
@click.pass_context
def daemon(ctx: click.Context, ctl: str, source: str | type, preload_sock: str, preload_dir: str, probe: str | type, status_file: str,
           watchdog: bool, duration: int | None, rt_priority: int, switch_order: str, preempt_poll: int,
           online_hold: int, preempt_after: int, online_sample: int, guard_interval: int, lock_file: str,
           replace: bool, verbose: int) -> None:
    """Run the scheduler (one per host): gate each instance's channels into its slots;
    all re-enabled at start and exit. Options in full: docs/policies.md."""
    from gpuslice.sched.gate import RmGate, Watchdog
    from gpuslice.sched.rm import RmClient
    from gpuslice.sched.scheduler import Scheduler

    if online_sample and not 50_000 <= online_sample <= online_hold // 2:
        half = units.format_duration_ns(online_hold // 2)
        raise bad_option(ctx, "online_sample", units.format_duration_ns(online_sample),
                         f"must be 0 or between 50us and half the --online-hold ({half}): busy online work "
                         "must be seen within the hold")
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
    lock_fd: int | None = None
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
        # the inputs first: a source or probe class (MODULE:CLASS) that cannot be had fails
        # before anything else; then the driver, in one line, before a socket, the watchdog
        # or the guard is made; then the built-in source and probe
        src = _make_source(ctx, source, preload_sock, preload_dir) if isinstance(source, type) else None
        if src is not None:
            cleanups.append(src.close)
        prb = _make_probe(probe) if isinstance(probe, type) else None
        _require_driver(ctl)
        lock_fd = daemonlock.take(lock_file, replace)  # before any socket, the watchdog or a gate
        if src is None:
            src = _make_source(ctx, source, preload_sock, preload_dir)
            cleanups.append(src.close)
        t_src = time.monotonic_ns()
        if prb is None:
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
        if lock_fd is not None:
            os.close(lock_fd)  # last: a daemon waiting with --replace starts once all of ours is gone
    if "sig" in stop:
        logging.info("stopped by signal %d; every channel re-enabled", stop["sig"])


@click.command()
@click.option("--ctl", default="/dev/nvidiactl", show_default=True, help="RM control node to query RM through.")
@click.option("--interval", type=DURATION, default="100ms", show_default=True,
              help="How often RM's per-process memory is read (a bare number is seconds, no longer milliseconds).")
@click.option("--source", type=click.Choice(["netlink", "environ"]), default="netlink", show_default=True,
              help="Where instances come from: the module, or (user-space build) every process with "
              "libgpuslice.so preloaded, each its own slice with its GPUSLICE_MEM_LIMIT.")
@click.option("--gpu", "gpus", type=GPUS, default="0", show_default=True, help="GPUs for --source environ.")
@click.option("--once", is_flag=True, help="One poll: print the breaches found and exit (a dry run unless --kill).")
@click.option("--dry-run", is_flag=True, help="Report breaches, kill nothing (the default with --once).")
@click.option("--kill", is_flag=True, help="With --once: SIGKILL each breach's largest process, as the running "
              "guard does.")
@click.option("--duration", type=DURATION, help="Exit after this long (default: until SIGTERM/SIGINT).")
@click.option("--status-file", default=GUARD_STATUS, show_default=True, help="Where to report.")
@json_option
@click.pass_context
def guard(ctx: click.Context, ctl: str, interval: int, source: str, gpus: list[int], once: bool,
          dry_run: bool, kill: bool, duration: int | None, status_file: str) -> None:
    """Hold each instance's memory limit against RM's own count: SIGKILL the largest process
    of an instance whose processes hold more video memory than its limit and than the module
    charged (what a thread racing the module's check can get). `gpuctl daemon` runs it.
    --once prints one poll's breaches and kills nothing unless given --kill."""
    from gpuslice.sched.reconcile import Kill, Reconciler, breaches, environ_slices, netlink_slices, rm_usage
    from gpuslice.sched.rm import RmClient, RmError

    if dry_run and kill:
        raise click.UsageError("--dry-run and --kill are mutually exclusive")
    _require_driver(ctl)
    logging.basicConfig(level=logging.INFO, format="gpuctl guard: %(message)s")
    stop: dict[str, int] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: stop.setdefault("sig", n))
    slices = netlink_slices(kernel(ctx)) if source == "netlink" else environ_slices(gpus)
    try:
        rm = RmClient(ctl).open()
    except (OSError, RmError) as e:
        raise GpuctlError(f"cannot open an RM client on {ctl}: {e}") from None
    dry_run = dry_run or (once and not kill)
    rec = Reconciler(rm, slices)
    if dry_run:  # the breaches Reconciler.poll would find, and no kill
        def dry_poll() -> list[Kill]:
            sl = slices()
            found = breaches(sl, rm_usage(rm, {g for s in sl for g in s.gpus})) if any(s.pids for s in sl) else []
            rec.polls += 1
            for b in found:
                logging.warning("instance %s holds %d bytes in RM's count (limit %d, charged %d): pid %d (%d bytes) "
                                "not killed (dry run)", b.name, b.rm_bytes, b.limit, b.used, b.pid, b.pid_bytes)
            done = [Kill(time.time(), b, False) for b in found]
            rec.kills.extend(done)
            return done

        poll = dry_poll
    else:
        poll = rec.poll
    until = time.monotonic_ns() + duration if duration else None
    failed = 0
    try:
        while "sig" not in stop and (until is None or time.monotonic_ns() < until):
            t = time.monotonic()
            try:
                found = poll()
                failed = 0
            except (OSError, RmError) as e:
                failed += 1
                if failed == 1:
                    logging.error("poll failed (retrying): %s", e)
                found = []
            if not (once and dry_run):  # a one-off look leaves the running guard's report alone
                _write_json(status_file, {"pid": os.getpid(), "time": time.time(), "dry_run": dry_run,
                                          **rec.summary()})
            if once:
                rows = [{"instance": k.breach.name, "pid": k.breach.pid, "rm_bytes": k.breach.rm_bytes,
                         "limit": k.breach.limit, "used": k.breach.used, "killed": k.killed, "dry_run": dry_run}
                        for k in found]
                text_rows = [{**r, "killed": "no (dry run)" if dry_run else ("yes" if r["killed"] else "failed")}
                             for r in rows]
                emit(ctx, rows, lambda: table(text_rows, [("instance", "INSTANCE"), ("pid", "PID"),
                                                          ("rm_bytes", "RM BYTES"), ("limit", "LIMIT"),
                                                          ("used", "CHARGED"), ("killed", "KILLED")]))
                return
            time.sleep(max(0.0, interval / 1e9 - (time.monotonic() - t)))
    finally:
        rm.close()


def _require_driver(ctl: str) -> None:
    """A one-line GpuctlError when RM's control node cannot be opened (no NVIDIA driver,
    a node with no driver behind it, no permission)."""
    from gpuslice.sched.rm import driver_missing

    missing = driver_missing(ctl)
    if missing is not None:
        raise GpuctlError(missing)


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

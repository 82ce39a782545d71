"""`gpuctl instance`: create, list, show, set, delete and restore instances."""

from __future__ import annotations

import errno
import re
from typing import Any

import click

from gpuslice import instances
from gpuslice import state as S
from gpuslice import units
from gpuslice.netlink import CAPS_ALL, caps_names, caps_text, lock_summary, parse_caps
from gpuslice.policy import EPS, POLICIES, compute_shares, shares_online_idle

from .cdi import _cdi_failed, _regenerate_cdi
from .common import (GPUS, ID_RANGE, MEMORY, MEMORY_HELP, MIN_SHARE, SHARE, SHARE_HELP, GpuctlError, _Unit, bad_option,
                     emit, given, gpu_conflicts, json_option, kernel, new_conflicts, share_json, share_text, table, warn)


def inst_row(i: S.Instance) -> dict[str, Any]:
    return {"name": i.name, "gpus": ",".join(map(str, i.gpus)), "memory": units.format_memory(i.memory, i.gpu_memory),
            "memory_bytes": i.memory, "weight": i.weight,
            "share": units.format_share(i.share) if i.share is not None else None,
            "ceiling": units.format_share(i.ceiling) if i.ceiling is not None else None,
            "priority": i.priority + (f" (min {units.format_share(i.min_share)})" if i.min_share else ""),
            "caps": caps_text(CAPS_ALL if i.caps is None else i.caps)}


def inst_json(i: S.Instance) -> dict[str, Any]:
    """memory: the largest limit (as before per-GPU limits); gpu_memory: the limit on
    each GPU; memory_per_gpu: the per-GPU limits as given (--memory 0=8Gi,1=4Gi), null
    where one limit applies to every GPU."""
    return {"name": i.name, "gpus": i.gpus, "memory": i.memory,
            "gpu_memory": {str(g): i.memory_of(g) for g in i.gpus},
            "memory_per_gpu": {str(g): v for g, v in sorted(i.gpu_memory.items())} if i.gpu_memory else None,
            "weight": i.weight, "share": share_json(i.share),
            "ceiling": share_json(i.ceiling), "priority": i.priority, "min_share": share_json(i.min_share),
            "uid": i.uid, "gid": i.gid, "mode": None if i.mode is None else f"{i.mode:04o}",
            "caps": caps_names(CAPS_ALL if i.caps is None else i.caps)}


PRIORITY = click.Choice(["online", "offline"])
PRIORITY_HELP = ("online (default) or offline: while any online instance of the GPU has work, offline ones get "
                 "nothing (or their --min-share) and are preempted as soon as online work appears; with no "
                 "online work they share the GPU by its policy.")


def _parse_mode(text: str) -> int:
    """--mode: octal, 0..0777, the owner's read and write, no execute bit. Bits for
    others are taken with a warning (:func:`_mode_warning`): the Kubernetes plugins make
    their nodes 0666 (S.OWNED_NODE_MODE) and rely on the module's require_device_cgroup."""
    if not re.fullmatch(r"[0-7]{1,4}", text):
        raise ValueError("not an octal mode (write e.g. 0660)")
    v = int(text, 8)
    if v > 0o777:
        raise ValueError("outside 0..0777 (no setuid, setgid or sticky bit on a device node)")
    if v & 0o111:
        raise ValueError("has execute bits: a device node is opened, never run (write e.g. 0660)")
    if v & 0o600 != 0o600:
        raise ValueError("gives the owner no read and write: the nodes are opened read-write (write e.g. 0660)")
    return v


def _mode_warning(mode: int | None) -> list[str]:
    if mode is None or not mode & 0o007:
        return []
    return [f"--mode {mode:04o} lets other users open the nodes: only the module's require_device_cgroup=Y then "
            "keeps host processes out (a process whose device cgroup lets it open the real nodes gets EPERM); "
            "without it every local user gets the GPU"]


MODE = _Unit("mode", _parse_mode)
CAPS = _Unit("caps", parse_caps)
CAPS_HELP = "compute,utility,graphics,video or all (default): what the module lets it use."
MODE_HELP = ("Permission bits of the device nodes, octal (default 0660): the owner reads and writes, no execute "
             "bit. Bits for others (0666, as the Kubernetes plugins make their nodes) are taken with a warning: "
             "then only the module's require_device_cgroup=Y keeps host processes out.")


@click.group()
def instance() -> None:
    """Create, change, inspect and delete instances."""


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A new instance's name, a CDI device name the module takes (state.NEW_NAME_RE): a
    usage error, not the state's."""
    if not S.valid_new_name(value):
        raise click.UsageError(f"bad instance name {value!r} ({S.NEW_NAME_RULE})")
    return value


def _check_gpus(gpus: list[int]) -> list[str]:
    """Without the module (--kernel no): the GPUs must be this host's (its /dev/nvidia<N>,
    what the module checks at INSTANCE_NEW); where no GPU node can be read, a warning."""
    gone = instances.missing_gpus(gpus)
    if gone is None:
        return [f"{instances.gpu_words(gpus)} not checked: no NVIDIA GPU nodes in {instances.DEV} (no driver "
                "loaded?); `instance restore` will say if the host lacks it"]
    if gone:
        have = ",".join(map(str, instances.host_gpus() or []))
        raise GpuctlError(f"this host has no {instances.gpu_words(gone)} (GPUs: {have}; no "
                          f"{', '.join(f'{instances.DEV}/nvidia{g}' for g in gone)})")
    return []


@instance.command("create")
@click.argument("name", callback=_name)
@click.option("--gpu", "gpus", type=GPUS, default="0", show_default=True, help="GPU minor(s), e.g. 0 or 0,1.")
@click.option("--memory", type=MEMORY, required=True, help=MEMORY_HELP)
@click.option("--policy", type=click.Choice(POLICIES), help="Also set its GPUs' policy (refused where other "
              "instances use it).")
@click.option("--force", is_flag=True, help="--policy for the GPUs' other instances too.")
@click.option("--weight", type=click.IntRange(1, 10000), help="Weight 1..10000 (weight, burst; default 1).")
@click.option("--share", type=SHARE, help="Fixed share of the GPU (fixed policy), e.g. 30%. " + SHARE_HELP)
@click.option("--ceiling", type=SHARE, help="At most this share (equal, burst), e.g. 50%.")
@click.option("--priority", type=PRIORITY, default="online", show_default=True, help=PRIORITY_HELP)
@click.option("--min-share", type=MIN_SHARE, help="Offline only: the share it keeps while online work runs, e.g. 5%.")
@click.option("--uid", type=ID_RANGE, help="Owner of the device nodes.")
@click.option("--gid", type=ID_RANGE, help="Group of the device nodes.")
@click.option("--mode", type=MODE, help=MODE_HELP)
@click.option("--caps", type=CAPS, help=CAPS_HELP)
@json_option
@click.pass_context
def instance_create(ctx: click.Context, name: str, gpus: list[int], memory: tuple[int, dict[int, int]],
                    policy: str | None, force: bool,
                    weight: int | None, share: float | None, ceiling: float | None, priority: str,
                    min_share: float | None, uid: int | None, gid: int | None, mode: int | None,
                    caps: int | None) -> None:
    """Create instance NAME on --gpu with a --memory limit."""
    if weight is not None and share is not None:
        raise click.UsageError("--weight and --share are mutually exclusive")
    if min_share is not None and priority != "offline":
        raise click.UsageError("--min-share is for --priority offline")
    _floor_within_ceiling(min_share, ceiling)
    size, per_gpu = _memory(ctx, memory, gpus)
    nl = kernel(ctx, "record the instance")
    unchecked = _check_gpus(gpus) if nl is None else []
    with S.locked(ctx.obj["state"]) as st:
        before = gpu_conflicts(st, gpus)
        # --policy is the GPU's: it changes what the GPU's other instances run under, which
        # only `policy set` (or --force) may do
        others = {g: [i.name for i in st.instances_on(g)] for g in gpus
                  if policy and policy != st.policy_of(g).policy and st.instances_on(g)}
        if others and not force:
            g, names = next(iter(others.items()))
            raise GpuctlError(f"gpu {g}: --policy {policy} would switch {', '.join(names)} from "
                              f"{st.policy_of(g).policy} to {policy}: set the GPU's policy with `gpuctl policy set "
                              f"{policy} --gpu {g}`, or add --force")
        replaced = [f"gpu {g}: --policy {policy} replaces {st.policy_of(g).policy} for every instance of the GPU, "
                    f"also {', '.join(names)} (--force)" for g, names in others.items()]
        inst = S.Instance(name, gpus, size, weight=weight or 1, share=share, ceiling=ceiling, priority=priority,
                          min_share=min_share, gpu_memory=per_gpu, uid=uid, gid=gid, mode=mode,
                          caps=None if caps == CAPS_ALL else caps)
        try:
            instances.add(st, inst, nl, policy=policy)
        except instances.InstanceError as e:
            raise GpuctlError(str(e)) from None
        except OSError as e:  # the module's refusal (NetlinkError), in words
            raise GpuctlError(f"cannot create {name} on {instances.gpu_words(gpus)}: {instances.refusal(e, inst)}") \
                from None
        warnings = new_conflicts(before, gpu_conflicts(st, gpus), name)
        cdi_err = _regenerate_cdi(ctx, st)
    warn(unchecked + _mode_warning(mode) + replaced + warnings)
    _cdi_failed(f"created {name}", cdi_err)
    emit(ctx, inst_json(inst), lambda: f"created {name}\n" + table([inst_row(inst)], INST_COLS))


def _floor_within_ceiling(min_share: float | None, ceiling: float | None) -> None:
    """An offline floor above the ceiling cannot be honoured where the ceiling counts
    (equal, burst): the floor is given in full beside online work (policy.compute_shares),
    the ceiling caps the instance without it. Refused whatever the policy of the day."""
    if min_share is not None and ceiling is not None and min_share > ceiling + EPS:
        raise click.UsageError(f"--min-share {units.format_share(min_share).replace('.0%', '%')} is above "
                               f"--ceiling {units.format_share(ceiling).replace('.0%', '%')}: the floor is given in "
                               "full beside online work, the ceiling caps it without")


def _memory(ctx: click.Context, memory: tuple[int, dict[int, int]], gpus: list[int],
            where: str = "the instance", how: str = " (--gpu)") -> tuple[int, dict[int, int] | None]:
    """--memory for an instance of ``gpus``: a per-GPU form names each of them."""
    size, per_gpu = memory
    if per_gpu and sorted(per_gpu) != sorted(gpus):
        named = ",".join(map(str, sorted(per_gpu)))
        on = (f"GPU {gpus[0]} only" if len(gpus) == 1 else f"GPUs {','.join(map(str, sorted(gpus)))}")
        raise bad_option(ctx, "memory", given(ctx, "memory") or units.format_memory(size, per_gpu),
                         f"names GPU{'s' if len(per_gpu) > 1 else ''} {named} but {where} is on {on}{how}")
    return size, per_gpu or None


INST_COLS = [("name", "NAME"), ("gpus", "GPUS"), ("memory", "MEMORY"), ("weight", "WEIGHT"), ("share", "SHARE"),
             ("ceiling", "CEILING"), ("priority", "PRIORITY"), ("caps", "CAPS")]


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
    idle = {g: s[name] for g in i.gpus if i.priority == "offline"
            and (s := shares_online_idle(st.policy_of(g).policy, st.claims(g))) is not None}
    lock = lock_summary(k)
    gm = gpu_mem(k)
    data = {**inst_json(i), "policy": {str(g): st.policy_of(g).policy for g in i.gpus},
            "gpu_mem": {str(g): v for g, v in gm.items()} if k else None,
            "share_when_all_busy": {str(g): share_json(s) for g, s in shares.items()},
            "share_when_online_idle": {str(g): share_json(s) for g, s in idle.items()} or None, "kernel": k or None,
            "lock": lock or None}

    def text() -> str:
        r = inst_row(i)
        lines = [("name", i.name), ("gpus", r["gpus"]), ("memory", r["memory"]), ("weight", str(i.weight)),
                 ("share", r["share"] or "-"), ("ceiling", r["ceiling"] or "-"), ("priority", r["priority"]),
                 ("caps", r["caps"])]
        if (i.uid, i.gid, i.mode) != (None, None, None):
            lines.append(("nodes", ", ".join(f"{k} {v}" for k, v in (("uid", i.uid), ("gid", i.gid),
                                                                     ("mode", data["mode"])) if v is not None)))
        for g in i.gpus:
            m = gm.get(g)
            lines.append((f"gpu{g} memory", f"{units.format_size(m['used'])} used of {units.format_size(m['limit'])}"
                          f" (peak {units.format_size(m['peak'])})" if m else units.format_size(i.memory_of(g))))
            lines.append((f"gpu{g} policy", f"{st.policy_of(g).policy}, "
                          f"period {units.format_duration_ns(st.policy_of(g).period_ns)}"))
            lines.append((f"gpu{g} share (all busy)", share_text(shares[g], idle.get(g))))
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
@click.option("--min-share", type=MIN_SHARE, help="Offline only: the share it keeps while online work runs.")
@click.option("--no-min-share", is_flag=True, help="Remove the offline floor.")
@click.option("--caps", type=CAPS, help="compute,utility,graphics,video or all: for the calls to come.")
@json_option
@click.pass_context
def instance_set(ctx: click.Context, name: str, memory: tuple[int, dict[int, int]] | None, weight: int | None,
                 share: float | None,
                 no_share: bool, ceiling: float | None, no_ceiling: bool, priority: str | None,
                 min_share: float | None, no_min_share: bool, caps: int | None) -> None:
    """Change an instance; the daemon applies it from its next period."""
    if share is not None and no_share:
        raise click.UsageError("--share and --no-share are mutually exclusive")
    if ceiling is not None and no_ceiling:
        raise click.UsageError("--ceiling and --no-ceiling are mutually exclusive")
    if min_share is not None and no_min_share:
        raise click.UsageError("--min-share and --no-min-share are mutually exclusive")
    if all(v is None for v in (memory, weight, share, ceiling, priority, min_share, caps)) and \
            not (no_share or no_ceiling or no_min_share):
        raise click.UsageError("nothing to change (give --memory, --weight, --share, --ceiling, --priority, "
                               "--min-share or --caps)")
    dropped: list[str] = []
    nl = kernel(ctx, "record the change")
    with S.locked(ctx.obj["state"]) as st:
        i = _get(st, name)
        before = gpu_conflicts(st, i.gpus)
        size = per_gpu = None
        if memory is not None:
            size, per_gpu = _memory(ctx, memory, i.gpus, name, "")
            i.memory, i.gpu_memory = size, per_gpu
        if weight is not None:
            i.weight = weight
        if share is not None or no_share:
            i.share = share
        if ceiling is not None or no_ceiling:
            i.ceiling = ceiling
        if priority is not None:
            i.priority = priority
            if priority == "online" and min_share is None and i.min_share is not None:
                dropped.append(f"{name}: min-share {units.format_share(i.min_share)} dropped: a floor is for "
                               "offline instances only")
                i.min_share = None  # a floor means nothing online
        if min_share is not None or no_min_share:
            i.min_share = min_share
        if caps is not None:
            i.caps = None if caps == CAPS_ALL else caps
        if i.min_share is not None and i.priority != "offline":
            raise click.UsageError(f"--min-share is for offline instances ({name} is {i.priority}; "
                                   "add --priority offline)")
        _floor_within_ceiling(i.min_share, i.ceiling)
        st.check()
        warnings = dropped + new_conflicts(before, gpu_conflicts(st, i.gpus), name)
        if nl is not None:
            from gpuslice.netlink import MAX_GPUS, gpu_mem_limits

            nl.instance_set(name, mem_limit=size, weight=weight,
                            gpu_mem_limit=None if memory is None else gpu_mem_limits(per_gpu) or [0] * MAX_GPUS,
                            share=units.share_to_ppt(i.share) if i.share else None, caps=caps)
        cdi_err = _regenerate_cdi(ctx, st) if caps is not None else None
    warn(warnings)
    _cdi_failed(f"updated {name}", cdi_err)
    emit(ctx, inst_json(i), lambda: f"updated {name}\n" + table([inst_row(i)], INST_COLS))


@instance.command("delete")
@click.argument("name")
@json_option
@click.pass_context
def instance_delete(ctx: click.Context, name: str) -> None:
    """Delete an instance (the module refuses while its device nodes are open)."""
    nl = kernel(ctx, "remove it from the state file")
    with S.locked(ctx.obj["state"]) as st:
        _get(st, name)
        try:
            instances.remove(st, name, nl)
        except instances.InstanceError as e:
            raise GpuctlError(str(e)) from None
        cdi_err = _regenerate_cdi(ctx, st)
    _cdi_failed(f"deleted {name}", cdi_err)
    emit(ctx, {"deleted": name}, lambda: f"deleted {name}")


@instance.command("handover")
@click.argument("names", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every instance the module has.")
@json_option
@click.pass_context
def instance_handover(ctx: click.Context, names: tuple[str, ...], every: bool) -> None:
    """Hand each instance's decision state to a fresh core in the module while its
    containers keep running (INSTANCE_HANDOVER): new calls wait while the calls in
    flight finish (at most 100 ms, else the instance keeps its core and is named
    busy), then run on the new core with the same charges and limits. Prints how long
    new calls were held (PAUSE), the part spent on calls in flight (DRAIN) and the
    state's size."""
    if bool(names) == every:
        raise click.UsageError("name one or more instances, or --all")
    nl = kernel(ctx)
    if nl is None:
        if ctx.obj["kernel"] == "no":
            raise click.UsageError("instance handover needs the gpuslice module whatever --kernel says (drop --kernel no)")
        raise GpuctlError("gpuslice module not loaded (modprobe gpuslice)")
    have = [d["name"] for d in nl.instances() if "name" in d]
    if every:
        names = tuple(sorted(have))
    unknown = [n for n in names if n not in have]
    if unknown:
        raise GpuctlError(f"no instance {unknown[0]!r} in the module (instances: {', '.join(sorted(have)) or 'none'})")
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for name in names:
        try:
            r = nl.instance_handover(name)
        except OSError as e:
            why = ("calls in flight did not finish within 100 ms; it keeps its core (try again)"
                   if e.errno == errno.EBUSY else (e.strerror or str(e)))
            failed.append(f"{name}: {why}")
            rows.append({"name": name, "ok": False, "error": why})
            continue
        rows.append({"name": name, "ok": True, **r})
    warn([f"not handed over: {f}" for f in failed])

    def text() -> str:
        return table([{"NAME": r["name"], "PAUSE": f"{r['handover_ns'] / 1e6:.2f} ms" if r["ok"] else "-",
                       "DRAIN": f"{r['handover_drain_ns'] / 1e6:.2f} ms" if r["ok"] else "-",
                       "STATE": units.format_size(r["snapshot_bytes"]) if r["ok"] else "-",
                       "RESULT": "handed over" if r["ok"] else r["error"]} for r in rows],
                     [(c, c) for c in ("NAME", "PAUSE", "DRAIN", "STATE", "RESULT")])

    emit(ctx, rows, text)
    if failed:
        raise GpuctlError(f"{len(failed)} instance(s) not handed over: {', '.join(f.split(':')[0] for f in failed)}")


@instance.command("restore")
@click.option("--strict", is_flag=True, help="Exit status 1 when an instance could not be made (default: 0, with "
              "a warning naming each, so that the daemon's unit starts the daemon with the rest).")
@json_option
@click.pass_context
def instance_restore(ctx: click.Context, strict: bool) -> None:
    """Create in the module every instance of the state file it does not have (after a
    boot or a module reload; the gpuslice-daemon unit runs it before the daemon), with
    the node owner, group and mode it was created with (the Kubernetes plugins'
    instances: 0666, as they made them). An instance the module refuses (its GPU is
    gone) is named with the reason, stays in the state file, and the others are made;
    the CDI spec lists those made."""
    nl = kernel(ctx)
    if nl is None:
        if ctx.obj["kernel"] == "no":
            raise click.UsageError("instance restore needs the gpuslice module whatever --kernel says: it creates "
                                   "the instances there (drop --kernel no)")
        raise GpuctlError("instance restore needs the gpuslice module whatever --kernel says: it creates the "
                          "instances there (modprobe gpuslice)")
    with S.locked(ctx.obj["state"]) as st:
        have = {d["name"] for d in nl.instances() if "name" in d}
        made: list[str] = []
        failed: list[dict[str, Any]] = []
        for i in sorted(st.instances.values(), key=lambda i: i.name):
            if i.name in have:
                continue
            try:
                instances.create_in_module(nl, i)
            except OSError as e:  # the module's refusal: name it, make the others
                failed.append({"name": i.name, "gpus": i.gpus, "reason": instances.refusal(e, i)})
                continue
            made.append(i.name)
        cdi_err = _regenerate_cdi(ctx, st)
    warn([f"instance {f['name']} ({instances.gpu_words(f['gpus'])}) not restored: {f['reason']}; it stays in "
          f"the state file (`gpuctl instance delete {f['name']}` forgets it)" for f in failed])
    _cdi_failed(f"created {', '.join(made) or 'nothing'}", cdi_err)

    def text() -> str:
        lines = [f"created {', '.join(made)}" if made else ("nothing created" if failed else "nothing to restore")]
        if failed:
            lines.append(f"not restored: {', '.join(f['name'] for f in failed)}")
        return "\n".join(lines)

    emit(ctx, {"created": made, "failed": failed}, text)
    if failed and strict:
        raise GpuctlError(f"{len(failed)} instance(s) not restored: {', '.join(f['name'] for f in failed)}")

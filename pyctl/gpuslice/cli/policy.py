"""`gpuctl policy`: set and show each GPU's compute policy."""

from __future__ import annotations

import click

from gpuslice import instances
from gpuslice import state as S
from gpuslice import units
from gpuslice.policy import POLICIES, compute_shares, shares_online_idle, validate

from .common import GPUS, PERIOD, GpuctlError, emit, gpu_conflicts, json_option, share_json, share_text, table, warn


@click.group()
def policy() -> None:
    """Per-GPU compute policy: fixed, weight, equal or burst (see docs/policies.md)."""


@policy.command("set")
@click.argument("kind", type=click.Choice(POLICIES))
@click.option("--period", type=PERIOD, help="Scheduling period, 1ms to 10s, e.g. 50ms (a bare number is "
              "seconds, no longer milliseconds: 0.05 is 50ms; default: keep the GPU's period (50ms for a new GPU)).")
@click.option("--gpu", "gpus", type=GPUS, help="GPU minor(s), e.g. 0 or 0,1 (this or --all is required).")
@click.option("--all", "all_gpus", is_flag=True, help="Every GPU of this host (/dev/nvidia<N>) and of the state file.")
@json_option
@click.pass_context
def policy_set(ctx: click.Context, kind: str, period: int | None, gpus: list[int] | None, all_gpus: bool) -> None:
    """Set the policy of --gpu (or --all GPUs). fixed: each instance its --share (sum <= 100%), idle time
    stays idle. weight: weight/sum of weights, idle time stays idle. equal: the busy
    instances split the GPU evenly. burst: weight/sum guaranteed, idle time goes to the
    busy ones by weight, each at most its --ceiling."""
    if gpus is not None and all_gpus:
        raise click.UsageError("--gpu and --all are mutually exclusive")
    if gpus is None and not all_gpus:
        raise click.UsageError("a policy is a GPU's: name it with --gpu (e.g. --gpu 0), or give --all for every GPU")
    with S.locked(ctx.obj["state"]) as st:
        if gpus is None:
            gpus = sorted(set(instances.host_gpus() or []) | set(st.used_gpus()))
            if not gpus:
                raise GpuctlError(f"--all: no GPU known (no /dev/nvidia<N> in {instances.DEV}, none in the state "
                                  "file): name it with --gpu")
        for g in gpus:
            st.gpus[g] = S.GpuPolicy(kind, period or st.policy_of(g).period_ns)
            errs = validate(kind, st.claims(g))
            if errs:
                raise GpuctlError(f"gpu {g}: {errs[0]}")
        st.check()
        warnings = gpu_conflicts(st, gpus)
    warn(warnings)
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
        idle = shares_online_idle(gp.policy, claims)
        data[str(g)] = {"policy": gp.policy, "period_ns": gp.period_ns,
                        "shares_all_busy": {n: share_json(s) for n, s in shares.items()},
                        "priorities": {c.name: c.priority for c in claims},
                        "shares_online_idle": None if idle is None else {n: share_json(s) for n, s in idle.items()}}
        if not claims:
            rows.append({"gpu": g, "policy": gp.policy, "period": units.format_duration_ns(gp.period_ns)})
        for c in claims:
            rows.append({"gpu": g, "policy": gp.policy, "period": units.format_duration_ns(gp.period_ns),
                         "instance": c.name, "priority": c.priority, "weight": c.weight,
                         "share": share_text(shares[c.name], idle[c.name] if idle and c.offline else None)})
    emit(ctx, data, lambda: table(rows, [("gpu", "GPU"), ("policy", "POLICY"), ("period", "PERIOD"),
                                         ("instance", "INSTANCE"), ("priority", "PRIORITY"), ("weight", "WEIGHT"),
                                         ("share", "SHARE(ALL BUSY)")]))

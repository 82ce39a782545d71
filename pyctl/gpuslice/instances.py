"""Creating and deleting instances: the state file and the module, in one step.

Shared by `gpuctl instance create/delete` and the Kubernetes plugins. The caller holds
the state lock (:func:`gpuslice.state.locked`) and passes the state it yielded: a
change is saved only when the whole block succeeds, so a refusal by the module leaves
the state file as it was.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

from gpuslice import state as S
from gpuslice import units


class InstanceError(Exception):
    """A one-line reason why an instance was not created or deleted."""


def add(st: S.State, inst: S.Instance, nl: Any, *, policy: str | None = None, uid: int | None = None,
        gid: int | None = None, mode: int | None = None) -> None:
    """Add ``inst`` to ``st`` (and ``policy`` to its GPUs), check the whole state, then
    create it in the module when ``nl`` (a GpusliceNetlink) is given. Raises
    InstanceError or StateError with ``st`` unchanged."""
    if inst.name in st.instances:
        raise InstanceError(f"instance {inst.name!r} exists")
    if not S.valid_new_name(inst.name):
        raise InstanceError(f"bad instance name {inst.name!r} ({S.NEW_NAME_RULE})")
    other = S.same_name(st, inst.name)
    if other is not None:
        raise InstanceError(f"instance {other!r} exists: names are unique whatever their case")
    old_policies = {g: st.gpus.get(g) for g in inst.gpus}
    st.instances[inst.name] = inst
    if policy:
        for g in inst.gpus:
            st.gpus[g] = S.GpuPolicy(policy, st.policy_of(g).period_ns)
    try:
        st.check()
        if nl is not None:
            create_in_module(nl, inst, uid=uid, gid=gid, mode=mode)
    except BaseException:
        del st.instances[inst.name]
        for g, p in old_policies.items():
            if p is None:
                st.gpus.pop(g, None)
            else:
                st.gpus[g] = p
        raise


def create_in_module(nl: Any, inst: S.Instance, **attrs: Any) -> None:
    """INSTANCE_NEW of ``inst`` as the state file has it: GPUs, memory limits, weight,
    share, capability set, and its nodes' uid, gid and mode (`instance restore` and the daemon's re-create
    after a reboot or a module reload make them as they were made); the nodes of an
    instance a Kubernetes plugin owns get S.OWNED_NODE_MODE unless it or ``attrs`` names a
    mode. ``attrs`` adds to or overrides the attributes (None: left out)."""
    from gpuslice.netlink import gpu_mem_limits, mask_of

    attrs = {"weight": inst.weight, "share": units.share_to_ppt(inst.share) if inst.share else None,
             **attrs}
    for k in ("uid", "gid", "mode"):
        if attrs.get(k) is None and getattr(inst, k) is not None:
            attrs[k] = getattr(inst, k)
    if inst.owner is not None and attrs.get("mode") is None:
        attrs["mode"] = S.OWNED_NODE_MODE
    if attrs.get("caps") is None and inst.caps is not None:
        attrs["caps"] = inst.caps  # else left out: the module gives all
    nl.instance_new(inst.name, mask_of(inst.gpus), inst.memory, gpu_mem_limit=gpu_mem_limits(inst.gpu_memory),
                    **attrs)


def remove(st: S.State, name: str, nl: Any) -> None:
    """Delete instance ``name`` from the module (when ``nl`` is given; one it does not
    know is fine) and from ``st``. The module refuses while the instance's nodes are
    open: InstanceError, ``st`` unchanged."""
    if name not in st.instances:
        raise InstanceError(f"no instance {name!r}")
    if nl is not None:
        try:
            nl.instance_del(name)
        except OSError as e:
            if e.errno != errno.ENOENT:  # the module does not know it (e.g. after a reload)
                raise InstanceError(f"cannot delete {name} in the kernel: {e}") from None
    del st.instances[name]


DEV = "/dev"  # where the NVIDIA driver's nodes are (tests point it elsewhere)
_GPU_NODE_RE = re.compile(r"nvidia(\d+)")


def host_gpus(dev: str | None = None) -> list[int] | None:
    """The GPUs of this host as the module sees them: the minors of the NVIDIA driver's
    ``/dev/nvidia<N>`` nodes (the module opens them, kmod/driver.c). None when there is
    no GPU node at all (no driver loaded, or a container without them): then nothing is
    known, and nothing can be checked."""
    d = DEV if dev is None else dev
    try:
        names = os.listdir(d)
    except OSError:
        return None
    gpus = sorted(int(m.group(1)) for n in names if (m := _GPU_NODE_RE.fullmatch(n)))
    return gpus or None


def missing_gpus(gpus: list[int], dev: str | None = None) -> list[int] | None:
    """Those of ``gpus`` this host does not have (:func:`host_gpus`); None when the host's
    GPUs cannot be read."""
    have = host_gpus(dev)
    return None if have is None else [g for g in gpus if g not in have]


def gpu_words(gpus: list[int]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


def refusal(e: OSError, inst: S.Instance, dev: str | None = None) -> str:
    """The module's refusal of INSTANCE_NEW for ``inst``, in words (not the errno)."""
    d = DEV if dev is None else dev
    if e.errno == errno.ENODEV:
        gone = missing_gpus(inst.gpus, d) or []
        return (f"this host has no {gpu_words(gone)} (no {', '.join(f'{d}/nvidia{g}' for g in gone)})" if gone
                else f"the module has no {gpu_words(inst.gpus)} (is the NVIDIA driver loaded?)")
    if e.errno == errno.EEXIST:
        return f"the module already has an instance {inst.name!r} or its nodes exist"
    if e.errno == errno.EINVAL:
        return "the module refused its settings as invalid (a gpuctl and a module of different checkouts?)"
    if e.errno == errno.ENOMEM:
        return "the kernel is out of memory"
    if e.errno in (errno.EPERM, errno.EACCES):
        return "not permitted (needs CAP_NET_ADMIN: run as root)"
    return f"the module refused it: {os.strerror(e.errno) if e.errno else e}"

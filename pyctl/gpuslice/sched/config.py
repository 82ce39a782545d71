"""Configuration: the state file as the scheduler follows it, and who is told of it.

This module owns reading the state file (again only when it changed: a live policy or
weight change takes effect at the next period start), keeping the module in step with
it (each instance's weight, share and timeslice; an instance configured but unknown to
the module is created there), and telling a channel source what the configuration asks
of it (sources.KnowsInstances, SamplesFast, SetsTimeslices).
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

from gpuslice import instances
from gpuslice import state as st
from gpuslice.sched.planner import fast_instances, timeslices
from gpuslice.sched.sources import KnowsInstances, ReportsGap, SamplesFast, SetsTimeslices, Source
from gpuslice.units import share_to_ppt

log = logging.getLogger("gpuslice.sched.scheduler")

# How often the user-space build's library looks at an online instance's channels on a
# GPU with offline ones (its own default is 5 ms): each busy period of the online work
# runs beside the offline work until its first submission is seen and the disable lands
# (docs/h100-priority.md, run 6)
ONLINE_SAMPLE_US = 200


def report_repeat_us(hold_ns: int) -> int:
    """How often the library should report an online channel that keeps submitting:
    within half the online hold, so that busy online work never looks quiet between two
    reports (the library's own default, 10 ms, is longer than the 5 ms hold: under a
    backlog the offline work came back for 5 ms in every 10; docs/h100-priority.md, run 9)."""
    return max(500, min(10_000, hold_ns // 2000))


def gap_source(source: Source) -> ReportsGap | None:
    """``source`` as one that says its gap between reports, or None. Asked once per
    source: a source's report_gap_ns may read a file (NetlinkSource)."""
    return source if isinstance(source, ReportsGap) else None


def hold_ns(online_hold_ns: int, gap: ReportsGap | None) -> int:
    """The online hold in effect: --online-hold, but never shorter than the longest gap
    the source leaves between two reports of work that goes on (``gap``: the source, if
    it says, gap_source; the module reports an instance at most every 50 ms,
    kmod/activity.c: a shorter hold would let busy online work look quiet and the
    offline work back beside it)."""
    return max(online_hold_ns, gap.report_gap_ns if gap is not None else 0)


class Config:
    """The configuration in force. ``state_obj`` given: that one, fixed (tests,
    benchmarks); else the state file at ``state_path``, re-read when it changes.
    ``netlink``: the module to keep in step (None: the user-space build)."""

    def __init__(self, state_path: str | None, netlink: Any = None, state_obj: st.State | None = None) -> None:
        self.state_path = state_path
        self.netlink = netlink
        self.state = state_obj or st.State()
        self.fixed = state_obj is not None
        self._stamp: tuple[int, int, int] | None = None
        self._told: st.State | None = None  # the configuration the source was told of

    def reload(self, force: bool = False) -> bool:
        """Read the state file if it changed (``force``: in any case); True if a new
        configuration is in force. One that does not load keeps the previous."""
        if self.fixed:
            return False
        stamp = st.file_stamp(self.state_path)
        if not force and stamp == self._stamp:
            return False
        try:
            new = st.load(self.state_path)
        except st.StateError as e:
            if self._stamp != stamp:
                log.error("%s; keeping the previous configuration", e)
            self._stamp = stamp
            return False
        self._stamp = stamp
        self.state = new
        self.sync_kernel()
        return True

    def set_state(self, new: st.State) -> None:
        """Replace the configuration directly (tests, benchmarks)."""
        self.state = new
        self.fixed = True

    def changed_on_disk(self) -> bool:
        """Whether the state file changed since it was last read (never, when fixed)."""
        return not self.fixed and st.file_stamp(self.state_path) != self._stamp

    def sync_kernel(self) -> None:
        """Tell the module each instance's weight, share and timeslice."""
        if self.netlink is None:
            return
        slices = timeslices(self.state)
        for inst in sorted(self.state.instances.values(), key=lambda i: i.name):
            attrs = {"weight": inst.weight, "share": share_to_ppt(inst.share) if inst.share else None,
                     "timeslice_us": slices.get(inst.name, 0)}
            try:
                try:
                    self.netlink.instance_set(inst.name, **attrs)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise
                    # configured but unknown to the module (reloaded?): create it, unless
                    # it was deleted since this configuration was read (a `gpuctl instance
                    # delete` or a Kubernetes plugin deletes in the module, then saves the
                    # state file, under the exclusive lock: the shared lock waits for both)
                    if self._create_if_configured(inst, attrs):
                        log.info("created instance %s in the kernel", inst.name)
            except OSError as e:
                log.warning("netlink INSTANCE_SET %s: %s", inst.name, e)

    def _create_if_configured(self, inst: st.Instance, attrs: dict[str, Any]) -> bool:
        """Create ``inst`` in the module if the state file still has it, under the shared
        state lock (no delete runs meanwhile). Without a state file: create it."""
        assert self.netlink is not None

        def create() -> None:
            instances.create_in_module(self.netlink, inst, **attrs)

        if self.fixed or not os.path.exists(st.state_path(self.state_path)):
            create()
            return True
        with st.shared_lock(self.state_path):
            try:
                if inst.name not in st.load(self.state_path).instances:
                    return False
            except st.StateError:
                pass
            create()
        return True

    def tell_source(self, source: Source, online_sample_us: int, online_hold_ns: int) -> None:
        """When the configuration changed, tell a source that listens per instance
        (the user-space build's, PreloadSource.set_instances) which instances there are,
        and one that can ask its processes to sample faster (PreloadSource.set_fast)
        which to ask, and each instance's hardware timeslice (set_timeslices)."""
        if self._told is self.state:
            return
        self._told = self.state
        if isinstance(source, KnowsInstances):  # a socket per instance (PreloadSource)
            source.set_instances(self.state.instances)
        if isinstance(source, SamplesFast):
            source.set_fast(fast_instances(self.state), online_sample_us, report_repeat_us(online_hold_ns))
        if isinstance(source, SetsTimeslices):  # the user-space build: the library sets them, as the module does
            source.set_timeslices(timeslices(self.state))

"""Guest benchmark (figures, no asserts on speed), run by name inside the guest:

    scripts/vm.sh -- env GUEST_FILES=tests/guest/bench_activity.py bash scripts/guest-tests.sh -s

Not collected by the guest suite (not test_*.py). The rates the functional tests used to
assert as floors, which depend on the guest's speed (TCG) more than on the code:

- CHANNEL_WORK per second of a channel whose entries wait, at the module's default period
  and with INSTANCE_SET sample_us=1000 repeat_us=10000 (test_activity.py asserts the
  default's ceiling and that asking gives more than it);
- the share of the wall time a lone TSG executes on the stand-in's engine after every CPU
  stalled for 0.3 s (test_standin.py asserts it never stops).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvstub  # noqa: E402
from test_activity import SAMPLE, collect, fetch, nl, work_of  # noqa: E402,F401 (nl: the fixture)
from test_standin import busy_workers, executed, stall_every_cpu  # noqa: E402

pytestmark = pytest.mark.guest


@pytest.mark.skipif(not (nvstub.present() and Path(SAMPLE).exists()),
                    reason="needs nvstub.ko and gpuslice.ko (with its USERD sampler) loaded")
def test_bench_waiting_channel_report_rate(nl):  # noqa: F811
    from gpuslice.netlink import GpusliceNetlink
    from gsinst import Instance, session

    with Instance(nl, 64 << 20) as inst:
        s = session(inst)
        try:
            _tsg, ch, u = s.userd_channel()
            key = (s.client, ch)
            time.sleep(0.3)
            u.put()  # not fetched: it waits

            def rate(seconds: float = 2.0) -> float:
                with GpusliceNetlink() as sock:
                    sock.subscribe()
                    return len(work_of(collect(sock, seconds), inst.name, key)) / seconds

            slow = rate()
            nl.instance_set(inst.name, sample_us=1000, repeat_us=10000)
            fast = rate()
            nl.instance_set(inst.name, sample_us=0, repeat_us=0)
            again = rate()
            print(f"\nCHANNEL_WORK of a waiting channel per second: default {slow:.1f}, "
                  f"asked sample 1000 us repeat 10000 us {fast:.1f}, default again {again:.1f}")
            fetch(u)
            u.close()
        finally:
            s.close()


@pytest.mark.skipif(not nvstub.present(), reason="nvstub.ko is not loaded")
def test_bench_lone_tsg_after_a_stall() -> None:
    with busy_workers([250]) as workers:
        chans = [(c, ch) for _, c, ch in workers]
        time.sleep(0.3)
        stall_every_cpu(0.3)
        time.sleep(0.1)
        before = executed(chans)
        t0 = time.monotonic()
        time.sleep(1.5)
        after = executed(chans)
        wall = time.monotonic() - t0
    got = (after[0] - before[0]) / 1e9
    print(f"\nlone TSG after a 0.3 s stall of every CPU: executed {got:.3f} s of {wall:.3f} s "
          f"({got / wall:.0%})")

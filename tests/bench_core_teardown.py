"""Benchmark: the time a file's release takes in the core, per client, as the clients grow.

Run: .venv/bin/python tests/bench_core_teardown.py. A release walks the file's clients and
frees each client's tree once (registry.c gs_obj_free_file()): the time per client stays
about flat from 2,000 to 60,000 clients on one file.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "core"))
import coreshim as cs  # noqa: E402
from coreshim import GiB, abi  # noqa: E402


def teardown(so: Path, n: int) -> float:
    core = cs.Core(so, 1 * GiB)
    rm = cs.MockRM()
    for _ in range(n):
        arg = cs.alloc_arg(0, 0, 0, abi.NV01_ROOT_CLIENT)
        assert core.call(abi.IOCTL_RM_ALLOC, arg, rm.alloc, file_id=9, pid=100).verdict == cs.GS_PASS
    t = time.perf_counter()
    core.file_closed(9)
    dt = time.perf_counter() - t
    assert core.stats()["objects"] == 0
    core.close()
    return dt


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        so = cs.build(Path(d))
        for n in (2000, 20000, 60000):
            dt = teardown(so, n)
            print(f"clients {n:6d}: release {dt * 1e3:8.2f} ms, {dt / n * 1e6:6.2f} us per client")


if __name__ == "__main__":
    main()

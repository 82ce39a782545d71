"""`gpuctl exporter` against the loaded module (issue 13): scraped over loopback while an
instance holds memory and a process has its nodes open, the figures are the module's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gsinst import Instance, needs_modules, session
from test_quota_hostile import MIB

pytestmark = needs_modules
REPO = Path(__file__).resolve().parents[2]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exporter_reports_a_busy_instance(nl, tmp_path):
    log_file = tmp_path / "log"
    with Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        ex = None
        try:
            st, h, size = s.alloc_vidmem(8 * MIB)
            assert st == 0
            ex = subprocess.Popen(
                [sys.executable, "-c", "from gpuslice.cli import main; main()", "exporter",
                 "--listen", "127.0.0.1:19400", "--no-nvml", "--status-file", str(tmp_path / "none.json")],
                env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")}, stderr=open(log_file, "w"))
            deadline = time.monotonic() + 60
            while True:
                try:
                    m = _scrape(19400)
                    break
                except OSError:
                    assert ex.poll() is None and time.monotonic() < deadline, log_file.read_text()
                    time.sleep(0.2)
            lab = (("gpuslice_instance", inst.name),)
            assert m[("gpuslice_module_up", ())] == 1
            assert m[("gpuslice_instance_memory_limit_bytes", lab)] == 64 * MIB
            assert m[("gpuslice_instance_memory_used_bytes", lab)] == size
            assert m[("gpuslice_instance_ioctls_total", lab)] > 0
            assert m[("gpuslice_instance_processes", lab)] == 1
            s.free(h)
            m = _scrape(19400)
            assert m[("gpuslice_instance_memory_used_bytes", lab)] == 0
            assert m[("gpuslice_instance_memory_peak_bytes", lab)] == size
        finally:
            if ex is not None:
                ex.terminate()
                ex.wait(10)
            s.close()

"""Does the library give a live process's TSGs the timeslice the daemon asks for?

  PYTHONPATH=pyctl python3 tests/gpu/probe_timeslice.py

A PyTorch process under libgpuslice.so (GPUSLICE_DEBUG=1) reports to a PreloadSource of
this script, which asks {"timeslice_us":8000} once the process's channels are known
(sources.PreloadSource.set_timeslices, as the daemon does); printed: the library's debug
lines about it ("timeslice N us asked for M TSG(s)", and any control RM refused).
"""

import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pyctl"))
from gpuslice.sched.sources import PreloadSource  # noqa: E402

d = tempfile.mkdtemp()
sock = os.path.join(d, "s.sock")
src = PreloadSource(sock)
env = dict(os.environ, LD_PRELOAD=os.path.abspath("preload/libgpuslice.so"), GPUSLICE_INSTANCE="x",
           GPUSLICE_SOCKET=sock, GPUSLICE_DEBUG="1")
p = subprocess.Popen([sys.executable, "-c", "import torch, time; a = torch.ones(256, device='cuda'); "
                      "torch.cuda.synchronize(); time.sleep(30)"], env=env, stderr=subprocess.PIPE, text=True)
t0 = time.time()
asked = None
while time.time() - t0 < 40 and (asked is None or time.time() - asked < 2):
    src.refresh()
    if asked is None and src.channels().get("x"):
        src.set_timeslices({"x": 8000})
        asked = time.time()
    time.sleep(0.02)
print("channels", len(src.channels().get("x", ())))
p.kill()
err = p.communicate()[1]
print("\n".join(ln for ln in err.splitlines() if "timeslice" in ln or "control 0x" in ln))
src.close()

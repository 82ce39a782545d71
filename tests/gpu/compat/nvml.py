"""Compatibility workload: NVML (nvidia-ml-py's pynvml) and nvidia-smi. The memory total is
expected to differ under a limit (it is the limit), so it is reported beside the result.

  nvml.py                   result: [device count]; mem_total, mem_used, smi: extra fields
"""

from __future__ import annotations

import subprocess
import sys

import compat_common as C


def as_str(s: bytes | str) -> str:
    return s.decode() if isinstance(s, bytes) else s


def smi() -> tuple[int, list[str]]:
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60)
    sys.stderr.write(p.stderr)  # the library's refusal lines, if any, reach the runner
    return p.returncode, p.stdout.strip().splitlines()


def work(argv: list[str]) -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        names, total, used = [], [], []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            names.append(as_str(pynvml.nvmlDeviceGetName(h)))
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            total.append(int(mem.total))
            used.append(int(mem.used))
        driver = as_str(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    rc, lines = smi()
    return {"ok": count >= 1 and rc == 0 and len(lines) == count, "result": [count], "tol": 0,
            "names": names, "mem_total": total, "mem_used": used, "driver": driver, "smi": lines, "smi_rc": rc}


if __name__ == "__main__":
    C.main(work)

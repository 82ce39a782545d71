"""The user-space daemon's proof of channel ownership, against the real driver.

A CUDA process under libgpuslice.so connects to its instance's socket of a
PreloadSource (pyctl/gpuslice/sched/sources.py) that asks RM through the file the process
passes (rm.owns_channel). Checked here, on the H100:
- the process's channels are registered, each proven (none refused);
- another process, with an RM client of its own, cannot prove the CUDA process's
  channel: RM answers NV_ERR_INVALID_CLIENT through its file; on another instance's
  socket, after passing its own file, its CHANNEL_NEW for that channel is refused, and
  one for its own client's handle (not a channel) is unproven;
- a line naming another instance than the socket's is a bad line.
Also printed: what one proof costs (a figure, not asserted).

Run: python3 -m pytest tests/gpu/test_proof.py, or python3 tests/gpu/test_proof.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "pyctl"))
from gpu_common import SO, build, have_gpu, raw  # noqa: E402

import pytest  # noqa: E402

pytestmark = pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU")

WL = """
import sys, time, torch
x = torch.randn(2048, 2048, device="cuda")
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.01)
"""


def _pump(src, until, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        src.refresh()
        if until():
            return True
        time.sleep(0.01)
    return False


def run_proof() -> dict:
    from gpuslice import abi
    from gpuslice.sched.rm import RmClient, RmError, owns_channel
    from gpuslice.sched.sources import PreloadSource

    build()
    d = Path(tempfile.mkdtemp(prefix="gs-proof-"))
    src = PreloadSource(str(d / "host.sock"), instance_dir=str(d / "instances"))
    src.set_instances({"a", "b"})
    env = {**os.environ, "LD_PRELOAD": str(SO), "GPUSLICE_INSTANCE": "a",
           "GPUSLICE_SOCKET": src.instance_socket("a") or ""}
    p = subprocess.Popen([sys.executable, "-c", WL, "60"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out: dict = {}
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert _pump(src, lambda: bool(src.channels().get("a"))), f"no channel registered, unproven {src.unproven}"
        _pump(src, lambda: False, 1.0)  # the rest of its channels
        chans = src.channels()["a"]
        out["channels"] = len(chans)
        out["unproven_own"] = src.unproven
        victim = sorted(chans)[0]
        with RmClient() as att:  # another process's RM client, on a file of its own
            out["attacker_proves"] = owns_channel(att.fd, victim.client, victim.handle)
            try:
                att.control(victim.handle, abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, b"\0" * 4,
                            h_client=victim.client)
                out["attacker_status"] = 0
            except RmError as e:
                out["attacker_status"] = e.status
            before, bad = src.unproven, src.bad_lines
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(src.instance_socket("b") or "")
            line = {"event": 3, "pid": 1, "client": victim.client, "handle": victim.handle, "gpu": victim.gpu,
                    "obj_kind": 2, "proof": 1}
            socket.send_fds(c, [b'{"proof_file":1}\n'], [att.fd])  # its own RM file, as the library does
            c.sendall((json.dumps(line) + "\n").encode())  # the victim's channel: already the victim's
            c.sendall((json.dumps({**line, "client": att.client, "handle": att.client}) + "\n").encode())
            c.sendall((json.dumps({**line, "name": "a", "proof": 0}) + "\n").encode())  # another instance
            _pump(src, lambda: src.unproven > before and src.bad_lines >= bad + 2, 10)
            out["attacker_refused"] = src.unproven - before  # its own client, not a channel: RM says so
            out["attacker_bad_lines"] = src.bad_lines - bad
            c.close()
        # what a proof costs: the owner's file is the process's; a dup of our own client's file
        with RmClient() as own:
            t0 = time.perf_counter_ns()
            n = 2000
            for _ in range(n):
                owns_channel(own.fd, own.client, own.client)  # refused by RM (not a channel): same path
            out["proof_us"] = (time.perf_counter_ns() - t0) / n / 1000
        out["channels_after"] = {k: len(v) for k, v in src.channels().items()}
    finally:
        p.kill()
        _, err = p.communicate(timeout=60)
        src.close()
        raw("proof", json.dumps(out) + "\n--- workload stderr\n" + err[-3000:])
    return out


def test_channels_are_proven_and_anothers_cannot_be() -> None:
    out = run_proof()
    print(json.dumps(out))
    assert out["channels"] >= 1 and out["unproven_own"] == 0
    assert out["attacker_proves"] is False
    assert out["attacker_status"] == 0x23  # NV_ERR_INVALID_CLIENT
    assert out["attacker_refused"] == 1 and out["attacker_bad_lines"] == 2
    assert out["channels_after"] == {"a": out["channels"]}


if __name__ == "__main__":
    print(json.dumps(run_proof(), indent=1))

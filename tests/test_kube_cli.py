"""`gpuctl kubelet-plugin` as a process: the real command, the real Kubernetes Python
client against the API server stand-in (tests/kube/apiserver.py), the test kubelet
(tests/kube/drakubelet.py) over unix sockets, `--kernel no` (the state file only; the
guest test makes instances in the module).

The host has no GPU: the process runs gpuctl with ``inventory.discover`` replaced by
two fake H100s (RUNNER below, test code only). Covered: start-up publishing (shared
GPUs, and whole GPUs when the API server drops the consumable-capacity fields), prepare
through the API server, `kill -9` between prepare and unprepare, SIGTERM, bad options
and an unreachable API server as one-line errors. Not covered: a real kubelet or API
server (authentication, admission, watches), a real scheduler.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from kube.apiserver import FakeApiServer
from kube.drakubelet import DraKubelet
from test_kube_dra import claim, result

REPO = Path(__file__).resolve().parents[1]
GI = 1 << 30
RUNNER = """
import sys
from gpuslice.kube import inventory
fake = [inventory.GpuInfo(minor=m, uuid=f"GPU-0000000{m}-0000-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3",
        compute_capability="9.0", driver_version="580.159.04", pci_bus_id=f"0000:1{m}:00.0",
        memory=81559 * (1 << 20)) for m in (0, 1)]
inventory.discover = lambda *a, **k: fake
from gpuslice.cli import main
sys.argv[0] = "gpuctl"
main()
"""


class Proc:
    def __init__(self, tmp: Path, api: FakeApiServer, *extra: str) -> None:
        self.tmp = tmp
        self.registry = tmp / "registry"
        self.cdi = tmp / "cdi"
        self.state = tmp / "state.json"
        self.args = [sys.executable, "-c", RUNNER, "--state", str(self.state), "--kernel", "no", "kubelet-plugin",
                     "--node-name", "node-a", "--plugin-dir", str(tmp / "plugin"), "--registry-dir",
                     str(self.registry), "--cdi-dir", str(self.cdi), "--kubeconfig",
                     api.kubeconfig(tmp / "kubeconfig"), *extra]
        self.p: subprocess.Popen[str] | None = None

    def start(self) -> DraKubelet:
        self.p = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
        assert self.p.stderr is not None
        self.log: list[str] = []
        for line in self.p.stderr:  # until it serves (the socket of a killed one may still be there)
            self.log.append(line)
            if " serving gpuslice.dev on " in line:
                break
        else:
            raise AssertionError(f"exited {self.p.wait()}: {''.join(self.log)}")
        k = DraKubelet(str(self.registry))
        k.register()
        return k

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        assert self.p is not None
        self.p.send_signal(sig)
        _out, err = self.p.communicate(timeout=60)
        return self.p.returncode, "".join(self.log) + err


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as a:
        a.add_node("node-a")
        yield a


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    ps: list[Proc] = []
    yield ps
    for p in ps:
        if p.p is not None and p.p.poll() is None:
            p.p.kill()
            p.p.wait()


def state(p: Proc) -> dict[str, Any]:
    return json.loads(p.state.read_text())["instances"] if p.state.exists() else {}


def test_publish_prepare_kill9_restart_unprepare(tmp_path: Path, api: FakeApiServer, procs: list[Proc]) -> None:
    p = Proc(tmp_path, api)
    procs.append(p)
    k = p.start()
    (sl,) = api.slices()
    devs = {d["name"]: d for d in sl["spec"]["devices"]}
    assert sorted(devs) == ["gpu-0", "gpu-1"] and devs["gpu-0"]["allowMultipleAllocations"] is True
    assert devs["gpu-0"]["attributes"]["uuid"] == {"string": "GPU-00000000-0000-0000-0000-000000000000"}
    c = api.add_claim(claim(memory="4Gi", compute="30"))
    ref = (c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"])
    r = k.prepare([ref])[ref[1]]
    assert r.error == "", r.error
    cdi_ids = list(r.devices[0].cdi_device_ids)
    (inst,) = state(p).values()
    assert (inst["memory"], inst["share"], inst["owner"]) == (4 * GI, 0.3, "kubelet-plugin")
    assert len(list(p.cdi.iterdir())) == 1

    rc, _err = p.stop(signal.SIGKILL)
    assert rc == -signal.SIGKILL
    k = p.start()  # a stale socket left by the killed process is replaced
    again = k.prepare([ref], "v1beta1")[ref[1]]
    assert again.error == "" and list(again.devices[0].cdi_device_ids) == cdi_ids
    assert len(state(p)) == 1
    assert k.unprepare([ref]) == {ref[1]: ""}
    assert state(p) == {} and list(p.cdi.iterdir()) == []
    rc, err = p.stop()
    assert rc == 0, err
    assert not (p.registry / "gpuslice.dev-reg.sock").exists()


def test_gate_off_publishes_whole_gpus_and_says_so(tmp_path: Path, procs: list[Proc]) -> None:
    with FakeApiServer(gate_consumable_capacity=False) as api:
        api.add_node("node-a")
        p = Proc(tmp_path, api)
        procs.append(p)
        k = p.start()
        (sl,) = api.slices()
        assert all("allowMultipleAllocations" not in d for d in sl["spec"]["devices"])
        # a whole-GPU allocation works; a share is refused: the node does not advertise it
        whole = api.add_claim(claim(name="w", results=[result("gpu", "gpu-1", memory=None, compute=None)]))
        share = api.add_claim(claim(name="s"))
        out = k.prepare([(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"])
                         for c in (whole, share)])
        assert out[whole["metadata"]["uid"]].error == ""
        assert "not shared" in out[share["metadata"]["uid"]].error
        rc, err = p.stop()
        assert rc == 0 and "publishing whole GPUs" in err, err


@pytest.mark.parametrize("args,msg", [
    (["--memory-step", "banana"], "Invalid value for '--memory-step'"),
    (["--memory-min", "0"], "at least 1 byte"),
    (["--policy", "fastest"], "Invalid value for '--policy'"),
])
def test_bad_options_are_one_line(tmp_path: Path, api: FakeApiServer, args: list[str], msg: str) -> None:
    p = Proc(tmp_path, api, *args)
    r = subprocess.run(p.args, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
    assert r.returncode == 2 or r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctl: ") and msg in lines[0], r.stderr
    assert not (tmp_path / "registry").exists()


def test_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        p = Proc(tmp_path, api)
    r = subprocess.run(p.args, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO / "pyctl")})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "cannot publish the ResourceSlices" in lines[0], r.stderr


def tgkill(pid: int, tid: int, sig: int) -> None:
    """``sig`` to thread ``tid`` of process ``pid`` alone (tgkill(2)): the kernel may
    hand a process's signal to any thread that does not block it, a gRPC thread too."""
    import ctypes
    import platform

    nr = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if nr is None:
        pytest.skip(f"no tgkill number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_taken_by_a_grpc_thread_stops_the_plugin(tmp_path: Path, api: FakeApiServer, procs: list[Proc],
                                                          sig: int) -> None:
    """SIGTERM or SIGINT delivered to one of gRPC's threads (not the main one, where Python
    runs handlers) stops the plugin as one delivered to the main thread does: it exits 0
    within a generous deadline (a liveness bound, not a speed one; the republish period
    is 10 minutes) and removes both sockets."""
    p = Proc(tmp_path, api)
    procs.append(p)
    p.start()
    assert p.p is not None
    dra_sock, reg_sock = tmp_path / "plugin" / "dra.sock", p.registry / "gpuslice.dev-reg.sock"
    assert dra_sock.exists() and reg_sock.exists()
    task = Path(f"/proc/{p.p.pid}/task")
    names = {int(t.name): (t / "comm").read_text().strip() for t in task.iterdir()}
    grpc_threads = sorted(t for t, n in names.items() if t != p.p.pid and n.startswith(("grpc", "event_engine")))
    assert grpc_threads, names
    tgkill(p.p.pid, grpc_threads[0], sig)
    try:
        p.p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 20 s after signal {sig} to thread {names[grpc_threads[0]]}") from None
    rc, err = p.stop()
    assert rc == 0, err
    assert f"signal {int(sig)}: stopping" in err
    assert not dra_sock.exists() and not reg_sock.exists()

"""The Kubernetes DRA plugin on a real GPU machine (scripts/gpu-run.sh kube).

What a node with the real driver gives the plugin, where no kubelet or API server runs:

1. the GPU inventory from NVML and from the controller's own RM client (the plugin's
   image has no NVML: `--gpu-source auto` falls back to RM), field by field;
2. the ResourceSlice built from it, published through the real Kubernetes client to the
   API server stand-in (tests/kube/apiserver.py: the upstream validation rules it has),
   with consumable capacity and with the gate off;
3. `gpuctl kubelet-plugin` itself (`--kernel no`: the module cannot load beside the
   real driver here), prepared a claim of 4 GiB and 30% through the test kubelet: the
   instance, and the CDI spec with the host's real driver files;
4. the granted amount enforced by the same decision core against the real driver:
   PyTorch under the user-space library with the instance's limit
   (GPUSLICE_MEM_LIMIT = the instance's memory), allocating until OutOfMemoryError.

Prints JSON lines; raw output in $GPUSLICE_RAW.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "pyctl"), str(REPO / "tests"), str(HERE)]

import gpu_common as g  # noqa: E402
from gpuslice.kube import inventory, slices  # noqa: E402
from gpuslice.kube.apiclient import ApiClient  # noqa: E402
from kube.apiserver import FakeApiServer  # noqa: E402
from kube.drakubelet import DraKubelet  # noqa: E402

NODE = "h100-node"


def emit(what: str, **kw: object) -> None:
    print(json.dumps({"what": what, **kw}, default=str), flush=True)


def main() -> int:
    rc = 0
    # 1. inventory
    nv = [dataclasses.asdict(x) for x in inventory.from_nvml()]
    rm = [dataclasses.asdict(x) for x in inventory.from_rm()]
    emit("inventory", nvml=nv, rm=rm)
    diff = [(i, k, a.get(k), b.get(k)) for i, (a, b) in enumerate(zip(nv, rm)) for k in a if a.get(k) != b.get(k)]
    emit("inventory-diff", same_count=len(nv) == len(rm), fields=diff)
    if diff or len(nv) != len(rm):
        rc = 1
    gpus = inventory.from_rm()
    # 2. slices through the real client
    for gate in (True, False):
        with FakeApiServer(gate_consumable_capacity=gate) as api:
            api.add_node(NODE)
            pub = slices.SlicePublisher(ApiClient(api.configuration()), NODE)
            res = pub.publish(gpus, shared_wanted=True)
            emit("publish", gate=gate, shared=res.shared, fallback=res.fallback_reason, slices=api.slices())
    # 3. the plugin, a claim of 4 GiB and 30%
    tmp = Path(tempfile.mkdtemp(prefix="gs-kube-"))
    with FakeApiServer() as api:
        api.add_node(NODE)
        args = [sys.executable, "-c", "from gpuslice.cli import main; main()", "--state", str(tmp / "state.json"),
                "--kernel", "no", "kubelet-plugin", "--node-name", NODE, "--plugin-dir", str(tmp / "plugin"),
                "--registry-dir", str(tmp / "registry"), "--cdi-dir", str(tmp / "cdi"), "--kubeconfig",
                api.kubeconfig(tmp / "kubeconfig")]
        p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert p.stderr is not None
        log = []
        for line in p.stderr:
            log.append(line)
            if " serving gpuslice.dev on " in line:
                break
        else:
            emit("plugin-failed", rc=p.wait(), log="".join(log))
            return 1
        k = DraKubelet(str(tmp / "registry"))
        emit("registered", info=dataclasses.asdict(k.register()))
        uid = str(uuid.uuid4())
        api.add_claim({"metadata": {"name": "share", "namespace": "default", "uid": uid},
                       "status": {"allocation": {"devices": {"results": [{
                           "request": "gpu", "driver": "gpuslice.dev", "pool": NODE, "device": "gpu-0",
                           "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "4Gi", "compute": "30"}}],
                           "config": []}}}})
        r = k.prepare([("default", uid, "share")])[uid]
        state = json.loads((tmp / "state.json").read_text())
        spec_files = sorted((tmp / "cdi").iterdir())
        emit("prepared", error=r.error, cdi=[list(d.cdi_device_ids) for d in r.devices], state=state,
             spec=[f.read_text() for f in spec_files])
        if r.error:
            rc = 1
        (inst,) = state["instances"].values()
        # 4. the granted amount, enforced against the real driver by the same core
        g.build()
        out, err, st = g.run([str(HERE / "wl_torch.py"), "limit", "256"], str(inst["memory"]),
                             "kube: torch under the claim's limit",
                             extra={"GPUSLICE_INSTANCE": next(iter(state["instances"]))})
        emit("torch-under-claim", limit=inst["memory"], total_seen=out.get("total0"), allocated=out.get("allocated"),
             oom=out.get("oom"), second=out.get("second"), stats=st, rc=out.get("_rc"), err=err[-2000:])
        if out.get("total0") != inst["memory"] or out.get("oom") is None:
            rc = 1
        emit("unprepared", errors=k.unprepare([("default", uid, "share")]),
             left=json.loads((tmp / "state.json").read_text())["instances"])
        p.send_signal(signal.SIGTERM)
        _o, e = p.communicate(timeout=60)
        emit("plugin-exit", rc=p.returncode, log="".join(log) + e)
    return rc


if __name__ == "__main__":
    sys.exit(main())

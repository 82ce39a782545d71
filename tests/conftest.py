"""Host tests: gpuctl run in-process sees a host of its own, not this machine's.

- ``gpuslice.instances.DEV``: a directory with the nodes of GPUs 0-3 (where `instance
  create --kernel no` checks the GPUs it is given, and `policy set --all` finds them);
- ``gpuslice.ops.cdi.DEFAULT_OUTPUT``: a path whose directory does not exist, so that the
  instance commands do not keep this machine's /etc/cdi/gpuslice.yaml current.

A test that wants other values sets its own (monkeypatch). In the QEMU guest
(tests/guest, GPUSLICE_GUEST=1) nothing is changed: the guest's tests run the real host's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

HOST_GPUS = (0, 1, 2, 3)


@pytest.fixture(scope="session")
def fake_dev(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dev = tmp_path_factory.mktemp("dev")
    for n in ("nvidiactl", "nvidia-uvm", *(f"nvidia{g}" for g in HOST_GPUS)):
        (dev / n).touch()
    return dev


@pytest.fixture(autouse=True)
def _a_host_of_its_own(fake_dev: Path, tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if os.environ.get("GPUSLICE_GUEST") == "1":
        yield
        return
    from gpuslice import instances
    from gpuslice.ops import cdi

    monkeypatch.setattr(instances, "DEV", str(fake_dev), raising=False)
    monkeypatch.setattr(cdi, "DEFAULT_OUTPUT", str(fake_dev / "no-etc-cdi" / "gpuslice.yaml"))
    yield

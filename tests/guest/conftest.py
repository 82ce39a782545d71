"""Guest-only tests: they run inside the QEMU guest (scripts/vm.sh), where
scripts/guest-tests.sh sets GPUSLICE_GUEST=1 and has loaded the stand-in driver.

On the host the whole directory is left out of collection, so `pytest tests` stays
clean there even when a guest test imports something that only exists in the guest.
"""

from __future__ import annotations

import os

IN_GUEST = os.environ.get("GPUSLICE_GUEST") == "1"

# Relative to this directory: ignore every test module (and helper) on the host.
collect_ignore_glob: list[str] = [] if IN_GUEST else ["*.py", "*/"]


if IN_GUEST:
    import pytest

    from hangwatch import pytest_configure, pytest_runtest_protocol, pytest_sessionfinish  # noqa: F401  (a hung test is reported, not waited for)

    @pytest.fixture
    def nl():
        """A netlink connection to gpuslice.ko (tests that use it also mark
        themselves with gsinst.needs_modules)."""
        from gpuslice.netlink import GpusliceNetlink

        with GpusliceNetlink() as s:
            yield s

    @pytest.fixture(scope="session")
    def podman(tmp_path_factory):
        """Rootful podman with the rmclient image, all under a directory in /tmp
        (tests/guest/podmanlib.py); one image for the whole session."""
        from podmanlib import build_image

        return build_image(tmp_path_factory.mktemp("podman"))

    @pytest.fixture
    def devcg_required():
        """The module's production setting while the containers run: a process whose device
        cgroup lets it open the real node gets no instance node."""
        from podmanlib import DEVCG_PARAM

        old = DEVCG_PARAM.read_text().strip()
        DEVCG_PARAM.write_text("Y")
        try:
            yield
        finally:
            DEVCG_PARAM.write_text(old)

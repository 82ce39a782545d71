"""Loading gpuslice.ko: only next to a present NVIDIA driver of a release it has an ABI
table for (kmod/core/nvrm_tables.c), unless passthrough_only=1; the suite's module is the test build, the
shipped one has none of its test hooks. These tests reload both modules and leave
them loaded as scripts/guest-tests.sh loaded them (NVSTUB_ARGS, GPUSLICE_ARGS)."""

from __future__ import annotations

import os

import pytest

from gpuslice import abi, nvrm_versions
from gpuslice.netlink import GpusliceNetlink

import nvstub
from gsinst import (GPUSLICE_KO, GPUSLICE_SHIPPED_KO, NVSTUB_KO, TEST_PARAMS, Instance, insmod,
                    load_as_the_suite, real_session, session, sh, unload_all)

MIB = 1 << 20

pytestmark = pytest.mark.skipif(not (nvstub.present() and os.path.exists("/sys/module/gpuslice")),
                                reason="needs nvstub.ko and gpuslice.ko loaded")


@pytest.fixture
def reload():
    """Unloads both modules; afterwards restores them with the suite's arguments."""
    unload_all()
    sh("dmesg", "-C")
    yield
    load_as_the_suite()


def test_no_driver_refuses_to_load(reload):
    r = insmod(GPUSLICE_KO)
    assert r.returncode != 0
    assert not os.path.exists("/sys/module/gpuslice")
    assert "gpuslice: no NVIDIA driver" in sh("dmesg").stdout


@pytest.mark.parametrize("version", ["999.1.2", "580.1.1"])
def test_version_without_a_table_refused_unless_passthrough_only(reload, version):
    assert insmod(NVSTUB_KO, f"version={version}").returncode == 0
    sh("udevadm", "settle")
    r = insmod(GPUSLICE_KO)
    assert r.returncode != 0 and not os.path.exists("/sys/module/gpuslice")
    log = sh("dmesg").stdout
    assert f"NVIDIA driver {version} has no ABI table (supported: {nvrm_versions.supported_summary()})" in log
    assert "passthrough_only=1" in log
    if version != "999.1.2":
        return

    r = insmod(GPUSLICE_KO, "passthrough_only=1", "require_device_cgroup=0")
    assert r.returncode == 0, r.stderr
    with GpusliceNetlink() as nl, Instance(nl, 4 * MIB) as inst:
        s = session(inst)
        try:
            # no decoding: the limit is not enforced, the core sees nothing
            st, h, _ = s.alloc_vidmem(8 * MIB)
            assert st == abi.NV_OK
            assert s.free(h) == abi.NV_OK
        finally:
            s.close()
        d = inst.get()
        assert d["nr_ioctls"] == 0 and d["mem_used"] == 0


@pytest.mark.parametrize("version", ["535.43.02", "535.288.01", "550.40.07", "550.163.01", "570.211.01",
                                     "575.64.05", "580.142", "580.159.04"])
def test_each_supported_branch_loads_and_decodes(reload, version):
    """Beside the stand-in answering as each branch's release (its layouts: struct
    nvrm_table), the module loads with that branch's table and the limit holds."""
    assert insmod(NVSTUB_KO, f"version={version}").returncode == 0
    sh("udevadm", "settle")
    assert insmod(GPUSLICE_KO, "require_device_cgroup=0").returncode == 0  # the test runs on the host side
    assert f"NVIDIA driver {version}, ABI table of branch {version.split('.')[0]}" in sh("dmesg").stdout
    with GpusliceNetlink() as nl, Instance(nl, 4 * MIB) as inst:
        s = session(inst)
        try:
            assert s.alloc_vidmem(8 * MIB)[0] == abi.NV_ERR_NO_MEMORY
            st, h, _ = s.alloc_vidmem(2 * MIB)
            assert st == abi.NV_OK
            assert inst.get()["mem_used"] == 2 * MIB
            assert s.free(h) == abi.NV_OK
        finally:
            s.close()


PARAMS = "/sys/module/gpuslice/parameters/"


def test_the_suite_runs_the_test_build():
    """scripts/guest-tests.sh loads build/test-kmod/gpuslice.ko, whose test parameters the
    fault, race and escape tests set."""
    for p in TEST_PARAMS:
        assert os.path.exists(PARAMS + p), p


def test_the_shipped_module_has_no_test_hooks(reload):
    """kmod/gpuslice.ko (what DKMS builds): asked for the test parameters, the kernel
    ignores them as unknown; the stand-in's test escape stays refused through an instance."""
    assert insmod(NVSTUB_KO).returncode == 0
    sh("udevadm", "settle")
    r = insmod(GPUSLICE_SHIPPED_KO, "require_device_cgroup=0", "allow_test_escapes=1", "fail_alloc_every=1")
    assert r.returncode == 0, r.stderr
    log = sh("dmesg").stdout
    assert "unknown parameter 'allow_test_escapes' ignored" in log
    assert "unknown parameter 'fail_alloc_every' ignored" in log
    assert os.path.exists(PARAMS + "require_device_cgroup")
    for p in TEST_PARAMS:
        assert not os.path.exists(PARAMS + p), p
    with GpusliceNetlink() as nl, Instance(nl, 64 * MIB) as inst:
        s = session(inst)
        real = real_session()
        try:
            _tsg, ch = s.tsg_channel()  # allocations work: fail_alloc_every=1 did nothing
            _rtsg, rch = real.tsg_channel()
            assert nvstub.submit(real.ctl, real.client, rch, 1000) == abi.NV_OK
            try:
                st = nvstub.submit(s.ctl, s.client, ch, 1000)
            except OSError as e:
                st = -e.errno
            assert st != abi.NV_OK
        finally:
            s.close()
            real.close()

"""Host test: the stand-in driver's test interface (tests/standin/nvstub_uapi.h) and the
nvidia-uvm layouts (kmod/core/nvrm_abi.h) agree with their Python mirrors
(tests/guest/nvstub.py, gpuslice.abi). Compiles a probe with the C compiler."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice import abi

REPO = Path(__file__).resolve().parents[1]

UVM_STRUCTS = {
    abi.UVM_INITIALIZE: ("uvm_initialize_params", None),
    abi.UVM_CREATE_RANGE_GROUP: ("uvm_range_group_params", None),
    abi.UVM_DESTROY_RANGE_GROUP: ("uvm_range_group_params", None),
    abi.UVM_REGISTER_GPU_VASPACE: ("uvm_register_gpu_vaspace_params", "rm_ctrl_fd"),
    abi.UVM_REGISTER_CHANNEL: ("uvm_register_channel_params", "rm_ctrl_fd"),
    abi.UVM_UNREGISTER_CHANNEL: ("uvm_unregister_channel_params", None),
    abi.UVM_MAP_EXTERNAL_ALLOCATION: ("uvm_map_external_allocation_params", "rm_ctrl_fd"),
    abi.UVM_FREE: ("uvm_range_params", None),
    abi.UVM_REGISTER_GPU: ("uvm_register_gpu_params", "rm_ctrl_fd"),
    abi.UVM_PAGEABLE_MEM_ACCESS: ("uvm_pageable_mem_access_params", None),
    abi.UVM_MAP_DYNAMIC_PARALLELISM_REGION: ("uvm_map_dynamic_parallelism_region_params", None),
    abi.UVM_UNMAP_EXTERNAL: ("uvm_unmap_external_params", None),
    abi.UVM_ALLOC_SEMAPHORE_POOL: ("uvm_alloc_semaphore_pool_params", None),
    abi.UVM_VALIDATE_VA_RANGE: ("uvm_range_params", None),
    abi.UVM_CREATE_EXTERNAL_RANGE: ("uvm_range_params", None),
    abi.UVM_MM_INITIALIZE: ("uvm_mm_initialize_params", "uvm_fd"),
}


# C expressions (nvrm_abi.h) the Python mirrors (gpuslice.abi) must agree with
PROBE_EXPRS = {
    "NV2080_CTRL_CMD_GPU_GET_PIDS": "NV2080_CTRL_CMD_GPU_GET_PIDS",
    "NV2080_CTRL_CMD_GPU_GET_PID_INFO": "NV2080_CTRL_CMD_GPU_GET_PID_INFO",
    "NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT": "NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT",
    "NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT": "NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT",
    "NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS": "NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS",
    "NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_VGPU_GUEST": "NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_VGPU_GUEST",
    "NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE": "NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE",
    "NV2080_CTRL_GPU_PARTITION_ID_INVALID": "NV2080_CTRL_GPU_PARTITION_ID_INVALID",
    "MPS_COMPUTE": "MPS_COMPUTE",
    "GET_PIDS_SIZE": "sizeof(struct nv2080_ctrl_gpu_get_pids_params)",
    "GET_PID_INFO_SIZE": "sizeof(struct nv2080_ctrl_gpu_get_pid_info_params)",
    "GET_PID_INFO_LIST_OFFSET": "offsetof(struct nv2080_ctrl_gpu_get_pid_info_params, pid_info_list)",
    "PID_INFO_SIZE": "sizeof(struct nv2080_ctrl_gpu_pid_info)",
    "PID_INFO_DATA_OFFSET": "offsetof(struct nv2080_ctrl_gpu_pid_info, data)",
    "PID_INFO_CI_OFFSET": "offsetof(struct nv2080_ctrl_gpu_pid_info, compute_instance_id)",
    "NV_ERR_INVALID_OWNER": "NV_ERR_INVALID_OWNER",
    "NVOS32_ATTR_PAGE_SIZE_SHIFT": "NVOS32_ATTR_PAGE_SIZE_SHIFT",
    "NVOS32_ATTR_PAGE_SIZE_HUGE": "NVOS32_ATTR_PAGE_SIZE_HUGE",
    "NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT": "NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT",
    "NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB": "NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB",
    "NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE": "NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE",
    "UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE": "UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE",
    "NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO": "NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO",
    "EXPORT_OBJECT_TO_FD_SIZE": "sizeof(struct nv0000_export_object_to_fd_params)",
    "IMPORT_OBJECT_FROM_FD_SIZE": "sizeof(struct nv0000_import_object_from_fd_params)",
    "GET_EXPORT_OBJECT_INFO_SIZE": "sizeof(struct nv0000_get_export_object_info_params)",
    "EXPORT_OBJECTS_TO_FD_SIZE": "sizeof(struct nv0000_export_objects_to_fd_params)",
    "EXPORT_OBJECTS_TO_FD_NUM": "offsetof(struct nv0000_export_objects_to_fd_params, num_objects)",
    "EXPORT_OBJECTS_TO_FD_OBJECTS": "offsetof(struct nv0000_export_objects_to_fd_params, objects)",
    "IMPORT_OBJECTS_FROM_FD_SIZE": "sizeof(struct nv0000_import_objects_from_fd_params)",
    "IMPORT_OBJECTS_FROM_FD_NUM": "offsetof(struct nv0000_import_objects_from_fd_params, num_objects)",
    "NV00F8_ALLOC_PARAMS_SIZE": "sizeof(struct nv00f8_alloc_params)",
    "NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA": "NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA",
    "NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL": "NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL",
    # the vid-heap block the guest tests build (tests/guest/nvstub.py vid_heap_*)
    "NVOS32_PARAMS_SIZE": "NVOS32_PARAMS_SIZE",
    "NVOS32_FUNCTION_ALLOC_SIZE": "NVOS32_FUNCTION_ALLOC_SIZE",
    "NVOS32_FUNCTION_FREE": "NVOS32_FUNCTION_FREE",
    "NVOS32_FUNCTION_INFO": "NVOS32_FUNCTION_INFO",
    "NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT": "NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT",
    "NVOS32_FUNCTION_ALLOC_SIZE_RANGE": "NVOS32_FUNCTION_ALLOC_SIZE_RANGE",
    "NVOS32_FUNCTION_GET_MEM_ALIGNMENT": "NVOS32_FUNCTION_GET_MEM_ALIGNMENT",
    "NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED": "NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED",
    "NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED": "NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED",
}


def load_nvstub_py():
    spec = importlib.util.spec_from_file_location("nvstub_mirror", REPO / "tests/guest/nvstub.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "nvrm_abi.h"', '#include "nvstub_uapi.h"',
             "int main(void) {",
             '  printf("submit_size %zu\\n", sizeof(struct nvstub_submit));',
             '  printf("submit_status %zu\\n", offsetof(struct nvstub_submit, status));',
             '  printf("submit_req %lu\\n", (unsigned long)NVSTUB_IOCTL_SUBMIT);',
             '  printf("submit_nr %d\\n", NVSTUB_ESC_SUBMIT);']
    for cmd, (st, fd) in UVM_STRUCTS.items():
        lines.append(f'  printf("uvm{cmd}_size %zu\\n", sizeof(struct {st}));')
        lines.append(f'  printf("uvm{cmd}_status %zu\\n", offsetof(struct {st}, rm_status));')
        if fd:
            lines.append(f'  printf("uvm{cmd}_fd %zu\\n", offsetof(struct {st}, {fd}));')
    for name, expr in PROBE_EXPRS.items():
        lines.append(f'  printf("{name} %llu\\n", (unsigned long long)({expr}));')
    lines += ["  return 0;", "}"]
    d = tmp_path_factory.mktemp("probe")
    (d / "p.c").write_text("\n".join(lines))
    subprocess.run([cc, "-I", str(REPO / "kmod/core"), "-I", str(REPO / "tests/standin"), "-o", str(d / "p"),
                    str(d / "p.c")], check=True)
    out = subprocess.run([str(d / "p")], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_submit_mirror(probe: dict[str, int]) -> None:
    nv = load_nvstub_py()
    assert nv.NVSTUB_SUBMIT.size == probe["submit_size"] == 24
    assert nv.NVSTUB_ESC_SUBMIT == probe["submit_nr"] == 0xF0
    assert nv.NVSTUB_IOCTL_SUBMIT == probe["submit_req"]
    assert probe["submit_status"] == 16


def test_uvm_layouts(probe: dict[str, int]) -> None:
    assert set(abi.UVM_PARAMS) == set(UVM_STRUCTS)
    for cmd, (size, status_off, fd_off) in abi.UVM_PARAMS.items():
        assert probe[f"uvm{cmd}_size"] == size, hex(cmd)
        assert probe[f"uvm{cmd}_status"] == status_off, hex(cmd)
        if fd_off is not None:
            assert probe[f"uvm{cmd}_fd"] == fd_off, hex(cmd)
        else:
            assert f"uvm{cmd}_fd" not in probe


def test_pid_controls_and_vidmem_attrs(probe: dict[str, int]) -> None:
    """GET_PIDS / GET_PID_INFO (ctrl2080gpu.h: 3812 and 14408 bytes) and the NVOS32 page-size
    fields mirrored in gpuslice.abi match nvrm_abi.h."""
    for name in PROBE_EXPRS:
        if hasattr(abi, name):
            assert getattr(abi, name) == probe[name], name
    assert probe["GET_PIDS_SIZE"] == abi.GET_PIDS_SIZE == 3812
    assert probe["GET_PID_INFO_SIZE"] == abi.GET_PID_INFO_SIZE == 14408
    assert probe["PID_INFO_SIZE"] == abi.PID_INFO.size == 72
    assert probe["PID_INFO_DATA_OFFSET"] == 16 and probe["PID_INFO_CI_OFFSET"] == 64


def test_export_import_layouts(probe: dict[str, int]) -> None:
    """The NV0000 OS_UNIX export/import parameters (ctrl0000unix.h) and their mirrors, at the
    offsets kmod/core/export.c reads."""
    assert probe["EXPORT_OBJECT_TO_FD_SIZE"] == abi.EXPORT_OBJECT_TO_FD.size == 24
    assert probe["IMPORT_OBJECT_FROM_FD_SIZE"] == abi.IMPORT_OBJECT_FROM_FD.size == 20
    assert probe["GET_EXPORT_OBJECT_INFO_SIZE"] == abi.GET_EXPORT_OBJECT_INFO.size == 80
    assert probe["EXPORT_OBJECTS_TO_FD_SIZE"] == abi.EXPORT_OBJECTS_TO_FD.size == 2128
    assert (probe["EXPORT_OBJECTS_TO_FD_OBJECTS"], probe["EXPORT_OBJECTS_TO_FD_NUM"]) == (76, 2124)
    assert probe["IMPORT_OBJECTS_FROM_FD_SIZE"] == abi.IMPORT_OBJECTS_FROM_FD.size == 652
    assert probe["IMPORT_OBJECTS_FROM_FD_NUM"] == 648


def test_vid_heap_mirror(probe: dict[str, int]) -> None:
    """tests/guest/nvstub.py's NVOS32 constants are nvrm_abi.h's (the stand-in lays the block out
    from nvos.h on its own: nvstub_legacy.c's static_asserts check the same offsets)."""
    m = load_nvstub_py()
    assert m.NVOS32_SIZE == probe["NVOS32_PARAMS_SIZE"] == 184
    for name in ("NVOS32_FUNCTION_ALLOC_SIZE", "NVOS32_FUNCTION_FREE", "NVOS32_FUNCTION_INFO",
                 "NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT", "NVOS32_FUNCTION_ALLOC_SIZE_RANGE",
                 "NVOS32_FUNCTION_GET_MEM_ALIGNMENT", "NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED",
                 "NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED"):
        assert getattr(m, name) == probe[name], name
    assert m.IOCTL_VID_HEAP_CONTROL == abi.iowr(abi.NV_ESC_RM_VID_HEAP_CONTROL, 184)

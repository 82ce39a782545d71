"""An instance's capability set (kmod/core/core.h GS_CAP_*, NVIDIA_DRIVER_CAPABILITIES' names):
a class or control whose filter row is for none of the instance's capabilities is refused as RM
refuses one it does not have (a class NV_ERR_INVALID_CLASS, a control NV_ERR_NOT_SUPPORTED),
counted as a filter refusal; the default set is all four, which changes nothing."""

from __future__ import annotations

import ctypes

import pytest

from test_core import DEV, SUB, Proc, cs, env, so  # noqa: F401  (fixtures)
from test_core_render import video_params
from coreshim import abi

CHAN = 0x5C000060
NV0080_GR_GET_CAPS = 0x00801102  # a graphics-only control row (filter.c)
NV2080_GR_GET_CAPS_V2 = 0x20801227  # a compute row


def graphics(p: Proc):
    return p.alloc(CHAN, abi.HOPPER_A)[0]


def video(p: Proc):
    return p.alloc(CHAN, abi.NVB8B0_VIDEO_DECODER, params=video_params(0))[0]


def compute(p: Proc):
    return p.alloc(CHAN, abi.HOPPER_COMPUTE_A)[0]


def test_all_capabilities_by_default(env):
    core, rm = env
    p = Proc(core, rm)
    for r in (graphics(p), video(p), compute(p)):
        assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE)
    r, _ = p.control(DEV, NV0080_GR_GET_CAPS, ctypes.create_string_buffer(16), 16)
    assert r.verdict == cs.GS_PASS


@pytest.mark.parametrize("caps, refused", [
    (cs.CAP_COMPUTE | cs.CAP_UTILITY, {"graphics", "video"}),
    (cs.CAP_COMPUTE | cs.CAP_UTILITY | cs.CAP_VIDEO, {"graphics"}),
    (cs.CAP_COMPUTE | cs.CAP_UTILITY | cs.CAP_GRAPHICS, {"video"}),
    (cs.CAPS_ALL, set()),
])
def test_a_class_for_none_of_the_instances_capabilities_is_one_rm_does_not_have(env, caps, refused):
    core, rm = env
    core.set_caps(caps)
    p = Proc(core, rm)
    before = core.stats()["refused_filter"]
    for name, call in (("graphics", graphics), ("video", video), ("compute", compute)):
        r = call(p)
        if name in refused:
            assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS), name
        else:
            assert (r.verdict, r.refusal) == (cs.GS_PASS, cs.GS_REFUSE_NONE), name
    assert core.stats()["refused_filter"] - before == len(refused)


def test_a_control_for_none_of_them_is_one_rm_does_not_have(env):
    core, rm = env
    core.set_caps(cs.CAP_COMPUTE | cs.CAP_UTILITY)
    p = Proc(core, rm)
    r, _ = p.control(DEV, NV0080_GR_GET_CAPS, ctypes.create_string_buffer(16), 16)
    assert (r.verdict, r.status, r.refusal) == (cs.GS_REPLY, abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CAPS)
    r, _ = p.control(SUB, NV2080_GR_GET_CAPS_V2, ctypes.create_string_buffer(32), 32)
    assert r.verdict == cs.GS_PASS


def test_without_compute_cuda_gets_no_compute_class(env):
    """utility alone (nvidia-smi): the client, device and subdevice rows are utility's too, the
    compute engine class is not."""
    core, rm = env
    core.set_caps(cs.CAP_UTILITY)
    p = Proc(core, rm)
    r = compute(p)
    assert (r.status, r.refusal) == (abi.NV_ERR_INVALID_CLASS, cs.GS_REFUSE_CAPS)
    r, _ = p.control(SUB, NV2080_GR_GET_CAPS_V2, ctypes.create_string_buffer(32), 32)
    assert (r.status, r.refusal) == (abi.NV_ERR_NOT_SUPPORTED, cs.GS_REFUSE_CAPS)

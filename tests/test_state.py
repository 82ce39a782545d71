import json
import os

import pytest
from hypothesis import given, settings, HealthCheck, strategies as st

from gpuslice import state as S


def sample() -> S.State:
    st_ = S.State()
    st_.instances["a"] = S.Instance("a", [0], 8 << 30, weight=3)
    st_.instances["b.x-1"] = S.Instance("b.x-1", [0, 1], 1 << 20, share=0.25, ceiling=0.5)
    st_.gpus[0] = S.GpuPolicy("fixed", 20_000_000)
    return st_


def test_round_trip(tmp_path) -> None:
    p = str(tmp_path / "sub" / "state.json")
    S.save(sample(), p)
    back = S.load(p)
    assert back == sample()
    assert back.policy_of(1) == S.GpuPolicy()  # default for unconfigured GPUs
    assert [i.name for i in back.instances_on(1)] == ["b.x-1"]
    assert not [f for f in os.listdir(tmp_path / "sub") if f.startswith(".state.")]  # no temp left


def test_missing_file_is_empty(tmp_path) -> None:
    assert S.load(str(tmp_path / "none.json")) == S.State()


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "invalid state file"),
        ("[]", "not an object"),
        ('{"version": 2}', "unsupported version"),
        ('{"version": 1, "instances": {"a": {"gpus": [0], "memory": 0}}}', "memory must be positive"),
        ('{"version": 1, "instances": {"a": {"gpus": [0], "memory": 1, "weight": 0}}}', "weight 0"),
        ('{"version": 1, "instances": {"a b": {"gpus": [0], "memory": 1}}}', "bad instance name"),
        ('{"version": 1, "instances": {"..": {"gpus": [0], "memory": 1}}}', "bad instance name"),
        ('{"version": 1, "instances": {"a": {"gpus": [0], "memory": 1, "bogus": 1}}}', "bogus"),
        ('{"version": 1, "instances": {"a": {"gpus": "0", "memory": 1}}}', "wrong type"),
        ('{"version": 1, "gpus": {"0": {"policy": "nope"}}}', "unknown policy"),
        ('{"version": 1, "gpus": {"0": {"policy": "fixed"}}, "instances": {'
         '"a": {"gpus": [0], "memory": 1, "share": 0.7}, "b": {"gpus": [0], "memory": 1, "share": 0.7}}}', "140.0%"),
    ],
)
def test_invalid_file_reported_and_kept(tmp_path, content: str, needle: str) -> None:
    p = tmp_path / "state.json"
    p.write_text(content)
    with pytest.raises(S.StateError) as ei:
        S.load(str(p))
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg
    # a locked read-modify-write must not replace the broken file
    with pytest.raises(S.StateError):
        with S.locked(str(p)):
            pass
    assert p.read_text() == content


def test_save_refuses_invalid_state(tmp_path) -> None:
    p = tmp_path / "state.json"
    S.save(sample(), str(p))
    before = p.read_text()
    bad = sample()
    bad.instances["c"] = S.Instance("c", [0], 1, share=0.9)  # fixed shares 0.25 + 0.9 > 1
    with pytest.raises(S.StateError):
        S.save(bad, str(p))
    assert p.read_text() == before


def test_locked_saves(tmp_path) -> None:
    p = str(tmp_path / "state.json")
    with S.locked(p) as st_:
        st_.instances["z"] = S.Instance("z", [2], 5)
    assert S.load(p).instances["z"].gpus == [2]
    stamp = S.file_stamp(p)
    assert stamp is not None and S.file_stamp(str(tmp_path / "x")) is None


inst_st = st.builds(
    lambda n, g, m, w, c, per: S.Instance(n, g, m, weight=w, ceiling=c,
                                         gpu_memory={x: m + i for i, x in enumerate(g)} if per else None),
    st.from_regex(S.NAME_RE, fullmatch=True).filter(S.valid_name),
    st.lists(st.integers(0, 31), min_size=1, max_size=4, unique=True),
    st.integers(1, 1 << 50),
    st.integers(1, 10000),
    st.one_of(st.none(), st.floats(0.01, 1.0)),
    st.booleans(),
)


@given(st.lists(inst_st, max_size=5, unique_by=lambda i: i.name))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
def test_round_trip_property(tmp_path, insts) -> None:
    st_ = S.State(instances={i.name: i for i in insts})
    p = str(tmp_path / "p.json")
    S.save(st_, p)
    assert S.load(p) == st_
    json.loads(open(p).read())


def test_per_gpu_memory_names_each_gpu(tmp_path) -> None:
    p = str(tmp_path / "s.json")
    good = S.Instance("a", [0, 1], 8 << 30, gpu_memory={0: 8 << 30, 1: 4 << 30})
    S.save(S.State(instances={"a": good}), p)
    back = S.load(p).instances["a"]
    assert back.gpu_memory == {0: 8 << 30, 1: 4 << 30} and back.memory_of(1) == 4 << 30
    assert json.load(open(p))["instances"]["a"]["gpu_memory"] == {"0": 8 << 30, "1": 4 << 30}
    for bad in ({0: 8 << 30}, {0: 1, 1: 1, 2: 1}, {0: 1, 1: 0}):
        with pytest.raises(S.StateError):
            S.save(S.State(instances={"a": S.Instance("a", [0, 1], 8 << 30, gpu_memory=bad)}), p)
    assert S.load(p).instances["a"] == good  # a refused save leaves the file alone


# ---- node owner, group and mode are kept (instance restore after a reboot applies them) ----

def test_node_owner_group_and_mode_are_kept(tmp_path) -> None:
    p = str(tmp_path / "state.json")
    st_ = S.State()
    st_.instances["a"] = S.Instance("a", [0], 1 << 30, uid=1000, gid=44, mode=0o660)
    st_.instances["b"] = S.Instance("b", [0], 1 << 30)
    S.save(st_, p)
    back = S.load(p)
    assert (back.instances["a"].uid, back.instances["a"].gid, back.instances["a"].mode) == (1000, 44, 0o660)
    doc = json.load(open(p))
    assert doc["instances"]["a"]["mode"] == "0660"  # octal, as chmod and --mode write it
    assert not {"uid", "gid", "mode"} & set(doc["instances"]["b"])  # files without them read as before


def test_a_state_file_of_before_reads_without_them(tmp_path) -> None:
    p = tmp_path / "state.json"
    p.write_text('{"version": 1, "gpus": {}, "instances": {"a": {"gpus": [0], "memory": 1073741824, '
                 '"weight": 1, "share": null, "ceiling": null, "priority": "online", "min_share": null}}}')
    a = S.load(str(p)).instances["a"]
    assert (a.uid, a.gid, a.mode) == (None, None, None)


@pytest.mark.parametrize("field,value", [("uid", -1), ("uid", 1 << 32), ("gid", "44"), ("mode", "0999"),
                                         ("mode", "01777"), ("mode", 432)])
def test_bad_node_attributes_are_refused(tmp_path, field: str, value) -> None:
    p = tmp_path / "state.json"
    p.write_text(json.dumps({"version": 1, "instances": {"a": {"gpus": [0], "memory": 1 << 30, field: value}}}))
    with pytest.raises(S.StateError):
        S.load(str(p))

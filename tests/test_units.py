import pytest
from hypothesis import given, strategies as st

from gpuslice import units


@pytest.mark.parametrize(
    "text,expected",
    [("8GiB", 8 << 30), ("512MiB", 512 << 20), ("4096", 4096), ("1.5G", 3 << 29), ("100MB", 100_000_000),
     ("1 kib", 1024), ("2TiB", 2 << 40), ("7b", 7)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "8XB", "-1GiB", "0", "0.1", "1e3", "99999999TiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_size(text)


@given(st.integers(min_value=1, max_value=(1 << 50)))
def test_size_format_round_trips_when_exact(n: int) -> None:
    text = units.format_size(n)
    if "." not in text:
        assert units.parse_size(text) == n


@pytest.mark.parametrize("text,expected", [("30%", 0.3), ("0.25", 0.25), ("100%", 1.0), ("1", 1.0), (" 5 %", 0.05)])
def test_parse_share(text: str, expected: float) -> None:
    assert units.parse_share(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0", "0%", "101%", "1.5", "abc", "-3%", "nan", "inf"])
def test_parse_share_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_share(text)


@pytest.mark.parametrize(
    "text,ns", [("50ms", 50_000_000), ("500us", 500_000), ("2s", 2_000_000_000), ("100ns", 100), ("20", 20_000_000),
                ("1.5ms", 1_500_000)],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert units.parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "ms", "5 min", "0ms", "-5ms", "0.1ns"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_duration_ns(text)


@given(st.integers(min_value=1, max_value=10**12))
def test_duration_format_round_trips_when_whole(ns: int) -> None:
    text = units.format_duration_ns(ns)
    if "." not in text:
        assert units.parse_duration_ns(text) == ns


@given(st.floats(min_value=0, max_value=1))
def test_share_to_ppt_in_range(f: float) -> None:
    assert 0 <= units.share_to_ppt(f) <= 10000
    assert abs(units.share_to_ppt(f) / 10000 - f) <= 0.00005 + 1e-12


@pytest.mark.parametrize("text,expected", [
    ("8GiB", (8 << 30, {})),
    ("0=8GiB,1=4GiB", (8 << 30, {0: 8 << 30, 1: 4 << 30})),
    (" 1 = 512MiB ", (512 << 20, {1: 512 << 20})),
])
def test_parse_memory(text: str, expected: tuple) -> None:
    assert units.parse_memory(text) == expected


@pytest.mark.parametrize("text", ["0=8GiB,0=4GiB", "0=8GiB,", "x=1GiB", "32=1GiB", "0=0", "=1GiB", "0=8GiB;1=1GiB"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_memory(text)


@given(st.dictionaries(st.integers(0, 31), st.integers(1, 1 << 30).map(lambda n: n << 20), min_size=1, max_size=8))
def test_memory_format_round_trips(per: dict) -> None:
    text = units.format_memory(max(per.values()), per)
    if "." not in text:  # format_size is exact only for whole units
        assert units.parse_memory(text) == (max(per.values()), per)

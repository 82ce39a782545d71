import pytest
from hypothesis import given, strategies as st

from gpuslice import units


@pytest.mark.parametrize(
    "text,expected",
    [("8GiB", 8 << 30), ("512MiB", 512 << 20), ("4096B", 4096), ("1.5Gi", 3 << 29), ("100MB", 100_000_000),
     ("1 KiB", 1024), ("2TiB", 2 << 40), ("7B", 7)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "8XB", "-1GiB", "0", "0.1", "1e3", "99999999TiB", "4096", "1 kib", "7b",
                                  "0B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_size(text)


@given(st.integers(min_value=1, max_value=(1 << 50)))
def test_size_format_round_trips_when_exact(n: int) -> None:
    text = units.format_size(n)
    if "." not in text:
        assert units.parse_size(text) == n


@pytest.mark.parametrize("text,expected", [("30%", 0.3), ("25", 0.25), ("100%", 1.0), ("1", 0.01), (" 5 %", 0.05)])
def test_parse_share(text: str, expected: float) -> None:
    assert units.parse_share(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0", "0%", "101%", "0.5", "abc", "-3%", "nan", "inf", "1e2"])
def test_parse_share_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_share(text)


@pytest.mark.parametrize(
    "text,ns", [("50ms", 50_000_000), ("500us", 500_000), ("2s", 2_000_000_000), ("100ns", 100), ("20", 20_000_000_000),
                ("1.5ms", 1_500_000), ("0.05", 50_000_000), ("2m", 120_000_000_000), ("1h", 3_600_000_000_000),
                ("50MS", 50_000_000), ("500µs", 500_000), (" 5 s ", 5_000_000_000)],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert units.parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "ms", "5 min", "0ms", "-5ms", "0.1ns", "5M", "1e3", "nan", "inf", "5s5",
                                  "1m30s", "0", "0.0"])
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


# ---- sizes are Kubernetes quantities (operator-readiness: --memory 8 was 8 bytes, 8Gi unknown) ----

SIZE_UNITS = {"B": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
              "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
              "k": 1000, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
              "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}


@given(st.sampled_from(sorted(SIZE_UNITS)), st.integers(1, 1 << 20), st.booleans())
def test_every_unit_is_a_kubernetes_quantity(unit: str, n: int, space: bool) -> None:
    assert units.parse_size(f"{n}{' ' if space else ''}{unit}") == n * SIZE_UNITS[unit]


@pytest.mark.parametrize("text,expected", [("8Gi", 8 << 30), ("8G", 8 * 10**9), ("8GB", 8 * 10**9),
                                           ("8GiB", 8 << 30), ("1.5Gi", 3 << 29), ("0.5k", 500),
                                           ("1.1Ki", 1127)])  # a fraction of a byte rounds up, as Kubernetes does
def test_parse_size_quantities(text: str, expected: int) -> None:
    assert units.parse_size(text) == expected


def test_a_bare_number_is_no_size() -> None:
    with pytest.raises(ValueError) as e:
        units.parse_size("8")
    assert str(e.value) == "no unit; write 8Gi, 8GiB or 8GB (bytes: 8B)"


@pytest.mark.parametrize("text", ["8X", "8gib", "8m", "8Gb"])
def test_an_unknown_unit_names_every_unit(text: str) -> None:
    with pytest.raises(ValueError) as e:
        units.parse_size(text)
    listed = str(e.value).replace(",", " ").replace("(", " ").replace(")", " ").split()
    assert set(SIZE_UNITS) <= set(listed), str(e.value)


def test_per_gpu_memory_takes_quantities() -> None:
    assert units.parse_memory("0=8Gi,1=4G") == (8 << 30, {0: 8 << 30, 1: 4 * 10**9})
    with pytest.raises(ValueError, match="GPU 1: no unit"):
        units.parse_memory("0=8Gi,1=4")


@pytest.mark.parametrize("text,expected", [("4G", 4 << 30), ("4096", 4096), ("1k", 1024), ("0=8G,1=4M", (8 << 30))])
def test_the_preload_librarys_limit_keeps_its_own_units(text: str, expected: int) -> None:
    """GPUSLICE_MEM_LIMIT is parsed by preload/preload.c: bytes, or K/M/G/T binary. The
    guard (--source environ) reads it the same way, whatever gpuctl's --memory takes."""
    assert units.parse_env_memory(text)[0] == expected


# ---- shares: a bare number is percent; a bare fraction is ambiguous -----------------------------

@pytest.mark.parametrize("text,expected", [("30", 0.3), ("30%", 0.3), ("0.3%", 0.003), ("1", 0.01), ("100", 1.0),
                                           ("12.5", 0.125)])
def test_a_bare_share_is_percent(text: str, expected: float) -> None:
    assert units.parse_share(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0.3", "0.5", ".25"])
def test_a_bare_fraction_is_ambiguous(text: str) -> None:
    with pytest.raises(ValueError, match=r"^ambiguous; write \S+% \(or \S+%\)$"):
        units.parse_share(text)


@given(st.integers(10, 10000))  # format_share has one decimal: 0.1% and up
def test_share_percent_round_trips(ppt: int) -> None:
    f = ppt / 10000
    assert units.share_to_ppt(units.parse_share(units.format_share(f))) == pytest.approx(ppt, abs=5)


# ---- durations: one syntax for every command and plugin (units.Duration) ----------------------

_DUR_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "": 1_000_000_000}


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(sorted(_DUR_UNITS)))
def test_duration_round_trips_every_unit(n: int, unit: str) -> None:
    """A whole number of any unit parses to that many nanoseconds (a bare number: seconds),
    and what format_duration_ns prints of it parses back to the same."""
    ns = units.parse_duration_ns(f"{n}{unit}")
    assert ns == n * _DUR_UNITS[unit]
    assert units.parse_duration_ns(units.format_duration_ns(ns)) == ns or "." in units.format_duration_ns(ns)


@given(st.text(max_size=12))
def test_duration_refuses_junk_in_one_line(text: str) -> None:
    """Whatever the text, parse_duration_ns returns a positive count or raises a
    ValueError of one line; the click type says it as ``--opt TEXT: ...`` (exit 2)."""
    try:
        ns = units.parse_duration_ns(text)
    except ValueError as e:
        assert "\n" not in str(e) and str(e)
    else:
        assert ns >= 1
    import click
    from click.testing import CliRunner

    @click.command()
    @click.option("--every", type=units.Duration())
    def cmd(every: int) -> None:
        click.echo(repr(every))

    res = CliRunner().invoke(cmd, ["--every", text])
    if res.exit_code == 2:
        assert f"--every {text}: " in res.output
    else:
        assert res.exit_code == 0 and int(res.output) == units.parse_duration_ns(text)


@pytest.mark.parametrize("text", ["5x", "five", "5min", "-1", "", "1s2", "M", "5 M", "1e3s"])
def test_duration_junk_is_refused(text: str) -> None:
    with pytest.raises(ValueError) as e:
        units.parse_duration_ns(text)
    assert "\n" not in str(e.value)


def test_duration_type_range_zero_and_seconds() -> None:
    t = units.Duration(1_000_000, 10 * 10**9, zero=True)
    assert t.parse("0") == 0 and t.parse("0ms") == 0 and t.parse("2") == 2 * 10**9
    with pytest.raises(ValueError, match="must be 0 \\(off\\) or between 1ms and 10s"):
        t.parse("11")
    assert units.Duration(seconds=True).convert("250ms", None, None) == pytest.approx(0.25)
    assert units.Duration(seconds=True).convert("5", None, None) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        units.Duration().parse("0")  # 0 is "off" only where the option says so


def _duration_options() -> list[tuple[str, str]]:
    """Every option of every gpuctl command (the plugins and trace included) whose name
    says it is a duration."""
    from gpuslice.cli import main

    found = []

    def walk(cmd: object, path: str) -> None:
        import click
        for p in getattr(cmd, "params", []):
            if isinstance(p, click.Option) and any(w in p.name for w in ("interval", "period", "duration", "hold",
                                                                          "poll", "after", "sample", "retry",
                                                                          "republish", "timeout")):
                found.append((path, p))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(main, "")
    return found


def test_every_duration_option_takes_the_one_syntax() -> None:
    """top --interval, trace -i, the daemon's and guard's options and the plugins'
    --retry/--republish: all units.Duration, so `5` is 5 seconds and `5ms` is taken."""
    opts = _duration_options()
    names = {f"{c} {max(p.opts, key=len)}" for c, p in opts}
    for must in ("top --interval", "daemon --online-hold", "daemon --preempt-poll", "guard --interval",
                 "policy set --period", "device-plugin --retry", "kubelet-plugin --republish"):
        assert must in names, (must, sorted(names))
    bad = [f"{c} {max(p.opts, key=len)}: {p.type!r}" for c, p in opts if not isinstance(p.type, units.Duration)]
    assert bad == []


def test_trace_interval_takes_suffixes() -> None:
    import click
    from gpuslice.trace import live

    opt = next(p for p in live.trace.params if p.name == "interval")
    assert isinstance(opt.type, units.Duration)
    with pytest.raises(click.BadParameter, match="must be at least 10ms"):
        opt.type.convert("5ms", None, None)  # below its floor, in words
    assert opt.type.convert("5", None, None) == pytest.approx(5.0)
    assert opt.type.convert("20ms", None, None) == pytest.approx(0.02)

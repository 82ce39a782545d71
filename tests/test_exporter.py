"""`gpuctl exporter`: metric families from fake sources, scraped over loopback HTTP and
parsed with prometheus_client's own parser; the command itself as a process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.ops import exporter as E
from gpuslice.netlink import LOCK_HIST_BUCKETS

REPO = os.path.join(os.path.dirname(__file__), "..")
GIB = 1 << 30


def lock_hist(*pairs: tuple[int, int]) -> list[int]:
    h = [0] * LOCK_HIST_BUCKETS
    for i, n in pairs:
        h[i] = n
    return h


WEB = {"name": "web", "id": 1, "gpu_mask": 0b11, "mem_limit": 8 * GIB, "mem_used": 3 * GIB, "mem_peak": 5 * GIB,
       "weight": 3, "nr_ioctls": 1234, "nr_refused_quota": 7, "nr_refused_filter": 2, "nr_events_suppressed": 1,
       "pids": [100, 101], "lock_acquired": 10, "lock_contended": 3, "lock_hold_ns": 5000, "lock_hold_max_ns": 2000,
       "lock_hold_hist": lock_hist((0, 1), (10, 6), (11, 3)), "lock_wait_ns": 900, "lock_wait_max_ns": 600,
       "lock_wait_hist": lock_hist((0, 7), (10, 3)),
       "gpu_mem_limit": [8 * GIB, 4 * GIB] + [8 * GIB] * 30, "gpu_mem_used": [2 * GIB, GIB] + [0] * 30,
       "gpu_mem_peak": [4 * GIB, GIB] + [0] * 30}
BATCH = {"name": "batch", "id": 2, "gpu_mask": 1, "mem_limit": GIB, "mem_used": 0, "mem_peak": 0, "weight": 1,
         "nr_ioctls": 0, "nr_refused_quota": 0, "nr_refused_filter": 0, "pids": []}
STATUS = {"running": True, "pid": 1, "switches": 42, "rm_calls": 84,
          "switch_latency_ns": {"p50": 120_000, "p99": 900_000, "max": None},
          "gpus": {"0": {"policy": "burst", "period_ns": 50_000_000,
                         "switch_latency_hist_ns": lock_hist((17, 30), (18, 10), (20, 2)),
                         "switch_latency_sum_ns": 10_000_000,
                         "preemptions": 5, "resumes": 4,
                         "preempt_latency_ns": {"n": 5, "p50": 800_000, "p99": 2_000_000, "max": 2_000_000},
                         "instances": {"web": {"share": 0.75, "active": True, "gated": True, "channels": 4,
                                               "engines": {"GR0": 3, "NVJPG1": 1},
                                               "slot_ns": 3_000_000_000, "gated_ns": 1_000_000_000},
                                       "batch": {"share": 0.25, "active": False, "gated": False, "channels": 0,
                                                 "slot_ns": 1_000_000_000, "gated_ns": 3_000_000_000}}}}}
GUARD = {"pid": 2, "polls": 500, "kills": 1}
GPUS = [{"index": 0, "uuid": "GPU-abc", "utilization": 37, "memory_used": 3 * GIB, "memory_total": 80 * GIB,
         "processes": [{"pid": 100, "smUtil": 30, "encUtil": 0, "decUtil": 40},
                       {"pid": 101, "smUtil": 20, "encUtil": 0, "decUtil": 70},
                       {"pid": 99, "smUtil": 50, "encUtil": 0, "decUtil": 0}]}]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(sm: dict, name: str, **labels: str) -> float:
    return sm[(name, tuple(sorted(labels.items())))]


@pytest.fixture()
def server():
    """An exporter on an ephemeral loopback port; yields (url, sources)."""
    src = E.Sources(instances=lambda: [WEB, BATCH], status=lambda: STATUS, guard=lambda: GUARD, gpus=lambda: GPUS)
    srv = E.make_server("127.0.0.1:0", E.registry_for(src))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", src
    srv.shutdown()
    srv.server_close()


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode(), r.headers["Content-Type"]


def test_scrape_over_loopback(server) -> None:
    url, _src = server
    text, ctype = scrape(url)
    assert ctype.startswith("text/plain; version=")  # the text format (0.0.4, or 1.0.0 from client 0.22 on)
    sm = samples(text)
    assert value(sm, "gpuslice_module_up") == 1
    assert value(sm, "gpuslice_gpu_preemptions_total", gpu="0") == 5
    assert value(sm, "gpuslice_gpu_resumes_total", gpu="0") == 4
    assert value(sm, "gpuslice_gpu_recent_preempt_latency_seconds", gpu="0", stat="p99") == 0.002
    assert value(sm, "gpuslice_instance_info", gpuslice_instance="web", gpus="0,1") == 1
    assert value(sm, "gpuslice_instance_memory_limit_bytes", gpuslice_instance="web") == 8 * GIB
    assert value(sm, "gpuslice_instance_memory_used_bytes", gpuslice_instance="web") == 3 * GIB
    assert value(sm, "gpuslice_instance_memory_peak_bytes", gpuslice_instance="web") == 5 * GIB
    # per GPU, for the GPUs of the instance only
    assert value(sm, "gpuslice_instance_gpu_memory_limit_bytes", gpuslice_instance="web", gpu="1") == 4 * GIB
    assert value(sm, "gpuslice_instance_gpu_memory_used_bytes", gpuslice_instance="web", gpu="0") == 2 * GIB
    assert value(sm, "gpuslice_instance_gpu_memory_peak_bytes", gpuslice_instance="web", gpu="0") == 4 * GIB
    assert not [k for k in sm if k[0] == "gpuslice_instance_gpu_memory_limit_bytes" and ("gpu", "2") in k[1]]
    assert value(sm, "gpuslice_instance_ioctls_total", gpuslice_instance="web") == 1234
    assert value(sm, "gpuslice_instance_refusals_total", gpuslice_instance="web", reason="quota") == 7
    assert value(sm, "gpuslice_instance_refusals_total", gpuslice_instance="web", reason="filter") == 2
    assert value(sm, "gpuslice_instance_processes", gpuslice_instance="web") == 2
    assert value(sm, "gpuslice_instance_processes", gpuslice_instance="batch") == 0
    # the lock histogram: cumulative, in seconds, count = acquisitions, sum = total hold time
    assert value(sm, "gpuslice_instance_lock_hold_seconds_count", gpuslice_instance="web") == 10
    assert value(sm, "gpuslice_instance_lock_hold_seconds_sum", gpuslice_instance="web") == pytest.approx(5e-6)
    assert value(sm, "gpuslice_instance_lock_hold_seconds_bucket", gpuslice_instance="web", le="1e-09") == 1
    assert value(sm, "gpuslice_instance_lock_hold_seconds_bucket", gpuslice_instance="web",
                 le="1.024e-06") == 7
    assert value(sm, "gpuslice_instance_lock_hold_seconds_bucket", gpuslice_instance="web", le="+Inf") == 10
    assert value(sm, "gpuslice_instance_lock_wait_max_seconds", gpuslice_instance="web") == pytest.approx(6e-7)
    # no figures: no series
    assert ("gpuslice_instance_lock_hold_seconds_count", (("gpuslice_instance", "batch"),)) not in sm
    # the daemon
    assert value(sm, "gpuslice_daemon_up") == 1
    assert value(sm, "gpuslice_daemon_slot_switches_total") == 42
    assert value(sm, "gpuslice_daemon_recent_switch_latency_seconds", stat="p99") == pytest.approx(9e-4)
    assert value(sm, "gpuslice_gpu_switch_latency_seconds_count", gpu="0") == 42
    assert value(sm, "gpuslice_gpu_switch_latency_seconds_bucket", gpu="0", le="0.000131072") == 30
    assert value(sm, "gpuslice_gpu_switch_latency_seconds_sum", gpu="0") == pytest.approx(0.01)
    assert value(sm, "gpuslice_instance_slot_seconds_total", gpuslice_instance="web", gpu="0") == 3.0
    assert value(sm, "gpuslice_instance_gated_seconds_total", gpuslice_instance="batch", gpu="0") == 3.0
    assert value(sm, "gpuslice_instance_share_target_ratio", gpuslice_instance="web", gpu="0") == 0.75
    assert value(sm, "gpuslice_instance_gated", gpuslice_instance="web", gpu="0") == 1
    chans = "gpuslice_instance_engine_channels"
    assert value(sm, chans, gpuslice_instance="web", gpu="0", engine="NVJPG1") == 1
    assert value(sm, chans, gpuslice_instance="web", gpu="0", engine="GR0") == 3
    assert value(sm, "gpuslice_instance_active", gpuslice_instance="batch", gpu="0") == 0
    assert value(sm, "gpuslice_gpu_period_seconds", gpu="0") == pytest.approx(0.05)
    assert value(sm, "gpuslice_guard_kills_total") == 1
    # NVML
    assert value(sm, "gpuslice_gpu_utilization_ratio", gpu="0", uuid="GPU-abc") == pytest.approx(0.37)
    # NVML's per-process engine samples, summed over the instance's pids (pid 99 is no instance's)
    use = "gpuslice_instance_engine_utilization_ratio"
    assert value(sm, use, gpuslice_instance="web", gpu="0", engine="sm") == pytest.approx(0.5)
    assert value(sm, use, gpuslice_instance="web", gpu="0", engine="dec") == 1.0
    assert (use, (("engine", "sm"), ("gpu", "0"), ("gpuslice_instance", "batch"))) not in sm
    assert value(sm, "gpuslice_gpu_memory_total_bytes", gpu="0", uuid="GPU-abc") == 80 * GIB


def test_every_name_follows_the_conventions(server) -> None:
    text, _ = scrape(server[0])
    for fam in text_string_to_metric_families(text):
        assert re.fullmatch(r"gpuslice_[a-z0-9_]+", fam.name), fam.name
        assert fam.documentation, fam.name
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
        for s in fam.samples:
            assert not re.search(r"_(ms|us|ns|mib|kb|percent)(_|$)", s.name), s.name  # base units only


def test_sources_that_fail_or_are_absent(server) -> None:
    url, src = server

    def broken() -> None:
        raise OSError(19, "gone")

    src.instances, src.status, src.guard, src.gpus = broken, lambda: None, lambda: None, lambda: []
    sm = samples(scrape(url)[0])
    assert value(sm, "gpuslice_module_up") == 0
    assert value(sm, "gpuslice_daemon_up") == 0
    assert value(sm, "gpuslice_exporter_read_errors_total", source="instances") == 1
    assert not any(n.startswith(("gpuslice_instance_", "gpuslice_gpu_")) for n, _ in sm)
    assert urllib.request.urlopen(url + "/metrics", timeout=5).status == 200  # and again


def test_unknown_path_is_404(server) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server[0] + "/nope", timeout=5)
    assert e.value.code == 404


@given(st.lists(st.integers(0, 10**6), min_size=LOCK_HIST_BUCKETS, max_size=LOCK_HIST_BUCKETS))
def test_lock_histogram_is_cumulative(hist: list[int]) -> None:
    d = {**BATCH, "lock_acquired": sum(hist), "lock_hold_ns": 1, "lock_hold_hist": hist}
    (h,) = [f for f in E.families([d], None, None, []) if f.name == "gpuslice_instance_lock_hold_seconds"]
    buckets = [s.value for s in h.samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == sum(hist) and len(buckets) == LOCK_HIST_BUCKETS
    les = [float(s.labels["le"]) for s in h.samples if s.name.endswith("_bucket")]
    assert les == sorted(les) and les[-1] == float("inf")


@pytest.mark.parametrize("text,want", [("127.0.0.1:9410", ("127.0.0.1", 9410)), (":9410", ("127.0.0.1", 9410)),
                                       ("9410", ("127.0.0.1", 9410)), ("[::1]:0", ("::1", 0)),
                                       ("0.0.0.0:80", ("0.0.0.0", 80))])
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert E.parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "host", "1.2.3.4:", "1.2.3.4:99999", "::1:80", "a:b"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        E.parse_listen(text)


def test_nvml_without_a_gpu_is_empty() -> None:
    got = E.nvml_gpus()  # this host: no GPU, maybe no libnvidia-ml: [] either way, never raises
    assert isinstance(got, list)


def test_the_command_serves_until_sigterm(tmp_path) -> None:
    """`gpuctl exporter` as a process: prints where it listens, answers a scrape, exits
    0 on SIGTERM."""
    status = tmp_path / "status.json"
    status.write_text('{"pid": %d, "switches": 5, "gpus": {}}' % os.getpid())
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "pyctl")}
    p = subprocess.Popen([sys.executable, "-m", "gpuslice", "--kernel", "no", "--state", str(tmp_path / "s.json"),
                          "exporter", "--listen", "127.0.0.1:0", "--no-nvml", "--status-file", str(status),
                          "--guard-file", str(tmp_path / "none.json")], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        m = re.search(r"serving (http://127\.0\.0\.1:\d+)/metrics", line)
        assert m, line
        sm = samples(scrape(m.group(1))[0])
        assert value(sm, "gpuslice_daemon_up") == 1 and value(sm, "gpuslice_daemon_slot_switches_total") == 5
        assert value(sm, "gpuslice_module_up") == 0
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_the_command_refuses_a_bad_listen_in_one_line(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "pyctl")}
    r = subprocess.run([sys.executable, "-m", "gpuslice", "--kernel", "no", "exporter", "--listen", "nowhere"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--listen" in r.stderr


def test_nvml_process_samples_keep_each_pids_latest() -> None:
    from types import SimpleNamespace as NS_

    class FakeNvml:
        def __init__(self, samples):  # type: ignore[no-untyped-def]
            self.samples = samples

        def nvmlDeviceGetProcessUtilization(self, h, last):  # type: ignore[no-untyped-def]
            if self.samples is None:
                raise RuntimeError("NVML_ERROR_NOT_FOUND")
            return self.samples

    s = [NS_(pid=5, timeStamp=1, smUtil=10, memUtil=1, encUtil=0, decUtil=0),
         NS_(pid=5, timeStamp=3, smUtil=30, memUtil=1, encUtil=0, decUtil=60),
         NS_(pid=6, timeStamp=2, smUtil=5, memUtil=1, encUtil=7, decUtil=0)]
    assert E.nvml_process_samples(FakeNvml(s), None) == [
        {"pid": 5, "smUtil": 30, "encUtil": 0, "decUtil": 60}, {"pid": 6, "smUtil": 5, "encUtil": 7, "decUtil": 0}]
    assert E.nvml_process_samples(FakeNvml(None), None) == []


def test_no_series_carries_a_prometheus_target_label(server) -> None:
    """`instance` and `job` are the labels Prometheus puts on every target: a series that
    carried its own would have it renamed to `exported_instance` on scrape (unless
    honor_labels). The instance is `gpuslice_instance`, on every per-instance series."""
    sm = samples(scrape(server[0])[0])
    for name, labels in sm:
        keys = {k for k, _v in labels}
        assert not keys & {"instance", "job"}, (name, labels)
    per_instance = [(n, dict(lb)) for n, lb in sm if n.startswith("gpuslice_instance_")]
    assert per_instance and all(lb.get("gpuslice_instance") in ("web", "batch") for _n, lb in per_instance)
    assert E.INSTANCE_LABEL == "gpuslice_instance"


def test_one_default_address_used_everywhere(tmp_path) -> None:
    """ops.listen.DEFAULT_LISTEN (re-exported as exporter.DEFAULT_LISTEN) is the `exporter`
    command's --listen default, what doctor checks when the unit names none, what the
    systemd unit and metrics.md say; and not 9400, dcgm-exporter's port, which runs on
    the same GPU hosts."""
    from click.testing import CliRunner

    from gpuslice.cli import main
    from gpuslice.ops import doctor as D
    from gpuslice.ops import listen as L

    assert E.parse_listen(E.DEFAULT_LISTEN) == ("127.0.0.1", 9410)
    (listen,) = [p for p in main.commands["exporter"].params if p.name == "listen"]
    assert listen.default == E.DEFAULT_LISTEN
    help_ = CliRunner().invoke(main, ["doctor", "--help"]).output
    assert E.DEFAULT_LISTEN in help_.replace("\n", " ").replace("  ", " ") and "9400" not in help_
    urls: list[str] = []

    def get(url: str, timeout: float) -> tuple[int, str]:
        urls.append(url)
        return 404, ""

    assert E.DEFAULT_LISTEN is L.DEFAULT_LISTEN and E.parse_listen is L.parse_listen  # one place
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(L, "DEFAULT_LISTEN", "127.0.0.1:1")  # doctor reads the constant, not a copy of it
        D.run_all(str(tmp_path / "s.json"), str(tmp_path / "c.yaml"), lambda: {}, root=str(tmp_path),
                  connect=lambda: None, unit=lambda u: None, exec_start=lambda u: None, get=get)
    assert urls == ["http://127.0.0.1:1/metrics"]
    unit = open(os.path.join(REPO, "deploy", "systemd", "gpuslice-exporter.service")).read()
    assert f"gpuctl exporter --listen {E.DEFAULT_LISTEN}\n" in unit and "9400" not in unit
    doc = open(os.path.join(REPO, "docs", "metrics.md")).read()
    assert f"--listen {E.DEFAULT_LISTEN}" in doc
    assert re.search(r"9410[^\n]*\n?[^\n]*9400[^\n]*\n?[^\n]*dcgm-exporter", doc), "metrics.md: why 9410"

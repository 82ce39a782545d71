"""`gpuctl exporter`: Prometheus metrics of instances, the daemon and the GPUs.

Read on each scrape (a custom collector, no background polling): the module's
INSTANCE_GET dump, the daemon's and the guard's status files, and NVML when it finds a
GPU. Names and why they differ from DCGM exporter's and HAMi's: docs/metrics.md.

:func:`families` is pure (inputs in, metric families out); :class:`Sources` does the
reading and :func:`serve` the HTTP.
"""

from __future__ import annotations

import http.server
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from gpuslice.netlink import LOCK_HIST_BUCKETS, gpu_mem, gpus_of, hist_bucket_ns
from gpuslice.ops.listen import DEFAULT_LISTEN as DEFAULT_LISTEN  # re-exported: the one default (9410)
from gpuslice.ops.listen import parse_listen as parse_listen

log = logging.getLogger(__name__)
# The instance's label. Not `instance`: Prometheus sets that (and `job`) on every series
# of a target and renames a series' own to `exported_instance` (unless honor_labels).
INSTANCE_LABEL = "gpuslice_instance"
NS = 1e-9


def _hist(name: str, doc: str, rows: Iterable[tuple[list[str], list[int], int, int]],
          labels: Sequence[str]) -> HistogramMetricFamily:
    """A LOCK_*_HIST (log2 ns buckets) as a Prometheus histogram in seconds: bucket i's
    values are below 2^i ns, so its cumulative count is the le="2^i ns" bucket."""
    h = HistogramMetricFamily(name, doc, labels=list(labels))
    for lv, hist, total_ns, count in rows:
        buckets, cum = [], 0
        for i in range(LOCK_HIST_BUCKETS - 1):
            cum += hist[i] if i < len(hist) else 0
            high = hist_bucket_ns(i)[1]
            assert high is not None
            buckets.append((repr(high * NS), cum))
        cum += sum(hist[LOCK_HIST_BUCKETS - 1:])
        buckets.append(("+Inf", cum))
        h.add_metric(lv, buckets, total_ns * NS)
    return h


def families(instances: Sequence[Mapping[str, Any]] | None, status: Mapping[str, Any] | None,
             guard: Mapping[str, Any] | None, gpus: Sequence[Mapping[str, Any]]) -> list[Metric]:
    """Metric families from what the sources read.

    instances: INSTANCE_GET dicts (netlink.to_dict, merged), None when the module is not
    reachable; status: the daemon's status.json, with ``running``; guard: guard.json;
    gpus: one dict per NVML device (index, uuid, name, utilization, memory_used,
    memory_total, processes: NVML's per-process engine samples, nvml_process_samples)."""
    out: list[Metric] = []
    up = GaugeMetricFamily("gpuslice_module_up", "1 when the gpuslice module answered over netlink.")
    up.add_metric([], 0 if instances is None else 1)
    out.append(up)

    L = [INSTANCE_LABEL]

    def per_instance(family, name: str, doc: str, key: str, scale: float):  # type: ignore[no-untyped-def]
        m = family(name, doc, labels=L)
        for d in instances or ():
            if key in d:
                m.add_metric([d["name"]], d[key] * scale)
        return m

    def gauge(name: str, doc: str, key: str, scale: float = 1.0) -> GaugeMetricFamily:
        return per_instance(GaugeMetricFamily, name, doc, key, scale)

    def counter(name: str, doc: str, key: str, scale: float = 1.0) -> CounterMetricFamily:
        return per_instance(CounterMetricFamily, name, doc, key, scale)

    insts = [d for d in instances or () if "name" in d]
    info = GaugeMetricFamily("gpuslice_instance_info", "An instance and its GPUs (always 1).",
                             labels=[INSTANCE_LABEL, "gpus"])
    for d in insts:
        info.add_metric([d["name"], ",".join(map(str, gpus_of(int(d.get("gpu_mask", 0)))))], 1)
    out.append(info)
    out += [
        gauge("gpuslice_instance_memory_limit_bytes", "Video memory limit of the instance.", "mem_limit"),
        gauge("gpuslice_instance_memory_used_bytes", "Video memory the instance holds now (as the module counts it).",
              "mem_used"),
        gauge("gpuslice_instance_memory_peak_bytes", "Most video memory the instance held at once.", "mem_peak"),
        gauge("gpuslice_instance_weight", "Scheduling weight of the instance (1..10000).", "weight"),
        counter("gpuslice_instance_ioctls", "Driver calls through the instance's nodes.", "nr_ioctls"),
        counter("gpuslice_instance_refusal_events_suppressed",
                "Refusal events not sent on netlink (rate limit); the refusals are counted all the same.",
                "nr_events_suppressed"),
        counter("gpuslice_instance_lock_acquisitions", "Holds of the instance's core lock.", "lock_acquired"),
        counter("gpuslice_instance_lock_contended", "Holds of the instance's core lock that had to wait.",
                "lock_contended"),
        gauge("gpuslice_instance_lock_hold_max_seconds", "Longest hold of the instance's core lock.",
              "lock_hold_max_ns", NS),
        gauge("gpuslice_instance_lock_wait_max_seconds", "Longest wait for the instance's core lock.",
              "lock_wait_max_ns", NS),
    ]
    ref = CounterMetricFamily("gpuslice_instance_refusals", "Calls refused by the module, by reason: quota (an "
                              "allocation over the memory limit), filter (a call outside what a container may make).",
                              labels=[INSTANCE_LABEL, "reason"])
    procs = GaugeMetricFamily("gpuslice_instance_processes", "Processes with an instance node open.", labels=L)
    for d in insts:
        for reason in ("quota", "filter"):
            if f"nr_refused_{reason}" in d:
                ref.add_metric([d["name"], reason], d[f"nr_refused_{reason}"])
        procs.add_metric([d["name"]], len(d.get("pids", [])))
    out += [ref, procs]
    for key, doc in (("limit", "Video memory limit of the instance on the GPU."),
                     ("used", "Video memory the instance holds on the GPU now (as the module counts it)."),
                     ("peak", "Most video memory the instance held on the GPU at once.")):
        m = GaugeMetricFamily(f"gpuslice_instance_gpu_memory_{key}_bytes", doc, labels=[INSTANCE_LABEL, "gpu"])
        for d in insts:
            for g, v in gpu_mem(d).items():
                m.add_metric([d["name"], str(g)], v[key])
        out.append(m)
    for what in ("hold", "wait"):
        out.append(_hist(f"gpuslice_instance_lock_{what}_seconds",
                         f"{what.capitalize()} times of the instance's core lock (log2 buckets from the module).",
                         (([d["name"]], list(d[f"lock_{what}_hist"]), int(d.get(f"lock_{what}_ns", 0)),
                           int(d.get("lock_acquired", 0))) for d in insts if f"lock_{what}_hist" in d), L))
    out += _daemon(status)
    out += _guard(guard)
    out += _gpus(gpus)
    out += _engine_use(insts, gpus)
    return out


# NVML's per-process engine samples (nvmlDeviceGetProcessUtilization), by engine label
ENGINE_SAMPLES = (("sm", "smUtil"), ("enc", "encUtil"), ("dec", "decUtil"))


def engine_utilization(insts: Sequence[Mapping[str, Any]],
                       gpus: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(instance, gpu, engine) -> fraction of NVML's last sample period the instance's
    processes kept that engine busy (sm: the SMs, enc: NVENC, dec: NVDEC), summed over its
    processes and capped at 1. A process is the instance's when the module lists its pid
    (INSTANCE_GET pids); NVML's samples name host pids, as the module does."""
    owner = {int(pid): str(d["name"]) for d in insts for pid in d.get("pids", ())}
    out: dict[tuple[str, str, str], float] = {}
    for g in gpus:
        for p in g.get("processes") or ():
            name = owner.get(int(p.get("pid", 0)))
            if name is None:
                continue
            for engine, key in ENGINE_SAMPLES:
                k = (name, str(g["index"]), engine)
                out[k] = min(1.0, out.get(k, 0.0) + float(p.get(key, 0)) / 100.0)
    return out


def _engine_use(insts: Sequence[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]]) -> list[Metric]:
    m = GaugeMetricFamily("gpuslice_instance_engine_utilization_ratio",
                          "Fraction of NVML's last sample period the instance's processes kept an engine busy "
                          "(sm, enc: NVENC, dec: NVDEC), from NVML's per-process samples.",
                          labels=[INSTANCE_LABEL, "gpu", "engine"])
    for (name, g, engine), v in sorted(engine_utilization(insts, gpus).items()):
        m.add_metric([name, g, engine], v)
    return [m]


def _daemon(status: Mapping[str, Any] | None) -> list[Metric]:
    running = bool(status and status.get("running"))
    up = GaugeMetricFamily("gpuslice_daemon_up", "1 when `gpuctl daemon` is running (its status file names a live pid).")
    up.add_metric([], 1 if running else 0)
    out: list[Metric] = [up]
    if not running or status is None:
        return out
    for key, name, doc in (("switches", "gpuslice_daemon_slot_switches", "Slot switches made by the daemon."),
                           ("rm_calls", "gpuslice_daemon_rm_calls", "FIFO_DISABLE_CHANNELS calls made by the daemon."),
                           ("stale_channels", "gpuslice_daemon_stale_channels", "Channels dropped from the daemon's "
                            "FIFO_DISABLE_CHANNELS batches because RM answered them alone as naming no live channel.")):
        c = CounterMetricFamily(name, doc)
        c.add_metric([], status.get(key, 0))
        out.append(c)
    held = GaugeMetricFamily("gpuslice_daemon_stale_channels_held", "Stale channels the daemon holds out of its "
                             "batches now (the source still reports them; each is probed alone now and then).")
    held.add_metric([], status.get("stale_now", 0))
    out.append(held)
    lat = GaugeMetricFamily("gpuslice_daemon_recent_switch_latency_seconds", "Slot switch latency over the daemon's "
                            "last 10000 switches, all GPUs, by statistic (p50, p99, max).", labels=["stat"])
    for stat, v in sorted((status.get("switch_latency_ns") or {}).items()):
        if v is not None:
            lat.add_metric([stat], v * NS)
    out.append(lat)
    labels = [INSTANCE_LABEL, "gpu"]
    target = GaugeMetricFamily("gpuslice_instance_share_target_ratio", "Share of the GPU the policy gives the instance "
                               "now (0..1).", labels=labels)
    active = GaugeMetricFamily("gpuslice_instance_active", "1 when the daemon counts the instance as busy.",
                               labels=labels)
    gated = GaugeMetricFamily("gpuslice_instance_gated", "1 when the instance's channels are disabled outside its slot.",
                              labels=labels)
    chans = GaugeMetricFamily("gpuslice_instance_channels", "Channels of the instance on the GPU.", labels=labels)
    engine_chans = GaugeMetricFamily("gpuslice_instance_engine_channels", "Channels of the instance on the GPU, by "
                                     "engine (GR0, NVDEC0..6, NVJPG0..6, OFA0, CE).", labels=labels + ["engine"])
    policy = GaugeMetricFamily("gpuslice_gpu_policy_info", "The GPU's policy (always 1).",
                               labels=["gpu", "policy"])
    period = GaugeMetricFamily("gpuslice_gpu_period_seconds", "Scheduling period of the GPU.", labels=["gpu"])
    slot = CounterMetricFamily("gpuslice_instance_slot_seconds", "Time in the instance's own slots (its channels "
                               "enabled for it) since the daemon started; rate() is the achieved share.", labels=labels)
    gated_t = CounterMetricFamily("gpuslice_instance_gated_seconds", "Time the instance's channels were disabled "
                                  "for others' slots since the daemon started.", labels=labels)
    gpus = sorted((status.get("gpus") or {}).items())
    lat_hist = _hist("gpuslice_gpu_switch_latency_seconds", "Slot switch latency per GPU (log2 buckets): from the "
                     "slot boundary to the gating applied.",
                     (([g], list(tl["switch_latency_hist_ns"]), int(tl.get("switch_latency_sum_ns", 0)),
                       sum(tl["switch_latency_hist_ns"])) for g, tl in gpus if "switch_latency_hist_ns" in tl), ["gpu"])
    preempt = CounterMetricFamily("gpuslice_gpu_preemptions", "Times online work preempted the GPU's offline "
                                  "instances (priority, docs/policies.md).", labels=["gpu"])
    resumes = CounterMetricFamily("gpuslice_gpu_resumes", "Times the GPU went back to offline instances the moment "
                                  "online work ended.", labels=["gpu"])
    plat = GaugeMetricFamily("gpuslice_gpu_recent_preempt_latency_seconds", "From an online instance's first work to "
                             "the last offline channel disabled, over the last 10000 preemptions, by statistic.",
                             labels=["gpu", "stat"])
    for g, tl in gpus:
        policy.add_metric([g, str(tl.get("policy"))], 1)
        if "preemptions" in tl:
            preempt.add_metric([g], tl["preemptions"])
            resumes.add_metric([g], tl.get("resumes", 0))
            for stat in ("p50", "p99", "max"):
                v = (tl.get("preempt_latency_ns") or {}).get(stat)
                if v is not None:
                    plat.add_metric([g, stat], v * NS)
        if "period_ns" in tl:
            period.add_metric([g], tl["period_ns"] * NS)
        for name, li in sorted((tl.get("instances") or {}).items()):
            target.add_metric([name, g], float(li.get("share", 0.0)))
            active.add_metric([name, g], 1 if li.get("active") else 0)
            gated.add_metric([name, g], 1 if li.get("gated") else 0)
            chans.add_metric([name, g], li.get("channels", 0))
            for engine, n in sorted((li.get("engines") or {}).items()):
                engine_chans.add_metric([name, g, str(engine)], n)
            if "slot_ns" in li:
                slot.add_metric([name, g], li["slot_ns"] * NS)
            if "gated_ns" in li:
                gated_t.add_metric([name, g], li["gated_ns"] * NS)
    return out + [target, active, gated, chans, engine_chans, slot, gated_t, policy, period, lat_hist, preempt, resumes, plat]


def _guard(guard: Mapping[str, Any] | None) -> list[Metric]:
    if not guard:
        return []
    out: list[Metric] = []
    for key, name, doc in (("polls", "gpuslice_guard_polls", "Reads of RM's per-process memory by `gpuctl guard`."),
                           ("kills", "gpuslice_guard_kills", "Processes `gpuctl guard` killed over their instance's "
                            "limit.")):
        if key in guard:
            c = CounterMetricFamily(name, doc)
            c.add_metric([], guard[key])
            out.append(c)
    return out


def _gpus(gpus: Sequence[Mapping[str, Any]]) -> list[Metric]:
    if not gpus:
        return []
    L = ["gpu", "uuid"]
    util = GaugeMetricFamily("gpuslice_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran (NVML).",
                             labels=L)
    used = GaugeMetricFamily("gpuslice_gpu_memory_used_bytes", "Video memory in use on the GPU, all clients (NVML).",
                             labels=L)
    total = GaugeMetricFamily("gpuslice_gpu_memory_total_bytes", "Video memory of the GPU (NVML).", labels=L)
    for d in gpus:
        lv = [str(d["index"]), str(d.get("uuid", ""))]
        if d.get("utilization") is not None:
            util.add_metric(lv, d["utilization"] / 100.0)
        if d.get("memory_used") is not None:
            used.add_metric(lv, d["memory_used"])
        if d.get("memory_total") is not None:
            total.add_metric(lv, d["memory_total"])
    return [util, used, total]


# ---- reading -------------------------------------------------------------------------

def nvml_gpus() -> list[dict[str, Any]]:
    """Every GPU NVML finds; [] without NVML or a GPU (never raises)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            d: dict[str, Any] = {"index": i}
            for key, fn in (("uuid", lambda: pynvml.nvmlDeviceGetUUID(h)),
                            ("utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                            ("memory_used", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used),
                            ("memory_total", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total)):
                try:
                    d[key] = fn()
                except Exception:
                    pass
            d["processes"] = nvml_process_samples(pynvml, h)
            out.append(d)
    except Exception as e:
        log.debug("NVML: %s", e)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def nvml_process_samples(pynvml: Any, h: Any) -> list[dict[str, int]]:
    """The latest of NVML's per-process utilisation samples of each pid on the GPU (SM,
    memory, NVENC, NVDEC in percent); [] when NVML has none (it raises NotFound then)."""
    latest: dict[int, Any] = {}
    try:
        for smp in pynvml.nvmlDeviceGetProcessUtilization(h, 0):
            if smp.pid not in latest or smp.timeStamp > latest[smp.pid].timeStamp:
                latest[smp.pid] = smp
    except Exception:
        return []
    return [{"pid": int(p), **{key: int(getattr(smp, key)) for _e, key in ENGINE_SAMPLES}}
            for p, smp in sorted(latest.items())]


@dataclass
class Sources:
    """Where a scrape reads from; each callable may fail, which drops only its part.
    instances: None when the module is not reachable."""
    instances: Callable[[], Sequence[Mapping[str, Any]] | None]
    status: Callable[[], Mapping[str, Any] | None] = lambda: None
    guard: Callable[[], Mapping[str, Any] | None] = lambda: None
    gpus: Callable[[], Sequence[Mapping[str, Any]]] = nvml_gpus
    errors: dict[str, int] = field(default_factory=dict)

    def read(self) -> tuple[Any, Any, Any, Any]:
        def safe(name: str, fn: Callable[[], Any], empty: Any) -> Any:
            try:
                return fn()
            except Exception as e:
                self.errors[name] = self.errors.get(name, 0) + 1
                log.debug("scrape: %s: %s", name, e)
                return empty

        return (safe("instances", self.instances, None), safe("status", self.status, None),
                safe("guard", self.guard, None), safe("gpus", self.gpus, []))


class Collector:
    """prometheus_client collector: reads the sources on every scrape."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._lock = threading.Lock()  # one scrape at a time reads the netlink socket

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            fams = families(*self.sources.read())
            errs = CounterMetricFamily("gpuslice_exporter_read_errors", "Failed reads of a source during scrapes.",
                                       labels=["source"])
            for name, n in sorted(self.sources.errors.items()):
                errs.add_metric([name], n)
        yield from fams
        yield errs


def registry_for(sources: Sources) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(sources))  # type: ignore[arg-type]
    return reg


def make_server(listen: str, registry: CollectorRegistry) -> http.server.HTTPServer:
    """An HTTP server answering /metrics (and /) with the registry's text format.
    Port 0 takes a free one (server.server_address says which). One request at a
    time, in the thread that serves: the netlink client (pyroute2 keeps an event loop
    per thread) is only ever used from there; a client that stalls is cut off after
    10 s."""
    host, port = parse_listen(listen)

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 10

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug(fmt, *args)

    cls = http.server.HTTPServer
    if ":" in host:
        import socket

        class V6(http.server.HTTPServer):
            address_family = socket.AF_INET6

        cls = V6
    return cls((host, port), Handler)

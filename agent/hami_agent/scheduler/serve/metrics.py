"""Prometheus metrics of the extender, in a registry the component creates (no global state).

Per-device gauges reuse HAMi's scheduler metric names (``GPUDeviceMemoryLimit``, ...) so existing
dashboards keep working; they are computed from the usage cache at scrape time."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from hami_agent.protocol import reasons as R
from hami_agent.protocol.errors import ProtocolError

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# a preemptor's wait: the victims' grace period (30 s by default) and more (docs/scheduler.md "What it costs")
WAIT_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)


class _CacheCollector:
    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def collect(self):
        labels = ["nodeid", "deviceuuid", "deviceidx"]
        fams = {
            "GPUDeviceMemoryLimit": GaugeMetricFamily("GPUDeviceMemoryLimit", "Device memory limit (bytes)",
                                                      labels=labels),
            "GPUDeviceMemoryAllocated": GaugeMetricFamily("GPUDeviceMemoryAllocated",
                                                          "Device memory allocated (bytes)", labels=labels),
            "GPUDeviceCoreLimit": GaugeMetricFamily("GPUDeviceCoreLimit", "Device core limit", labels=labels),
            "GPUDeviceCoreAllocated": GaugeMetricFamily("GPUDeviceCoreAllocated", "Device cores allocated",
                                                        labels=labels),
            "GPUDeviceSharedNum": GaugeMetricFamily("GPUDeviceSharedNum", "Containers sharing the device",
                                                    labels=labels),
        }
        with self.cache.lock:
            for node in self.cache.nodes.values():
                for d in node.devices:
                    lv = [node.name, d.id, str(d.index)]
                    fams["GPUDeviceMemoryLimit"].add_metric(lv, d.totalmem * 1024 * 1024)
                    fams["GPUDeviceMemoryAllocated"].add_metric(lv, d.usedmem * 1024 * 1024)
                    fams["GPUDeviceCoreLimit"].add_metric(lv, d.totalcore)
                    fams["GPUDeviceCoreAllocated"].add_metric(lv, d.usedcores)
                    fams["GPUDeviceSharedNum"].add_metric(lv, d.used)
            n_nodes, n_pods = len(self.cache.nodes), len(self.cache.pods)
        yield from fams.values()
        g = GaugeMetricFamily("hami_scheduler_cache_nodes", "Nodes with GPUs in the usage cache")
        g.add_metric([], n_nodes)
        yield g
        g = GaugeMetricFamily("hami_scheduler_cache_pods", "Pods with GPU allocations in the usage cache")
        g.add_metric([], n_pods)
        yield g


class SchedulerMetrics:
    def __init__(self, cache: Any, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("hami_scheduler_requests", "Extender requests by verb and result",
                                ["verb", "result"], registry=self.registry)
        self.latency = Histogram("hami_scheduler_request_duration_seconds", "Extender request latency",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.node_failures = Counter("hami_scheduler_filter_node_failures",
                                     "Nodes /filter found unfit for a pod, by reason (a node counts once per "
                                     "reason it gave)", ["reason"], registry=self.registry)
        # GPU preemption from /filter (--preemption extender): attempts by result (preempted: a hold and
        # its victims; none: no node could be helped; stale: the chosen node changed during the dry run;
        # error: the hold could not be recorded), and victims
        self.preemptions = Counter("hami_scheduler_preemption_attempts",
                                   "GPU preemptions /filter attempted, by result", ["result"],
                                   registry=self.registry)
        self.preemption_victims = Counter("hami_scheduler_preemption_victims",
                                          "Pods /filter chose to preempt", registry=self.registry)
        self.preemption_holds = Gauge("hami_scheduler_preemption_holds",
                                      "Preemptors whose GPU capacity is held while their victims terminate",
                                      registry=self.registry)
        # from a preemptor's hold to its binding on the held node (the victims' grace period, teardown,
        # informer lag, requeue backoff, one cycle); holds rebuilt by a new leader are not observed
        self.preemption_wait = Histogram("hami_scheduler_preemption_wait_seconds",
                                         "Seconds from a GPU preemption's hold to the preemptor's binding on "
                                         "the held node", buckets=WAIT_BUCKETS, registry=self.registry)
        self.registry.register(_CacheCollector(cache))

    def count_node_failures(self, failed: Mapping[str, str]) -> None:
        """Count ``/filter``'s per-node failure texts (``"1/2 CardInsufficientMemory, ..."`` or a bare
        reason) by reason word. The label takes only the known reasons (bounded), anything else is
        ``Other``."""
        for text, n in collections.Counter(failed.values()).items():  # thousands of nodes share a few texts
            for reason in failure_reasons(text):
                self.node_failures.labels(reason).inc(n)


# the scheduler's own failure strings that are not one-word HAMi reasons, as label values
_OTHER_FAILURES = {R.NODE_UNREGISTERED: "NodeUnregistered", R.NODE_USAGE_UNAVAILABLE: "NodeUsageUnavailable",
                   R.DEVICE_TYPE_NOT_FOUND: "DeviceTypeNotFound"}


def failure_reasons(text: str) -> list[str]:
    """The reason words in one node's failure text, each one of ``ALL_REASONS``, the
    ``_OTHER_FAILURES`` names or ``Other``."""
    if text in _OTHER_FAILURES:
        return [_OTHER_FAILURES[text]]
    if text in R.ALL_REASONS:
        return [text]
    try:
        words = list(R.parse_reason(text))
    except ProtocolError:
        return ["Other"]
    return [w if w in R.ALL_REASONS else "Other" for w in words] or ["Other"]

"""Prometheus metrics of the device plugin, in a registry the plugin owns (no global state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector


class DelegatingCollector(Collector):
    """Re-exports the metrics of the *current* NVML supervisor. A paused plugin creates a new
    supervisor on resume; giving each its own registry and pointing this collector at the live one
    avoids duplicate-registration errors while ``hami_nvml_*`` stay on the plugin's /metrics."""

    def __init__(self) -> None:
        self.target: CollectorRegistry | None = None

    def collect(self):
        target = self.target
        if target is not None:
            yield from target.collect()


class BeforeCollect(Collector):
    """Registered first, so a scrape runs ``hook`` before the plugin's own gauges are read: gauges that
    follow a clock (the NVML snapshot's age) are brought up to date when someone reads them, not on a
    timer that wakes an idle node (issue 31). Exports nothing itself."""

    def __init__(self) -> None:
        self.hook: Callable[[], None] | None = None

    def describe(self) -> list:
        return []

    def collect(self):
        hook = self.hook
        if hook is not None:
            hook()
        return iter(())


# RPCs must answer in milliseconds; the tail buckets show deadline hits (default deadline 2 s).
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.before_collect = BeforeCollect()
        r.register(self.before_collect)
        self.rpc_duration = Histogram(
            "hami_device_plugin_rpc_duration_seconds", "Latency of kubelet device-plugin RPCs as served",
            ["method", "resource"], registry=r, buckets=RPC_BUCKETS)
        self.rpc_errors = Counter(
            "hami_device_plugin_rpc_errors_total", "Device-plugin RPCs answered with an error",
            ["method", "resource", "code"], registry=r)
        self.allocations = Counter(
            "hami_device_plugin_allocations_total", "Allocate calls by outcome",
            ["resource", "result"], registry=r)
        self.devices = Gauge(
            "hami_device_plugin_devices", "Advertised device IDs by health",
            ["resource", "health"], registry=r)
        self.registrations = Counter(
            "hami_device_plugin_registrations_total", "Successful Register calls to the kubelet",
            ["resource"], registry=r)
        self.reregistrations = Counter(
            "hami_device_plugin_reregistrations_total",
            "Re-registrations after a kubelet restart or a deleted plugin socket",
            ["resource", "cause"], registry=r)
        self.server_restarts = Counter(
            "hami_device_plugin_grpc_server_restarts_total", "gRPC server (re)starts after a failure",
            ["resource"], registry=r)
        self.nvml_stuck = Gauge(
            "hami_device_plugin_nvml_stuck", "1 while the NVML worker is stuck in a call", registry=r)
        self.nvml_status = Gauge(
            "hami_device_plugin_nvml_status", "NVML supervisor status (1 for the current one)",
            ["status"], registry=r)
        self.nvml_snapshot_age = Gauge(
            "hami_device_plugin_nvml_snapshot_age_seconds", "Age of the inventory snapshot served",
            registry=r)
        self.nvml_call_duration = Gauge(
            "hami_device_plugin_nvml_last_call_seconds",
            "Duration of the supervisor's last NVML call by function (when the supervisor reports it)",
            ["call"], registry=r)
        self.nvml = DelegatingCollector()
        r.register(self.nvml)
        self.paused = Gauge(
            "hami_device_plugin_paused", "1 while paused for a MIG reconfiguration", registry=r)
        self.mig_lock_untrusted = Gauge(
            "hami_mig_apply_lock_untrusted", "1 while a MIG apply lock file exists that is not trusted (not "
            "root's, or group/other-writable) and is therefore ignored", registry=r)

"""Prometheus metrics of the DRA driver, in a registry the driver owns (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hami_agent.deviceplugin.metrics import RPC_BUCKETS, DelegatingCollector


class DraMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rpc_duration = Histogram(
            "hami_dra_rpc_duration_seconds", "Latency of kubelet DRA RPCs as served", ["method"], registry=r,
            buckets=RPC_BUCKETS)
        self.rpc_errors = Counter(
            "hami_dra_rpc_errors_total", "Kubelet DRA RPCs answered with a gRPC error", ["method", "code"],
            registry=r)
        self.claims = Counter(
            "hami_dra_claims_total", "Claims prepared/unprepared, by outcome", ["operation", "result"],
            registry=r)
        self.prepared = Gauge("hami_dra_prepared_claims", "Claims prepared on this node", registry=r)
        self.devices = Gauge("hami_dra_devices", "Published devices by health", ["health"], registry=r)
        self.slice_writes = Counter(
            "hami_dra_resourceslice_writes_total", "ResourceSlice writes by kind", ["operation"], registry=r)
        self.nvml_stuck = Gauge("hami_dra_nvml_stuck", "1 while the NVML worker is stuck", registry=r)
        self.paused = Gauge("hami_dra_paused", "1 while paused for MIG reconfiguration", registry=r)
        self.nvml = DelegatingCollector()  # hami_nvml_* of the current supervisor
        r.register(self.nvml)

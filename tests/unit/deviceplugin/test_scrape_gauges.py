"""The device plugin's NVML gauges are brought up to date by the scrape that reads them, not by a timer
that wakes an idle node every few seconds (issue 31)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from hami_agent.deviceplugin.manager import DevicePluginManager
from hami_agent.deviceplugin.metrics import PluginMetrics
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings

pytestmark = pytest.mark.unit


@dataclass
class _Snap:
    status: str = "ok"
    taken_at: float = field(default_factory=time.time)
    generation: int = 1


class _Source:
    def __init__(self) -> None:
        self.snap = _Snap()
        self.reads = 0

    def snapshot(self) -> _Snap:
        self.reads += 1
        return self.snap

    def call_durations(self) -> dict[str, float]:
        return {"nvmlDeviceGetCount": 0.0002}


def _manager() -> tuple[DevicePluginManager, PluginMetrics, CollectorRegistry]:
    metrics = PluginMetrics()
    manager = DevicePluginManager(PluginSettings(node_name="gpu-1"), lambda: None, MemoryPodSource("gpu-1"),
                                  metrics)
    return manager, metrics, metrics.registry


def test_a_scrape_reads_the_snapshot_as_of_now() -> None:
    manager, _metrics, registry = _manager()
    source = _Source()
    manager.source = source
    try:
        source.snap = _Snap(status="stuck", taken_at=time.time() - 42)
        age = registry.get_sample_value("hami_device_plugin_nvml_snapshot_age_seconds")
        assert age is not None and 41 <= age < 60  # computed by this very read
        assert registry.get_sample_value("hami_device_plugin_nvml_stuck") == 1
        assert registry.get_sample_value("hami_device_plugin_nvml_status", {"status": "stuck"}) == 1
        assert registry.get_sample_value("hami_device_plugin_nvml_last_call_seconds",
                                         {"call": "nvmlDeviceGetCount"}) == 0.0002
        source.snap = _Snap(status="ok")
        assert registry.get_sample_value("hami_device_plugin_nvml_stuck") == 0  # the next scrape follows
        assert source.reads >= 2
    finally:
        manager.allocator.close()


def test_a_paused_plugin_keeps_its_last_gauges() -> None:
    manager, _metrics, registry = _manager()
    source = _Source()
    manager.source = source
    try:
        assert registry.get_sample_value("hami_device_plugin_nvml_status", {"status": "ok"}) == 1
        manager.paused = True
        reads = source.reads
        source.snap = _Snap(status="stuck")
        assert registry.get_sample_value("hami_device_plugin_nvml_status", {"status": "ok"}) == 1
        assert source.reads == reads  # NVML's supervisor is not even asked while paused
    finally:
        manager.allocator.close()

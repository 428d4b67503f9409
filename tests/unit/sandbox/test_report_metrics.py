"""The demo report's dashboard picture, rendered from /metrics texts (the demo itself needs podman)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from sandbox.report import write_html
from sandbox.report_metrics import panels_html

pytestmark = pytest.mark.unit

GIB = 2**30
SCHEDULER = f"""# TYPE GPUDeviceMemoryLimit gauge
GPUDeviceMemoryLimit{{nodeid="gpu-1",deviceuuid="GPU-a",deviceidx="0"}} {16 * GIB}
GPUDeviceMemoryLimit{{nodeid="gpu-1",deviceuuid="GPU-b",deviceidx="1"}} {16 * GIB}
# TYPE GPUDeviceMemoryAllocated gauge
GPUDeviceMemoryAllocated{{nodeid="gpu-1",deviceuuid="GPU-a",deviceidx="0"}} {8 * GIB}
GPUDeviceMemoryAllocated{{nodeid="gpu-1",deviceuuid="GPU-b",deviceidx="1"}} 0
# TYPE GPUDeviceCoreLimit gauge
GPUDeviceCoreLimit{{nodeid="gpu-1",deviceuuid="GPU-a",deviceidx="0"}} 100
# TYPE GPUDeviceCoreAllocated gauge
GPUDeviceCoreAllocated{{nodeid="gpu-1",deviceuuid="GPU-a",deviceidx="0"}} 30
# TYPE hami_scheduler_requests_total counter
hami_scheduler_requests_total{{verb="filter",result="scheduled"}} 3
hami_scheduler_requests_total{{verb="filter",result="unschedulable"}} 1
# TYPE hami_scheduler_filter_node_failures_total counter
hami_scheduler_filter_node_failures_total{{reason="CardInsufficientMemory"}} 2
"""
PLUGIN = """# TYPE hami_device_plugin_devices gauge
hami_device_plugin_devices{resource="nvidia.com/gpu",health="Healthy"} 20
hami_device_plugin_devices{resource="nvidia.com/gpu",health="Unhealthy"} 4
# TYPE hami_device_plugin_nvml_stuck gauge
hami_device_plugin_nvml_stuck 1
# TYPE hami_device_plugin_rpc_duration_seconds histogram
hami_device_plugin_rpc_duration_seconds_sum{method="Allocate",resource="nvidia.com/gpu"} 0.5
hami_device_plugin_rpc_duration_seconds_count{method="Allocate",resource="nvidia.com/gpu"} 4
"""


def _bar(out: str, label: str) -> str:
    """The value text drawn after the bar labelled ``label``."""
    m = re.search(re.escape(f">{label}</text>") + r"<rect[^>]*/><text[^>]*>([^<]*)</text>", out)
    assert m, (label, out[:2000])
    return m.group(1)


def test_panels_show_the_dashboards_current_values():
    out = panels_html({"scheduler": SCHEDULER, "plugin gpu-1": PLUGIN, "plugin gpu-2": ""})
    assert _bar(out, "gpu-1 allocated") == "8.0 GiB" and _bar(out, "gpu-1 capacity") == "32.0 GiB"
    assert _bar(out, "gpu-1 Healthy") == "20" and _bar(out, "gpu-1 Unhealthy") == "4"
    assert _bar(out, "gpu-1 stuck") == "1"
    assert _bar(out, "gpu-1 Allocate mean") == "125.0 ms"
    assert _bar(out, "filter unschedulable requests") == "1"
    assert _bar(out, "CardInsufficientMemory nodes") == "2"
    assert "Not scraped (down or unreachable): plugin gpu-2" in out
    assert "dashboards/hami-node.json" in out


def test_nothing_scraped_or_garbage_draws_empty_panels_and_never_raises():
    out = panels_html({"scheduler": "not { metrics", "plugin gpu-1": "<script>"})
    assert out.count("no samples") >= 5 and "<script>" not in out


def test_report_embeds_the_panels(tmp_path):
    check = SimpleNamespace(step="f", ok=True, name="n", detail="d")
    path = tmp_path / "report.html"
    write_html(path, [check], {}, 1.0, panels_html({"scheduler": SCHEDULER}))
    text = path.read_text()
    assert "<h2>Dashboard</h2>" in text and "<svg" in text

"""The demo report's picture of the Grafana dashboard (dashboards/hami-node.json): the same panels,
drawn as inline SVG bars from one scrape of the sandbox's ``/metrics`` at the end of the demo.

One scrape has no history, so time series become current values: per-node memory and cores allocated vs
capacity (extender), devices by health and NVML stuck (each node's device plugin), /filter results and
nodes refused by reason (extender counters), and the mean RPC latency per method (``_sum / _count``).
The sandbox runs no ``hami-agent monitor``, so the "used" and per-pod panels are not drawn here.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = "dashboards/hami-node.json"
BAR_W, ROW_H, LABEL_W = 360, 18, 220


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of one ``/metrics`` text; an unparsable text gives nothing."""
    try:
        return [(s.name, dict(s.labels), float(s.value))
                for fam in text_string_to_metric_families(text) for s in fam.samples]
    except ValueError:
        return []


def _sum_by(rows: Iterable[tuple[str, dict[str, str], float]], name: str, *keys: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for n, labels, value in rows:
        if n == name:
            out[" ".join(labels.get(k, "") for k in keys)] += value
    return dict(out)


def _bars(title: str, series: dict[str, dict[str, float]], unit: str = "") -> str:
    """One panel: for each key, one bar per series (e.g. allocated, capacity), scaled to the largest."""
    keys = sorted({k for values in series.values() for k in values})
    if not keys:
        return f"<h3>{html.escape(title)}</h3><p><em>no samples</em></p>"
    top = max((v for values in series.values() for v in values.values()), default=0) or 1.0
    colors = ("#3b7dd8", "#e59c2b", "#5aa454", "#b84a62")
    rows, y = [], 0
    for key in keys:
        for i, (name, values) in enumerate(series.items()):
            value = values.get(key, 0.0)
            width = max(1, round(BAR_W * value / top)) if value else 0
            label = f"{key} {name}".strip()
            rows.append(f'<text x="0" y="{y + 13}" font-size="12">{html.escape(label)}</text>'
                        f'<rect x="{LABEL_W}" y="{y + 2}" width="{width}" height="{ROW_H - 4}" '
                        f'fill="{colors[i % len(colors)]}"/>'
                        f'<text x="{LABEL_W + width + 4}" y="{y + 13}" font-size="12">'
                        f'{html.escape(_fmt(value, unit))}</text>')
            y += ROW_H
    width = LABEL_W + BAR_W + 90
    return (f"<h3>{html.escape(title)}</h3><svg xmlns='http://www.w3.org/2000/svg' width='{width}'"
            f" height='{y}' role='img' aria-label='{html.escape(title)}'>{''.join(rows)}</svg>")


def _fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 2**30:.1f} GiB"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    return f"{value:g}{unit}"


def panels_html(scrapes: dict[str, str]) -> str:
    """The panels from ``{"scheduler": text, "plugin <node>": text, ...}``; sources that could not be
    scraped (empty text) are listed as such."""
    sched = samples(scrapes.get("scheduler", ""))
    plugins = {src.split(" ", 1)[1]: samples(text) for src, text in scrapes.items()
               if src.startswith("plugin ")}
    parts = [f"<p>Drawn from one scrape at the end of the demo; the same panels over time: "
             f"<code>{DASHBOARD}</code> in Grafana (docs/dashboards.md).</p>"]
    missing = sorted(src for src, text in scrapes.items() if not text)
    if missing:
        parts.append(f"<p>Not scraped (down or unreachable): {html.escape(', '.join(missing))}</p>")
    parts.append(_bars("GPU memory per node: allocated vs capacity", {
        "allocated": _sum_by(sched, "GPUDeviceMemoryAllocated", "nodeid"),
        "capacity": _sum_by(sched, "GPUDeviceMemoryLimit", "nodeid")}, "bytes"))
    parts.append(_bars("GPU cores per node: allocated vs capacity (gpucores)", {
        "allocated": _sum_by(sched, "GPUDeviceCoreAllocated", "nodeid"),
        "capacity": _sum_by(sched, "GPUDeviceCoreLimit", "nodeid")}))
    health: dict[str, dict[str, float]] = defaultdict(dict)
    stuck: dict[str, float] = {}
    latency: dict[str, float] = {}
    for node, rows in sorted(plugins.items()):
        for h, v in _sum_by(rows, "hami_device_plugin_devices", "health").items():
            health[h][node] = v
        stuck[node] = max((v for n, _, v in rows if n == "hami_device_plugin_nvml_stuck"), default=0.0)
        sums = _sum_by(rows, "hami_device_plugin_rpc_duration_seconds_sum", "method")
        counts = _sum_by(rows, "hami_device_plugin_rpc_duration_seconds_count", "method")
        for method, total in sums.items():
            if counts.get(method):
                latency[f"{node} {method}"] = total / counts[method]
    parts.append(_bars("Devices advertised to the kubelet, by health", dict(health)))
    parts.append(_bars("NVML stuck (1 = a call is past its deadline)", {"stuck": stuck}))
    parts.append(_bars("Device plugin RPC latency (mean since start)", {"mean": latency}, "s"))
    results = _sum_by(sched, "hami_scheduler_requests_total", "verb", "result")
    parts.append(_bars("Extender requests by verb and result (since start)", {"requests": results}))
    parts.append(_bars("Nodes refused by reason (since start)", {
        "nodes": _sum_by(sched, "hami_scheduler_filter_node_failures_total", "reason")}))
    return "\n".join(parts)

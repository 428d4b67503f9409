"""Evidence from the scheduler's and the device plugin's ``/healthz`` and ``/metrics`` endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request

from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.model import Facts


def _get(url: str, timeout_s: float) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - operator-given URL
            return resp.status, resp.read(4 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(4096).decode("utf-8", "replace") if exc.fp else ""


def _endpoint(prefix: str, base: str, ctx: Context, facts: Facts) -> str | None:
    base = base.rstrip("/")
    try:
        code, body = _get(base + "/healthz", ctx.http_timeout_s)
        ok = code == 200
        facts.set(f"{prefix}.healthz.ok", ok, f"GET {base}/healthz -> {code} {body.strip()[:80]!r}")
    except (OSError, ValueError) as exc:  # refused, timeout, bad URL
        facts.set(f"{prefix}.healthz.ok", False, f"GET {base}/healthz failed: {exc}")
        facts.set(f"{prefix}.reachable", False)
        return None
    facts.set(f"{prefix}.reachable", True)
    try:
        code, body = _get(base + "/metrics", ctx.http_timeout_s)
    except (OSError, ValueError) as exc:
        facts.set(f"{prefix}.metrics.error", str(exc), f"GET {base}/metrics failed: {exc}")
        return None
    if code != 200:
        facts.set(f"{prefix}.metrics.error", f"HTTP {code}", f"GET {base}/metrics -> {code}")
        return None
    return body


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def collect_scheduler_endpoint(ctx: Context, facts: Facts) -> None:
    if not ctx.scheduler_url:
        return
    body = _endpoint("scheduler", ctx.scheduler_url, ctx, facts)
    if body is None:
        return
    samples = metric_samples(body)
    facts.set("scheduler.metrics.samples", len(samples))


def collect_plugin_endpoint(ctx: Context, facts: Facts) -> None:
    if not ctx.plugin_url:
        return
    body = _endpoint("plugin", ctx.plugin_url, ctx, facts)
    if body is None:
        return
    samples = metric_samples(body)
    facts.set("plugin.metrics.samples", len(samples))
    for name, labels, value in samples:
        if name == "hami_device_plugin_nvml_stuck":
            facts.set("plugin.metrics.nvml_stuck", value, f"{ctx.plugin_url} metric {name} = {value:g}")
        elif name == "hami_nvml_stuck_unkillable":
            facts.set("plugin.metrics.nvml_stuck_unkillable", value,
                      f"{ctx.plugin_url} metric {name} = {value:g}")
        elif name == "hami_device_plugin_nvml_status" and value == 1:
            facts.set("plugin.metrics.nvml_status", labels.get("status", ""),
                      f"{ctx.plugin_url} metric {name}{{status={labels.get('status')!r}}} = 1")
        elif name == "hami_device_plugin_devices" and labels.get("health") == "Unhealthy" and value > 0:
            facts.set("plugin.metrics.unhealthy_devices", value,
                      f"{ctx.plugin_url} metric {name}{labels} = {value:g}")

import threading
import time
import urllib.error
import urllib.request

import pytest

from hami_agent.deviceplugin.httpserver import OpsServer, parse_bind
from hami_agent.deviceplugin.metrics import PluginMetrics
from hami_agent.kubeletplugin import DeadlineExceeded, DeadlineRunner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_parse_bind():
    assert parse_bind(":9394") == ("", 9394)
    assert parse_bind("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_bind("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="--metrics-bind"):
        parse_bind("9394x")


def test_healthz_and_metrics_endpoints():
    m = PluginMetrics()
    m.allocations.labels("nvidia.com/gpu", "success").inc()
    state = {"ok": True}
    ops = OpsServer(
        "127.0.0.1:0", m.registry, lambda: (state["ok"], "ok" if state["ok"] else "socket missing")
    )
    ops.start()
    try:
        base = f"http://127.0.0.1:{ops.port}"
        assert get(base + "/healthz") == (200, "ok\n")
        state["ok"] = False
        assert get(base + "/healthz") == (503, "socket missing\n")
        code, body = get(base + "/metrics")
        assert code == 200
        assert 'hami_device_plugin_allocations_total{resource="nvidia.com/gpu",result="success"} 1.0' in body
        assert get(base + "/nope")[0] == 404
    finally:
        ops.stop()


def test_deadline_runner_returns_in_time_even_when_the_body_hangs():
    runner = DeadlineRunner(workers=2, deadline_s=0.2)
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="Allocate for 'x' did not finish within the 0.2s deadline"):
        runner.run(lambda _budget: release.wait(10), "Allocate for 'x'")
    assert time.monotonic() - t0 < 1.0
    assert runner.run(lambda _budget: 42, "quick") == 42  # the other worker still serves
    release.set()
    runner.shutdown()

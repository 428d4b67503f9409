"""The credential refresh hook runs at most once per period (``ThrottledRefresh``), not before every
request: the kubeconfig loader's hook re-applies the whole configuration each time."""

from __future__ import annotations

import pytest

from hami_agent.k8s.client import KubeClient, ThrottledRefresh
from tests.clock import ManualClock
from tests.integration.scheduler.cluster import gpu_node
from tests.sim.apiserver import ApiServer
from tests.sim.apiserver_auth import TokenTable

pytestmark = pytest.mark.unit


def test_the_hook_runs_once_per_period_and_a_failure_is_retried_at_the_next_request():
    clock = ManualClock()
    calls: list[float] = []
    fail = [False]

    def hook(cfg: dict) -> None:
        if fail[0]:
            raise RuntimeError("exec plugin failed")
        calls.append(clock())
        cfg["token"] = f"t{len(calls)}"

    cfg: dict = {}
    throttled = ThrottledRefresh(hook, period_s=10.0, clock=clock)
    throttled(cfg)
    clock.t += 9.9
    throttled(cfg)
    assert calls == [100.0] and cfg["token"] == "t1"
    clock.t += 0.1  # the period is over: the next request refreshes
    throttled(cfg)
    assert calls == [100.0, 110.0] and cfg["token"] == "t2"
    clock.t += 10
    fail[0] = True
    with pytest.raises(RuntimeError):
        throttled(cfg)
    fail[0] = False
    throttled(cfg)  # the failed refresh did not arm the throttle
    assert calls == [100.0, 110.0, 120.0] and cfg["token"] == "t3"


def test_a_kubeconfig_client_refreshes_its_credentials_once_for_many_requests(monkeypatch):
    """The kubeconfig loader's hook re-applies the configuration (``_set_config``) and installs itself
    again as it runs; the throttle must stay in front of it."""
    from kubernetes.config import kube_config

    applied = []
    original = kube_config.KubeConfigLoader._set_config

    def counting(self, configuration):
        applied.append(1)
        return original(self, configuration)

    monkeypatch.setattr(kube_config.KubeConfigLoader, "_set_config", counting)
    api = ApiServer(auth=TokenTable()).start()  # 401 without the kubeconfig's token
    try:
        api.create(gpu_node("n1", gpus=1, mem=1024))
        client = KubeClient.from_kubeconfig(api.kubeconfig_path)
        cfg = client._api.configuration
        at_load = len(applied)
        for _ in range(20):
            assert client.get_node("n1")["metadata"]["name"] == "n1"  # the token goes out every time
        assert isinstance(cfg.refresh_api_key_hook, ThrottledRefresh)
        assert len(applied) == at_load + 1  # the first request's refresh only
    finally:
        api.close()

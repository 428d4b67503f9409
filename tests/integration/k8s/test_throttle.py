"""Client-side rate limit: every request of a throttled client waits for a token (or fails when the wait
would outlast its timeout), and a view made with ``limiter=None`` is never throttled."""

from __future__ import annotations

import time

import pytest

from hami_agent.k8s import KubeClient, KubeTimeoutError
from hami_agent.k8s.ratelimit import RateLimiter
from tests.integration.k8s.conftest import node
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_throttled_client_waits_and_fails_past_its_timeout(api_server: ApiServer) -> None:
    api_server.create(node("gpu-1"))
    kube = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=0.5, qps=2.0, burst=1)
    try:
        kube.get_node("gpu-1")  # the burst token
        t0 = time.monotonic()
        kube.get_node("gpu-1")  # waits ~0.5 s for the next token
        assert time.monotonic() - t0 >= 0.4
        kube.limiter = RateLimiter(qps=0.1, burst=1)
        kube.get_node("gpu-1")
        with pytest.raises(KubeTimeoutError, match="client-side throttling"):
            kube.get_node("gpu-1")  # the next token is 10 s away: more than the 0.5 s timeout
    finally:
        kube.close()


def test_unthrottled_view_shares_the_pool_but_never_waits(api_server: ApiServer) -> None:
    api_server.create(node("gpu-1"))
    kube = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=2, qps=0.01, burst=1)
    try:
        fast = kube.with_options(timeout_s=1, attempts=1, limiter=None)
        assert kube.limiter is not None and fast.limiter is None
        kube.get_node("gpu-1")  # the throttled client's only token for the next 100 s
        t0 = time.monotonic()
        for _ in range(20):
            fast.patch_node_annotations("gpu-1", {"k": str(time.monotonic())})
        assert time.monotonic() - t0 < 5.0  # 20 writes, none waited for a 100 s token
        with pytest.raises(KubeTimeoutError):
            kube.get_node("gpu-1")
        same = kube.with_options(timeout_s=1)  # a view keeps its parent's limiter unless told otherwise
        assert same.limiter is kube.limiter
    finally:
        kube.close()

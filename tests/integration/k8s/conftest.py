from __future__ import annotations

from collections.abc import Iterator

import pytest

from hami_agent.k8s import KubeClient, RetryPolicy
from tests.sim.apiserver import ApiServer
from tests.sim.fixtures import api_server  # noqa: F401


@pytest.fixture
def kube(api_server: ApiServer) -> Iterator[KubeClient]:  # noqa: F811
    """The real client against the simulated server, with short timeouts and fast retries."""
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=3.0,
                                        retry=RetryPolicy(attempts=3, base_s=0.02, cap_s=0.2))
    try:
        yield client
    finally:
        client.close()


def node(name: str, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
            "status": {"allocatable": {"nvidia.com/gpu": "10"}}}


def pod(name: str, namespace: str = "default", node_name: str = "", labels: dict[str, str] | None = None,
        phase: str = "Pending") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "busybox"}]},
            "status": {"phase": phase}}

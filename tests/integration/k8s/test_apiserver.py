"""The simulated API server's watch, discovery and lifecycle, seen through real clients."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.k8s import ExpiredError, KubeClient
from tests.integration.k8s.conftest import node, pod
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_watch_delivers_changes_in_order(api_server: ApiServer, kube: KubeClient) -> None:
    _items, rv = kube.list("nodes")
    got: list[tuple[str, str, str]] = []

    def consume() -> None:
        with kube.watch("nodes", rv, timeout_s=2, allow_bookmarks=False) as w:
            for type_, obj in w:
                got.append((type_, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))
                if type_ == "DELETED":
                    return

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.1)
    kube.create("nodes", node("gpu-1"))
    kube.patch_node_annotations("gpu-1", {"a": "1"})
    kube.delete("nodes", "gpu-1")
    t.join(5)
    assert [(ty, n) for ty, n, _ in got] == [("ADDED", "gpu-1"), ("MODIFIED", "gpu-1"), ("DELETED", "gpu-1")]
    rvs = [int(r) for _, _, r in got]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def test_watch_from_zero_sends_current_state_and_timeout_ends_stream(api_server: ApiServer,
                                                                     kube: KubeClient) -> None:
    api_server.create(pod("a", node_name="gpu-1"))
    api_server.create(pod("b", node_name="gpu-2"))
    t0 = time.monotonic()
    with kube.watch("pods", "0", field_selector="spec.nodeName=gpu-1", timeout_s=1,
                    allow_bookmarks=False) as w:
        events = [(ty, o["metadata"]["name"]) for ty, o in w]
    assert events == [("ADDED", "a")]
    assert 0.9 <= time.monotonic() - t0 < 3


def test_watch_too_old_resource_version_is_410_expired(api_server: ApiServer, kube: KubeClient) -> None:
    _items, rv = kube.list("nodes")
    api_server.create(node("gpu-1"))
    api_server.compact()
    with pytest.raises(ExpiredError) as ei:
        with kube.watch("nodes", rv, timeout_s=5) as w:
            list(w)
    assert ei.value.status == 410
    assert ei.value.message.startswith(f"too old resource version: {rv} (")


def test_history_window_is_bounded() -> None:
    with ApiServer(history_limit=5) as api:
        client = KubeClient.from_kubeconfig(api.kubeconfig_path)
        _items, rv = client.list("nodes")
        for i in range(10):
            api.create(node(f"n{i}"))
        with pytest.raises(ExpiredError):
            with client.watch("nodes", rv, timeout_s=5) as w:
                list(w)
        client.close()


def test_bookmarks_carry_the_current_resource_version() -> None:
    with ApiServer(bookmark_interval_s=0.1) as api:
        client = KubeClient.from_kubeconfig(api.kubeconfig_path)
        _items, rv = client.list("pods")
        api.create(node("gpu-1"))  # another kind moves the global resourceVersion
        with client.watch("pods", rv, timeout_s=1) as w:
            marks = [o["metadata"]["resourceVersion"] for ty, o in w if ty == "BOOKMARK"]
        assert marks and int(marks[-1]) == api.store.current_rv()
        client.close()


def test_official_typed_client_and_watch_work_too(api_server: ApiServer) -> None:
    from kubernetes import client, config, watch

    api = config.new_client_from_config(api_server.kubeconfig_path)
    v1 = client.CoreV1Api(api)
    v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
    v1.create_namespaced_pod("default", pod("p"))
    assert v1.read_node("gpu-1").metadata.name == "gpu-1"
    names = []
    for ev in watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=1):
        names.append((ev["type"], ev["object"].metadata.name))
    assert names == [("ADDED", "p")]
    assert client.VersionApi(api).get_code().git_version.startswith("v1.")
    assert "leases" in {r.name for r in client.CoordinationV1Api(api).get_api_resources().resources}
    api.close()


def test_restart_keeps_port_and_data(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    port, rv = api_server.port, api_server.store.current_rv()
    api_server.restart(down_s=0.1)
    assert api_server.port == port
    assert kube.get_node("gpu-1")["metadata"]["resourceVersion"] == str(rv)


def test_quota_and_lease_kinds(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create({"apiVersion": "v1", "kind": "ResourceQuota",
                       "metadata": {"name": "gpu", "namespace": "team"},
                       "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}})
    quotas = kube.list_resource_quotas("team")
    assert [q["spec"]["hard"] for q in quotas] == [{"limits.nvidia.com/gpumem": "1000"}]
    kube.create("leases", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "x"}}, "kube-system")
    assert kube.get_lease("kube-system", "l")["spec"]["holderIdentity"] == "x"


def test_errors_are_kubernetes_status_objects(api_server: ApiServer) -> None:
    import json
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(f"{api_server.url}/api/v1/namespaces/default/pods/nope", timeout=5)
    body = json.loads(ei.value.read())
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": 'pods "nope" not found', "reason": "NotFound", "code": 404,
                    "details": {"name": "nope", "kind": "pods"}}

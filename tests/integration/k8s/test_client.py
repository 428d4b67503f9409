"""KubeClient against the simulated API server over real HTTP with the real ``kubernetes`` client."""

from __future__ import annotations

import time

import pytest

from hami_agent.k8s import ConflictError, KubeClient, KubeError, KubeTimeoutError, NotFoundError, RetryPolicy
from hami_agent.k8s.errors import KubeConfigError
from tests.integration.k8s.conftest import node, pod
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_crud_and_merge_patch_semantics(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1", annotations={"keep": "1", "drop": "2"}))
    got = kube.get_node("gpu-1")
    assert got["metadata"]["annotations"] == {"keep": "1", "drop": "2"}
    out = kube.patch_node_annotations("gpu-1", {"drop": None, "new": "3"})
    assert out["metadata"]["annotations"] == {"keep": "1", "new": "3"}  # null deletes, others kept
    assert api_server.get("nodes", None, "gpu-1")["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    assert [n["metadata"]["name"] for n in kube.list_nodes()] == ["gpu-1"]

    created = kube.create("pods", pod("p1", namespace="ns1"), "ns1")
    assert created["status"]["phase"] == "Pending"
    assert created["metadata"]["uid"]
    kube.patch_pod_metadata("ns1", "p1", annotations={"hami.io/bind-phase": "allocating"},
                            labels={"hami.io/vgpu-node": "gpu-1"})
    p = kube.get_pod("ns1", "p1")
    assert p["metadata"]["annotations"]["hami.io/bind-phase"] == "allocating"
    assert p["metadata"]["labels"]["hami.io/vgpu-node"] == "gpu-1"
    kube.patch_pod_status("ns1", "p1", {"phase": "Running"})
    assert kube.get_pod("ns1", "p1")["status"]["phase"] == "Running"
    kube.delete("pods", "p1", "ns1")
    with pytest.raises(NotFoundError) as ei:
        kube.get_pod("ns1", "p1")
    assert str(ei.value) == 'get pod error: 404 Not Found on pod ns1/p1: pods "p1" not found'


def test_stale_resource_version_gives_conflict_error(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    rv = kube.get_node("gpu-1")["metadata"]["resourceVersion"]
    kube.patch_node_annotations("gpu-1", {"a": "1"}, resource_version=rv)
    with pytest.raises(ConflictError) as ei:
        kube.patch_node_annotations("gpu-1", {"a": "2"}, resource_version=rv)
    assert ei.value.summary == "patch node error: 409 Conflict on node gpu-1"
    assert ei.value.status == 409
    assert api_server.get("nodes", None, "gpu-1")["metadata"]["annotations"] == {"a": "1"}
    # conflicts are not retried: exactly two PATCH requests reached the server
    assert len(api_server.requests_matching("PATCH", r"/nodes/gpu-1$")) == 2


def test_update_with_resource_version(api_server: ApiServer, kube: KubeClient) -> None:
    kube.create("configmaps", {"metadata": {"name": "cm"}, "data": {"k": "v"}}, "default")
    cm = kube.get("configmaps", "cm", "default")
    cm["data"] = {"k": "w"}
    kube.replace("configmaps", cm)
    cm["data"] = {"k": "x"}  # still carries the old resourceVersion
    with pytest.raises(ConflictError):
        kube.replace("configmaps", cm)
    assert kube.get("configmaps", "cm", "default")["data"] == {"k": "w"}


def test_selectors(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(pod("a", node_name="gpu-1", labels={"app": "x"}, phase="Running"))
    api_server.create(pod("b", node_name="gpu-1", labels={"app": "y"}, phase="Succeeded"))
    api_server.create(pod("c", node_name="gpu-2", labels={"app": "x"}))
    api_server.create(pod("d", namespace="other", labels={"app": "x"}))

    def names(items: list[dict]) -> list[str]:
        return sorted(p["metadata"]["name"] for p in items)

    assert names(kube.list_pods(field_selector="spec.nodeName=gpu-1")) == ["a", "b"]
    assert names(kube.list_pods(field_selector="spec.nodeName=gpu-1,status.phase!=Succeeded")) == ["a"]
    assert names(kube.list_pods(label_selector="app=x")) == ["a", "c", "d"]
    assert names(kube.list_pods("default", label_selector="app in (x,y)")) == ["a", "b", "c"]
    assert names(kube.list_pods(field_selector="metadata.name=d")) == ["d"]
    assert names(kube.list_pods(field_selector="spec.nodeName=")) == ["d"]
    with pytest.raises(KubeError) as ei:
        kube.list_pods(field_selector="spec.bogus=1")
    assert ei.value.status == 400 and "field label not supported: spec.bogus" in str(ei.value)


def test_binding(api_server: ApiServer, kube: KubeClient) -> None:
    created = api_server.create(pod("p"))
    with pytest.raises(ConflictError, match="Precondition failed"):
        kube.bind_pod("default", "p", "gpu-1", uid="not-the-uid")
    kube.bind_pod("default", "p", "gpu-1", uid=created["metadata"]["uid"])
    assert kube.get_pod("default", "p")["spec"]["nodeName"] == "gpu-1"
    with pytest.raises(ConflictError) as ei:
        kube.bind_pod("default", "p", "gpu-2")
    assert 'pod p is already assigned to node "gpu-1"' in str(ei.value)
    with pytest.raises(NotFoundError):
        kube.bind_pod("default", "missing", "gpu-1")


def test_events_are_created_then_aggregated(api_server: ApiServer, kube: KubeClient) -> None:
    p = api_server.create(pod("p"))
    msg = "no available node, 2 nodes do not meet"
    kube.create_event(p, "Warning", "FilteringFailed", msg, "hami-scheduler")
    kube.create_event(p, "Warning", "FilteringFailed", msg, "hami-scheduler")
    kube.create_event(p, "Normal", "BindingSucceed", "Successfully binding node [gpu-1] to default/p",
                      "hami-scheduler")
    events = api_server.list("events", "default")
    by_reason = {e["reason"]: e for e in events}
    assert len(events) == 2
    failed = by_reason["FilteringFailed"]
    assert failed["count"] == 2 and failed["type"] == "Warning"
    assert failed["involvedObject"] == {"kind": "Pod", "name": "p", "namespace": "default",
                                        "uid": p["metadata"]["uid"], "apiVersion": "v1",
                                        "resourceVersion": p["metadata"]["resourceVersion"]}
    assert failed["source"] == {"component": "hami-scheduler"}
    assert failed["firstTimestamp"] and failed["lastTimestamp"]
    n = api_server.create(node("gpu-1"))
    ev = kube.create_event(n, "Warning", "AsymmetricGPUP2PLink", "asymmetric", "hami-device-plugin")
    assert ev["metadata"]["namespace"] == "default" and ev["involvedObject"]["kind"] == "Node"


def test_transient_errors_are_retried_with_backoff(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    api_server.inject_fault(503, method="GET", path_regex="/nodes/gpu-1", times=2)
    assert kube.get_node("gpu-1")["metadata"]["name"] == "gpu-1"
    assert len(api_server.requests_matching("GET", "/nodes/gpu-1")) == 3
    api_server.inject_fault(500, method="GET", path_regex="/nodes/gpu-1", times=5)
    with pytest.raises(KubeError) as ei:
        kube.get_node("gpu-1")
    assert ei.value.summary == "get node error: 500 Internal Server Error on node gpu-1"
    api_server.clear_faults()
    # 429 with Retry-After is honoured (capped by the policy)
    api_server.inject_fault(429, method="PATCH", times=1, retry_after=1)
    t0 = time.monotonic()
    kube.patch_node_annotations("gpu-1", {"x": "1"})
    assert time.monotonic() - t0 >= 0.2  # cap_s of the test policy


def test_create_is_not_retried_after_a_server_error(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.inject_fault(500, method="POST", path_regex="/pods$", times=1)
    with pytest.raises(KubeError) as ei:
        kube.create("pods", pod("p"))
    assert ei.value.status == 500
    assert len(api_server.requests_matching("POST", "/pods$")) == 1
    api_server.inject_fault(503, method="POST", path_regex="/pods$", times=1)
    kube.create("pods", pod("p"))  # 503 means "not processed": retried
    assert len(api_server.requests_matching("POST", "/pods$")) == 3


def test_timeout_is_bounded_and_named(api_server: ApiServer) -> None:
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=0.3,
                                        retry=RetryPolicy(attempts=1))
    api_server.create(node("gpu-1"))
    api_server.inject_fault(None, method="GET", delay_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(KubeTimeoutError) as ei:
        client.get_node("gpu-1")
    assert time.monotonic() - t0 < 3.0  # the 0.3 s timeout, not the server's 5 s (room for a shared machine)
    assert ei.value.summary == "get node error: timeout on node gpu-1"
    client.close()


def test_connection_refused_then_recovery(api_server: ApiServer) -> None:
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=2.0,
                                        retry=RetryPolicy(attempts=1))
    api_server.create(node("gpu-1"))
    assert client.get_node("gpu-1")
    api_server.stop()
    with pytest.raises(KubeError) as ei:
        client.get_node("gpu-1")
    assert ei.value.summary == "get node error: connection refused on node gpu-1"
    api_server.start()
    assert client.get_node("gpu-1")["metadata"]["name"] == "gpu-1"  # same port, same data
    client.close()


def test_kubeconfig_sources(api_server: ApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", api_server.kubeconfig_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    client = KubeClient.from_kubeconfig(None)
    assert client.host == api_server.url
    client.close()
    monkeypatch.delenv("KUBECONFIG")
    with pytest.raises(KubeConfigError, match="no Kubernetes credentials found: pass --kubeconfig"):
        KubeClient.from_kubeconfig(None)
    bad = tmp_path / "bad"
    bad.write_text("not: [a kubeconfig")
    with pytest.raises(KubeConfigError, match=f"cannot load Kubernetes credentials from kubeconfig {bad}"):
        KubeClient.from_kubeconfig(str(bad))


def test_a_write_whose_answer_is_not_read_is_not_decoded(api_server: ApiServer, kube: KubeClient,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import hami_agent.k8s.client as client_module
    from hami_agent.k8s import wirejson

    api_server.create(node("gpu-1"))
    decoded: list[bytes] = []

    class SpyDecoder:  # the client's decoder, counting what it decodes (the in-process server's is apart)
        @staticmethod
        def loads(data):
            decoded.append(data)
            return wirejson.loads(data)

    monkeypatch.setattr(client_module, "wirejson", SpyDecoder)
    assert kube.patch_node_annotations("gpu-1", {"a": "1"}, decode=False) == {}
    assert api_server.get("nodes", None, "gpu-1")["metadata"]["annotations"]["a"] == "1"  # written
    assert decoded == []  # the 5-15 KB answer was read off the wire, not parsed
    stale = {"a": "2"}
    with pytest.raises(ConflictError, match="Operation cannot be fulfilled"):  # an error is decoded as ever
        kube.patch_node_annotations("gpu-1", stale, resource_version="1", decode=False)
    assert len(decoded) == 1
    assert kube.patch_node_annotations("gpu-1", {"a": "3"})["metadata"]["annotations"]["a"] == "3"
    assert len(decoded) == 2  # the spy sees a success's answer when it is asked for

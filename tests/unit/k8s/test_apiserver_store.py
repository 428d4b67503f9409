"""The simulated API server's store: merge-patch semantics, selectors, conflicts, history window."""

from __future__ import annotations

import pytest

from tests.sim.apiserver_store import (
    ApiError,
    Store,
    json_patch,
    merge_patch,
    parse_field_selector,
    parse_label_selector,
    resource_for_kind,
)

pytestmark = pytest.mark.unit

PODS = resource_for_kind("pods")
NODES = resource_for_kind("nodes")


def _pod(name: str, node: str = "", labels: dict | None = None, phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}, "status": {"phase": phase}}


def test_merge_patch_rfc7386() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "k": "v"}
    out = merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3], "k": None})
    assert out == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "k": "v"}  # not mutated


def test_json_patch_subset() -> None:
    doc = {"metadata": {"annotations": {"x": "1"}}}
    out = json_patch(doc, [{"op": "add", "path": "/metadata/annotations/hami.io~1lock", "value": "v"},
                           {"op": "remove", "path": "/metadata/annotations/x"}])
    assert out == {"metadata": {"annotations": {"hami.io/lock": "v"}}}
    with pytest.raises(ApiError) as ei:
        json_patch(doc, [{"op": "test", "path": "/metadata/annotations/x", "value": "2"}])
    assert ei.value.code == 422


@pytest.mark.parametrize(("selector", "labels", "ok"), [
    ("app=a", {"app": "a"}, True),
    ("app==a", {"app": "b"}, False),
    ("app!=a", {}, True),
    ("app", {"app": ""}, True),
    ("!app", {"app": "x"}, False),
    ("env in (prod, dev),tier notin (db)", {"env": "dev", "tier": "web"}, True),
    ("env in (prod, dev),tier notin (db)", {"env": "dev", "tier": "db"}, False),
    ("hami.io/vgpu-node=gpu-1", {"hami.io/vgpu-node": "gpu-1"}, True),
])
def test_label_selector(selector: str, labels: dict, ok: bool) -> None:
    assert parse_label_selector(selector)({"metadata": {"labels": labels}}) is ok


def test_field_selector_and_unsupported_field() -> None:
    pred = parse_field_selector("spec.nodeName=gpu-1,status.phase!=Succeeded", PODS)
    assert pred(_pod("a", "gpu-1"))
    assert not pred(_pod("a", "gpu-2"))
    assert not pred(_pod("a", "gpu-1", phase="Succeeded"))
    assert parse_field_selector("spec.nodeName=", PODS)(_pod("unbound"))
    with pytest.raises(ApiError) as ei:
        parse_field_selector("spec.foo=bar", PODS)
    assert ei.value.code == 400 and ei.value.message == "field label not supported: spec.foo"


def test_stale_resource_version_conflicts_and_noop_keeps_rv() -> None:
    s = Store()
    node = s.create(NODES, "", {"metadata": {"name": "gpu-1"}})
    rv = node["metadata"]["resourceVersion"]
    n2 = s.patch(NODES, "", "gpu-1", "application/merge-patch+json",
                 {"metadata": {"resourceVersion": rv, "annotations": {"a": "1"}}})
    assert int(n2["metadata"]["resourceVersion"]) > int(rv)
    with pytest.raises(ApiError) as ei:
        s.patch(NODES, "", "gpu-1", "application/merge-patch+json",
                {"metadata": {"resourceVersion": rv, "annotations": {"a": "2"}}})
    assert ei.value.code == 409
    assert "the object has been modified" in ei.value.message
    same = s.patch(NODES, "", "gpu-1", "application/merge-patch+json",
                   {"metadata": {"annotations": {"a": "1"}}})
    assert same["metadata"]["resourceVersion"] == n2["metadata"]["resourceVersion"]


def test_status_subresource_rules() -> None:
    s = Store()
    s.create(PODS, "default", _pod("p"))
    out = s.patch(PODS, "default", "p", "application/merge-patch+json", {"status": {"phase": "Running"}})
    assert out["status"]["phase"] == "Pending"  # main resource ignores status
    out = s.patch(PODS, "default", "p", "application/merge-patch+json", {"status": {"phase": "Running"},
                                                                         "spec": {"nodeName": "x"}}, "status")
    assert out["status"]["phase"] == "Running" and out["spec"]["nodeName"] == ""


def test_history_window_expires_old_resource_versions() -> None:
    s = Store(history_limit=3)
    start = s.current_rv()
    for i in range(5):
        s.create(NODES, "", {"metadata": {"name": f"n{i}"}})
    assert s.expired(start)
    assert not s.expired(s.current_rv() - 1)
    assert [e.rv for e in s.entries_after(s.current_rv() - 2)] == [s.current_rv() - 1, s.current_rv()]


def test_binding_rules() -> None:
    s = Store()
    s.create(PODS, "default", _pod("p"))
    s.bind("default", "p", {"target": {"kind": "Node", "name": "gpu-1"}})
    pod = s.get(PODS, "default", "p")
    assert pod["spec"]["nodeName"] == "gpu-1"
    assert any(c["type"] == "PodScheduled" for c in pod["status"]["conditions"])
    with pytest.raises(ApiError) as ei:
        s.bind("default", "p", {"target": {"kind": "Node", "name": "gpu-2"}})
    assert ei.value.code == 409
    assert ei.value.message == ('Operation cannot be fulfilled on pods/binding "p": pod p is already '
                                'assigned to node "gpu-1"')

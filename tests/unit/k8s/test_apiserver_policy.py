"""The simulated API server's eviction, PodDisruptionBudget and graceful-deletion rules
(tests/sim/apiserver_policy.py), checked against the real code paths' behaviour without HTTP."""

from __future__ import annotations

import time

import pytest

from tests.sim.apiserver_policy import (
    BUDGET_MESSAGE,
    Policy,
    scaled_value,
    selector_matches,
)
from tests.sim.apiserver_store import ApiError, Store, resource_for_kind

pytestmark = pytest.mark.unit

PODS = resource_for_kind("pods")
PDBS = resource_for_kind("poddisruptionbudgets")
RS = resource_for_kind("replicasets")


def _pod(name: str, labels: dict | None = None, *, ready: bool = True, phase: str = "Running",
         node: str = "gpu-1", owner: dict | None = None) -> dict:
    md: dict = {"name": name, "namespace": "default", "labels": labels or {"app": "web"}}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True, **owner}]
    return {"metadata": md, "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pdb(name: str = "web", **spec: object) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}}


def _eviction(name: str, **delete_options: object) -> dict:
    body: dict = {"apiVersion": "policy/v1", "kind": "Eviction",
                  "metadata": {"name": name, "namespace": "default"}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


@pytest.fixture
def world() -> tuple[Store, Policy]:
    store = Store()
    return store, Policy(store, graceful_deletion=True)


def _status(store: Store, name: str = "web") -> dict:
    return store.get(PDBS, "default", name).get("status") or {}


def test_scaled_values_round_up_like_intstr() -> None:
    assert scaled_value(2, 10, "x") == 2
    assert scaled_value("25%", 4, "x") == 1
    assert scaled_value("25%", 5, "x") == 2  # 1.25 rounds up
    assert scaled_value("0%", 7, "x") == 0
    with pytest.raises(ValueError, match="integer or a percentage"):
        scaled_value("abc", 4, "spec.minAvailable")


def test_empty_selector_matches_nothing_and_expressions_work() -> None:
    assert not selector_matches({}, {"app": "web"})
    assert not selector_matches(None, {"app": "web"})
    sel = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]},
                                {"key": "canary", "operator": "DoesNotExist"}]}
    assert selector_matches(sel, {"tier": "gpu"})
    assert not selector_matches(sel, {"tier": "gpu", "canary": "1"})


def test_min_available_budget_refuses_with_the_real_status_and_spends_one_per_eviction(world) -> None:
    store, policy = world
    for i in range(3):
        store.create(PODS, "default", _pod(f"web-{i}"), seed=True)
    store.create(PDBS, "default", _pdb(minAvailable=2), seed=True)
    # before the controller has seen the budget, its status is older than its spec: 429, retry in 10 s
    with pytest.raises(ApiError) as ei:
        policy.evict("default", "web-0", _eviction("web-0"))
    assert ei.value.code == 429 and ei.value.retry_after == 10
    assert "still being processed" in ei.value.details["causes"][0]["message"]
    policy.sync_all()
    st = _status(store)
    assert (st["currentHealthy"], st["desiredHealthy"], st["expectedPods"]) == (3, 2, 3)
    assert st["disruptionsAllowed"] == 1
    assert st["conditions"][0]["reason"] == "SufficientPods"

    assert policy.evict("default", "web-0", _eviction("web-0"))["status"] == "Success"
    evicted = store.get(PODS, "default", "web-0")
    assert evicted["metadata"]["deletionTimestamp"]  # graceful: terminating, not gone
    st = _status(store)
    assert st["disruptionsAllowed"] == 0 and "web-0" in st["disruptedPods"]

    with pytest.raises(ApiError) as ei:
        policy.evict("default", "web-1", _eviction("web-1"))
    err = ei.value
    assert err.code == 429 and err.reason == "TooManyRequests" and err.message == BUDGET_MESSAGE
    assert err.retry_after is None and "retryAfterSeconds" not in err.details
    # the cause quotes the status as the controller last wrote it (3 healthy: web-0's eviction is not
    # counted yet), exactly like the real handler
    cause = "The disruption budget web needs 2 healthy pods and has 3 currently"
    assert err.details["causes"] == [{"reason": "DisruptionBudget", "message": cause}]
    assert store.get(PODS, "default", "web-1")["metadata"].get("deletionTimestamp") is None

    policy.sync_all()  # the terminating pod is not healthy, and it leaves disruptedPods
    st = _status(store)
    assert (st["currentHealthy"], st["disruptionsAllowed"]) == (2, 0) and "disruptedPods" not in st
    # a replacement becomes Ready: one disruption is allowed again
    store.create(PODS, "default", _pod("web-3"), seed=True)
    policy.sync_all()
    assert _status(store)["disruptionsAllowed"] == 1


def test_max_unavailable_percent_counts_the_replicaset_scale(world) -> None:
    store, policy = world
    rs = store.create(RS, "default", {"metadata": {"name": "web-rs"}, "spec": {"replicas": 4}}, seed=True)
    owner = {"name": "web-rs", "uid": rs["metadata"]["uid"]}
    for i in range(3):  # one replica is missing: expected 4, healthy 3
        store.create(PODS, "default", _pod(f"web-{i}", owner=owner), seed=True)
    store.create(PDBS, "default", _pdb(maxUnavailable="25%"), seed=True)
    policy.sync_all()
    st = _status(store)
    assert (st["expectedPods"], st["desiredHealthy"], st["currentHealthy"]) == (4, 3, 3)
    assert st["disruptionsAllowed"] == 0


def test_a_pod_whose_controller_is_missing_fails_safe(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0", owner={"name": "gone", "uid": "u-1"}), seed=True)
    store.create(PDBS, "default", _pdb(minAvailable="50%"), seed=True)
    policy.sync_all()
    st = _status(store)
    assert st["disruptionsAllowed"] == 0
    assert st["conditions"][-1]["reason"] == "SyncFailed"
    assert 'found no controllers for pod "web-0"' in st["conditions"][-1]["message"]


def test_pods_that_are_not_running_are_deleted_without_the_budget(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("done", phase="Succeeded"), seed=True)
    store.create(PODS, "default", _pod("pending", phase="Pending", node=""), seed=True)
    store.create(PDBS, "default", _pdb(minAvailable=5), seed=True)
    policy.sync_all()
    for name in ("done", "pending"):
        policy.evict("default", name, _eviction(name))
        with pytest.raises(ApiError):
            store.get(PODS, "default", name)  # terminal and unbound pods go at once
    assert _status(store)["disruptionsAllowed"] == 0


def test_unready_pod_is_evicted_outside_the_budget_only_while_the_budget_is_met(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0"), seed=True)
    store.create(PODS, "default", _pod("web-1"), seed=True)
    store.create(PODS, "default", _pod("sick", ready=False), seed=True)
    store.create(PDBS, "default", _pdb(minAvailable=2), seed=True)
    policy.sync_all()
    assert _status(store)["disruptionsAllowed"] == 0
    policy.evict("default", "sick", _eviction("sick"))  # healthy 2 >= desired 2: allowed, budget unspent
    assert store.get(PODS, "default", "sick")["metadata"]["deletionTimestamp"]
    assert "disruptedPods" not in _status(store)


def test_unready_pod_with_budget_unmet_needs_always_allow(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0"), seed=True)
    store.create(PODS, "default", _pod("sick", ready=False), seed=True)
    store.create(PDBS, "default", _pdb(minAvailable=2), seed=True)
    policy.sync_all()
    with pytest.raises(ApiError) as ei:
        policy.evict("default", "sick", _eviction("sick"))
    assert ei.value.code == 429
    store.patch(PDBS, "default", "web", "application/merge-patch+json",
                {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})
    assert store.get(PDBS, "default", "web")["metadata"]["generation"] == 2
    policy.sync_all()
    policy.evict("default", "sick", _eviction("sick"))
    assert store.get(PODS, "default", "sick")["metadata"]["deletionTimestamp"]


def test_two_budgets_for_one_pod_is_an_error(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0"), seed=True)
    store.create(PDBS, "default", _pdb("a", minAvailable=0), seed=True)
    store.create(PDBS, "default", _pdb("b", minAvailable=0), seed=True)
    policy.sync_all()
    with pytest.raises(ApiError) as ei:
        policy.evict("default", "web-0", _eviction("web-0"))
    assert ei.value.code == 500 and "more than one PodDisruptionBudget" in ei.value.message


def test_eviction_body_must_name_the_pod(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0"), seed=True)
    with pytest.raises(ApiError) as ei:
        policy.evict("default", "web-0", _eviction("other"))
    assert ei.value.code == 400 and "does not match" in ei.value.message
    with pytest.raises(ApiError) as ei:
        policy.evict("default", "nope", _eviction("nope"))
    assert ei.value.code == 404


def test_invalid_budget_is_refused_with_the_field_named(world) -> None:
    store, _policy = world
    with pytest.raises(ApiError) as ei:
        store.create(PDBS, "default", _pdb(minAvailable=1, maxUnavailable=1))
    assert ei.value.code == 422 and "minAvailable and maxUnavailable cannot be both set" in ei.value.message
    with pytest.raises(ApiError) as ei:
        store.create(PDBS, "default", _pdb(minAvailable="150%"))
    assert ei.value.code == 422 and "spec.minAvailable" in ei.value.message


def test_graceful_deletion_keeps_the_pod_until_its_kubelet_confirms(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0"), seed=True)
    store.create(PODS, "default", _pod("unbound", node=""), seed=True)
    pod = policy.delete_pod("default", "web-0", {"gracePeriodSeconds": 20})
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 20 and pod["metadata"]["deletionTimestamp"]
    # a client cannot take the deletion back
    store.patch(PODS, "default", "web-0", "application/merge-patch+json",
                {"metadata": {"deletionTimestamp": None, "labels": {"x": "1"}}})
    kept = store.get(PODS, "default", "web-0")["metadata"]
    assert kept["deletionTimestamp"] == pod["metadata"]["deletionTimestamp"] and kept["labels"]["x"] == "1"
    # a longer grace period changes nothing, a shorter one shortens it, 0 removes the pod (the kubelet)
    assert policy.delete_pod("default", "web-0", {"gracePeriodSeconds": 60})["metadata"][
        "deletionGracePeriodSeconds"] == 20
    assert policy.delete_pod("default", "web-0", {"gracePeriodSeconds": 5})["metadata"][
        "deletionGracePeriodSeconds"] == 5
    policy.delete_pod("default", "web-0", {"gracePeriodSeconds": 0})
    with pytest.raises(ApiError):
        store.get(PODS, "default", "web-0")
    policy.delete_pod("default", "unbound", {})  # never scheduled: nothing to terminate
    with pytest.raises(ApiError):
        store.get(PODS, "default", "unbound")


def test_expired_grace_periods_are_finalized_only_when_asked(world) -> None:
    store, policy = world
    store.create(PODS, "default", _pod("web-0"), seed=True)
    policy.delete_pod("default", "web-0", {"gracePeriodSeconds": 1})
    assert policy.finalize_expired_pods(now=time.time()) == []
    assert policy.finalize_expired_pods(now=time.time() + 5) == ["default/web-0"]


def test_immediate_deletion_is_the_default() -> None:
    store = Store()
    policy = Policy(store)
    store.create(PODS, "default", _pod("web-0"), seed=True)
    policy.delete_pod("default", "web-0", None)
    with pytest.raises(ApiError):
        store.get(PODS, "default", "web-0")

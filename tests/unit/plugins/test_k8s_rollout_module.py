"""hami.node.k8s_rollout main() in-process against a fake API (three LISTs): plan passes order and
leave_last to the planner; admit waits (bounded, with backoff) while a budget's replacement is placed but
not Ready, and answers at once when waiting would not let more members go."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.hami.node.plugins.modules import k8s_rollout

from tests.unit.plugins.moduletest import run_module

pytestmark = pytest.mark.unit


def node(name: str, rack: str) -> dict:
    return {"metadata": {"name": name, "labels": {"rack": rack}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "capacity": {"nvidia.com/gpu": "8"}}}


def pod(name: str, on: str, app: str, ready: bool = True) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "labels": {"app": app},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": app, "controller": True}]},
            "spec": {"nodeName": on, "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}}


def pdb(app: str, allowed: int) -> dict:
    return {"metadata": {"namespace": "ml", "name": app}, "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed}}


class FakeApi:
    """Nodes n1..n3; job t's pod on n1 (its budget allows nothing while its replacement on n3 is not
    Ready); the replacement turns Ready at the ``ready_after``-th reading."""

    reads = 0
    ready_after = 3
    placed = True  # the replacement t-1 is on n3 (else: nothing on its way back)

    def __init__(self, module: Any, hint_var: str = "") -> None:
        self.requests = 0

    def list_nodes(self, label_selector: Any = None) -> list:
        FakeApi.reads += 1
        self.requests += 1
        return [node("n1", "a"), node("n2", "b"), node("n3", "c")]

    def list_pods(self, node: Any = None) -> list:
        self.requests += 1
        ready = FakeApi.reads >= FakeApi.ready_after
        replacement = [pod("t-1", "n3", "t", ready=ready)] if FakeApi.placed else []
        return [pod("t-0", "n1", "t"), *replacement, pod("u-0", "n2", "u")]

    def list_pdbs(self) -> list:
        self.requests += 1
        ready = FakeApi.reads >= FakeApi.ready_after
        return [pdb("t", 1 if ready else 0), pdb("u", 1)]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> type[FakeApi]:
    clock = {"t": 0.0}
    monkeypatch.setattr(k8s_rollout._k8s, "Api", FakeApi)
    monkeypatch.setattr(k8s_rollout._k8s, "require_client", lambda module: None)
    monkeypatch.setattr(k8s_rollout.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(k8s_rollout.time, "sleep", lambda s: clock.update(t=clock["t"] + s))
    FakeApi.reads, FakeApi.ready_after, FakeApi.placed = 0, 3, True
    return FakeApi


def test_admit_waits_while_a_replacement_is_on_its_way_then_lets_both_go(api, monkeypatch) -> None:
    r = run_module(k8s_rollout.main, {"state": "admit", "nodes": ["n1", "n2"], "serial": 2, "wait": 120,
                                      "kubeconfig": "/dev/null"}, monkeypatch)
    assert r.get("failed") is not True, r
    assert r["go"] == ["n1", "n2"] and r["wait"] == {}
    assert api.reads == 3  # two polls saw ml/t at 0 with its replacement placed, the third let n1 go


def test_admit_does_not_wait_for_a_budget_with_nothing_on_its_way(api, monkeypatch) -> None:
    api.ready_after, api.placed = 10**6, False
    r = run_module(k8s_rollout.main, {"state": "admit", "nodes": ["n1", "n2"], "serial": 2, "wait": 120,
                                      "kubeconfig": "/dev/null"}, monkeypatch)
    assert r["go"] == ["n2"] and list(r["wait"]) == ["n1"] and api.reads == 1


def test_admit_waits_no_longer_than_its_wait(api, monkeypatch) -> None:
    api.ready_after = 10**6  # the replacement never turns Ready
    r = run_module(k8s_rollout.main, {"state": "admit", "nodes": ["n1", "n2"], "serial": 2, "wait": 0,
                                      "kubeconfig": "/dev/null"}, monkeypatch)
    assert r["go"] == ["n2"] and list(r["wait"]) == ["n1"] and api.reads == 1  # wait 0: one reading
    api.reads = 0
    r = run_module(k8s_rollout.main, {"state": "admit", "nodes": ["n1", "n2"], "serial": 2, "wait": 20,
                                      "kubeconfig": "/dev/null"}, monkeypatch)
    assert r["go"] == ["n2"] and list(r["wait"]) == ["n1"]
    assert api.reads == 4  # polled at 0, 2, 6, 14 s; the next (30 s) would pass the 20 s wait


def test_admit_with_nobody_fitting_waits_then_answers(api, monkeypatch) -> None:
    # (the answer used to be built only when it returned at once: a wait with nobody fitting crashed)
    api.ready_after = 10**6
    r = run_module(k8s_rollout.main, {"state": "admit", "nodes": ["n1"], "serial": 1, "wait": 10,
                                      "kubeconfig": "/dev/null"}, monkeypatch)
    assert r.get("failed") is not True, r
    assert r["go"] == [] and list(r["hosts"]["wait"]) == ["n1"] and api.reads == 3  # 0, 2, 6 s


def test_plan_passes_order_and_leave_last(api, monkeypatch) -> None:
    api.ready_after = 0
    args = {"state": "plan", "nodes": ["n1", "n2", "n3"], "serial": 1, "kubeconfig": "/dev/null"}
    r = run_module(k8s_rollout.main, {**args, "order": "inventory", "leave_last": 1}, monkeypatch)
    assert r["plan"]["batches"] == [["n1"], ["n2"]]
    assert list(r["plan"]["deferred"]) == ["n3"] and "next pass" in r["plan"]["deferred"]["n3"]
    r = run_module(k8s_rollout.main, {**args, "order": "sideways"}, monkeypatch)
    assert r["failed"] and "order" in r["msg"]

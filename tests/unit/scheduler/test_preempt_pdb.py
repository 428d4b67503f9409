"""Issue 29: PodDisruptionBudgets in GPU preemption's dry run (``scheduler/core/pdb.py``), counted as
kube-scheduler's ``filterPodsWithPDBViolation`` counts them (kubernetes v1.35.4
``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go``): per victim set, most
important first, a budget's ``disruptionsAllowed`` spent by the earlier victims of the same set; the count
orders the sets on a node and the nodes."""

from __future__ import annotations

import pytest

from hami_agent.scheduler.core import preempt as pre
from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.core.nodes import NodeState, apply_pod
from hami_agent.scheduler.core.pdb import Budget, Violations, budget, selector_matches
from tests.unit.scheduler.helpers import dev, preq, req

pytestmark = pytest.mark.unit

CTX = PodContext()
LABELS = {"a": {"app": "web"}, "b": {"app": "web"}, "c": {"app": "web"}, "x": {"app": "batch"},
          "bare": {}}


def pod(uid: str, prio: int = 0, gpu: int = 0, mem: int = 12000, started: float = 0.0,
        ns: str = "ns", node: str = "n1") -> PodUsage:
    return PodUsage(uid=uid, namespace=ns, name=uid, node=node, priority=prio, started=started,
                    devices={f"GPU-{gpu}": DeviceAmount(slots=1, mem=mem, cores=0)})


def web(allowed: int, ns: str = "ns", disrupted: frozenset[str] = frozenset()) -> Budget:
    return Budget(ns, {"matchLabels": {"app": "web"}}, allowed, disrupted)


def count(budgets: list[Budget]) -> Violations:
    return Violations(budgets, lambda p: LABELS.get(p.uid))


def node(pods: list[PodUsage], gpus: int = 2, name: str = "n1") -> NodeState:
    st = NodeState(name, [dev(i, mem=16000) for i in range(gpus)])
    for p in pods:
        apply_pod(st, p, +1)
    return st


def test_a_budget_is_spent_by_the_earlier_victims_of_the_same_set():
    """disruptionsAllowed 1: the first matching victim (most important) spends it, the next ones violate;
    the same pod alone violates nothing."""
    a, b, c = pod("a", prio=5), pod("b", prio=3), pod("c", prio=1)
    v = count([web(1)])
    assert v([a, b, c]) == {"b", "c"}
    assert v([b]) == frozenset()
    assert pre.violators(v, [c, a]) == {"c"}  # taken most important first whatever the order given
    assert count([web(0)])([a]) == {"a"}


def test_what_matches_a_budget():
    """Own namespace only, labels needed, an empty selector matches nothing, a pod in disruptedPods spends
    nothing, and two budgets are spent each on its own."""
    a, x, bare = pod("a"), pod("x"), pod("bare")
    assert count([web(0, ns="other")])([a]) == frozenset()
    assert count([Budget("ns", {}, 0, frozenset())])([a, x, bare]) == frozenset()
    assert count([web(0)])([x, bare]) == frozenset()
    assert count([web(0, disrupted=frozenset({"a"}))])([a]) == frozenset()
    batch = Budget("ns", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["batch"]}]}, 1,
                   frozenset())
    assert count([web(0), batch])([a, x]) == {"a"}
    assert not selector_matches({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]},
                                {"app": "web"})  # invalid: matches nothing
    assert not count([])  # no budget: nothing to count
    b = budget({"metadata": {"namespace": "ns"}, "spec": {"selector": {"matchLabels": {"app": "web"}}},
                "status": {"disruptionsAllowed": 2, "disruptedPods": {"a": "2026-11-27T15:00:00Z"}}})
    assert b == web(2, disrupted=frozenset({"a"}))
    assert budget({"metadata": {"namespace": "ns"}}).allowed == 0  # no status yet: nothing allowed


def test_the_node_keeps_the_protected_pod_when_another_set_of_the_same_cost_frees_room():
    """Two GPUs, one priority-0 pod of 12 GB each; ``a`` (later started, so upstream's order would take it
    first among equals) is protected by a budget with no disruption left: ``x`` goes instead."""
    pods = [pod("x", gpu=0, started=1), pod("a", gpu=1, started=2)]
    st = node(pods)
    assert {p.uid for p in pre.select_victims_on_node(st, pods, preq(req(mem=8000)), CTX, 1000).pods} == {"a"}
    v = pre.select_victims_on_node(st, pods, preq(req(mem=8000)), CTX, 1000, count([web(0)]))
    assert [p.uid for p in v.pods] == ["x"] and v.pdb_violations == 0
    # only the protected pod can make room: it goes, and the violation is counted
    only = [pod("a", gpu=0), pod("b", gpu=0, mem=2000)]
    st = node(only, gpus=1)
    v = pre.select_victims_on_node(st, only, preq(req(mem=8000)), CTX, 1000, count([web(0)]))
    assert [p.uid for p in v.pods] == ["a"] and v.pdb_violations == 1
    # upstream's reprieve (the bound run out) counts the same way
    r = pre.reprieve(st, pre.potential_victims(only, 1000), preq(req(mem=8000)), CTX, count([web(0)]))
    assert [p.uid for p in r.pods] == ["a"] and r.pdb_violations == 1


def test_the_node_pick_prefers_the_node_without_a_violation():
    """Two nodes, each needing one equal victim: the node whose victim violates a budget loses, even where
    its name would win the tie."""
    n1 = [pod("a", node="n1", gpu=0)]
    n2 = [pod("x", node="n2", gpu=0)]
    nodes = {"n1": node(n1, gpus=1, name="n1"), "n2": node(n2, gpus=1, name="n2")}
    args = (nodes, {"n1": n1, "n2": n2}, ["n1", "n2"], preq(req(mem=8000)), CTX, 1000, "PreemptLowerPriority")
    assert pre.preempt(*args).node == "n1"
    v = pre.preempt(*args, pdb=count([web(0)]))
    assert v.node == "n2" and v.pdb_violations == 0

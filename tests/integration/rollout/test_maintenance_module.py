"""hami.node.k8s_node_maintenance against the simulated cluster: the real kubernetes client, the
simulated API server's Eviction API and PodDisruptionBudgets, graceful deletion, a ReplicaSet controller
that replaces evicted pods and a scheduler that keeps them off cordoned nodes."""

from __future__ import annotations

import pytest
from ansible_collections.hami.node.plugins.modules import k8s_node_maintenance

from tests.integration.rollout.harness import cluster, pdb, replicaset
from tests.unit.plugins.moduletest import run_module

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _run(c, monkeypatch, check_mode=False, **args):
    full = {"kubeconfig": c.api.kubeconfig_path, "api_timeout": 5, "backoff_initial": 0.2, "backoff_max": 1,
            "timeout": 60, **args}
    return run_module(k8s_node_maintenance.main, full, monkeypatch, check_mode=check_mode)


def test_drain_waits_for_the_budget_and_never_breaks_it(monkeypatch) -> None:
    with cluster(["gpu-1", "gpu-2", "gpu-3"]) as c:
        c.api.create(replicaset("trainer", 6))
        c.api.create(pdb("trainer", "trainer", minAvailable=5))
        assert c.wait(lambda: len(c.ready_pods("trainer")) == 6)
        # the node with the most trainers is drained: six pods on three nodes put at least two on it, so
        # the second eviction has to wait for the budget (where the scheduler spreads them varies)
        per_node: dict[str, list[str]] = {}
        for p in c.pods("trainer"):
            per_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
        drained = max(sorted(per_node), key=lambda n: len(per_node[n]))
        on_1 = sorted(per_node[drained])
        assert len(on_1) >= 2
        c.api.create(replicaset("web", 2, gpu=False, node=drained))  # non-GPU pods on the drained node
        assert c.wait(lambda: len(c.ready_pods("web")) == 2)
        c.monitor.arm()

        plan = _run(c, monkeypatch, check_mode=True, name=drained, state="drain")
        assert plan["changed"] and sorted(plan["evicted"]) == [f"ml/{n}" for n in on_1]
        assert not (c.api.get("Node", None, drained)["spec"].get("unschedulable"))

        out = _run(c, monkeypatch, name=drained, state="drain", reason="driver 570.172.08 -> 570.195.03")
        assert not out.get("failed"), out
        assert sorted(out["evicted"]) == [f"ml/{n}" for n in on_1]
        # the second eviction had to wait until the first pod's replacement was Ready elsewhere
        assert out["budget_refusals"] >= 1 and out["budget_wait_s"] > 0
        assert out["cordoned_by"] == "hami.node" and out["node"]["unschedulable"]
        assert out["node"]["maintenance"]["hami.io/maintenance-reason"] == "driver 570.172.08 -> 570.195.03"
        assert set(out["skipped"].values()) == {"uses no GPU"}  # the web pods stay
        assert c.monitor.lowest == 5  # minAvailable held at every change the API server recorded
        assert c.wait(lambda: len(c.ready_pods("trainer")) == 6)
        assert all(p["spec"]["nodeName"] != drained for p in c.ready_pods("trainer"))
        # every eviction went through the Eviction API
        posts = c.api.requests_matching("POST", r"/pods/[^/]+/eviction$")
        assert len(posts) == len(on_1) + out["budget_refusals"]
        assert not c.api.requests_matching("DELETE", r"/namespaces/ml/pods/trainer")

        again = _run(c, monkeypatch, name=drained, state="drain")
        assert not again["changed"] and again["evicted"] == []

        up = _run(c, monkeypatch, name=drained, state="uncordon")
        assert up["changed"] and up["uncordoned"] and not up["node"]["unschedulable"]
        assert up["node"]["maintenance"] == {}
        assert c.monitor.max_cordoned == 1


def test_budget_deadline_leaves_the_node_cordoned(monkeypatch) -> None:
    with cluster(["gpu-1", "gpu-2"]) as c:
        c.api.create(replicaset("trainer", 2))
        c.api.create(pdb("trainer", "trainer", maxUnavailable=0))
        assert c.wait(lambda: len(c.ready_pods("trainer")) == 2)
        # a node with a trainer on it (the scheduler may have put both on one node)
        drained = sorted(p["spec"]["nodeName"] for p in c.ready_pods("trainer"))[0]
        out = _run(c, monkeypatch, name=drained, state="drain", timeout=3)
        assert out["failed"] and "still refused" in out["msg"]
        assert "The disruption budget trainer needs 2 healthy pods and has 2 currently" in out["msg"]
        assert c.api.get("Node", None, drained)["spec"]["unschedulable"] is True
        assert len(c.ready_pods("trainer")) == 2


def test_operator_cordon_survives_and_a_failed_gate_parks_the_node(monkeypatch) -> None:
    with cluster(["gpu-1", "gpu-2"]) as c:
        c.api.patch("Node", None, "gpu-2", {"spec": {"unschedulable": True}})
        out = _run(c, monkeypatch, name="gpu-2", state="drain")
        assert out["cordoned_by"] == "operator" and not out["changed"]
        up = _run(c, monkeypatch, name="gpu-2", state="uncordon")
        assert not up["uncordoned"] and up["node"]["unschedulable"]

        gates = _run(c, monkeypatch, name="gpu-1", state="verify", timeout=1)
        assert gates["gates"]["node_ready"]["ok"] and gates["gates"]["device_plugin"]["ok"]
        gates = _run(c, monkeypatch, name="gpu-1", state="verify", timeout=1, expect_gpus=["GPU-x"])
        assert not gates["gates"]["device_plugin"]["ok"]

        parked = _run(c, monkeypatch, name="gpu-1", state="park", gate="device_plugin",
                      runbook="docs/runbooks/rollout_gates.md#device_plugin",
                      message=gates["gates"]["device_plugin"]["detail"])
        assert parked["changed"] and parked["node"]["unschedulable"]
        assert parked["node"]["cordoned_by"] == "hami.node"
        ann = c.api.get("Node", None, "gpu-1")["metadata"]["annotations"]
        assert ann["hami.io/maintenance-failed-gate"] == "device_plugin"
        events = [e for e in c.api.list("events") if e["reason"] == "HamiMaintenanceGateFailed"]
        assert len(events) == 1 and events[0]["involvedObject"]["name"] == "gpu-1"
        assert "rollout_gates.md#device_plugin" in events[0]["message"]

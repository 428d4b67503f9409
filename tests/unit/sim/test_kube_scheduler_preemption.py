"""The simulated kube-scheduler preempts as kube-scheduler v1.35.4's DefaultPreemption does
(tests/sim/kube_scheduler_preemption.py): PostFilter after a FitError, a dry run with the framework's own
filters on the nodes whose status is Unschedulable, the reprieve, ``expected at least one victim``,
SelectCandidate, the victims' DisruptionTarget condition and graceful DELETE, the preemptor's
``nominatedNodeName``, and nominated pods counted by later cycles."""

from __future__ import annotations

import time

import pytest

from hami_agent.k8s.client import KubeClient
from tests.sim import kube_scheduler_preemption as pre
from tests.sim import kube_scheduler_queue as qu
from tests.sim.fixtures import api_server  # noqa: F401
from tests.sim.kube_scheduler import KubeSchedulerSim

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def node(name: str, cpu: str = "4", pods: str = "110") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": pods},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, cpu: str = "1", prio: int | None = None, node_name: str = "", start: str = "",
        labels: dict | None = None, never: bool = False, grace: int | None = None) -> dict:
    spec: dict = {"schedulerName": "hami-scheduler",
                  "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if prio is not None:
        spec["priority"] = prio
    if never:
        spec["preemptionPolicy"] = "Never"
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    status: dict = {"phase": "Running" if node_name else "Pending"}
    if node_name:
        spec["nodeName"] = node_name
        status["startTime"] = start or "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels or {}},
            "spec": spec, "status": status}


def _wait(fn, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.02)
    return bool(fn())


# ------------------------------------------------------------------------------------ pure rules
def test_reprieve_keeps_the_most_important_pods_and_pdb_violators_first():
    fits_3 = lambda held: None if sum(pre.pod_request(p, "cpu") for p in held) <= 3000 else pre.Status(  # noqa: E731
        pre.UNSCHEDULABLE, ["Insufficient cpu"])
    preemptor = pod("hi", cpu="2", prio=100)
    a = pod("a", cpu="1", prio=10, node_name="n", start="2026-01-01T00:00:01Z")
    b = pod("b", cpu="1", prio=10, node_name="n", start="2026-01-01T00:00:02Z")
    c = pod("c", cpu="1", prio=5, node_name="n")
    # 2 cpu for the preemptor leaves 1 for the others: a (priority 10, oldest) is reprieved
    victims, violations, st = pre.select_victims_on_node(preemptor, [c, b, a], lambda held: fits_3(
        [*held, preemptor]), [])
    assert st.code == pre.SUCCESS and violations == 0
    assert [v["metadata"]["name"] for v in victims] == ["b", "c"]
    # a budget that allows nothing protects c: the violator is reprieved first
    c["metadata"]["labels"] = {"app": "c"}
    pdb = {"metadata": {"namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "c"}}},
           "status": {"disruptionsAllowed": 0}}
    victims, violations, _ = pre.select_victims_on_node(preemptor, [c, b, a], lambda held: fits_3(
        [*held, preemptor]), [pdb])
    assert [v["metadata"]["name"] for v in victims] == ["a", "b"] and violations == 0
    # nothing of lower priority: upstream's reason, UnschedulableAndUnresolvable
    _, _, st = pre.select_victims_on_node(pod("x", prio=0), [a], lambda held: None, [])
    assert (st.code, st.reasons) == (pre.UNRESOLVABLE, [pre.NO_VICTIMS])


def test_select_candidate_criteria_in_upstream_order():
    lo = lambda n, p, s="2026-01-01T00:00:00Z": pod(n, prio=p, node_name="x", start=s)  # noqa: E731
    assert pre.pick_one_node({"n1": ([lo("a", 5)], 1), "n2": ([lo("b", 9)], 0)}) == "n2"  # PDB violations
    assert pre.pick_one_node({"n1": ([lo("a", 5)], 0), "n2": ([lo("b", 3), lo("c", 3)], 0)}) == "n2"
    assert pre.pick_one_node({"n1": ([lo("a", 5), lo("b", 1)], 0),
                              "n2": ([lo("c", 5), lo("d", 2)], 0)}) == "n1"  # sum of priorities
    assert pre.pick_one_node({"n1": ([lo("a", -5), lo("b", -5)], 0), "n2": ([lo("c", -5)], 0)}) == "n2"
    assert pre.pick_one_node({"n1": ([lo("a", 5, "2026-01-01T00:00:00Z")], 0),
                              "n2": ([lo("b", 5, "2026-02-01T00:00:00Z")], 0)}) == "n2"  # latest start
    assert pre.num_candidates(5) == 5 and pre.num_candidates(2000) == 200 and pre.num_candidates(500) == 100


def test_messages_are_upstreams():
    assert pre.aggregate(["a"]) == "a" and pre.aggregate(["a", "b", "a"]) == "[a, b]"
    statuses = {"n1": pre.Status(pre.UNRESOLVABLE, [pre.NO_VICTIMS])}
    assert pre.fit_error(3, statuses, absent=pre.NOT_HELPFUL) == (
        "0/3 nodes are available: 1 No preemption victims found for incoming pod, "
        "2 Preemption is not helpful for scheduling.")


def test_the_queue_pops_the_higher_priority_pod_first():
    q = qu.SchedulingQueue()
    q.add("default/low", pod("low", prio=1))
    q.add("default/high", pod("high", prio=5))
    q.add("default/none", pod("none"))
    assert [q.pop(0).key for _ in range(3)] == ["default/high", "default/low", "default/none"]


# ------------------------------------------------------------------------------------ the simulator
@pytest.fixture
def cluster(api_server):  # noqa: F811
    api_server.policy.graceful_deletion = True  # a bound victim terminates for its grace period
    api_server.policy.finalize_expired = True  # then goes, as its kubelet would remove it
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    sims = []

    def start(**kw) -> KubeSchedulerSim:
        sim = KubeSchedulerSim(client, None, initial_backoff_s=0.05, max_backoff_s=0.2, **kw).start()
        sims.append(sim)
        return sim

    yield api_server, start
    for s in sims:
        s.stop()


def test_a_high_priority_pod_preempts_the_low_priority_pod_holding_the_cpu(cluster):
    api, start = cluster
    api.create(node("cpu-0", cpu="4"))
    api.create(pod("low", cpu="3", prio=0, node_name="cpu-0", grace=1))
    api.create(pod("keep", cpu="1", prio=500, node_name="cpu-0"))  # above the preemptor: never a victim
    sim = start()
    api.create(pod("high", cpu="2", prio=100))
    assert _wait(lambda: (api.get("Pod", "default", "low") or {})["metadata"].get("deletionTimestamp"))
    low = api.get("Pod", "default", "low")
    cond = [c for c in low["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"]
    assert cond and cond[0]["reason"] == "PreemptionByScheduler" and cond[0]["status"] == "True"
    assert cond[0]["message"] == "hami-scheduler: preempting to accommodate a higher priority pod"
    # the nomination is written after the victims' deletion (handleSchedulingFailure)
    assert _wait(lambda: api.get("Pod", "default", "high")["status"].get("nominatedNodeName") == "cpu-0")
    assert ("default/high", "preempted 1 pod(s) on cpu-0: default/low") in sim.preemption.log
    ev = [e for e in api.list("Event", "default") if e.get("reason") == "Preempted"]
    assert ev and ev[0]["message"] == "Preempted by pod uid-high on node cpu-0"
    # the victim terminates for its grace period (1 s), then the preemptor is bound to its nominated node
    assert _wait(lambda: sim.bound.get("default/high") == "cpu-0", 15)
    assert api.get("Pod", "default", "low") is None and api.get("Pod", "default", "keep") is not None


def test_no_lower_priority_pod_no_preemption_and_upstreams_reason(cluster):
    api, start = cluster
    api.create(node("cpu-0", cpu="4"))
    api.create(pod("same", cpu="3", prio=100, node_name="cpu-0"))
    sim = start()
    api.create(pod("high", cpu="2", prio=100))
    msg = ("0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
           "1 No preemption victims found for incoming pod.")
    assert _wait(lambda: ("default/high", msg) in sim.failures)
    assert api.get("Pod", "default", "same")["metadata"].get("deletionTimestamp") is None


def test_preemption_policy_never_and_a_request_larger_than_the_node(cluster):
    api, start = cluster
    api.create(node("cpu-0", cpu="4"))
    api.create(pod("low", cpu="3", prio=0, node_name="cpu-0"))
    sim = start()
    api.create(pod("polite", cpu="2", prio=100, never=True))
    api.create(pod("huge", cpu="8", prio=100))  # UnschedulableAndUnresolvable: never a potential node
    assert _wait(lambda: ("default/polite", "0/1 nodes are available: 1 Insufficient cpu. preemption: not "
                          "eligible due to preemptionPolicy=Never.") in sim.failures)
    assert _wait(lambda: ("default/huge", "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 "
                          "nodes are available: 1 Preemption is not helpful for scheduling.") in sim.failures)
    assert api.get("Pod", "default", "low")["metadata"].get("deletionTimestamp") is None


def test_a_nominated_pod_holds_its_cpu_against_lower_priority_pods(cluster):
    api, start = cluster
    api.create(node("cpu-0", cpu="4"))
    api.create(pod("low", cpu="3", prio=0, node_name="cpu-0", grace=30))  # terminates slowly
    sim = start()
    api.create(pod("high", cpu="3", prio=100))
    assert _wait(lambda: api.get("Pod", "default", "high")["status"].get("nominatedNodeName") == "cpu-0")
    # a cluster event retries it while its victim terminates: not eligible to preempt again, and the
    # nomination stays (default_preemption.go PodEligibleToPreemptOthers)
    api.create(node("small", cpu="1"))
    assert _wait(lambda: ("default/high", pre.TERMINATING_ON_NOMINATED) in sim.preemption.log)
    assert api.get("Pod", "default", "high")["status"].get("nominatedNodeName") == "cpu-0"
    # once the victim is gone, a pod of lower priority must not take the cpu freed for the preemptor
    api.delete("Pod", "default", "low")  # stand-in for the kubelet finishing the termination now
    api.create(pod("mid", cpu="2", prio=50))
    assert _wait(lambda: sim.bound.get("default/high") == "cpu-0")
    assert "default/mid" not in sim.bound

"""Issue 29 item 3, step 3: the GPU dry run (``scheduler/core/preempt.py``). On one node the victims are the
cheapest set by (number, highest priority, PDB violations, ...) that makes HAMi's fit succeed, checked
against an exhaustive search on small random nodes; across nodes upstream's ``pickOneNodeForPreemption``
order picks; equal priority and ``preemptionPolicy: Never`` preempt nothing; system-critical pods are never
victims; past its bound the search answers with upstream's reprieve."""

from __future__ import annotations

import itertools
import random

import pytest

from hami_agent.scheduler.core import preempt as pre
from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.core.nodes import NodeState, apply_pod
from tests.unit.scheduler.helpers import dev, preq, req

pytestmark = pytest.mark.unit

CTX = PodContext()
BIG = 10**9  # no bound: the search is exhaustive


def pod(uid: str, prio: int, *on: tuple[int, int], cores: int = 0, started: float = 0.0,
        node: str = "n1") -> PodUsage:
    """A bound pod holding ``mem`` MiB on each ``(gpu index, mem)``."""
    return PodUsage(uid=uid, namespace="ns", name=uid, node=node, priority=prio, started=started,
                    devices={f"GPU-{i}": DeviceAmount(slots=1, mem=m, cores=cores) for i, m in on})


def node(pods: list[PodUsage], gpus: int = 2, mem: int = 16000, name: str = "n1",
         count: int = 10) -> NodeState:
    st = NodeState(name, [dev(i, mem=mem, count=count) for i in range(gpus)])
    for p in pods:
        apply_pod(st, p, +1)
    return st


def uids(v: pre.Victims | None) -> set[str] | None:
    return None if v is None else {p.uid for p in v.pods}


def test_equal_priority_gives_no_victim_and_never_preempts_nothing():
    pods = [pod("a", 100, (0, 12000)), pod("b", 100, (1, 12000))]
    st = node(pods)
    assert pre.select_victims_on_node(st, pods, preq(req(mem=8000)), CTX, priority=100) is None
    low = [pod("a", 0, (0, 12000)), pod("b", 0, (1, 12000))]
    st = node(low)
    args = ({"n1": st}, {"n1": low}, ["n1"], preq(req(mem=8000)), CTX, 100)
    assert pre.preempt(*args, policy="Never") is None
    assert uids(pre.preempt(*args, policy="PreemptLowerPriority")) in ({"a"}, {"b"})


def test_one_victim_on_one_gpu_beats_two_cheaper_looking_ones_on_another():
    """GPU-0: three priority-0 pods of 5 GB (1 GB free: two must go for 8 GB); GPU-1: one priority-10 pod of
    12 GB. The fewest victims is that one pod. Upstream's reprieve keeps the priority-10 pod (the most
    important is reprieved first) and evicts two."""
    pods = [pod("a", 0, (0, 5000), started=1), pod("b", 0, (0, 5000), started=2),
            pod("c", 0, (0, 5000), started=3), pod("big", 10, (1, 12000))]
    st = node(pods)
    v = pre.select_victims_on_node(st, pods, preq(req(mem=8000)), CTX, priority=1000)
    assert uids(v) == {"big"} and v.exact
    assert [p.uuid for c in v.fit.containers for p in c] == ["GPU-1"]  # the devices the hold keeps
    assert uids(pre.reprieve(st, pre.potential_victims(pods, 1000), preq(req(mem=8000)), CTX)) == {"b", "c"}
    # with two victims needed on every GPU, the lower priorities go, the later-started first among equals
    pods = pods[:3] + [pod(f"mid{i}", 10, (1, 5000)) for i in range(3)]
    v = pre.select_victims_on_node(node(pods), pods, preq(req(mem=8000)), CTX, priority=1000)
    assert uids(v) == {"b", "c"}


def test_multi_gpu_requests_take_victims_across_gpus():
    pods = [pod("g0", 5, (0, 12000)), pod("g1", 1, (1, 12000)), pod("g2", 3, (2, 12000)),
            pod("g3", 2, (3, 12000))]
    st = node(pods, gpus=4)
    v = pre.select_victims_on_node(st, pods, preq(req(nums=2, mem=8000)), CTX, priority=1000)
    assert uids(v) == {"g1", "g3"} and v.exact  # two victims, the lowest highest priority
    # a pod on two GPUs frees both: one victim
    pods = [pod("wide", 5, (0, 12000), (1, 12000)), pod("g2", 1, (2, 12000)), pod("g3", 1, (3, 12000))]
    v = pre.select_victims_on_node(node(pods, gpus=4), pods, preq(req(nums=2, mem=8000)), CTX, priority=1000)
    assert uids(v) == {"wide"}
    # two containers of one GPU each, too big to share one (whole-node search)
    v = pre.select_victims_on_node(node(pods, gpus=4), pods, preq(req(mem=10000), req(mem=10000)), CTX,
                                   priority=1000)
    assert uids(v) == {"wide"}
    v = pre.select_victims_on_node(node(pods, gpus=4), pods, preq(req(mem=8000), req(mem=8000)), CTX,
                                   priority=1000)
    assert uids(v) == {"g2"}  # both fit one freed GPU: one priority-1 victim (g2/g3 tie: the UID)


def test_a_pod_on_two_gpus_is_tried_on_each():
    """``wide`` (priority 0) sits on GPU-0 (beside ``q``, priority 5) and GPU-1 (alone): taking it away frees
    GPU-1 only. The per-GPU search must try {wide} on GPU-1's view too, not only on GPU-0's (where {q} would
    then win)."""
    pods = [pod("wide", 0, (0, 6000), (1, 12000)), pod("q", 5, (0, 10000))]
    v = pre.select_victims_on_node(node(pods), pods, preq(req(mem=8000)), CTX, priority=10)
    assert uids(v) == {"wide"} and [p.uuid for c in v.fit.containers for p in c] == ["GPU-1"]


def test_system_critical_pods_are_never_victims():
    pods = [pod("crit", pre.SYSTEM_CRITICAL, (0, 12000))]
    assert pre.select_victims_on_node(node(pods, gpus=1), pods, preq(req(mem=8000)), CTX,
                                      priority=pre.SYSTEM_CRITICAL + 1000) is None


def test_a_pod_that_fits_needs_no_victim_and_is_no_candidate():
    pods = [pod("a", 0, (0, 4000))]
    v = pre.select_victims_on_node(node(pods), pods, preq(req(mem=8000)), CTX, priority=10)
    assert v is not None and v.pods == ()
    assert pre.select_candidate([v]) is None  # upstream: "expected at least one victim pod on node"


def test_past_the_bound_upstreams_reprieve_answers():
    pods = [pod(f"p{i}", i % 3, (0, 2000)) for i in range(8)]  # GPU-0 full: 4 must go for 8 GB
    st = node(pods, gpus=1)
    exact = pre.select_victims_on_node(st, pods, preq(req(mem=8000)), CTX, priority=10)  # 163 fit runs
    # priorities 0,1,2,0,1,2,0,1: the three of priority 0 and one of priority 1
    assert exact.exact and sorted(p.priority for p in exact.pods) == [0, 0, 0, 1]
    bounded = pre.select_victims_on_node(st, pods, preq(req(mem=8000)), CTX, priority=10, max_fits=20)
    assert not bounded.exact
    assert uids(bounded) == uids(pre.reprieve(st, pre.potential_victims(pods, 10), preq(req(mem=8000)), CTX))


def test_select_candidate_follows_upstreams_order():
    def v(name: str, prios: list[int], pdb: int = 0, started: float = 0.0) -> pre.Victims:
        ps = tuple(pod(f"{name}{i}", p, (0, 1), started=started, node=name) for i, p in enumerate(prios))
        return pre.Victims(name, ps, pdb, fit=None)  # type: ignore[arg-type]

    assert pre.select_candidate([v("a", [1], pdb=1), v("b", [50])]).node == "b"  # PDB violations first
    assert pre.select_candidate([v("a", [5, 1]), v("b", [7])]).node == "a"  # then the highest priority
    assert pre.select_candidate([v("a", [5, 5]), v("b", [5, 1])]).node == "b"  # then the shifted sum
    # then the latest start among the highest-priority victims
    assert pre.select_candidate([v("a", [5], started=10), v("b", [5], started=20)]).node == "b"
    assert pre.select_candidate([v("b", [5]), v("a", [5])]).node == "a"  # then the name


def test_preempt_picks_across_nodes():
    n1 = [pod("x", 50, (0, 12000), node="n1"), pod("y", 50, (1, 12000), node="n1")]
    n2 = [pod("z", 5, (0, 12000), node="n2"), pod("w", 60, (1, 12000), node="n2")]
    nodes = {"n1": node(n1, name="n1"), "n2": node(n2, name="n2")}
    v = pre.preempt(nodes, {"n1": n1, "n2": n2}, ["n1", "n2", "gone"], preq(req(mem=8000)), CTX, 100,
                    "PreemptLowerPriority")
    assert (v.node, uids(v)) == ("n2", {"z"})
    # PDB: z is protected, so n1's unprotected victim wins
    v = pre.preempt(nodes, {"n1": n1, "n2": n2}, ["n1", "n2"], preq(req(mem=8000)), CTX, 100,
                    "PreemptLowerPriority", pdb={"z"})
    assert v.node == "n1" and v.pdb_violations == 0


def _brute(st: NodeState, pods: list[PodUsage], rq, prio: int, pdb: set[str]) -> tuple | None:
    cands = pre.potential_victims(pods, prio)
    best = None
    for k in range(len(cands) + 1):
        for combo in itertools.combinations(cands, k):
            if pre.fit_without(st, combo, rq, CTX).ok:
                key = pre.set_key(combo, pdb)
                best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("seed", range(4))
def test_exhaustive_cross_check_on_small_random_nodes(seed):
    """Every case: the search's set is as cheap (``set_key``) as the cheapest of all subsets, or both find
    none."""
    rnd = random.Random(seed)
    checked = found = 0
    for case in range(60):
        gpus = rnd.randint(1, 3)
        pods = []
        for i in range(rnd.randint(1, 6)):
            on = rnd.sample(range(gpus), rnd.choice([1, 1, 1, 2]) if gpus > 1 else 1)
            pods.append(pod(f"p{i}", rnd.choice([0, 0, 1, 5, 10, 100]),
                            *[(g, rnd.choice([2000, 4000, 6000, 8000])) for g in on],
                            cores=rnd.choice([0, 20, 50]), started=rnd.randint(0, 3)))
        st = node(pods, gpus=gpus, count=rnd.choice([2, 10]))
        rq = rnd.choice([preq(req(mem=rnd.choice([4000, 8000, 12000]), cores=rnd.choice([0, 50]))),
                         preq(req(nums=min(2, gpus), mem=6000)),
                         preq(req(mem=4000), req(mem=6000))])
        prio = rnd.choice([1, 10, 50])
        pdb = {p.uid for p in pods if rnd.random() < 0.3}
        got = pre.select_victims_on_node(st, pods, rq, CTX, prio, pdb, max_fits=BIG)
        want = _brute(st, pods, rq, prio, pdb)
        assert (None if got is None else pre.set_key(got.pods, pdb)) == want, (seed, case)
        if got is not None:
            assert got.exact and got.fit.ok
            found += bool(got.pods)
        checked += 1
    assert checked == 60 and found > 5  # the cases do exercise victims


def test_dynamic_mig_victims_free_their_placements():
    """A dynamic-MIG A100: two 3g.40gb instances (placements 0 and 4) held by priority-0 and priority-5 pods;
    a 3g.40gb request needs one of them to go: the priority-0 one, and the preemptor gets its placement."""
    from hami_agent.protocol import MigPlacement
    from tests.unit.scheduler.helpers import mig_dev

    def mig_pod(uid: str, prio: int, start: int) -> PodUsage:
        return PodUsage(uid=uid, namespace="ns", name=uid, node="n1", priority=prio,
                        devices={"GPU-0": DeviceAmount(slots=1, mem=40192, cores=43)},
                        mig_alloc={"GPU-0": (MigPlacement(start, 4),)})

    st = NodeState("n1", [mig_dev(0)])
    pods = [mig_pod("a", 0, 4), mig_pod("b", 5, 0)]
    for p in pods:
        apply_pod(st, p, +1)
    rq = preq(req(mem=40000))
    assert not pre.fit_without(st, (), rq, CTX).ok
    v = pre.select_victims_on_node(st, pods, rq, CTX, priority=10)
    assert uids(v) == {"a"} and v.exact
    (pick,) = v.fit.containers[0]
    assert (pick.mig_profile, pick.mig_placement) == ("3g.40gb", MigPlacement(4, 4))
    assert st.devices[0].mig_used == (MigPlacement(4, 4), MigPlacement(0, 4))  # the node itself unchanged

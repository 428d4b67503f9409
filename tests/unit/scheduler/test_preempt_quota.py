"""Issue 29: the GPU dry run keeps to the preemptor's namespace GPU quota as /filter does (HAMi's
``FitQuota``, ``core.fit.QuotaBudget``). Victims of the preemptor's namespace give their quota back, victims
of other namespaces do not; a pod refused by quota alone is helped only by lower-priority pods of its own
namespace, and never costs another namespace a pod just for quota."""

from __future__ import annotations

import pytest

from hami_agent.scheduler.core import preempt as pre
from hami_agent.scheduler.core.fit import PodContext, QuotaBudget
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from tests.unit.scheduler.helpers import preq, req
from tests.unit.scheduler.test_preempt_core import node, uids

pytestmark = pytest.mark.unit

CTX = PodContext()


def pod(uid: str, ns: str, prio: int, gpu: int, mem: int, cores: int = 0) -> PodUsage:
    return PodUsage(uid=uid, namespace=ns, name=uid, node="n1", priority=prio, bound=True,
                    devices={f"GPU-{gpu}": DeviceAmount(slots=1, mem=mem, cores=cores)})


def test_quota_without_gives_back_only_the_namespaces_victims():
    q = pre.Quota("team", QuotaBudget(mem_left=1000, cores_left=None))
    back = q.without([pod("a", "team", 0, 0, 4000, cores=30), pod("b", "other", 0, 1, 8000)])
    assert (back.mem_left, back.cores_left) == (5000, None)


def test_refused_by_quota_alone_evicts_a_lower_priority_pod_of_its_own_namespace():
    """GPU-1 is free, so capacity is no problem; the namespace has 2,000 MiB of quota left and the pod asks
    8,000. The victim is team's own 6,000 MiB pod, not the other namespace's (which would free no quota)."""
    pods = [pod("mine", "team", 0, 0, 6000), pod("theirs", "other", 0, 0, 6000)]
    st = node(pods)
    quota = pre.Quota("team", QuotaBudget(mem_left=2000))
    rq = preq(req(mem=8000))
    assert pre.fit_without(st, (), rq, CTX).ok  # room on the node: only the quota refuses it
    assert not pre.fit_without(st, (), rq, CTX, quota).ok
    v = pre.select_victims_on_node(st, pods, rq, CTX, priority=1000, quota=quota)
    assert uids(v) == {"mine"} and v.exact
    assert uids(pre.reprieve(st, pre.potential_victims(pods, 1000), rq, CTX, quota=quota)) == {"mine"}


def test_no_lower_priority_pod_of_the_namespace_means_no_preemption():
    """Quota is the only problem and the namespace's pods are of equal priority: another namespace's
    lower-priority pods are never evicted for it."""
    pods = [pod("mine", "team", 1000, 0, 6000), pod("theirs", "other", 0, 1, 6000)]
    st = node(pods)
    quota = pre.Quota("team", QuotaBudget(mem_left=2000))
    args = ({"n1": st}, {"n1": pods}, ["n1"], preq(req(mem=8000)), CTX, 1000, "PreemptLowerPriority")
    assert pre.preempt(*args, quota=quota) is None
    assert uids(pre.preempt(*args, quota=pre.Quota("team", QuotaBudget(mem_left=20000)))) is None  # fits


def test_capacity_and_quota_short_together():
    """Both GPUs full: the preemptor needs room on a GPU and quota. Evicting the other namespace's pod frees
    the GPU but no quota, so the cheapest set that works is the own namespace's pod on a GPU where that also
    frees the room: one victim, not two."""
    pods = [pod("mine", "team", 0, 0, 12000), pod("theirs", "other", 0, 1, 12000)]
    st = node(pods)
    rq = preq(req(mem=8000))
    v = pre.select_victims_on_node(st, pods, rq, CTX, priority=1000,
                                   quota=pre.Quota("team", QuotaBudget(mem_left=0)))
    assert uids(v) == {"mine"}
    assert [p.uuid for c in v.fit.containers for p in c] == ["GPU-0"]
    # without a quota either victim would do; the tie goes by UID
    assert uids(pre.select_victims_on_node(st, pods, rq, CTX, priority=1000)) in ({"mine"}, {"theirs"})
    # the own namespace's pod is of higher priority than the preemptor: nothing helps
    pods[0] = pod("mine", "team", 5000, 0, 12000)
    assert pre.select_victims_on_node(node(pods), pods, rq, CTX, priority=1000,
                                      quota=pre.Quota("team", QuotaBudget(mem_left=0))) is None


def test_cores_quota_counts_too():
    pods = [pod("mine", "team", 0, 0, 1000, cores=60)]
    st = node(pods)
    rq = preq(req(mem=1000, cores=50))
    quota = pre.Quota("team", QuotaBudget(cores_left=40))
    assert uids(pre.select_victims_on_node(st, pods, rq, CTX, priority=10, quota=quota)) == {"mine"}


def test_a_hold_uses_its_namespaces_quota():
    """Quota a preemption frees stays with its preemptor: the holds that count for a pod add to the usage of
    their own namespace only."""
    from hami_agent.scheduler.state.holds import add_namespace_usage

    held = {"n1": [pod("own", "team", 1000, 0, 8000, cores=30), pod("else", "other", 1000, 1, 4000)]}
    assert add_namespace_usage(held, "team", 1000, 10) == (9000, 40)
    assert add_namespace_usage(held, "third", 1000, 10) == (1000, 10)

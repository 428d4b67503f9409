"""Issue 29 item 4: a preemptor's last victim leaves the usage cache between /filter's decision and the
refusal that follows it. Before the fix ``refused`` saw "victims gone, still no fit", judged the hold taken,
dropped it and preempted again (``python -m benchmarks preempt --wave`` found 17 victims for 16 preemptors,
and owners then took each other's freed GPUs). Now /filter decides once more and the pod lands on its hold,
and ``refused`` itself drops a hold only when its node has no room for the owner at that moment."""

from __future__ import annotations

import pytest

from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.holds import Hold, Holds
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from hami_agent.scheduler.verbs.preemption import Preemption
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod, preq, req

pytestmark = pytest.mark.unit


class VictimLeavesNow:
    """Stands in for the GoneCheck that runs between the decision and the refusal: the informer's delete of
    the victim lands exactly there."""

    def __init__(self, cache: UsageCache, victim: str) -> None:
        self.cache, self.victim = cache, victim

    def release(self, *_a: object) -> list[str]:
        self.cache.remove_pod(self.victim)
        return []


def test_a_victim_gone_between_decision_and_refusal_does_not_preempt_twice() -> None:
    cache = UsageCache()
    cache.set_node("n1", [dev(0, mem=16000, uuid="GPU-0")])
    cache.add_pod(PodUsage(uid="v1", namespace="default", name="v1", node="n1", priority=0, bound=True,
                           devices={"GPU-0": DeviceAmount(slots=1, mem=12000)}))
    api = FakePodClient()
    ext = Extender(cache, SchedulerConfig(preemption="extender", write_behind=False), api)
    ext.synced.set()
    pod = gpu_pod("high", mem=8000)
    pod["spec"]["priority"] = 1000
    api.add(pod)
    held = PodUsage(uid="uid-high", namespace="default", name="high", node="n1", priority=1000,
                    devices={"GPU-0": DeviceAmount(slots=1, mem=8000)})
    ext.holds.put(Hold(held, ("v1",), deadline=1e12, since=0.0))  # its preemption of v1 is under way
    ext.gone_check = VictimLeavesNow(cache, "v1")
    out = ext.filter({"Pod": pod, "NodeNames": ["n1"]})
    assert out["NodeNames"] == ["n1"], out  # decided again: its own hold's room
    assert ext.holds.get("uid-high") is None  # ended by its own reservation, not dropped as taken
    assert cache.nodes["n1"].devices[0].usedmem == 8000


def _prem_with_hold(cache: UsageCache) -> Preemption:
    prem = Preemption(cache, Holds(), rclient=None, wclient=None, gate=None, writer=None, events=None,
                      metrics=None, scheduler_name="hami-scheduler")
    held = PodUsage(uid="a", namespace="ns", name="a", node="n1", priority=100,
                    devices={"GPU-0": DeviceAmount(slots=1, mem=8000)})
    prem.holds.put(Hold(held, ("v1",), deadline=1e12, since=0.0))
    return prem


REC = {"priority": 100, "preemption_policy": "PreemptLowerPriority"}
POD_A = {"metadata": {"namespace": "ns", "name": "a", "uid": "a"}}


def test_refused_keeps_the_hold_when_its_room_is_there_now() -> None:
    """The victim went after the decision that refused the pod (a narrower window than the one above:
    between the extender's check and ``refused``): the room is free now, so the hold stays and the answer
    still says the pod waits; its next call takes the room."""
    cache = UsageCache()
    cache.set_node("n1", [dev(0, mem=16000, uuid="GPU-0")])  # v1 is gone from it already
    prem = _prem_with_hold(cache)
    out = prem.refused(POD_A, "a", ["n1"], preq(req(mem=8000)), PodContext(), REC, {"n1": "x"})
    assert out == {"n1": "waiting for 1 preempted pod(s) on GPU-0 to terminate"}
    assert prem.holds.get("a") is not None


def test_refused_drops_the_hold_when_someone_took_the_room() -> None:
    cache = UsageCache()
    cache.set_node("n1", [dev(0, mem=16000, uuid="GPU-0")])
    cache.add_pod(PodUsage(uid="taker", namespace="ns", name="taker", node="n1", priority=100, bound=True,
                           devices={"GPU-0": DeviceAmount(slots=1, mem=12000)}))
    prem = _prem_with_hold(cache)
    prem.refused(POD_A, "a", ["n1"], preq(req(mem=8000)), PodContext(), REC, {"n1": "x"})
    assert prem.holds.get("a") is None  # dropped (it may preempt again: taker has its own priority)

"""Issue 29 item 4: a preemptor's last victim leaves the usage cache between /filter's decision and the
refusal that follows it. Before the fix ``refused`` saw "victims gone, still no fit", judged the hold taken,
dropped it and preempted again (``python -m benchmarks preempt --wave`` found 17 victims for 16 preemptors,
and owners then took each other's freed GPUs). Now /filter decides once more and the pod lands on its hold."""

from __future__ import annotations

import pytest

from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.holds import Hold
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod

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

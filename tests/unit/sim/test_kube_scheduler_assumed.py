"""The simulated kube-scheduler keeps a pod *assumed* from its scheduling cycle until its informer shows
the pod bound, as kube-scheduler's cache does (pkg/scheduler/eventhandlers.go
``updatePodInSchedulingQueue`` skips assumed pods; schedule_one.go ``skipPodSchedule``): an update that
arrives after the binding but before the watch shows it (the extender's ``bind-phase`` patch, say) must
not queue the pod again, and the assumed pod's request stays counted until then."""

from __future__ import annotations

import copy

import pytest

from tests.sim.kube_scheduler import KubeSchedulerSim

pytestmark = pytest.mark.unit


class FakeInformer:
    def __init__(self, pods: list[dict]) -> None:
        self.pods = pods

    def list(self) -> list[dict]:
        return self.pods


def pod(name: str, node: str = "", rv: str = "1") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
            "spec": {"schedulerName": "hami-scheduler", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def test_an_assumed_pod_is_not_queued_again_and_stays_counted_until_the_informer_shows_it_bound():
    sim = KubeSchedulerSim(client=None, extender_url=None)
    pending = pod("p")
    sim.pod_informer = FakeInformer([pending])
    sim._assumed["default/p"] = ("gpu-1", 1)  # its scheduling cycle chose gpu-1; the binding ran
    sim.bound["default/p"] = "gpu-1"
    annotated = copy.deepcopy(pending)
    annotated["metadata"].update(resourceVersion="2", annotations={"hami.io/bind-phase": "allocating"})
    sim._on_pod_update(pending, annotated)  # the watch is behind the binding
    assert sim.queue.where("default/p") is None, "an assumed pod was queued for another scheduling cycle"
    assert sim._count_used() == {"gpu-1": 1}, "the bound-but-unseen pod must still hold its GPU"
    bound = pod("p", node="gpu-1", rv="3")
    sim.pod_informer = FakeInformer([bound])
    sim._on_pod_update(annotated, bound)  # the informer confirms the binding
    assert "default/p" not in sim._assumed
    assert sim._count_used() == {"gpu-1": 1}  # counted once, from the informer


def test_a_deleted_assumed_pod_is_forgotten_and_an_unassumed_pending_update_is_queued():
    sim = KubeSchedulerSim(client=None, extender_url=None)
    sim.pod_informer = FakeInformer([])
    sim._assumed["default/p"] = ("gpu-1", 1)
    sim._on_pod_delete(pod("p"))
    assert sim._assumed == {} and sim._count_used() == {}
    old, new = pod("q"), pod("q", rv="2")
    sim._on_pod_update(old, new)
    assert sim.queue.where("default/q") is not None  # not assumed: an update queues it, as before

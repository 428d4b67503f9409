"""Issue 29: GPU preemption for dynamic MIG (HAMi v2.10's ``mig`` operating mode: a vGPU request of
``nvidia.com/gpumem`` becomes the smallest MIG instance that fits, at a placement the extender chooses and
writes in ``hami.io/vgpu-mig-allocations``) in the simulated cluster, with ``--preemption extender``.

What is freed here is not memory but a *placement*: an A100's eight memory slices, each instance a
contiguous run of them at a fixed start. The preemptor must take the victims whose placements free a run
it can use, the hold must carry that placement (``migPlacements``) so no other pod is given it while the
victims terminate, and no two bound pods - terminating ones included - may ever hold overlapping
placements on one GPU."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import pytest

from hami_agent.protocol import keys
from hami_agent.protocol.mig import decode_mig_allocations
from tests.integration.scheduler.test_preemption_limit import _graceful, _wait
from tests.integration.scheduler.test_preemption_mig import a100_mig_node, cluster, gpu_pod
from tests.unit.scheduler.helpers import a100_mig_profiles

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

GPU = "GPU-dmig-0"


def dynamic_mig_node(name: str) -> dict:
    """A node whose one A100-SXM4-80GB is in dynamic MIG mode: it publishes every profile it can create
    (count = the largest instance count, 7), and the extender chooses the instance per pod."""
    return a100_mig_node(name, GPU, a100_mig_profiles(), "nvidia.com/gpu", 7)


def vgpu_pod(name: str, mem_mib: int, prio: int, grace: int = 1) -> dict:
    return gpu_pod(name, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem_mib)}, prio, grace)


def placements(pod: dict) -> list[tuple[int, int]]:
    """The (start, size) placements ``pod`` holds on the GPU, from its MIG allocations annotation."""
    raw = pod["metadata"].get("annotations", {}).get(keys.MIG_ALLOCATIONS)
    return [(a.placement.start, a.placement.size) for a in decode_mig_allocations(raw or "")
            if a.gpu_uuid == GPU]


@contextlib.contextmanager
def overlap_watch(api) -> Iterator[dict]:
    """Samples every 10 ms the placements of the pods bound to the node, terminating ones included (their
    containers may still run on the instance): counts the samples and records any two that overlap."""
    out: dict = {"samples": 0, "overlaps": []}
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            used: list[tuple[str, int, int]] = []
            for p in api.list("Pod", "default"):
                if p["spec"].get("nodeName"):
                    used += [(p["metadata"]["name"], s, z) for s, z in placements(p)]
            for i, (na, sa, za) in enumerate(used):
                for nb, sb, zb in used[i + 1:]:
                    if sa < sb + zb and sb < sa + za:
                        out["overlaps"].append((na, sa, za, nb, sb, zb))
            out["samples"] += 1
            stop.wait(0.01)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join(5)


def test_dynamic_mig_preemption_frees_a_placement_and_holds_it(api_server):
    """Two 3g.40gb instances fill the A100's eight memory slices: ``low`` (priority 0) and ``mid``
    (priority 5). A priority-1000 pod asking 40,000 MiB (a 3g.40gb) needs one of them to go: ``low``, the
    lower priority, and the hold names ``low``'s placement. While ``low`` terminates, a priority-500 rival
    asking 20,000 MiB (a 1g.20gb or 2g.20gb, placements inside either half) finds the held half taken and
    preempts ``mid`` for its own; both new pods run, and no two pods' placements ever overlap."""
    _graceful(api_server)
    with cluster(api_server) as sim, overlap_watch(api_server) as watch:
        api_server.create(dynamic_mig_node("a100-0"))
        api_server.create(vgpu_pod("low", 40000, 0, grace=2))
        assert sim.wait_idle(15, expect_bound=1), sim.failures
        api_server.create(vgpu_pod("mid", 40000, 5, grace=2))
        assert sim.wait_idle(15, expect_bound=2), sim.failures
        low_at = placements(api_server.get("Pod", "default", "low"))
        mid_at = placements(api_server.get("Pod", "default", "mid"))
        assert sorted(low_at + mid_at) == [(0, 4), (4, 4)], (low_at, mid_at)  # the GPU is full

        api_server.create(vgpu_pod("high", 40000, 1000))
        assert _wait(lambda: (api_server.get("Pod", "default", "high")["status"].get("nominatedNodeName")
                              == "a100-0"), 10), sim.failures
        hold = json.loads(api_server.get("Pod", "default", "high")["metadata"]["annotations"][
            keys.PREEMPTION_HOLD])
        low_uid = api_server.get("Pod", "default", "low")["metadata"]["uid"]
        assert hold["victims"] == [low_uid], hold
        assert hold["migPlacements"] == {GPU: [list(low_at[0])]}, hold

        api_server.create(vgpu_pod("rival", 20000, 500))
        assert _wait(lambda: sim.bound.get("default/high") == "a100-0", 30), sim.failures
        assert _wait(lambda: sim.bound.get("default/rival") == "a100-0", 30), sim.failures
        assert api_server.get("Pod", "default", "low") is None
        assert _wait(lambda: api_server.get("Pod", "default", "mid") is None, 10)  # the rival's victim
        assert placements(api_server.get("Pod", "default", "high")) == low_at  # the held placement
        rival_at = placements(api_server.get("Pod", "default", "rival"))
        (rs, rz), (ms, mz) = rival_at[0], mid_at[0]
        assert ms <= rs and rs + rz <= ms + mz, (rival_at, mid_at)  # inside the half mid gave back
        assert sim.preemption.preempt_calls == []  # kube-scheduler itself preempts nothing
    assert watch["samples"] > 10 and watch["overlaps"] == [], watch

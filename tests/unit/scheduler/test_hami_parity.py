"""The scheduler decisions that used to differ from HAMi v2.10 (issue 19), each pinned to the HAMi source it
follows (Project-HAMi/HAMi at v2.10.0; file:line of that tag). Every test here failed on the code before
the fix."""

from __future__ import annotations

import pytest

from hami_agent.protocol import MigPlacement, ProtocolError, keys
from hami_agent.protocol.mig import decode_mig_allocations
from hami_agent.protocol.requests import RequestConfig
from hami_agent.scheduler.core.fit import (
    NodeExtras,
    PodContext,
    QuotaBudget,
    device_score,
    fit_devices,
    fit_node,
    pod_context,
    sort_devices,
)
from hami_agent.scheduler.core.model import PodUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.podinfo import pod_usage
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.unit.scheduler.helpers import FakePodClient, a100_mig_profiles, dev, gpu_pod, mig_dev, preq, req

pytestmark = pytest.mark.unit


def _ctx(**kw) -> PodContext:
    return PodContext(**kw)


# ------------------------------------------------------------------------------------------- quota
def test_quota_counts_init_containers_at_their_per_gpu_peak():
    # device.go:666-692 fitQuota collapses the pod with CollapseInitContainerUsage (initContainer.go:36-114):
    # two 1,500 MiB init containers (one after the other) and a 500 MiB app container hold 1,500 MiB of
    # a 2,048 MiB quota. The budget used to be reduced by every container in turn (3,500 > 2,048).
    fit = fit_node([dev(0, mem=8000)], preq(req(mem=1500), req(mem=1500), req(mem=500), n_init=2),
                   _ctx(), NodeExtras(), QuotaBudget(mem_left=2048))
    assert fit.ok, fit.reason
    over = fit_node([dev(0, mem=8000)], preq(req(mem=1500), req(mem=2100), n_init=1),
                    _ctx(), NodeExtras(), QuotaBudget(mem_left=2048))
    assert not over.ok and over.reason == "1/1 ResourceQuotaNotFit"


def _quota_extender(names, limit_mem: str):
    cache = UsageCache()
    cache.set_node("n1", [dev(0, mem=81920)])
    client = FakePodClient(quotas=[{"spec": {"hard": {"limits.nvidia.com/gpumem": limit_mem}}}])
    ext = Extender(cache, SchedulerConfig(names=names), client)
    ext.synced.set()
    return ext, client


def test_quota_limit_is_scaled_by_memory_factor():
    # quota.go:80-83 FitQuota: limit * memoryFactor, because usage is recorded in scaled MiB
    # (device.go:538-548). gpumem 600 x factor 2 = 1,200 MiB against a 1,000 limit x 2 = 2,000: fits.
    # The extender used to compare 1,200 with 1,000 and refuse.
    ext, client = _quota_extender(RequestConfig(memory_factor=2), "1000")
    pod = client.add(gpu_pod("p", mem=600))
    try:
        out = ext.filter({"Pod": pod, "NodeNames": ["n1"]})
        assert out["NodeNames"] == ["n1"], out
        pod2 = client.add(gpu_pod("q", mem=500))  # 1,200 + 1,000 > 2,000
        out = ext.filter({"Pod": pod2, "NodeNames": ["n1"]})
        assert out["FailedNodes"] == {"n1": "1/1 ResourceQuotaNotFit"}
    finally:
        ext.healer.stop()


# ---------------------------------------------------------------------------- device-scoring-weights
def test_empty_scoring_weights_are_refused_with_hamis_text():
    # device_scoring_weights.go:48-53: a present annotation is parsed even when empty (61-62 refuses it).
    # An empty value used to fall back to 1,1,1.
    with pytest.raises(ProtocolError) as err:
        pod_context({keys.DEVICE_SCORING_WEIGHTS: ""})
    assert str(err.value) == ('invalid hami.io/device-scoring-weights annotation "": expected slot, core, '
                              "and memory weights")
    assert pod_context({}).weights == (1, 1, 1)


# ------------------------------------------------------------------------------------------ isMIGRequest
def test_mig_request_needs_the_pod_to_allow_mig_mode():
    # score.go:54-69 isMIGRequest: a pod whose nvidia.com/vgpu-mode does not contain "mig" is not a MIG
    # request, so asking for more GPUs than the node has is NodeInsufficientDevice (score.go:99-102).
    # The extender used to skip that check whenever any GPU was in MIG mode.
    devs = [mig_dev(0)]
    ctx = pod_context({keys.VGPU_MODE: "hami-core"})
    fit = fit_node(devs, preq(req(nums=2, mem=8000)), ctx, NodeExtras())
    assert not fit.ok and fit.reason == "NodeInsufficientDevice"
    fit = fit_node([mig_dev(0)], preq(req(nums=2, mem=8000)), pod_context({}), NodeExtras())
    assert fit.ok  # a MIG request: two instances on the one GPU (device.go:846-848)


# -------------------------------------------------------------------------------------------- policies
def _pairs(*triples):
    out: dict[str, dict[str, int]] = {}
    for a, b, s in triples:
        out.setdefault(a, {})[b] = s
        out.setdefault(b, {})[a] = s
    return out


def test_topology_aware_works_inside_a_chain():
    # device.go:724 needTopology = util.PolicyContains (util.go:290-298): "binpack,topology-aware" chooses the
    # best-connected pair. Topology used to count only as the sole policy.
    devs = [dev(i, uuid=f"GPU-{i}") for i in range(3)]
    pairs = _pairs(("GPU-0", "GPU-1", 10), ("GPU-0", "GPU-2", 90), ("GPU-1", "GPU-2", 10))
    ctx = pod_context({keys.GPU_SCHEDULER_POLICY: "binpack,topology-aware"})
    fit = fit_node(devs, preq(req(nums=2, mem=1000)), ctx, NodeExtras(pair_scores=pairs))
    assert fit.ok and sorted(p.uuid for p in fit.containers[0]) == ["GPU-0", "GPU-2"]


def test_best_combination_is_kept_when_every_pair_score_is_below_minus_one():
    # device.go:953-977 computeBestCombination: the first combination is taken whatever its score
    # (!found), then any better one. With every score below -1 the extender used to fall back to the first
    # candidates instead of the best pair.
    devs = [dev(i, uuid=f"GPU-{i}") for i in range(3)]
    pairs = _pairs(("GPU-2", "GPU-1", -30), ("GPU-2", "GPU-0", -20), ("GPU-1", "GPU-0", -5))
    reasons: dict[str, int] = {}
    ctx = pod_context({keys.GPU_SCHEDULER_POLICY: "topology-aware"})
    ordered = sort_devices(devs, ctx)
    picked = fit_devices(ordered, req(nums=2, mem=1000), ctx, NodeExtras(pair_scores=pairs), None,
                         reasons=reasons)
    assert sorted(p.uuid for p in picked) == ["GPU-0", "GPU-1"]


def test_mutex_topology_chain_sorts_like_spread():
    # gpu_policy.go:132-136 lessByChain: a chain naming no sort key falls back to spread (score
    # descending). It used to order by index only.
    devs = [dev(0, used=1, usedmem=4000), dev(1), dev(2, used=2, usedmem=6000)]
    ctx = pod_context({keys.GPU_SCHEDULER_POLICY: "mutex,topology-aware"})
    for d in devs:
        d.score = device_score(d, None, ctx.weights)
    assert [d.index for d in sort_devices(devs, ctx)] == [2, 0, 1]


def test_device_score_uses_the_percentage_when_both_are_set():
    # gpu_policy.go:209-213 ComputeScore: MemPercentagereq (not 0, not 101) wins over Memreq. The score
    # used the MiB request. (The request term counts only when the device type is the request's, "NVIDIA".)
    d = dev(0, mem=8000, type_="NVIDIA", count=10)
    both = device_score(d, req(mem=1000, pct=50))
    assert both == pytest.approx(10 * (1 / 10 + 0 + 4000 / 8000))
    assert device_score(d, req(mem=1000)) == pytest.approx(10 * (1 / 10 + 1000 / 8000))


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "True"])
def test_numa_bind_accepts_go_parsebool_true_values(value):
    # device.go:482-491 assertNuma: strconv.ParseBool. Only "true" used to bind: a 2-GPU container got
    # GPUs of two NUMA nodes.
    devs = [dev(0, numa=0), dev(1, numa=1), dev(2, numa=1)]
    ctx = pod_context({keys.NUMA_BIND: value})
    assert ctx.numa_bind
    fit = fit_node(devs, preq(req(nums=2, mem=1000)), ctx, NodeExtras())
    assert fit.ok and {p.uuid for p in fit.containers[0]} == {"GPU-1", "GPU-2"}


# ----------------------------------------------------------------------------------------- dynamic MIG
def test_mig_profile_and_placement_follow_hami():
    # device.go:621-639 selectMigCandidate: smallest profile (memory, then slices) with a free placement;
    # mig_topology.go:26-39: 1g/3g take the highest start. A 1g.10gb goes to slice 6, then a 3g.40gb to 0
    # (its other placement, 4..7, overlaps slice 6).
    cache = UsageCache()
    cache.set_node("n1", [mig_dev(0, uuid="GPU-a")])
    client = FakePodClient()
    ext = Extender(cache, SchedulerConfig(), client)
    ext.synced.set()
    try:
        small = client.add(gpu_pod("small", mem=8000))
        assert ext.filter({"Pod": small, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        ann = client.pods[("default", "small")]["metadata"]["annotations"]
        (a,) = decode_mig_allocations(ann[keys.MIG_ALLOCATIONS])
        assert (a.container_index, a.device_index, a.gpu_uuid, a.profile, a.placement) == (
            0, 0, "GPU-a", "1g.10gb", MigPlacement(6, 1))
        assert ann[keys.DEVICES_ALLOCATED] == "GPU-a,NVIDIA,9728,15:;"  # the profile's memory and cores
        big = client.add(gpu_pod("big", mem=30000))
        assert ext.filter({"Pod": big, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        (b,) = decode_mig_allocations(client.pods[("default", "big")]["metadata"]["annotations"]
                                      [keys.MIG_ALLOCATIONS])
        assert (b.profile, b.placement) == ("3g.40gb", MigPlacement(0, 4))
        # placements left: 4 and 5; a second 3g.40gb has none (HAMi's reason, device.go:815-822)
        again = client.add(gpu_pod("again", mem=30000))
        out = ext.filter({"Pod": again, "NodeNames": ["n1"]})
        assert out["FailedNodes"] == {"n1": "1/1 CardMigTopologyInfeasible"}
    finally:
        ext.healer.stop()


def test_a_mig_gpu_is_examined_again_for_the_same_container():
    # device.go:846-848: after a pick on a MIG GPU the loop looks at the same GPU again, so nvidia.com/gpu: 2
    # gets two instances of one GPU; each pick gets the next placement (AddResourceUsage, 645-664).
    fit = fit_node([mig_dev(0, a100_mig_profiles("1g.10gb"), uuid="GPU-a")], preq(req(nums=2, mem=8000)),
                   pod_context({}), NodeExtras())
    assert fit.ok
    assert [(p.uuid, p.mig_profile, p.mig_placement) for p in fit.containers[0]] == [
        ("GPU-a", "1g.10gb", MigPlacement(6, 1)), ("GPU-a", "1g.10gb", MigPlacement(5, 1))]


def _pod_on(node: str, name: str, devices: str, mig: str | None) -> dict:
    pod = gpu_pod(name, mem=8000)
    pod["spec"]["nodeName"] = node
    ann = pod["metadata"]["annotations"]
    ann.update({keys.VGPU_NODE: node, keys.DEVICES_ALLOCATED: devices, keys.VGPU_TIME: "1"})
    if mig is not None:
        ann[keys.MIG_ALLOCATIONS] = mig
    pod["status"]["phase"] = "Running"
    return pod


def test_a_mig_gpu_whose_reservation_is_missing_is_unhealthy():
    # scheduler.go:799-802 getNodesUsage: a pod using a MIG GPU without a matching profile/placement
    # reservation marks the GPU unhealthy; 788-793: a reservation on a hami-core GPU does too. Both GPUs
    # used to stay healthy.
    cache = UsageCache()
    cache.set_node("n1", [mig_dev(0, uuid="GPU-m"), dev(1, uuid="GPU-h", mem=81920)])
    lost = pod_usage(_pod_on("n1", "lost", "GPU-m,NVIDIA,9728,15:;", None))
    cache.add_pod(lost)
    wrong = pod_usage(_pod_on("n1", "wrong", "GPU-h,NVIDIA,1000,0:;", '[{"containerIndex":0,"deviceIndex":0,'
                                  '"gpuUUID":"GPU-h","profile":"1g.10gb","placement":{"start":6,"size":1}}]'))
    cache.add_pod(wrong)
    by_id = cache.nodes["n1"].by_id
    assert not by_id["GPU-m"].healthy and not by_id["GPU-h"].healthy
    dec = cache.decide(["n1"], preq(req(mem=1000)), pod_context({}))
    assert dec.node is None and dec.failed["n1"] == "2/2 CardNotHealth"
    cache.remove_pod(lost.uid)
    cache.remove_pod(wrong.uid)
    assert by_id["GPU-m"].healthy and by_id["GPU-h"].healthy and by_id["GPU-m"].mig_used == ()


def test_reservations_of_running_pods_occupy_their_placements():
    cache = UsageCache()
    cache.set_node("n1", [mig_dev(0, a100_mig_profiles("3g.40gb"), uuid="GPU-m")])
    mig = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"3g.40gb",'
           '"placement":{"start":4,"size":4},"migUUID":"MIG-x","gpuInstanceID":2,"computeInstanceID":0}]')
    cache.add_pod(pod_usage(_pod_on("n1", "a", "GPU-m,NVIDIA,40192,43:;", mig)))
    assert cache.nodes["n1"].by_id["GPU-m"].mig_used == (MigPlacement(4, 4),)
    dec = cache.decide(["n1"], preq(req(mem=30000)), pod_context({}))
    assert dec.node == "n1" and dec.fit.containers[0][0].mig_placement == MigPlacement(0, 4)
    cache.add_pod(PodUsage("b", "default", "b", "n1", {}, mig_alloc={"GPU-m": (MigPlacement(0, 4),)}))
    dec = cache.decide(["n1"], preq(req(mem=30000)), pod_context({}))
    assert dec.node is None and dec.failed["n1"] == "1/1 CardMigTopologyInfeasible"


def test_a_decision_without_mig_removes_a_stale_reservation():
    # deliberate difference: HAMi's PatchAnnotations leaves an old hami.io/vgpu-mig-allocations in place
    # (its placements would stay occupied); a new decision without MIG removes it in the same write
    cache = UsageCache()
    cache.set_node("n1", [dev(0, mem=81920)])
    client = FakePodClient()
    ext = Extender(cache, SchedulerConfig(), client)
    ext.synced.set()
    try:
        stale = '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.10gb",' \
                '"placement":{"start":6,"size":1}}]'
        pod = client.add(gpu_pod("p", mem=1000, annotations={keys.MIG_ALLOCATIONS: stale}))
        assert ext.filter({"Pod": pod, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        assert keys.MIG_ALLOCATIONS not in client.pods[("default", "p")]["metadata"]["annotations"]
    finally:
        ext.healer.stop()

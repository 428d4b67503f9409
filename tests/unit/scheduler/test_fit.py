"""Table-driven tests of HAMi's Fit: every reason in check order, policies, init containers,
multi-GPU, exclusivity both ways, NUMA binding, quota, and Test_calcScore expectations."""

from __future__ import annotations

import pytest

from hami_agent.scheduler.core.fit import (
    NodeExtras,
    PodContext,
    QuotaBudget,
    device_score,
    fit_container,
    fit_node,
    node_score,
    parse_weights,
    pod_context,
)
from tests.unit.scheduler.helpers import dev, preq, req

pytestmark = pytest.mark.unit

CTX = PodContext()


def run(devs, r, ctx=CTX, extras=None, quota=None):
    return fit_container(devs, r, ctx, extras or NodeExtras(), quota)


@pytest.mark.parametrize(("devs", "request_", "ctx", "extras", "quota", "reason"), [
    ([dev(0, health=False), dev(1)], req(nums=2, mem=1000), CTX, None, None,
     "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth"),
    ([dev(0), dev(1)], req(mem=1000), CTX, NodeExtras(cordoned=frozenset({"GPU-0", "GPU-1"})), None,
     "2/2 CardCordoned"),
    ([dev(0, type_="NVIDIA-T4"), dev(1, type_="NVIDIA-T4")], req(mem=1000),
     PodContext(use_types=("a100",)), None, None, "2/2 CardTypeMismatch"),
    ([dev(0), dev(1, type_="NVIDIA-H100")], req(mem=1000),
     PodContext(nouse_types=("a100", "h100")), None, None, "2/2 CardTypeMismatch"),
    ([dev(0, mode="mig"), dev(1, mode="mig")], req(mem=1000),
     PodContext(vgpu_mode="hami-core"), None, None, "2/2 CardTypeMismatch"),
    ([dev(0), dev(1)], req(mem=1000), PodContext(use_uuids=frozenset({"GPU-9"})), None, None,
     "2/2 CardUuidMismatch"),
    ([dev(0), dev(1)], req(mem=1000), PodContext(nouse_uuids=frozenset({"GPU-0", "GPU-1"})), None, None,
     "2/2 CardUuidMismatch"),
    ([dev(0, count=2, used=2), dev(1, count=2, used=2)], req(mem=1000), CTX, None, None,
     "2/2 CardTimeSlicingExhausted"),
    ([dev(0, used=1), dev(1, used=1)], req(mem=1000), PodContext(gpu_policy=("mutex",)), None, None,
     "2/2 ExclusiveDeviceAllocateConflict"),
    ([dev(0), dev(1)], req(mem=3000), CTX, None, QuotaBudget(mem_left=2000), "2/2 ResourceQuotaNotFit"),
    ([dev(0, usedmem=6000, used=1), dev(1, usedmem=7000, used=1)], req(mem=4096), CTX, None, None,
     "2/2 CardInsufficientMemory"),
    ([dev(0, usedcores=80, used=1), dev(1, usedcores=90, used=1)], req(mem=100, cores=30), CTX, None, None,
     "2/2 CardInsufficientCore"),
    ([dev(0, used=1, usedmem=10), dev(1, used=1, usedmem=10)], req(mem=100, cores=100), CTX, None, None,
     "2/2 ExclusiveDeviceAllocateConflict"),
    ([dev(0, used=1, usedcores=100), dev(1, used=1, usedcores=100)], req(mem=100, cores=0), CTX, None, None,
     "2/2 CardComputeUnitsExhausted"),
    ([dev(0, usedmem=7900, used=1), dev(1, type_="NVIDIA-T4")], req(mem=1000),
     PodContext(use_types=("a100",)), None, None, "1/2 CardInsufficientMemory, 1/2 CardTypeMismatch"),
    ([dev(0)], req(nums=2, mem=1000), CTX, None, None, "NodeInsufficientDevice"),
])
def test_fit_reasons(devs, request_, ctx, extras, quota, reason):
    picked, got, _detail = run(devs, request_, ctx, extras, quota)
    assert picked is None
    assert got == reason


def test_check_order_health_before_memory():
    # an unhealthy, full GPU is reported as CardNotHealth, never CardInsufficientMemory
    _, reason, _ = run([dev(0, health=False, usedmem=8000)], req(mem=1000))
    assert reason == "1/1 CardNotHealth"


def test_memory_detail_line_matches_seed_wording():
    devs = [dev(0, mem=8192, usedmem=4096, used=1)]
    _, reason, detail = run(devs, req(mem=8192))
    assert reason == "1/1 CardInsufficientMemory"
    assert detail == "CardInsufficientMemory, requested 8192Mi but available 4096Mi"


def test_exclusive_pod_blocks_sharer_and_sharer_blocks_exclusive():
    devs = [dev(0)]
    picked, _, _ = run(devs, req(mem=1000, cores=100))
    assert picked and devs[0].usedcores == 100 and devs[0].used == 1
    _, reason, _ = run(devs, req(mem=1000, cores=0))
    assert reason == "1/1 CardComputeUnitsExhausted"
    devs = [dev(0)]
    assert run(devs, req(mem=1000, cores=0))[0]  # a sharer without a cores request
    _, reason, _ = run(devs, req(mem=1000, cores=100))
    assert reason == "1/1 ExclusiveDeviceAllocateConflict"
    devs = [dev(0)]
    assert run(devs, req(mem=1000, cores=10))[0]  # with cores: the core check comes first
    _, reason, _ = run(devs, req(mem=1000, cores=100))
    assert reason == "1/1 CardInsufficientCore"


def test_percentage_memory_and_default_whole_card():
    devs = [dev(0, mem=10000)]
    picked, _, _ = run(devs, req(pct=25))
    assert picked[0].usedmem == 2500
    picked, _, _ = run([dev(0, mem=10000, usedmem=1)], req(pct=100))
    assert picked is None


def test_cores_clamped_to_100():
    picked, _, _ = run([dev(0)], req(mem=10, cores=150))
    assert picked[0].usedcores == 100


def test_multi_gpu_on_distinct_devices():
    devs = [dev(0), dev(1), dev(2)]
    picked, _, _ = run(devs, req(nums=3, mem=1000))
    assert sorted(p.uuid for p in picked) == ["GPU-0", "GPU-1", "GPU-2"]
    assert all(d.used == 1 for d in devs)


def test_spread_picks_least_used_binpack_most_used():
    def devs():
        return [dev(0, used=3, usedmem=3000), dev(1, used=1, usedmem=1000), dev(2, used=2, usedmem=2000)]
    assert run(devs(), req(mem=100), PodContext(gpu_policy=("spread",)))[0][0].uuid == "GPU-1"
    assert run(devs(), req(mem=100), PodContext(gpu_policy=("binpack",)))[0][0].uuid == "GPU-0"


def test_mutex_picks_idle_device():
    devs = [dev(0, used=1, usedmem=10), dev(1), dev(2, used=2, usedmem=10)]
    assert run(devs, req(mem=100), PodContext(gpu_policy=("mutex",)))[0][0].uuid == "GPU-1"


def test_numa_bind_keeps_devices_on_one_numa_node():
    devs = [dev(0, numa=0), dev(1, numa=1, usedmem=7900, used=1), dev(2, numa=1), dev(3, numa=0)]
    picked, _, _ = run(devs, req(nums=2, mem=1000), PodContext(numa_bind=True))
    assert sorted(p.uuid for p in picked) == ["GPU-0", "GPU-3"]


def test_numa_bind_fails_when_no_numa_node_has_enough():
    devs = [dev(0, numa=0), dev(1, numa=1)]
    picked, reason, _ = run(devs, req(nums=2, mem=1000), PodContext(numa_bind=True))
    assert picked is None
    assert "NumaNotFit" in reason and "AllocatedCardsInsufficientRequest" in reason


def test_topology_aware_prefers_best_connected_pair():
    devs = [dev(0), dev(1), dev(2)]
    pairs = {"GPU-0": {"GPU-1": 10, "GPU-2": 200}, "GPU-1": {"GPU-0": 10, "GPU-2": 10},
             "GPU-2": {"GPU-0": 200, "GPU-1": 10}}
    picked, _, _ = run(devs, req(nums=2, mem=10), PodContext(gpu_policy=("topology-aware",)),
                       NodeExtras(pair_scores=pairs))
    assert sorted(p.uuid for p in picked) == ["GPU-0", "GPU-2"]
    picked, _, _ = run([dev(0), dev(1), dev(2)], req(nums=1, mem=10),
                       PodContext(gpu_policy=("topology-aware",)), NodeExtras(pair_scores=pairs))
    assert picked[0].uuid == "GPU-1"  # worst-connected card for a single-GPU pod


def test_quota_counts_all_picked_devices():
    picked, reason, _ = run([dev(0), dev(1)], req(nums=2, mem=1000), quota=QuotaBudget(mem_left=1500))
    assert picked is None and "ResourceQuotaNotFit" in reason
    assert run([dev(0), dev(1)], req(nums=2, mem=1000), quota=QuotaBudget(mem_left=2000))[0]


def test_init_containers_fit_individually_apps_cumulatively():
    base = [dev(0, mem=8000)]
    # init 6000 + app 5000: never run together, fits; two apps of 5000 do not.
    r = fit_node(base, preq(req(mem=6000), req(mem=5000), n_init=1), CTX, NodeExtras())
    assert r.ok and [len(c) for c in r.containers] == [1, 1]
    r = fit_node(base, preq(req(mem=5000), req(mem=5000)), CTX, NodeExtras())
    assert not r.ok and r.reason == "1/1 CardInsufficientMemory"
    assert base[0].usedmem == 0  # never mutates the node's devices


def test_empty_containers_kept_in_result():
    r = fit_node([dev(0)], preq(None, req(mem=100), None, n_init=1), CTX, NodeExtras())
    assert r.ok and [len(c) for c in r.containers] == [0, 1, 0]


def test_calc_score_expectation_node_15():
    # HAMi Test_calcScore: Used 5/10, cores 50/100, mem 4000/8000 -> 15
    assert node_score([dev(0, count=10, used=5, usedcores=50, mem=8000, usedmem=4000)]) == pytest.approx(15.0)
    assert node_score([dev(0), dev(1)]) == 0.0
    assert node_score([dev(0, count=0)]) == 0.0
    # summed over devices
    assert node_score([dev(0, used=10, usedcores=100, usedmem=8000), dev(1)]) == pytest.approx(15.0)


def test_device_score_request_term_only_for_equal_type():
    d = dev(0, used=5, usedcores=50, usedmem=4000)
    assert device_score(d, req(nums=2, mem=4000, cores=50)) == pytest.approx(15.0)  # model type != NVIDIA
    d2 = dev(0, used=5, usedcores=50, usedmem=4000, type_="NVIDIA")
    assert device_score(d2, req(nums=2, mem=4000, cores=50)) == pytest.approx(10 * (0.6 + 1.0 + 1.0))
    assert device_score(d, None, (2, 0, 0)) == pytest.approx(10.0)


def test_scoring_weights_annotation():
    assert parse_weights("slot=1,core=2,memory=3") == (1, 2, 3)
    for bad in ("slot=1,core=2", "slot=-1,core=1,memory=1", "slot=0,core=0,memory=0",
                "slot=x,core=1,memory=1"):
        with pytest.raises(ValueError, match="device-scoring-weights"):
            parse_weights(bad)
    ctx = pod_context({"hami.io/device-scoring-weights": "slot=0,core=0,memory=1",
                       "hami.io/gpu-scheduler-policy": "binpack,numa",
                       "hami.io/node-scheduler-policy": "spread", "nvidia.com/numa-bind": "true"})
    assert ctx.weights == (0, 0, 1) and ctx.gpu_policy == ("binpack", "numa")
    assert ctx.node_policy == "spread" and ctx.numa_bind
    assert pod_context({"hami.io/gpu-scheduler-policy": "bogus"}).gpu_policy == ("spread",)


def test_policy_chains_and_bare_numa():
    from hami_agent.scheduler.core.fit import sort_devices

    def devs():
        out = [dev(0, numa=1, used=1, usedmem=4000), dev(1, numa=0, used=1, usedmem=4000),
               dev(2, numa=1), dev(3, numa=0, used=2, usedmem=6000)]
        for d in out:
            d.score = device_score(d, None)
        return out
    order = [d.index for d in sort_devices(devs(), PodContext(gpu_policy=("binpack", "numa")))]
    assert order == [2, 1, 0, 3]  # score ascending, then numa ascending; Fit tries index 3 first
    order = [d.index for d in sort_devices(devs(), PodContext(gpu_policy=("numa",)))]
    assert order == [1, 3, 0, 2]  # numa ascending, then index
    order = [d.index for d in sort_devices(devs(), PodContext(gpu_policy=("spread",), numa_bind=True))]
    assert order == [3, 1, 0, 2]  # numa-bind + spread: numa ascending, then score descending

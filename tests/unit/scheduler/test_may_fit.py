"""``may_fit`` (the best-first walk's pre-check) is a necessary condition of the exact fit: whenever
``UsageCache.evaluate`` says a pod fits a node, ``may_fit`` says it may; and for the shapes
``screen_is_exact`` names, on nodes without MIG-mode GPUs, it is the exact answer; the capacity index
admits every node a pod fits. Checked on random nodes (shared and dynamic-MIG GPUs, NUMA, health, cordons,
static MIG resources, usage) and random requests (1-8 GPUs, MiB and percent memory, cores, exclusive, init
containers, types, modes, UUID lists, policies)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_agent.protocol import MigPlacement
from hami_agent.scheduler.core.fit import NodeExtras, PodContext
from hami_agent.scheduler.core.model import NVIDIA, ContainerDeviceRequest, DeviceUsage, PodRequest
from hami_agent.scheduler.core.nodes import NodeState
from hami_agent.scheduler.core.prefit import may_fit, screen_is_exact
from hami_agent.scheduler.state.cache import UsageCache
from tests.unit.scheduler.helpers import a100_mig_profiles, dev, preq, req

pytestmark = pytest.mark.unit

TYPES = ("NVIDIA-A100", "NVIDIA-H100", "NVIDIA A100-SXM4-80GB", "Tesla-T4")


@st.composite
def devices(draw) -> list[DeviceUsage]:
    out = []
    for i in range(draw(st.sampled_from((1, 1, 2, 3, 4, 8)))):
        if draw(st.integers(0, 4)) == 0:  # a dynamic-MIG GPU with some placements taken
            d = dev(i, mem=81920, count=7, mode="mig", type_="NVIDIA A100-SXM4-80GB",
                    numa=draw(st.integers(0, 1)))
            d.mig_profiles = a100_mig_profiles()
            taken = draw(st.lists(st.integers(0, 6), max_size=4, unique=True))
            d.mig_used = tuple(MigPlacement(s, 1) for s in taken)
            d.used = len(taken)
            d.usedmem = 9728 * len(taken)
            d.usedcores = 15 * len(taken)
        else:
            mem = draw(st.sampled_from((16384, 40960, 81920)))
            count = draw(st.integers(1, 10))
            total = draw(st.sampled_from((100, 100, 100, 50, 200)))
            d = dev(i, mem=mem, count=count, cores=total, numa=draw(st.integers(0, 1)),
                    type_=draw(st.sampled_from(TYPES)), mode=draw(st.sampled_from(("hami-core", "mps"))))
            d.used = draw(st.integers(0, count))
            d.usedmem = draw(st.sampled_from((0, mem // 2, mem - 1000, mem))) if d.used else 0
            d.usedcores = draw(st.sampled_from((0, 10, 50, total))) if d.used else 0
        d.health = draw(st.integers(0, 9)) > 0
        d.mig_faults = int(draw(st.integers(0, 19)) == 0)
        out.append(d)
    return out


@st.composite
def container(draw) -> ContainerDeviceRequest | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    pct = draw(st.sampled_from((101, 101, 10, 50, 100)))
    return ContainerDeviceRequest(
        nums=draw(st.integers(0, 8)), type=NVIDIA if draw(st.integers(0, 19)) else "Ascend",
        memreq=draw(st.sampled_from((0, 1000, 9000, 20000, 40000, 81000))), mem_percentage=pct,
        coresreq=draw(st.sampled_from((0, 0, 15, 30, 50, 100, 120))))


@st.composite
def requests(draw) -> PodRequest:
    apps = draw(st.lists(container(), min_size=1, max_size=3))
    inits = draw(st.lists(container(), max_size=2))
    mig = ((draw(st.sampled_from(("1g.10gb", "3g.40gb"))), draw(st.integers(1, 2))),) if draw(
        st.integers(0, 5)) == 0 else ()
    return PodRequest(containers=tuple(inits + apps), n_init=len(inits), mig=mig)


@st.composite
def contexts(draw, devs: list[DeviceUsage]) -> PodContext:
    ids = [d.id for d in devs]
    return PodContext(
        use_types=tuple(draw(st.lists(st.sampled_from(("A100", "H100", "T4")), max_size=2))),
        nouse_types=tuple(draw(st.lists(st.sampled_from(("H100", "SXM4")), max_size=1))),
        use_uuids=frozenset(draw(st.lists(st.sampled_from(ids), max_size=3))),
        nouse_uuids=frozenset(draw(st.lists(st.sampled_from(ids), max_size=2))),
        numa_bind=draw(st.booleans()),
        vgpu_mode=draw(st.sampled_from((None, None, "hami-core", "mig", "mps", ""))),
        gpu_policy=draw(st.sampled_from((("spread",), ("binpack",), ("mutex",), ("topology-aware",),
                                         ("numa",), ("binpack", "numa")))))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_may_fit_is_necessary_for_the_exact_fit(data) -> None:
    devs = data.draw(devices())
    pr = data.draw(requests())
    ctx = data.draw(contexts(devs))
    cordoned = frozenset(data.draw(st.lists(st.sampled_from([d.id for d in devs]), max_size=2)))
    capacity = {"1g.10gb": data.draw(st.integers(0, 3)), "3g.40gb": data.draw(st.integers(0, 2))}
    used = {k: data.draw(st.integers(0, v)) for k, v in capacity.items()}
    node = NodeState("n", devs, NodeExtras(cordoned=cordoned), capacity, used)
    exact = UsageCache().evaluate(node, pr, ctx, None)
    screened = may_fit(node, pr, ctx)
    if exact.ok:
        assert screened, (pr, ctx, exact)
    if screen_is_exact(pr, ctx) and not any(d.mode == "mig" for d in devs):
        assert screened == exact.ok, (pr, ctx, exact)  # the pre-check decides these shapes alone


def test_may_fit_prunes_full_and_unsuitable_nodes() -> None:
    """The pre-check is not vacuous: it refuses what clearly cannot fit, and the walk then skips it."""
    full = NodeState("full", [dev(i, used=10, count=10) for i in range(4)])
    small = NodeState("small", [dev(i, mem=8000) for i in range(4)])
    split = NodeState("split", [dev(0, numa=0), dev(1, numa=1)])
    mig = dev(0, mem=81920, count=7, mode="mig", type_="NVIDIA A100-SXM4-80GB")
    mig.mig_profiles = a100_mig_profiles()
    one_mig = NodeState("mig", [mig])
    assert not may_fit(full, preq(req(1)), PodContext())
    assert not may_fit(small, preq(req(1, mem=9000)), PodContext())
    assert not may_fit(small, preq(req(5)), PodContext())
    assert not may_fit(split, preq(req(2)), PodContext(numa_bind=True))
    assert may_fit(split, preq(req(2)), PodContext())
    assert not may_fit(small, preq(req(1)), PodContext(use_types=("H100",)))
    exhausted = NodeState("busy", [dev(0, used=1, usedcores=100, usedmem=1000)])
    assert not may_fit(exhausted, preq(req(1, mem=1000)), PodContext())  # compute units exhausted
    big = NodeState("big", [dev(0, cores=200, used=1, usedcores=50)])  # exclusivity binds 100-core GPUs only
    assert may_fit(big, preq(req(1, cores=100)), PodContext())
    assert UsageCache().evaluate(big, preq(req(1, cores=100)), PodContext(), None).ok
    # one MIG GPU serves several instances of a container: not refused for having one device
    assert may_fit(one_mig, preq(req(3, mem=9000)), PodContext())
    assert UsageCache().evaluate(one_mig, preq(req(3, mem=9000)), PodContext(), None).ok


def test_walk_skips_nodes_refused_by_may_fit_and_still_picks_the_best() -> None:
    rng = random.Random(7)
    cache = UsageCache()
    names = []
    for i in range(200):  # most nodes full: the walk must not fit them one by one
        busy = i % 50 != 0
        devs = [dev(g, count=4, used=4 if busy else rng.randrange(4), uuid=f"G-{i}-{g}") for g in range(4)]
        cache.set_node(f"n{i:03d}", devs)
        names.append(f"n{i:03d}")
    ctx = PodContext()
    shape = preq(req(1, mem=1000))
    want = max((n for n in names if cache.evaluate(cache.nodes[n], shape, ctx, None).ok),
               key=cache._rank.__getitem__)  # noqa: SLF001
    dec = cache.decide(names, shape, ctx)
    assert dec.node == want
    assert cache.lazy_fits <= 4  # only nodes with room were fitted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_capacity_index_admits_every_node_that_fits(data) -> None:
    cache = UsageCache()
    for i in range(data.draw(st.integers(1, 5))):
        devs = data.draw(devices())
        for d in devs:
            d.id = f"n{i}-{d.id}"
        cache.set_node(f"n{i}", devs)
    pr = data.draw(requests())
    ctx = data.draw(st.sampled_from((PodContext(), PodContext(numa_bind=True),
                                     PodContext(gpu_policy=("mutex",)),
                                     PodContext(gpu_policy=("topology-aware",)))))
    cand = cache._capacity.candidates(pr, min_gain=0)  # noqa: SLF001 - the index under test
    fitting = {n for n, node in cache.nodes.items() if cache.evaluate(node, pr, ctx, None).ok}
    assert cand is None or fitting <= cand, (pr, fitting - cand)


def test_a_node_whose_kth_free_gpu_is_too_small_is_refused_by_the_summary(monkeypatch) -> None:
    """8 GPUs of 60 GiB: a node whose largest free GPU has that much but whose eighth has not is refused
    from its summary (O(1)), without counting its devices (the walk of a new 8-GPU shape at 5,000 nodes
    screened 1,600 such nodes device by device: 30 ms)."""
    from hami_agent.scheduler.core import prefit

    counted: list[str] = []
    real = prefit._count_devices  # noqa: SLF001 - the step that must not run
    monkeypatch.setattr(prefit, "_count_devices", lambda st, p, c: counted.append(st.name) or real(st, p, c))
    node = NodeState("n", [dev(g, mem=81920, usedmem=0 if g < 7 else 40000) for g in range(8)])
    eight = preq(req(8, mem=61440, cores=15))
    assert not may_fit(node, eight, PodContext()) and counted == []
    assert not UsageCache().evaluate(node, eight, PodContext(), None).ok
    busy_cores = NodeState("c", [dev(g, mem=81920, usedcores=0 if g < 7 else 90) for g in range(8)])
    assert not may_fit(busy_cores, eight, PodContext()) and counted == []
    roomy = NodeState("r", [dev(g, mem=81920, usedmem=10000) for g in range(8)])
    assert may_fit(roomy, eight, PodContext()) and counted == ["r"]


def test_static_mig_shapes_walk_only_the_nodes_offering_the_profile() -> None:
    cache = UsageCache()
    rng = random.Random(3)
    for i in range(300):
        offer = {"1g.10gb": rng.randrange(3)} if i % 10 == 0 else {}
        cache.set_node(f"n{i:03d}", [dev(0, uuid=f"n{i}-0", used=rng.randrange(5))], mig_capacity=offer)
    cache.set_node("n000", [dev(0, uuid="n0-0")], mig_capacity={})  # re-registered without MIG capacity
    cache.remove_node("n010")
    names = sorted(cache.nodes)
    shape = PodRequest(containers=(None,), n_init=0, mig=(("1g.10gb", 1),))
    ctx = PodContext()
    fitting = [n for n in names if cache.evaluate(cache.nodes[n], shape, ctx, None).ok]
    want = max(fitting, key=cache._rank.__getitem__)  # noqa: SLF001
    assert fitting and all(int(n[1:]) % 10 == 0 for n in fitting) and "n000" not in fitting
    screened: list[str] = []
    real = cache._screen  # noqa: SLF001
    cache._screen = lambda st, *a: screened.append(st.name) or real(st, *a)  # noqa: SLF001
    dec = cache.decide(names, shape, ctx)  # a new shape, 299 dirty nodes: the best-first walk
    assert dec.node == want
    assert screened and all(int(n[1:]) % 10 == 0 and n not in ("n000", "n010") for n in screened)

"""The best-first (lazy) fit of a new request shape picks exactly the node a full evaluation picks, and
the counts completed later for the FilteringSucceed event match a full count."""

from __future__ import annotations

import random

import pytest

from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceUsage, Picked, PodRequest, PodUsage
from hami_agent.scheduler.state import cache as cache_mod
from hami_agent.scheduler.state.cache import UsageCache, collapse
from tests.unit.scheduler.helpers import preq as make_preq
from tests.unit.scheduler.helpers import req

pytestmark = pytest.mark.unit


def build(n_nodes: int, seed: int) -> UsageCache:
    rng = random.Random(seed)
    cache = UsageCache()
    for i in range(n_nodes):
        name = f"n{i:04d}"
        devs = [DeviceUsage(id=f"GPU-{i}-{g}", index=g, type="NVIDIA-A100", count=4, totalmem=40960,
                            totalcore=100, numa=g // 2, health=True, mode="hami-core") for g in range(4)]
        cache.set_node(name, devs)
        for k in range(rng.randrange(0, 9)):
            g = rng.randrange(4)
            mem, cores = rng.choice(((4096, 10), (16384, 50), (30000, 0), (2048, 100)))
            cache.add_pod(PodUsage(uid=f"u{i}-{k}", namespace="default", name=f"p{i}-{k}", node=name,
                                   devices=collapse([[Picked(devs[g].id, "NVIDIA", mem, cores)]], 0)))
    return cache


def brute(cache: UsageCache, names: list[str], preq: PodRequest,
          ctx: PodContext) -> tuple[str | None, set[str]]:
    ok = {n for n in names if n in cache.nodes and cache.evaluate(cache.nodes[n], preq, ctx, None).ok}
    if not ok:
        return None, ok
    key = cache._rank.__getitem__  # noqa: SLF001 - the policy's order of node scores
    return (min(ok, key=key) if ctx.node_policy == "spread" else max(ok, key=key)), ok


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_lazy_walk_picks_the_node_a_full_evaluation_picks(policy: str) -> None:
    cache = build(300, seed=3)
    names = sorted(cache.nodes) + ["ghost-node"]
    ctx = PodContext(node_policy=policy)
    shapes = [(1, 4096, 10), (2, 20000, 30), (4, 40000, 100), (1, 38000, 0), (3, 12000, 60), (4, 1000, 0)]
    before = cache.lazy_fits
    for gpus, mem, cores in shapes:
        preq = make_preq(req(gpus, mem=mem, cores=cores))
        want, ok = brute(cache, names, preq, ctx)
        dec = cache.decide(names, preq, ctx, event_nodes=5)
        assert dec.node == want, (gpus, mem, cores)
        if want is None:
            assert set(dec.failed) == set(names) and dec.failed["ghost-node"] == "node unregistered"
            continue
        cache.complete(dec)
        assert dec.n_fit == len(ok) and dec.fit_nodes[0] == want and len(dec.fit_nodes) == min(5, len(ok))
    assert cache.lazy_fits > before  # the walk was taken (more dirty candidates than EAGER_DIRTY)
    assert len(cache.nodes) > cache_mod.EAGER_DIRTY


def test_walk_stays_right_while_nodes_change() -> None:
    cache = build(200, seed=11)
    names = sorted(cache.nodes)
    ctx = PodContext()
    preq = make_preq(req(1, mem=8000, cores=20))
    rng = random.Random(5)
    for step in range(40):
        dec = cache.decide(names, preq, ctx)
        assert dec.node == brute(cache, names, preq, ctx)[0]
        node = dec.node or names[rng.randrange(len(names))]
        dev = cache.nodes[node].devices[rng.randrange(4)]
        cache.add_pod(PodUsage(uid=f"x{step}", namespace="default", name=f"x{step}", node=node,
                               devices=collapse([[Picked(dev.id, "NVIDIA", 8000, 20)]], 0)))
        if step % 7 == 0:
            cache.remove_pod(f"u{rng.randrange(200)}-0")

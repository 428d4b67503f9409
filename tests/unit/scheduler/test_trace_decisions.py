"""The screened, memoised, best-first decision picks the node a full evaluation of every node picks, on the
benchmark's realistic fleet (A100, H100 and dynamic-MIG nodes with running pods) and request shapes (1-8
GPUs, MiB / percent / whole memory, cores, exclusive, static MIG, init containers, NUMA and policy
annotations); placed pods are reserved so the cache keeps changing. And a decision waiting for its event
counts holds neither its memo (weakly referenced) nor a copy of the node names."""

from __future__ import annotations

import gc

import pytest

from benchmarks.scheduler.trace import build_fleet, shapes, trace
from hami_agent.scheduler import cache as cache_mod
from hami_agent.scheduler.cache import UsageCache, collapse
from hami_agent.scheduler.fit import pod_context
from hami_agent.scheduler.model import PodUsage
from hami_agent.scheduler.requests import pod_request

pytestmark = pytest.mark.unit


def brute(cache: UsageCache, names: list[str], preq, ctx) -> str | None:
    ok = [n for n in names if cache.evaluate(cache.nodes[n], preq, ctx, None).ok]
    if not ok:
        return None
    pick = min if ctx.node_policy == "spread" else max
    return pick(ok, key=cache._rank.__getitem__)  # noqa: SLF001 - the policy's order of node scores


def test_trace_decisions_match_a_full_evaluation() -> None:
    cache = build_fleet(120, seed=4)  # more nodes than EAGER_DIRTY: the best-first walk is taken
    assert len(cache.nodes) > cache_mod.EAGER_DIRTY
    names = sorted(cache.nodes)
    placed = 0
    for j, shape in enumerate(trace(shapes(60, seed=5), 80, seed=6)):
        pod = shape.pod(j)
        preq = pod_request(pod)
        ctx = pod_context(pod["metadata"]["annotations"])
        want = brute(cache, names, preq, ctx)
        dec = cache.decide(names, preq, ctx, event_nodes=5)
        assert dec.node == want, (j, shape)
        if dec.node is None:
            assert set(dec.failed) == set(names)
            assert all(r != cache_mod.PRUNED.reason for r in dec.failed.values())  # real reasons only
            continue
        cache.complete(dec)
        fitting = sum(1 for n in names if n == dec.node or cache.evaluate(cache.nodes[n], preq, ctx, None).ok)
        assert dec.n_fit == fitting and dec.fit_nodes[0] == dec.node
        cache.add_pod(PodUsage(uid=f"t{j}", namespace="default", name=f"t{j}", node=dec.node,
                               devices=collapse(dec.fit.containers, preq.n_init), mig=preq.mig))
        placed += 1
    assert placed > 40


def test_pending_counts_hold_no_names_and_a_weak_memo() -> None:
    cache = UsageCache(memo_shapes=1)
    big = build_fleet(100, seed=1)
    for name, st in big.nodes.items():
        cache.set_node(name, st.devices, st.extras, st.mig_capacity)
    names = sorted(cache.nodes)
    first, second = (shape.pod(j) for j, shape in enumerate(shapes(2, seed=9)))
    dec = cache.decide(names, pod_request(first), pod_context({}), event_nodes=5)
    assert dec.node is not None and dec.pending is not None
    memo_ref, names_ref = dec.pending[0], dec.pending[1]
    assert names_ref is None  # every known node was a candidate: no copy of the names is kept
    cache.decide(names, pod_request(second), pod_context({}), event_nodes=5)  # evicts the first memo
    gc.collect()
    assert memo_ref() is None  # the queued decision did not keep the evicted memo alive
    cache.complete(dec)  # counted on a scratch memo
    want = sum(1 for n in names if n == dec.node
               or cache.evaluate(cache.nodes[n], pod_request(first), pod_context({}), None).ok)
    assert dec.pending is None and dec.n_fit == want

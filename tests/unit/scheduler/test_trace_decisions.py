"""The screened, memoised, best-first decision (``state.cache.UsageCache.decide``) answers what the pure
decision core's definition answers (``core.decide.decide``: every candidate fitted, the best by policy), on
the benchmark's realistic fleet (A100, H100 and dynamic-MIG nodes with running pods) and request shapes (1-8
GPUs, MiB / percent / whole memory, cores, exclusive, static MIG, init containers, NUMA and policy
annotations); placed pods are reserved so the cache keeps changing. And a decision waiting for its event
counts holds neither its memo (weakly referenced) nor a copy of the node names."""

from __future__ import annotations

import gc
import random

import pytest

from benchmarks.scheduler.trace import build_fleet, shapes, trace
from hami_agent.scheduler.core.decide import decide
from hami_agent.scheduler.core.fit import QuotaBudget, pod_context
from hami_agent.scheduler.core.model import PodUsage
from hami_agent.scheduler.core.requests import pod_request
from hami_agent.scheduler.state import cache as cache_mod
from hami_agent.scheduler.state.cache import UsageCache, collapse, mig_reservations

pytestmark = pytest.mark.unit


def test_trace_decisions_match_the_decision_core() -> None:
    cache = build_fleet(120, seed=4)  # more nodes than EAGER_DIRTY: the best-first walk is taken
    assert len(cache.nodes) > cache_mod.EAGER_DIRTY
    names = sorted(cache.nodes)
    rng = random.Random(11)
    placed = refused = 0
    for j, shape in enumerate(trace(shapes(60, seed=5), 400, seed=6)):  # until the fleet is full
        pod = shape.pod(j)
        preq = pod_request(pod)
        ctx = pod_context(pod["metadata"]["annotations"])
        # busy nodes now and then (a pod being admitted there: taken only when nothing else fits)
        avoid = frozenset(rng.sample(names, 3)) if j % 4 == 0 else frozenset()
        want = decide(cache.nodes, names, preq, ctx, avoid=avoid)
        dec = cache.decide(names, preq, ctx, event_nodes=5, avoid=avoid)
        assert dec.node == want.node, (j, shape)
        if dec.node is None:
            assert dec.failed == want.failed  # the same reason for every candidate
            assert all(r != cache_mod.PRUNED.reason for r in dec.failed.values())  # real reasons only
            refused += 1
            continue
        cache.complete(dec)
        assert dec.n_fit == len(want.fit_nodes)
        assert dec.fit_nodes == want.fit_nodes[:len(dec.fit_nodes)] and dec.fit_nodes[0] in want.fit_nodes
        cache.add_pod(PodUsage(uid=f"t{j}", namespace="default", name=f"t{j}", node=dec.node,
                               devices=collapse(dec.fit.containers, preq.n_init), mig=preq.mig,
                               mig_alloc=mig_reservations(dec.fit.containers)))
        placed += 1
    assert placed > 40 and refused > 0


def test_quota_decisions_match_the_decision_core() -> None:
    cache = build_fleet(40, seed=2)
    names = sorted(cache.nodes)
    for j, shape in enumerate(trace(shapes(20, seed=3), 40, seed=8)):
        pod = shape.pod(j)
        preq, ctx = pod_request(pod), pod_context(pod["metadata"]["annotations"])
        quota = QuotaBudget(mem_left=[None, 20000, 200000][j % 3], cores_left=[None, 50, 400][j % 3])
        want = decide(cache.nodes, names, preq, ctx, quota)
        dec = cache.decide(names, preq, ctx, quota, event_nodes=0)
        assert dec.node == want.node, (j, shape)
        if dec.node is None:
            assert dec.failed == want.failed


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

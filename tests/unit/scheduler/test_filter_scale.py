"""The shortcuts that keep /filter flat from 500 to 5,000 nodes decide exactly what the long way decides:
the node-name set reused for an equal list, the walk bounded by the capacity index, and the event counts
completed with the index's refusals marked in bulk (``UsageCache``)."""

from __future__ import annotations

import pytest

from benchmarks.scheduler.trace import build_fleet, shapes
from hami_agent.protocol.annotations import DEFAULT_GPU_POLICY, DEFAULT_NODE_POLICY
from hami_agent.protocol.requests import RequestConfig
from hami_agent.scheduler.core.fit import pod_context
from hami_agent.scheduler.core.requests import pod_request
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.podinfo import annotations

pytestmark = pytest.mark.unit


def _requests(n: int) -> list:
    out = []
    for j, shape in enumerate(shapes(n, seed=5)):
        pod = shape.pod(j)
        out.append((pod_request(pod, RequestConfig()),
                    pod_context(annotations(pod), DEFAULT_NODE_POLICY, DEFAULT_GPU_POLICY)))
    return out


def test_equal_node_list_reuses_its_set() -> None:
    cache = build_fleet(40, seed=3)
    names = sorted(cache.nodes)
    first = cache._names_set(names)
    assert first == set(names)
    assert cache._names_set(list(names)) is first  # an equal list (another object): the same set
    fewer = names[:-1]
    other = cache._names_set(fewer)
    assert other == set(fewer) and other is not first
    names.append("changed-after-the-call")  # the caller's list changing does not change the reused set
    assert cache._names_set(sorted(cache.nodes)) == set(cache.nodes)
    with pytest.raises(ValueError, match="strings"):
        cache._names_set([["not", "a", "name"]])


def _outcome(cache: UsageCache, names: list[str], preq, ctx) -> tuple:
    dec = cache.complete(cache.decide(names, preq, ctx, event_nodes=10))
    return dec.node, dec.n_fit, dec.fit_nodes, sorted(dec.failed.items())


def test_bounded_walk_and_bulk_counts_equal_the_full_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two identical random fleets (shared, H100 and MIG nodes with running pods): one decides with the
    capacity index bounding the walk and pruning the counts, the other screens every node. Every request
    shape (1-8 GPUs, MiB/percent, cores, static MIG, NUMA, policies), asked twice (cold, then warm, with
    a name missing from the list), answers the same node, counts and reasons."""
    monkeypatch.setattr("hami_agent.scheduler.state.cache.COMPLETE_QUIET_S", 0.0)
    bounded, full = build_fleet(160, seed=7), build_fleet(160, seed=7)
    # bounded whenever the index rules out any node (by default: half of them), so most walks are
    bound = bounded._candidates
    monkeypatch.setattr(bounded, "_candidates", lambda preq, min_gain=2: bound(preq, 1))
    monkeypatch.setattr(full, "_candidates", lambda preq, min_gain=2: None)
    names = sorted(bounded.nodes)
    bounded_walks = 0
    for preq, ctx in _requests(40):
        bounded_walks += len(bounded._candidates(preq) or names) < len(names)
        for ask in (names, names[1:]):
            assert _outcome(bounded, ask, preq, ctx) == _outcome(full, ask, preq, ctx), (preq, ctx)
    assert bounded_walks >= 20, bounded_walks  # the index did bound most of the walks

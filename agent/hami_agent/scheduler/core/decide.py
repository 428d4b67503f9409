"""One /filter decision as a pure function: a snapshot of the nodes (``NodeState`` with their usage) and a
pod's request in, the chosen node (or every node's reason) out (Project-HAMi/HAMi ``pkg/scheduler/
scheduler.go`` Filter: ``calcScore`` over the candidates, then the best node by the node policy).

This is the decision's definition. ``state.cache.UsageCache.decide`` gives the same answers fast (a memo per
request shape, best-first walks, cheap pre-checks); ``tests/unit/scheduler/test_trace_decisions.py``
holds the two to the same answers on random clusters and traces.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from hami_agent.protocol import keys
from hami_agent.protocol import reasons as R
from hami_agent.protocol.reasons import gen_reason
from hami_agent.scheduler.core.fit import NodeFit, PodContext, QuotaBudget, fit_node, node_score
from hami_agent.scheduler.core.model import PodRequest
from hami_agent.scheduler.core.nodes import NodeState

UNREGISTERED = "node unregistered"  # a candidate the snapshot has no devices for


@dataclass
class Outcome:
    """The decision: ``node`` and its ``fit`` (devices picked), or None and every candidate's reason."""

    node: str | None
    fit: NodeFit | None
    failed: dict[str, str] = field(default_factory=dict)
    fit_nodes: list[str] = field(default_factory=list)  # every fitting node, best first
    scores: dict[str, float] = field(default_factory=dict)  # node -> HAMi's score before the pod


def evaluate(st: NodeState, preq: PodRequest, ctx: PodContext, quota: QuotaBudget | None) -> NodeFit:
    """Exact fit of one pod on one node: static MIG resources first, then the GPUs."""
    for profile, n in preq.mig:
        free = st.mig_capacity.get(profile, 0) - st.mig_used.get(profile, 0)
        if free < n:
            mig_devs = sum(1 for d in st.devices if d.mode == keys.MODE_MIG) or len(st.devices)
            return NodeFit(False, [], gen_reason({R.CARD_MIG_TOPOLOGY_INFEASIBLE: mig_devs}, len(st.devices)),
                           f"{R.CARD_MIG_TOPOLOGY_INFEASIBLE}, requested {n} "
                           f"{keys.mig_resource_name(profile)} but available {max(free, 0)}")
    if all(c is None for c in preq.containers):
        return NodeFit(True, [[] for _ in preq.containers])
    return fit_node(st.devices, preq, ctx, st.extras, quota)


def decide(nodes: Mapping[str, NodeState], names: Sequence[str], preq: PodRequest, ctx: PodContext,
           quota: QuotaBudget | None = None, avoid: Collection[str] = ()) -> Outcome:
    """Fit the pod on every candidate of ``names`` and pick by the node policy: the highest HAMi score
    (``binpack``) or the lowest (``spread``), ties by name; ``avoid`` (a pod is being admitted there) only
    when no other candidate fits. A quota budget is a fresh copy per node (each node is a separate
    what-if)."""
    fits = {}
    for n in dict.fromkeys(names):
        st = nodes.get(n)
        if st is not None:
            fits[n] = evaluate(st, preq, ctx, None if quota is None else QuotaBudget(quota.mem_left,
                                                                                   quota.cores_left))
    ok = [n for n, r in fits.items() if r.ok]
    if not ok:
        return Outcome(None, None, {n: (fits[n].reason if n in fits else UNREGISTERED) for n in names})
    scores = {n: node_score(nodes[n].devices) for n in fits}
    spread = ctx.node_policy == "spread"
    order = sorted(ok, key=lambda n: (scores[n], n), reverse=not spread)
    free = [n for n in order if n not in avoid]
    best = (free or order)[0]
    return Outcome(best, fits[best], {}, order, scores)

"""GPU preemption's dry run as pure functions (issue 29 item 3; docs/scheduler.md "Preemption"): which
lower-priority pods must go so that a pod fits a node, judged by HAMi's own fit (``core.decide.evaluate``)
instead of kube-scheduler's framework filters, which cannot see GPU memory (Project-HAMi/HAMi#1494).

Upstream's shape (kubernetes v1.35.4, ``pkg/scheduler/framework/plugins/defaultpreemption/
default_preemption.go`` ``SelectVictimsOnNode``, ``pkg/scheduler/framework/preemption/preemption.go``
``pickOneNodeForPreemption``), with one change: on a node the victims are the **fewest** that make the pod
fit, found by trying victim sets of growing size, not upstream's greedy reprieve. Upstream's reprieve is
cheap but can evict more than needed (a pod reprieved first may block a cheaper set); GPU pods are few per
node, so the exact search is affordable within a bound (``MAX_FITS`` fit runs per node). Past the bound,
upstream's reprieve answers (``Victims.exact`` False).

Rules kept from upstream: only pods of strictly lower priority are victims (``default_preemption.go``
``:235-242``); a pod with ``preemptionPolicy: Never`` preempts nothing (``:317-341``); system-critical pods
(priority >= 2,000,000,000, ``SystemCriticalPriority`` in ``pkg/apis/scheduling/types.go``) are never victims
here (upstream would let a higher system-critical pod take them; GPU pods are never system-critical).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami_agent.protocol import keys
from hami_agent.scheduler.core.decide import evaluate
from hami_agent.scheduler.core.fit import NodeFit, PodContext, QuotaBudget
from hami_agent.scheduler.core.model import PREEMPT_NEVER, PodRequest, PodUsage
from hami_agent.scheduler.core.nodes import NodeState, apply_pod

SYSTEM_CRITICAL = 2_000_000_000  # kubernetes pkg/apis/scheduling/types.go SystemCriticalPriority
MAX_FITS = 512  # fit runs per node for the exact search; past it, upstream's reprieve
_SHIFT = 1 << 31  # preemption.go: each priority shifted by MaxInt32+1 before summing, so all terms are > 0

# PodDisruptionBudgets: the UIDs that violate one whatever the set, or a function of a victim set (most
# important first) giving the UIDs of that set that violate one (``core.pdb.Violations``, upstream's
# ``filterPodsWithPDBViolation``: a budget is spent by the earlier victims of the same set)
Pdb = Collection[str] | Callable[[Sequence[PodUsage]], Collection[str]]


@dataclass(frozen=True)
class Quota:
    """The preemptor's namespace and the room left in its GPU quota (``QuotaBudget``, HAMi's ``FitQuota``):
    the filter refuses a pod that would go past it (``ResourceQuotaNotFit``), so the dry run must too.
    Victims of the same namespace give their memory and cores back; victims of other namespaces give
    nothing back to it (so a set never holds another namespace's pod just for quota: without it the set
    frees the same quota, is smaller, and is tried first)."""

    namespace: str
    budget: QuotaBudget

    def without(self, gone: Iterable[PodUsage]) -> QuotaBudget:
        """The room left once ``gone`` are deleted."""
        mem = cores = 0
        for p in gone:
            if p.namespace == self.namespace:
                mem += sum(a.mem for a in p.devices.values())
                cores += sum(a.cores for a in p.devices.values())
        b = self.budget
        return QuotaBudget(None if b.mem_left is None else b.mem_left + mem,
                           None if b.cores_left is None else b.cores_left + cores)


@dataclass(frozen=True)
class Victims:
    """The pods to delete on ``node`` so that the preemptor fits, and where it then fits (``fit``: its
    devices on the node with the victims gone, the capacity to hold for it)."""

    node: str
    pods: tuple[PodUsage, ...]  # most important first (upstream's order)
    pdb_violations: int
    fit: NodeFit
    exact: bool = True  # False: the exact search ran out of its bound and upstream's reprieve answered

    @property
    def max_priority(self) -> int:
        return max((p.priority for p in self.pods), default=-_SHIFT)

    @property
    def sum_priority(self) -> int:
        return sum(p.priority + _SHIFT for p in self.pods)

    def earliest_top_start(self) -> float:
        """The earliest start among the highest-priority victims (``GetEarliestPodStartTime``)."""
        top = self.max_priority
        return min((p.started for p in self.pods if p.priority == top), default=0.0)


def eligible(priority_policy: str) -> bool:
    """Whether a pod may preempt at all (``PodEligibleToPreemptOthers``: not with ``Never``). The other rule
    there, a terminating victim on its nominated node, is the caller's: it knows the holds."""
    return priority_policy != PREEMPT_NEVER


def importance(p: PodUsage) -> tuple[int, float, str]:
    """Sort key, most important first: higher priority, then earlier start (``util.MoreImportantPod``), then
    the UID (a fixed order for ties)."""
    return (-p.priority, p.started, p.uid)


def potential_victims(pods: Iterable[PodUsage], priority: int) -> list[PodUsage]:
    """The pods of strictly lower priority that are not system-critical, most important first."""
    return sorted((p for p in pods if p.priority < priority and p.priority < SYSTEM_CRITICAL), key=importance)


def violators(pdb: Pdb, pods: Sequence[PodUsage]) -> Collection[str]:
    """The UIDs among ``pods`` (one victim set) whose eviction would violate a PodDisruptionBudget."""
    return pdb(sorted(pods, key=importance)) if callable(pdb) else pdb


def set_key(victims: Sequence[PodUsage], pdb: Pdb) -> tuple:
    """Which victim set is cheaper on one node: fewer victims, then the lowest highest priority, then fewer
    PDB violations (counted within the set), then the lowest priority sum, then the latest-started victims
    (upstream reprieves the earlier-started first), then UIDs."""
    bad = violators(pdb, victims) if pdb else ()
    return (len(victims), max((p.priority for p in victims), default=-_SHIFT),
            sum(1 for p in victims if p.uid in bad), sum(p.priority for p in victims),
            sorted(-p.started for p in victims), sorted(p.uid for p in victims))


def fit_without(st: NodeState, gone: Iterable[PodUsage], preq: PodRequest, ctx: PodContext,
                quota: Quota | None = None) -> NodeFit:
    """HAMi's fit of the preemptor on a copy of ``st`` with ``gone`` taken away (the node is not changed),
    within the namespace quota left once they are gone (``quota`` None: no quota)."""
    gone = list(gone)
    copy = st.copy()
    for p in gone:
        apply_pod(copy, p, -1)
    return evaluate(copy, preq, ctx, None if quota is None else quota.without(gone))


def reprieve(st: NodeState, cands: Sequence[PodUsage], preq: PodRequest, ctx: PodContext,
             pdb: Pdb = (), quota: Quota | None = None) -> Victims | None:
    """Upstream's victim selection (``SelectVictimsOnNode`` ``:265-296``): take every candidate away, then
    add them back one by one, PDB violators first and most important first in each group, keeping each
    that still lets the pod fit. None when the pod does not fit even with every candidate gone. As upstream,
    the violators are judged over all the candidates, and the victims among them are counted."""
    if not fit_without(st, cands, preq, ctx, quota).ok:
        return None
    bad = violators(pdb, cands)
    order = [p for p in cands if p.uid in bad] + [p for p in cands if p.uid not in bad]
    gone = list(order)
    for p in order:
        trial = [q for q in gone if q is not p]
        if fit_without(st, trial, preq, ctx, quota).ok:
            gone = trial
    return _victims(st, gone, preq, ctx, bad, exact=False, quota=quota)


def _victims(st: NodeState, gone: Sequence[PodUsage], preq: PodRequest, ctx: PodContext,
             pdb: Pdb, exact: bool, quota: Quota | None = None) -> Victims:
    fit = fit_without(st, gone, preq, ctx, quota)
    pdb = violators(pdb, gone) if callable(pdb) else pdb
    return Victims(st.name, tuple(sorted(gone, key=importance)), sum(1 for p in gone if p.uid in pdb), fit,
                   exact)


def target_groups(st: NodeState, cands: Sequence[PodUsage],
                  preq: PodRequest) -> list[tuple[NodeState, list[PodUsage]]]:
    """Where the victims may be: (the node or a view of part of it, the pods the search takes sets from). A
    pod asking for one GPU in one container fits on one GPU, and whether it fits there depends on that GPU's
    usage alone, so the cheapest set lies among the pods on one GPU: one group per GPU, fitted on a view of
    that GPU alone (HAMi's fit of a one-GPU request on a one-GPU node is its per-device check; a whole-node
    copy per try costs as many device copies as the node has). Any other request (several GPUs or
    containers, init containers, static MIG resources) or a node with a GPU in MIG mode (a pod's MIG
    reservation can make every MIG GPU of its node unhealthy, ``nodes._apply_mig``): the whole node is one
    group."""
    reqs = [c for c in preq.containers if c is not None and c.nums > 0]
    if (preq.mig or preq.n_init or len(reqs) != 1 or reqs[0].nums != 1
            or any(d.mode == keys.MODE_MIG for d in st.devices)):
        return [(st, list(cands))]
    groups = []
    for d in st.devices:
        on = [p for p in cands if d.id in p.devices]
        if on:
            groups.append((NodeState(st.name, [d.clone()], st.extras), on))
    return groups


def select_victims_on_node(st: NodeState, pods: Iterable[PodUsage], preq: PodRequest, ctx: PodContext,
                           priority: int, pdb: Pdb = (),
                           max_fits: int = MAX_FITS, quota: Quota | None = None) -> Victims | None:
    """The cheapest victim set on one node (``set_key``), or None when taking every lower-priority pod away
    would not make the pod fit. ``pods``: the pods counted on the node (the caller leaves out those whose
    /bind is under way); ``pdb``: which victims would violate a PodDisruptionBudget (``Pdb``). A pod that fits
    already gets an empty set. Sets are tried by size, and within a size cheapest first, so the first set
    that fits is the answer. When the sets of the next size would take the runs past ``max_fits``,
    upstream's reprieve answers instead (``exact`` False). ``quota``: the preemptor's namespace quota
    (``Quota``), freed by the victims of that namespace."""
    cands = potential_victims(pods, priority)
    if not fit_without(st, cands, preq, ctx, quota).ok:
        return None
    if fit_without(st, (), preq, ctx, quota).ok:
        return _victims(st, (), preq, ctx, pdb, exact=True, quota=quota)
    groups = target_groups(st, cands, preq)
    runs = 2
    for k in range(1, max(len(g) for _v, g in groups) + 1):
        if runs + sum(math.comb(len(g), k) for _v, g in groups) > max_fits:
            return reprieve(st, cands, preq, ctx, pdb, quota)
        # a pod on two GPUs is in two groups: its sets are tried on each GPU's view
        sets = [(view, c) for view, g in groups for c in itertools.combinations(g, k)]
        for view, combo in sorted(sets, key=lambda vc: set_key(vc[1], pdb)):
            runs += 1
            if fit_without(view, combo, preq, ctx, quota).ok:
                return _victims(st, combo, preq, ctx, pdb, exact=True, quota=quota)
    return _victims(st, cands, preq, ctx, pdb, exact=True, quota=quota)  # only the whole node frees enough


def candidate_key(v: Victims) -> tuple:
    """``pickOneNodeForPreemption`` (preemption.go ``:651-737``) as a sort key, best first: fewest PDB
    violations, lowest highest victim priority, lowest sum of (shifted) priorities, fewest victims, latest
    start among the highest-priority victims; then the node name (upstream: the first node)."""
    return (v.pdb_violations, v.max_priority, v.sum_priority, len(v.pods), -v.earliest_top_start(), v.node)


def select_candidate(cands: Iterable[Victims]) -> Victims | None:
    """The node to preempt on, among candidates that need at least one victim (upstream: a candidate with
    none is an error, ``expected at least one victim pod on node``)."""
    return min((v for v in cands if v.pods), key=candidate_key, default=None)


def num_candidates(potential: int) -> int:
    """How many candidates the dry run wants: max(10 % of the potential nodes, 100), never more than there are
    (``default_preemption.go`` ``calculateNumCandidates``, ``MinCandidateNodesPercentage`` 10 and
    ``MinCandidateNodesAbsolute`` 100 by default)."""
    return min(potential, max(potential * 10 // 100, 100))


def preempt(nodes: Mapping[str, NodeState], pods_by_node: Mapping[str, Sequence[PodUsage]],
            names: Sequence[str], preq: PodRequest, ctx: PodContext, priority: int, policy: str,
            pdb: Pdb = (), max_fits: int = MAX_FITS, quota: Quota | None = None) -> Victims | None:
    """The dry run over the candidate nodes ``names`` (those kube-scheduler sent, which passed its own
    filters) and the pick among them; None when the pod may not preempt or no node can be helped. Only nodes
    with a potential victim are tried, in the order given (upstream starts at a random offset), and the run
    stops once it has ``num_candidates`` candidates of which one violates no PDB (``preemption.go``
    ``:803-806``). ``quota``: the preemptor's namespace quota; victims are taken on one node, as upstream,
    so a pod refused by quota alone is helped only by lower-priority pods of its namespace on that node."""
    if not eligible(policy) or preq.empty:
        return None
    potential = [n for n in dict.fromkeys(names)
                 if n in nodes and potential_victims(pods_by_node.get(n, ()), priority)]
    want = num_candidates(len(potential))
    found: list[Victims] = []
    for n in potential:
        v = select_victims_on_node(nodes[n], pods_by_node.get(n, ()), preq, ctx, priority, pdb, max_fits,
                                   quota)
        if v is not None and v.pods:
            found.append(v)
            if len(found) >= want and any(c.pdb_violations == 0 for c in found):
                break
    return select_candidate(found)

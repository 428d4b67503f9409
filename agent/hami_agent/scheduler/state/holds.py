"""Holds (issue 29 item 3; docs/scheduler.md "Preemption"): GPU capacity kept for a preemptor while its
victims terminate, so that no other pod takes what the preemption frees.

kube-scheduler's own rule for a nominated pod (kubernetes v1.35.4 ``pkg/scheduler/framework/runtime/
framework.go`` ``addGENominatedPods``: a pod nominated to a node counts there for every pod of lower or equal
priority) is applied to GPUs, which its framework cannot see: a hold counts as used for every pod of lower or
equal priority except its owner. The victims still count while they terminate (the usage cache keeps a
terminating pod, ``podinfo``), so a node is never over-committed: the hold covers capacity that is either
still used by a victim or freed for the owner. The usage cache itself never holds a hold; a decision for a
pod that meets holds fits the held nodes on a copy (``decide``), outside the cache's memo.

A hold ends when its owner's own decision is reserved (its assumption then counts the devices), when the
owner is deleted, when a higher-priority preemption on the node replaces it, or at its deadline (the
longest victim grace period plus ``SLACK_S``). A hold that ends in a reservation on its own node is
remembered until the owner is bound there, for ``hami_scheduler_preemption_wait_seconds`` (``waited``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_agent.scheduler.core.decide import UNREGISTERED, evaluate
from hami_agent.scheduler.core.fit import NodeFit, PodContext, QuotaBudget, node_score
from hami_agent.scheduler.core.model import PodRequest, PodUsage
from hami_agent.scheduler.core.nodes import NodeState, apply_pod
from hami_agent.scheduler.state.cache import Decision, UsageCache

SLACK_S = 120.0  # past the last victim's grace period: teardown, informer lag, requeue backoff, one cycle
WAIT_TTL_S = 3600.0  # a reserved owner's hold start is kept this long for its binding (``waited``)


@dataclass(frozen=True)
class Hold:
    """Capacity on ``usage.node`` kept for the pod ``usage.uid`` (``usage.priority`` its priority) while the
    pods ``victims`` (UIDs) terminate; ``deadline`` on the monotonic clock."""

    usage: PodUsage
    victims: tuple[str, ...]
    deadline: float
    since: float | None = None  # when it was made (monotonic); None: rebuilt by a new leader, start unknown

    @property
    def owner(self) -> str:
        return self.usage.uid

    @property
    def node(self) -> str:
        return self.usage.node

    @property
    def priority(self) -> int:
        return self.usage.priority


def deadline_for(victims: Iterable[PodUsage], now: float) -> float:
    """The last victim's grace period plus ``SLACK_S`` from ``now``."""
    return now + max((p.grace_s for p in victims), default=0) + SLACK_S


class Holds:
    """Thread-safe record of the holds, by owner UID (one hold per preemptor)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_owner: dict[str, Hold] = {}
        self._binding: dict[str, tuple[str, float]] = {}  # owner -> (held node, hold's since): until bound

    def put(self, hold: Hold) -> list[Hold]:
        """Record ``hold`` (replacing its owner's earlier one). Holds of lower priority on the same node are
        cleared, as upstream clears lower-priority nominations there; returns them (their owners will
        preempt again)."""
        with self._lock:
            cleared = [h for h in self._by_owner.values()
                       if h.node == hold.node and h.priority < hold.priority and h.owner != hold.owner]
            for h in cleared:
                del self._by_owner[h.owner]
            self._by_owner[hold.owner] = hold
            return cleared

    def get(self, owner: str) -> Hold | None:
        with self._lock:
            h = self._by_owner.get(owner)
            return h if h is not None and h.deadline > self._clock() else None

    def release(self, owner: str) -> Hold | None:
        with self._lock:
            return self._by_owner.pop(owner, None)

    def reserved(self, owner: str, node: str) -> None:
        """The owner's own decision is reserved on ``node``: its hold ends; if ``node`` is the held one, its
        start is kept for ``waited``."""
        now = self._clock()
        with self._lock:
            h = self._by_owner.pop(owner, None)
            # the pending-pod watch cannot tell a bound owner from a deleted one: entries of owners never
            # bound here go by age
            for o in [o for o, (_n, since) in self._binding.items() if since < now - WAIT_TTL_S]:
                del self._binding[o]
            if h is not None and h.node == node and h.since is not None:
                self._binding[owner] = (node, h.since)

    def waited(self, owner: str, node: str) -> float | None:
        """The owner is bound to ``node``: seconds from its hold to now when that is the node it held, else
        None."""
        with self._lock:
            got = self._binding.pop(owner, None)
        return self._clock() - got[1] if got is not None and got[0] == node else None

    def expire(self) -> list[Hold]:
        """Drop the holds past their deadline; returns them."""
        now = self._clock()
        with self._lock:
            gone = [h for h in self._by_owner.values() if h.deadline <= now]
            for h in gone:
                del self._by_owner[h.owner]
            return gone

    def against(self, uid: str, priority: int) -> dict[str, list[PodUsage]]:
        """The held usage that counts for the pod ``uid`` of ``priority``, per node: every live hold of
        higher or equal priority that is not its own."""
        now = self._clock()
        out: dict[str, list[PodUsage]] = {}
        with self._lock:
            if not self._by_owner:
                return out
            for h in self._by_owner.values():
                if h.owner != uid and h.priority >= priority and h.deadline > now:
                    out.setdefault(h.node, []).append(h.usage)
        return out

    def clear(self) -> None:
        """Leadership lost: the next leader rebuilds the holds from the annotations."""
        with self._lock:
            self._by_owner.clear()
            self._binding.clear()

    def all(self) -> list[Hold]:
        with self._lock:
            return list(self._by_owner.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_owner)


def add_namespace_usage(held: Mapping[str, Sequence[PodUsage]], ns: str, mem: int,
                        cores: int) -> tuple[int, int]:
    """``mem``/``cores`` plus what the holds of namespace ``ns`` keep: a hold uses its owner's namespace GPU
    quota, so that quota a preemption frees is not taken by a lower-priority pod of the namespace on another
    node (while the victims terminate both count, as for capacity)."""
    for usages in held.values():
        for u in usages:
            if u.namespace == ns:
                mem += sum(a.mem for a in u.devices.values())
                cores += sum(a.cores for a in u.devices.values())
    return mem, cores


@dataclass
class HeldFit:
    """The fit of a pod on the held nodes: per node its result and the node's score with the holds
    counted."""

    fits: dict[str, NodeFit]
    scores: dict[str, float]

    def best(self, spread: bool) -> str | None:
        ok = [n for n, r in self.fits.items() if r.ok]
        if not ok:
            return None
        return sorted(ok, key=lambda n: (self.scores[n], n), reverse=not spread)[0]


def fit_held(nodes: Mapping[str, NodeState], names: Sequence[str], held: Mapping[str, Sequence[PodUsage]],
             preq: PodRequest, ctx: PodContext, quota: QuotaBudget | None) -> HeldFit:
    """Fit the pod on each of ``names`` that has holds counting for it, on a copy with the holds counted as
    used (a quota budget is a fresh copy per node, as in ``core.decide``)."""
    out = HeldFit({}, {})
    for n in dict.fromkeys(names):
        st = nodes.get(n)
        if n not in held or st is None:
            continue
        copy = st.copy()
        for u in held[n]:
            apply_pod(copy, u, +1)
        out.fits[n] = evaluate(copy, preq, ctx,
                               None if quota is None else QuotaBudget(quota.mem_left, quota.cores_left))
        out.scores[n] = node_score(copy.devices)
    return out


def decide(cache: UsageCache, names: list[str], held: Mapping[str, Sequence[PodUsage]], preq: PodRequest,
           ctx: PodContext, quota: QuotaBudget | None, **kw: Any) -> Decision:
    """``cache.decide`` for a pod that meets holds (``held``: ``Holds.against``): the nodes without a hold
    through the cache and its memo, the held nodes fitted on copies; the best of both by the node policy
    (ties by name). Call under ``cache.lock`` (the caller reserves the decision under it)."""
    if not held:
        return cache.decide(names, preq, ctx, quota, **kw)
    dec = cache.decide([n for n in names if n not in held], preq, ctx, quota, **kw)
    hf = fit_held(cache.nodes, names, held, preq, ctx, quota)
    spread = ctx.node_policy == "spread"
    best = hf.best(spread)
    if best is None:
        if dec.node is None:
            dec.failed.update({n: hf.fits[n].reason if n in hf.fits else UNREGISTERED
                               for n in names if n in held})
        return dec
    if dec.node is not None:
        mine = (node_score(cache.nodes[dec.node].devices), dec.node)
        theirs = (hf.scores[best], best)
        if (mine < theirs) == spread:  # binpack: the higher score wins; spread: the lower
            return dec
    n_fit = sum(1 for r in hf.fits.values() if r.ok) + dec.n_fit  # dec's count may still be lazy: a floor
    return Decision(best, hf.fits[best], {}, n_fit=n_fit, fit_nodes=[best], scores={best: hf.scores[best]})

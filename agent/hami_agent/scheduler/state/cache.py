# Over 500 lines on purpose: nodes, pods, assumptions, rank and memo change under one lock.
"""The usage cache: nodes (devices from the register annotation) and pods (allocations from pod
annotations, keyed by UID), with each node's usage kept applied incrementally.

Why a memo: kube-scheduler sends every node name on every /filter. Re-fitting 5,000 nodes per pod in
Python costs ~100 ms. Fit is a pure function of (node state, pod request shape), and a placement changes
one node, so results are memoised per request shape and only nodes whose state changed since ("dirty")
are re-fitted. The per-request work left is set arithmetic in C over the node names.

Why lazy: a shape seen for the first time (or evicted from the memo) has every node dirty. The answer is
only the best node, so nodes are fitted best-first (the policy's order of node scores) until one fits;
the rest stay dirty. Only a pod that fits nowhere needs every node's reason. The FilteringSucceed event's
counts (how many nodes fit) are completed off the request path (``complete``).

Why screened: the walk and the counts decide most nodes with ``prefit`` (microseconds) instead of the fit
(a tenth of a millisecond or more). A node the pre-check refuses is remembered as ``PRUNED`` (its reason
is computed only if the pod fits nowhere); for shapes where the pre-check is exact, a node it accepts is
remembered as ``FITS_UNPICKED`` (its devices are picked only when it is chosen).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.protocol import reasons as R
from hami_agent.protocol.devices import MigPlacement
from hami_agent.scheduler.core.decide import decide, evaluate
from hami_agent.scheduler.core.fit import NodeExtras, NodeFit, PodContext, QuotaBudget, node_score
from hami_agent.scheduler.core.fitclass import (
    device_verdict,
    node_profiles,
    shareable,
    state_key,
    verdict_request,
)
from hami_agent.scheduler.core.model import DeviceAmount, DeviceUsage, Picked, PodRequest, PodUsage
from hami_agent.scheduler.core.nodes import NodeState, apply_pod
from hami_agent.scheduler.core.prefit import CapacityIndex, may_fit, screen_is_exact, summarize
from hami_agent.scheduler.state.nodenames import LAST_NODE_NAMES

logger = logging.getLogger(__name__)

MEMO_SHAPES = 64  # distinct request shapes remembered (LRU)
EAGER_DIRTY = 64  # up to this many dirty candidates are all re-fitted at once; beyond, best-first
COMPLETE_SLICE_S = 0.001  # longest lock hold when completing a memo's counts off the request path
COMPLETE_QUIET_S = 0.003  # ... started only this long after the last /filter decision (or after QUIET_MAX_S)
COMPLETE_QUIET_MAX_S = 0.05


# Screened results in a memo (identity matters): not fitted, decided by prefit.
PRUNED = NodeFit(False, [], "pruned by the pre-check (no device can take the request)")
FITS_UNPICKED = NodeFit(True, [], "fits (exact pre-check); devices picked when chosen")


@dataclass
class _Memo:
    """Fit results of one request shape. ``order`` holds the fitting nodes sorted by (score, name), so
    the best node is found by walking from one end instead of scanning every node."""

    fits: dict[str, NodeFit] = field(default_factory=dict)  # node -> result (ok or not)
    ok: set[str] = field(default_factory=set)
    dirty: set[str] = field(default_factory=set)
    order: list[tuple[float, str]] = field(default_factory=list)
    pos: dict[str, tuple[float, str]] = field(default_factory=dict)  # node -> its key in ``order``

    def drop(self, name: str) -> None:
        key = self.pos.pop(name, None)
        if key is not None:
            i = bisect.bisect_left(self.order, key)
            if i < len(self.order) and self.order[i] == key:
                del self.order[i]
        self.ok.discard(name)

    def put(self, name: str, r: NodeFit, key: tuple[float, str]) -> None:
        self.drop(name)
        self.fits[name] = r
        if r.ok:
            bisect.insort(self.order, key)
            self.pos[name] = key
            self.ok.add(name)


Signature = tuple[str, str, str]  # a pod's (vgpu-node, vgpu-devices-allocated, vgpu-time) annotations


@dataclass(frozen=True)
class Assumption:
    signature: Signature | None  # the annotations that confirm it (None: "no assignment")
    expires: float  # monotonic time after which the owner re-reads the truth


@dataclass
class Decision:
    """Outcome of one filter evaluation."""

    node: str | None
    fit: NodeFit | None
    failed: dict[str, str]  # node -> reason (only filled when no node fits)
    n_fit: int = 0
    fit_nodes: list[str] = field(default_factory=list)  # best first, for the event (capped)
    scores: dict[str, float] = field(default_factory=dict)
    # counts not known yet (the lazy walk stopped at the best node): ``UsageCache.complete(decision)``
    pending: tuple | None = None


class UsageCache:
    """Thread-safe. Mutations and decisions happen under one lock, so a /filter decision and the
    reservation of its devices are atomic: concurrent /filter calls cannot over-commit a GPU."""

    def __init__(self, memo_shapes: int = MEMO_SHAPES) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodUsage] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._assumed: dict[str, Assumption] = {}
        self._ns_usage: dict[str, list[int]] = {}
        self._memo: OrderedDict[tuple, _Memo] = OrderedDict()
        self._memo_shapes = memo_shapes
        self._rank: dict[str, tuple[float, str]] = {}
        self._order: list[tuple[float, str]] = []  # every node's rank key, ascending (the lazy walk)
        self.unknown_uuid_warnings = 0
        self.lazy_fits = 0  # nodes fitted by best-first walks (tests, benchmarks)
        self._capacity = CapacityIndex()
        self._mig_profiles: dict[tuple, tuple] = {}  # a handful: one per GPU model and MIG config
        self._static_mig: dict[str, set[str]] = {}  # profile -> nodes with static MIG capacity for it
        self._last_decide = 0.0  # monotonic time of the last decide (the counts wait for a quiet moment)
        # kube-scheduler sends the same node names on every /filter: the set built for the last list is
        # reused while the list is equal (no hashing of 5,000 names), and whether it covers every known
        # node while no node came or went (``_nodes_gen``)
        self._nodes_gen = 0
        self._covers: tuple[set[str] | None, int, bool] = (None, -1, False)  # (the set, _nodes_gen, covers)

    # ------------------------------------------------------------------------------------ nodes
    def set_node(self, name: str, devices: list[DeviceUsage], extras: NodeExtras | None = None,
                 mig_capacity: dict[str, int] | None = None) -> None:
        """Add or replace a node's devices; usage of cached pods on it is re-applied."""
        with self.lock:
            for d in devices:  # one object per distinct MIG profile list (core/fitclass.py state_key)
                if d.mig_profiles:
                    d.mig_profiles = self._mig_profiles.setdefault(d.mig_profiles, d.mig_profiles)
            st = NodeState(name, devices, extras or NodeExtras(), dict(mig_capacity or {}))
            if name not in self.nodes:
                self._nodes_gen += 1
            self._index_static_mig(name, self.nodes.get(name), st)
            self.nodes[name] = st
            for uid in self._pods_by_node.get(name, ()):
                self._apply(st, self.pods[uid], +1)
            self._touch(st)

    def set_node_extras(self, name: str, extras: NodeExtras) -> None:
        with self.lock:
            st = self.nodes.get(name)
            if st is not None and st.extras != extras:
                st.extras = extras
                self._touch(st)

    def _index_static_mig(self, name: str, old: NodeState | None, new: NodeState | None) -> None:
        for profile in old.mig_capacity if old is not None else ():
            self._static_mig.get(profile, set()).discard(name)
        for profile, n in new.mig_capacity.items() if new is not None else ():
            if n > 0:
                self._static_mig.setdefault(profile, set()).add(name)

    def remove_node(self, name: str) -> bool:
        with self.lock:
            old = self.nodes.pop(name, None)
            if old is None:
                return False
            self._nodes_gen += 1
            self._index_static_mig(name, old, None)
            self._drop_rank(name)
            self._capacity.update(name, None)
            for m in self._memo.values():
                m.drop(name)
                m.fits.pop(name, None)
                m.dirty.discard(name)
            return True

    def _touch(self, st: NodeState) -> None:
        st.score = node_score(st.devices)
        st.summary = summarize(st.devices)
        # core/fitclass.py class keys: a MIG node's state key now (its classes need it), others' lazily
        st.profiles = () if st.summary.has_mig else node_profiles(st)
        st.state_key = state_key(st) if st.summary.has_mig else None
        self._capacity.update(st.name, st.summary)
        key = (st.score, st.name)
        if self._rank.get(st.name) != key:
            self._drop_rank(st.name)
            self._rank[st.name] = key
            bisect.insort(self._order, key)
        for m in self._memo.values():
            m.dirty.add(st.name)

    def _drop_rank(self, name: str) -> None:
        old = self._rank.pop(name, None)
        if old is not None:
            i = bisect.bisect_left(self._order, old)
            if i < len(self._order) and self._order[i] == old:
                del self._order[i]

    # ------------------------------------------------------------------------------------- pods
    # Two sources write a pod's usage, and they can disagree for a while:
    # * the informer (``observe``/``observe_gone``): the API's truth, in order, but late;
    # * /filter (``assume``): a reservation made before its annotation write is seen — or even known to
    #   have happened (the answer may be lost).
    # As in kube-scheduler's assume cache, an assumption wins over what the informer says until the
    # informer shows the annotations the assumption expects (its ``signature``): a lagging event never
    # drops a reservation (no under-count), and a write whose answer was lost stays counted until the
    # truth is known. /filter replaces an assumption with the API's truth once it has read it back.
    def add_pod(self, pod: PodUsage) -> None:
        """Add or replace (same UID) a pod's usage, bypassing assumptions (tests, benchmarks)."""
        with self.lock:
            self._set(pod.uid, pod)

    def remove_pod(self, uid: str) -> PodUsage | None:
        """Remove a pod's usage (and any assumption about it); returns what was counted."""
        with self.lock:
            self._assumed.pop(uid, None)
            return self._set(uid, None)

    def observe(self, uid: str, usage: PodUsage | None, signature: Signature | None) -> None:
        """The informer's view of a pod: its countable usage (None: counts nothing) and the signature
        of its scheduler annotations. Ignored while an assumption waits for a different signature."""
        with self.lock:
            a = self._assumed.get(uid)
            if a is not None:
                if a.signature != signature:
                    return
                del self._assumed[uid]  # confirmed: from now on the informer is the truth
            self._set(uid, usage)

    def observe_gone(self, uid: str) -> PodUsage | None:
        """The pod was deleted or has finished: it counts nothing, whatever was assumed. Returns the usage
        it no longer counts (None when it counted nothing)."""
        return self.remove_pod(uid)

    def assume(self, uid: str, usage: PodUsage | None, signature: Signature | None,
               ttl_s: float = 300.0, now: float | None = None) -> None:
        """Count ``usage`` for the pod until the informer shows ``signature`` (then the informer's view
        takes over) or another assumption replaces it. ``ttl_s``: after that, :meth:`stale_assumptions`
        lists it so the owner re-reads the truth (an informer that skipped the state cannot confirm it)."""
        with self.lock:
            t = time.monotonic() if now is None else now
            self._assumed[uid] = Assumption(signature, t + ttl_s)
            self._set(uid, usage)

    def replace_assumption(self, uid: str, expect: Signature | None, usage: PodUsage | None,
                           signature: Signature | None, ttl_s: float = 300.0) -> bool:
        """:meth:`assume`, but only while the pod's current assumption still waits for ``expect``
        (a repair that ran late must not overwrite a newer decision). True when applied."""
        with self.lock:
            a = self._assumed.get(uid)
            if a is None or a.signature != expect:
                return False
            self.assume(uid, usage, signature, ttl_s)
            return True

    def settle(self, uid: str, expect: Signature | None, usage: PodUsage | None) -> bool:
        """End the pod's assumption (if it still waits for ``expect``) and count ``usage``, read from
        the API: from now on the informer's events apply directly."""
        with self.lock:
            a = self._assumed.get(uid)
            if a is None or a.signature != expect:
                return False
            del self._assumed[uid]
            self._set(uid, usage)
            return True

    def drop_assumption(self, uid: str, expect: Signature | None) -> bool:
        """Forget the pod entirely (deleted/replaced) if its assumption still waits for ``expect``."""
        with self.lock:
            a = self._assumed.get(uid)
            if a is None or a.signature != expect:
                return False
            self.remove_pod(uid)
            return True

    def assumption(self, uid: str) -> Assumption | None:
        with self.lock:
            return self._assumed.get(uid)

    def stale_assumptions(self, now: float | None = None) -> list[str]:
        t = time.monotonic() if now is None else now
        with self.lock:
            return [uid for uid, a in self._assumed.items() if a.expires <= t]

    def few_settled_pods(self, names: Iterable[str], at_most: int,
                         skip: str = "") -> dict[str, list[PodUsage]]:
        """For each of ``names`` on which the cache counts between 1 and ``at_most`` pods from the
        informer's view (not the assumptions: /filter decisions still being written or confirmed; not
        ``skip``): those pods. One pass under the lock; a node with many more pods is passed over by its
        count alone (a refusal at 5,000 full nodes must not walk their pods)."""
        out: dict[str, list[PodUsage]] = {}
        with self.lock:
            slack = at_most + 1 + len(self._assumed)  # more uids than this: too many settled ones for sure
            by_node, assumed, pods = self._pods_by_node, self._assumed, self.pods
            for node in names:
                uids = by_node.get(node)
                if not uids or len(uids) > slack or node in out:
                    continue
                few: list[PodUsage] = []
                for uid in uids:
                    if uid == skip or uid in assumed:
                        continue
                    if len(few) == at_most:
                        few = []
                        break
                    few.append(pods[uid])
                if few:
                    out[node] = few
        return out

    def few_settled_pods_per_gpu(self, node: str, at_most: int, skip: str = "") -> list[list[PodUsage]]:
        """The pods the cache counts on ``node`` from the informer's view (as ``few_settled_pods``), grouped
        by the GPU they use, each group of 1 to ``at_most`` pods, fewest first; a pod on several GPUs is in
        each of their groups. For a node with too many pods in all for one refusal to read: the pods of one
        GPU may be all that stands between a one-GPU pod and the node."""
        groups: dict[str, list[PodUsage]] = {}
        with self.lock:
            for uid in self._pods_by_node.get(node, ()):
                if uid == skip or uid in self._assumed:
                    continue
                pod = self.pods[uid]
                for gpu in pod.devices:
                    groups.setdefault(gpu, []).append(pod)
        few = [sorted(g, key=lambda u: u.uid) for _gpu, g in sorted(groups.items()) if len(g) <= at_most]
        return sorted(few, key=len)

    def fits_without(self, node: str, gone: list[PodUsage], preq: PodRequest, ctx: PodContext) -> bool:
        """Whether the pod would fit ``node`` if the pods ``gone`` counted nothing (on a copy: the cache is
        not changed)."""
        with self.lock:
            st = self.nodes.get(node)
            if st is None:
                return False
            copy = st.copy()
            for pod in gone:
                if self.pods.get(pod.uid) is pod and pod.node == node:
                    self._apply(copy, pod, -1)
            return self.evaluate(copy, preq, ctx, None).ok

    def settled_pods_on(self, node: str) -> list[PodUsage]:
        """The pods counted on ``node`` from the informer's view (not the assumptions: decisions still being
        written or confirmed). Call under ``lock``."""
        return [self.pods[u] for u in self._pods_by_node.get(node, ()) if u not in self._assumed]

    def forget_gone(self, uid: str, expect: PodUsage) -> PodUsage | None:
        """Stop counting a pod the API says is gone (deleted, or finished), read while the informer had
        not caught up yet: only while the cache still counts exactly ``expect`` for it from the informer
        (an assumption made meanwhile is a newer decision, and wins). Returns what it no longer counts."""
        with self.lock:
            if uid in self._assumed or self.pods.get(uid) is not expect:
                return None
            return self._set(uid, None)

    def exclude(self, uid: str) -> PodUsage | None:
        """Take a pod's usage off its node (for a /filter retry of that pod) without forgetting any
        assumption; give it back with :meth:`restore` or replace it with :meth:`assume`. Call under
        ``lock`` together with the decision."""
        with self.lock:
            return self._set(uid, None)

    def restore(self, uid: str, usage: PodUsage | None) -> None:
        with self.lock:
            self._set(uid, usage)

    def _set(self, uid: str, pod: PodUsage | None) -> PodUsage | None:
        """Make ``pod`` the counted usage of ``uid`` (None: nothing); returns the previous one."""
        old = self.pods.get(uid)
        if pod is not None and old is not None and old.same_usage(pod):
            if old != pod:  # same usage, newer record (bound now, terminating): what preemption reads
                self.pods[uid] = pod
            return old  # informer echo of our own reservation: nothing changed
        if old is not None:
            del self.pods[uid]
            on_node = self._pods_by_node.get(old.node)
            if on_node is not None:
                on_node.discard(uid)
                if not on_node:  # every node name ever seen would keep an empty set (node churn)
                    del self._pods_by_node[old.node]
            ns = self._ns_usage.get(old.namespace)
            if ns is not None:
                for a in old.devices.values():
                    ns[0] -= a.mem
                    ns[1] -= a.cores
                if ns == [0, 0]:  # nor every namespace ever seen (CI clusters make one per run)
                    del self._ns_usage[old.namespace]
            st = self.nodes.get(old.node)
            if st is not None:
                self._apply(st, old, -1)
                self._touch(st)
        if pod is not None:
            self.pods[uid] = pod
            self._pods_by_node.setdefault(pod.node, set()).add(uid)
            ns = self._ns_usage.setdefault(pod.namespace, [0, 0])
            for a in pod.devices.values():
                ns[0] += a.mem
                ns[1] += a.cores
            st = self.nodes.get(pod.node)
            if st is not None:
                self._apply(st, pod, +1)
                self._touch(st)
        return old

    def namespace_usage(self, namespace: str) -> tuple[int, int]:
        with self.lock:
            mem, cores = self._ns_usage.get(namespace, (0, 0))
            return mem, cores

    def _apply(self, st: NodeState, pod: PodUsage, sign: int) -> None:
        self.unknown_uuid_warnings += apply_pod(st, pod, sign)

    # --------------------------------------------------------------------------------- decisions
    def evaluate(self, st: NodeState, preq: PodRequest, ctx: PodContext,
                 quota: QuotaBudget | None) -> NodeFit:
        """Exact fit of one pod on one node (``core.decide.evaluate``)."""
        return evaluate(st, preq, ctx, quota)

    def decide(self, names: list[str], preq: PodRequest, ctx: PodContext,
               quota: QuotaBudget | None = None, event_nodes: int = 50, pod_name: str = "",
               avoid: set[str] | frozenset[str] = frozenset()) -> Decision:
        """Pick the node for a pod among ``names`` (reference §4.3 steps 2-4). Call under ``lock``
        together with :meth:`reserve` to make decide+reserve atomic. ``avoid``: nodes taken only when no
        other candidate fits (scheduler/state/busy.py: a pod is being admitted there)."""
        self._last_decide = time.monotonic()
        with self.lock:
            names_set = self._names_set(names)
            spread = ctx.node_policy == "spread"
            pending = None
            if quota is None:
                key = (preq, ctx)
                m = self._memo.get(key)
                if m is None:
                    m = _Memo(dirty=set(self.nodes))
                    self._memo[key] = m
                    if len(self._memo) > self._memo_shapes:
                        self._memo.popitem(last=False)
                else:
                    self._memo.move_to_end(key)
                exact = screen_is_exact(preq, ctx)
                todo = m.dirty & names_set if len(m.dirty) <= EAGER_DIRTY else m.dirty  # known nodes only
                if len(todo) <= EAGER_DIRTY:
                    self._fit_into(m, todo, preq, ctx, exact)
                    best = self._best_fitted(m, names_set, spread, preq, ctx, avoid)
                    if best is not None and (event_nodes or log.enabled(logger, 2)):
                        pending = (weakref.ref(m), self._names_ref(names_set), spread, event_nodes, preq, ctx)
                else:
                    best = self._walk(m, names_set, spread, preq, ctx, exact, avoid)
                    if best is not None and (event_nodes or log.enabled(logger, 2)):
                        pending = (weakref.ref(m), self._names_ref(names_set), spread, event_nodes, preq, ctx)
                if best is None:  # fits nowhere: every candidate's reason goes into FailedNodes
                    self._fit_classes(m, {n for n in names_set if n in m.dirty or m.fits.get(n) is PRUNED},
                                      preq, ctx)
                fits = m.fits
                ok_of = m.ok
            else:  # namespace quota changes with every pod of the namespace: no memo
                fits = {n: self.evaluate(self.nodes[n], preq, ctx, QuotaBudget(quota.mem_left,
                                                                                 quota.cores_left))
                        for n in names_set & self.nodes.keys()}
                ok_of = {n for n, r in fits.items() if r.ok}
                pick = min if spread else max
                free = ok_of - avoid if avoid else ok_of
                best = pick(free or ok_of, key=self._rank.__getitem__) if ok_of else None
            if log.enabled(logger, 4):
                for n in names:
                    log.v(logger, 4, "Filtering node %s for pod %s", n, pod_name)
                    r = fits.get(n)
                    if r is not None and not r.ok:
                        log.v(logger, 4, "Node %s filtered out: %s", n, r.detail or r.reason)
            if best is None:
                failed = {n: (fits[n].reason if n in fits else "node unregistered") for n in names}
                return Decision(None, None, failed)
            dec = Decision(best, fits[best], {})
            if pending is not None:
                if m.dirty.isdisjoint(names_set):  # every candidate is decided: count now (cheap)
                    self._count_fits(dec, m, names_set, spread, event_nodes, best, pending[1] is None)
                else:
                    dec.pending = (*pending, best)
            elif event_nodes or log.enabled(logger, 2):
                self._count_quota_fits(dec, ok_of & names_set, spread, event_nodes)
            return dec

    def _names_set(self, names: list[str]) -> frozenset[str]:
        """The set of ``names`` (``state.nodenames``: the last request's when the list is equal). Never
        changed by its users: it is shared."""
        return LAST_NODE_NAMES.as_set(names)

    def _names_ref(self, names: set[str]) -> set[str] | None:
        """What a pending count keeps of the request's node names: None when they cover every known node
        (kube-scheduler sends them all), so a queued event does not hold a set of thousands of names."""
        known, gen, covers = self._covers
        if known is not names or gen != self._nodes_gen:
            covers = len(names) >= len(self.nodes) and self.nodes.keys() <= names
            self._covers = (names, self._nodes_gen, covers)
        return None if covers else names

    def _screen(self, st: NodeState, preq: PodRequest, ctx: PodContext, exact: bool) -> NodeFit:
        if not may_fit(st, preq, ctx):
            return PRUNED
        if exact and st.summary is not None and not st.summary.has_mig:  # may_fit computed the summary
            return FITS_UNPICKED
        self.lazy_fits += 1
        return self.evaluate(st, preq, ctx, None)

    def _fit_into(self, m: _Memo, todo: set[str], preq: PodRequest, ctx: PodContext, exact: bool,
                  screen: bool = True) -> None:
        """Decide ``todo`` in the memo: screened, or (``screen=False``: reasons wanted) fitted."""
        for n in todo:
            st = self.nodes[n]
            m.put(n, self._screen(st, preq, ctx, exact) if screen else self.evaluate(st, preq, ctx, None),
                  self._rank[n])
        m.dirty -= todo

    def _fit_classes(self, m: _Memo, todo: set[str], preq: PodRequest, ctx: PodContext) -> None:
        """Fit every node of ``todo`` for its reason (the pod fits nowhere), one fit per node class
        (``core.fitclass``): the nodes of a class get the same failure, as one fit per node would give."""
        if log.enabled(logger, 4):  # the -v=4 "filtered out" line shows each node's own detail
            self._fit_into(m, todo, preq, ctx, False, screen=False)
            return
        req = verdict_request(preq, ctx)
        numa = ctx.numa_bind
        by_state = not (ctx.use_uuids or ctx.nouse_uuids)  # UUID lists read what state_key leaves out
        topo = "topology-aware" in ctx.gpu_policy
        verdicts: dict[str, str] = {}  # device profile -> its verdict for this request
        classes: dict[tuple, list[str]] = {}
        alone: list[str] = []  # nodes without a class: a fit each
        nodes, get = self.nodes, verdicts.get
        for n in todo:
            st = nodes[n]
            profiles = st.profiles  # empty on a node with a MIG-mode GPU (``_touch``)
            if req is not None and profiles:
                vs = list(map(get, profiles))
                if None in vs:
                    for i, d in enumerate(st.devices):
                        if vs[i] is None:
                            v = device_verdict(d, req, ctx, st.extras.cordoned)
                            # strings: a class key of strings hashes from their cached hashes
                            vs[i] = verdicts[profiles[i]] = f"{d.numa}:{v}" if numa else v
                vs.sort()  # type: ignore[call-arg]
                key: tuple = tuple(vs)
            elif by_state and not (topo and st.extras.pair_scores):  # the topology choice reads UUIDs
                if st.state_key is None:
                    st.state_key = state_key(st)
                if not st.state_key:
                    alone.append(n)
                    continue
                key = (st.state_key,)
            else:
                alone.append(n)
                continue
            members = classes.get(key)
            if members is None:
                classes[key] = [n]
            else:
                members.append(n)
        rank, fits = self._rank, m.fits
        for members in classes.values():
            r = self.evaluate(nodes[members[0]], preq, ctx, None)
            if not shareable(r, nodes[members[0]]):
                alone.extend(members)
                continue
            for n in m.pos.keys() & members:  # fitted before its change: leaves the fitting order
                m.drop(n)
            fits.update(dict.fromkeys(members, r))
        for n in alone:
            m.put(n, self.evaluate(nodes[n], preq, ctx, None), rank[n])
        m.dirty -= todo

    def _picked(self, m: _Memo, n: str, preq: PodRequest, ctx: PodContext) -> bool:
        """Make sure the memo holds the fit (devices picked) of node ``n``, which fits; False (and the
        memo corrected) when the full fit disagrees with the pre-check — a bug, logged."""
        if m.fits.get(n) is not FITS_UNPICKED:
            return True
        self.lazy_fits += 1
        r = self.evaluate(self.nodes[n], preq, ctx, None)
        m.put(n, r, self._rank[n])
        if not r.ok:
            logger.error("pre-check said node %s fits %s but the fit refused it (%s): please report",
                         n, preq, r.reason)
        return r.ok

    def _best_fitted(self, m: _Memo, names: set[str], spread: bool, preq: PodRequest,
                     ctx: PodContext, avoid: set[str] | frozenset[str] = frozenset()) -> str | None:
        """The best node among the fitting ones in the memo (every candidate decided), outside ``avoid``
        when one fits there."""
        while True:
            walk = m.order if spread else reversed(m.order)
            best = next((k[1] for k in walk if k[1] in names and k[1] not in avoid), None)
            if best is None and avoid:
                avoid = frozenset()  # every fitting candidate is avoided: the best of them
                continue
            if best is None or self._picked(m, best, preq, ctx):
                return best

    def _candidates(self, preq: PodRequest, min_gain: int = 2) -> set[str] | None:
        """A superset of the nodes ``preq`` can fit (the capacity index; for static MIG resources the
        nodes offering the profile), None when that rules out less than 1/``min_gain`` of the nodes."""
        cand = self._capacity.candidates(preq, min_gain)
        for profile, _n in preq.mig:  # static MIG resources: only nodes that offer the profile
            offer = self._static_mig.get(profile, set())
            cand = offer if cand is None else cand & offer
        return cand

    def _walk(self, m: _Memo, names: set[str], spread: bool, preq: PodRequest, ctx: PodContext,
              exact: bool, avoid: set[str] | frozenset[str] = frozenset()) -> str | None:
        """Best-first over the candidates' rank: decide dirty candidates until one fits outside ``avoid``
        (it is the best), else the best fitting one inside it. Candidates: the names the capacity index
        admits; when they are few, they are sorted by rank instead of walking every node's rank."""
        cand = self._candidates(preq)
        if cand is not None:
            names = names & cand
        if len(names) * 8 < len(self._order):
            order: Iterable[tuple[float, str]] = sorted(
                map(self._rank.__getitem__, names & self._rank.keys()), reverse=not spread)
        else:
            order = self._order if spread else reversed(self._order)
        dirty, fits, nodes = m.dirty, m.fits, self.nodes
        fallback = None
        for key in order:
            n = key[1]
            if n not in names:
                continue
            if n in dirty:
                m.put(n, self._screen(nodes[n], preq, ctx, exact), key)
                dirty.discard(n)
            r = fits.get(n)
            if r is not None and r.ok and self._picked(m, n, preq, ctx):
                if n not in avoid:
                    return n
                fallback = fallback or n
        return fallback

    def _count_fits(self, dec: Decision, m: _Memo, names: set[str] | Iterable[str], spread: bool,
                    event_nodes: int, best: str, every_node: bool = False) -> None:
        """Counts for the event from a memo whose candidates are all decided: the chosen node counts as
        fitting (it did, before its own reservation). The top ``event_nodes`` come from the memo's sorted
        order (no sort of every fitting node). ``every_node``: ``names`` cover every known node and ``m``
        is a live memo (its fitting nodes are known nodes): they are counted without a set operation."""
        if every_node:
            dec.n_fit = len(m.ok) + (best in self.nodes and best not in m.ok)
        else:
            ok = m.ok & names
            if best in self.nodes:
                ok.add(best)
            dec.n_fit = len(ok)
        top: list[str] = []
        if event_nodes:
            for k in (m.order if spread else reversed(m.order)):
                if k[1] in names and k[1] != best:
                    top.append(k[1])
                    if len(top) >= event_nodes:
                        break
            if best in self.nodes:
                top.append(best)
        top.sort(key=self._rank.__getitem__, reverse=not spread)
        dec.fit_nodes = top[:event_nodes]
        dec.scores = {n: self.nodes[n].score for n in dec.fit_nodes}

    def _count_quota_fits(self, dec: Decision, ok: set[str], spread: bool, event_nodes: int) -> None:
        dec.n_fit = len(ok)
        order = sorted(ok, key=self._rank.__getitem__, reverse=not spread)
        dec.fit_nodes = order[:event_nodes]
        dec.scores = {n: self.nodes[n].score for n in dec.fit_nodes}

    def complete(self, dec: Decision) -> Decision:
        """Fill in ``n_fit``/``fit_nodes``/``scores`` of a decision the lazy walk left open: the remaining
        candidates are decided in slices of at most ``COMPLETE_SLICE_S``, the lock released (and as long
        again slept) between them, so concurrent /filter calls wait at most one slice. Counted now,
        shortly after the decision: the chosen node counts as fitting (it did, before its own
        reservation), the others as they are now."""
        if dec.pending is None:
            return dec
        # The decision holds its memo weakly (a queued event must not keep an evicted memo alive): if it is
        # gone, the shape's live memo is as good (memos agree once their dirty nodes are decided), else a
        # scratch one.
        memo_ref, names_ref, spread, event_nodes, preq, ctx, best = dec.pending
        exact = screen_is_exact(preq, ctx)
        with self.lock:
            m = memo_ref() or self._memo.get((preq, ctx)) or _Memo(dirty=set(self.nodes))
        pruned = False
        while True:
            # Off the request path in earnest: a slice competes with /filter for the lock and for the GIL
            # (a thread waiting for it can lose milliseconds per hand-off), so wait for a quiet moment.
            waited = 0.0
            while waited < COMPLETE_QUIET_MAX_S and time.monotonic() - self._last_decide < COMPLETE_QUIET_S:
                time.sleep(COMPLETE_QUIET_S)
                waited += COMPLETE_QUIET_S
            with self.lock:
                names = self.nodes.keys() if names_ref is None else names_ref
                todo = m.dirty & names & self.nodes.keys()
                t0 = time.perf_counter()
                if not pruned:  # the nodes the capacity index rules out are marked at once, not screened
                    pruned = True
                    todo = self._prune(m, todo, preq)
                done: set[str] = set()
                for n in todo:  # a slice of at most COMPLETE_SLICE_S under the lock
                    done.add(n)
                    m.put(n, self._screen(self.nodes[n], preq, ctx, exact), self._rank[n])
                    if time.perf_counter() - t0 > COMPLETE_SLICE_S:
                        break
                m.dirty -= done
                held = time.perf_counter() - t0
                if len(done) == len(todo):
                    if names_ref is None and self._memo.get((preq, ctx)) is m:
                        self._count_fits(dec, m, names, spread, event_nodes, best, every_node=True)
                    else:
                        self._count_fits(dec, m, set(names & self.nodes.keys()), spread, event_nodes, best)
                    dec.pending = None
                    return dec
            time.sleep(held)  # at most half of a core, and /filter gets the lock (Python's is not fair)

    def _prune(self, m: _Memo, todo: set[str], preq: PodRequest) -> set[str]:
        """Mark the nodes of ``todo`` that cannot fit ``preq`` by the capacity index ``PRUNED`` in bulk
        (set and dict operations in C; the screen would refuse them one by one, a few microseconds each);
        the rest of ``todo`` is returned. ``PRUNED`` stands for any refusal: a reason is only computed
        when the pod fits nowhere."""
        cand = self._candidates(preq, min_gain=1)
        if cand is None:
            return todo
        out = todo - cand
        for n in out & m.pos.keys():  # fitted before its change: leaves the fitting order
            m.drop(n)
        m.fits.update(dict.fromkeys(out, PRUNED))
        m.dirty -= out
        return todo & cand

    def simulate(self, given: list[tuple[str, list[DeviceUsage] | None, NodeExtras, dict[str, int]]],
                 preq: PodRequest, ctx: PodContext, quota: QuotaBudget | None = None) -> Decision:
        """/filter with full Node objects (kube-scheduler's ``nodeCacheCapable: false``): each node's
        devices come from the given object's register annotation, as HAMi's ``filterSimulation`` reads
        them (``buildTransientNodeInfo`` in Project-HAMi/HAMi ``pkg/scheduler/scheduler.go``), so a node
        this cache has not seen yet is evaluated too. ``given``: (name, devices or None when the object
        has no usable annotation, extras, static MIG capacity). Unlike HAMi, which simulates every node
        empty, the pods this cache knows on a node are counted (a full node must not look free). Nothing
        is reserved."""
        with self.lock:
            states: dict[str, NodeState] = {}
            for name, devices, extras, capacity in given:
                if not devices:
                    continue
                st = states[name] = NodeState(name, [d.clone() for d in devices], extras, dict(capacity))
                for uid in self._pods_by_node.get(name, ()):
                    self._apply(st, self.pods[uid], +1)
            out = decide(states, list(states), preq, ctx, quota)
            if out.node is None:  # every reason, in the order the nodes were given
                return Decision(None, None, {n: out.failed.get(n, R.NODE_UNREGISTERED) for n, *_ in given})
            return Decision(out.node, out.fit, {}, n_fit=len(out.fit_nodes), fit_nodes=out.fit_nodes,
                            scores=out.scores)


def mig_reservations(containers: list[list[Picked]]) -> dict[str, tuple[MigPlacement, ...]]:
    """Placements a decision reserves per GPU (every container's, as HAMi counts the annotation)."""
    out: dict[str, tuple[MigPlacement, ...]] = {}
    for c in containers:
        for p in c:
            if p.mig_placement is not None:
                out[p.uuid] = (*out.get(p.uuid, ()), p.mig_placement)
    return out


def collapse(containers: list[list[Picked]], n_init: int) -> dict[str, DeviceAmount]:
    """Per physical GPU: mem/cores = max(max over init containers, sum over app containers);
    slots = app occurrences, or 1 when only init containers use it (reference §4.2)."""
    init: dict[str, DeviceAmount] = {}
    app: dict[str, DeviceAmount] = {}
    for i, c in enumerate(containers):
        for p in c:
            if i < n_init:
                a = init.setdefault(p.uuid, DeviceAmount())
                a.mem = max(a.mem, p.usedmem)
                a.cores = max(a.cores, p.usedcores)
                a.slots = 1
            else:
                a = app.setdefault(p.uuid, DeviceAmount())
                a.mem += p.usedmem
                a.cores += p.usedcores
                a.slots += 1
    out: dict[str, DeviceAmount] = {}
    for uuid in init.keys() | app.keys():
        i = init.get(uuid, DeviceAmount())
        a = app.get(uuid, DeviceAmount())
        out[uuid] = DeviceAmount(slots=a.slots or 1, mem=max(i.mem, a.mem), cores=max(i.cores, a.cores))
    return out

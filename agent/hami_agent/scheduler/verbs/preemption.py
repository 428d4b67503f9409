"""GPU preemption from /filter (``--preemption extender``; issue 29 item 3, docs/scheduler.md "Preemption").

kube-scheduler (v1.35) cannot preempt for GPUs through an extender: its dry run runs the framework's
filters only, which do not see GPU memory, so it finds no victim and never calls a ``preemptVerb``
(Project-HAMi/HAMi#1494). So /filter preempts by itself when a pod fits nowhere: the dry run
(``core.preempt``) under the cache lock, a hold (``state.holds``) recorded before /filter answers, and the
API calls kube-scheduler's ``prepareCandidate`` makes (``pkg/scheduler/framework/preemption/preemption.go``
``:177-219``, ``:464-500``) run behind the answer in the write-behind pool, as its async preemption runs
them:

1. the preemptor's annotation ``hami.io/preemption-hold`` (if this fails, the hold is dropped and nothing
   else happens);
2. its ``status.nominatedNodeName``, so that kube-scheduler keeps the pod nominated and, seeing the
   victims terminating with ``DisruptionTarget``, does not preempt again (``default_preemption.go``
   ``PodEligibleToPreemptOthers``);
3. per victim not terminating yet: the ``DisruptionTarget``/``PreemptionByScheduler`` condition, then a
   DELETE with a UID precondition and the pod's own grace period (not an eviction: PDBs are counted, not
   enforced, as upstream);
4. events: ``Preempted`` on each victim, ``Preempting`` on the preemptor.

While the victims terminate, /filter answers ``FailedNodes`` for the held node (``Unschedulable``: an
unresolvable status would make the pod eligible to preempt again).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from hami_agent import log
from hami_agent.httpserve import HTTPError
from hami_agent.k8s.errors import KubeError, NotFoundError
from hami_agent.protocol import keys
from hami_agent.protocol.devices import MigPlacement
from hami_agent.protocol.timefmt import format_rfc3339, parse_rfc3339
from hami_agent.scheduler.core import preempt as pre
from hami_agent.scheduler.core.fit import PodContext, QuotaBudget, pod_context
from hami_agent.scheduler.core.model import DeviceAmount, PodRequest, PodUsage
from hami_agent.scheduler.core.nodes import NodeState, apply_pod
from hami_agent.scheduler.core.requests import pod_request
from hami_agent.scheduler.state.cache import UsageCache, collapse, mig_reservations
from hami_agent.scheduler.state.holds import Hold, Holds, deadline_for
from hami_agent.scheduler.state.podinfo import annotations, pod_key, preemption_fields
from hami_agent.scheduler.verbs import events as ev
from hami_agent.scheduler.verbs.args import field_ci
from hami_agent.scheduler.verbs.leadership import LeaderGate, NotLeader
from hami_agent.scheduler.verbs.writebehind import WriteBehind

logger = logging.getLogger(__name__)

PREEMPTED = "Preempted"  # kube-scheduler's reason on a victim
PREEMPTING = "Preempting"  # ours on the preemptor (kube-scheduler posts none; its nomination is the signal)


def waiting_reason(hold: Hold) -> str:
    """/filter's ``FailedNodes`` text for the held node while the victims terminate."""
    gpus = ",".join(sorted(hold.usage.devices)) or "its GPUs"
    return f"waiting for {len(hold.victims)} preempted pod(s) on {gpus} to terminate"


def hold_annotation(hold: Hold, now_wall: float, now_mono: float) -> str:
    """``hami.io/preemption-hold``: what a new leader needs to hold the same capacity (``rebuild_holds``) and
    an operator to read: node, devices, per device [slots, MiB, cores], victim UIDs, priority, deadline;
    and, only when the hold has them, its MIG parts: ``mig`` the static MIG resources as [profile, count]
    pairs (``nvidia.com/mig-<profile>``), ``migPlacements`` the dynamic MIG placements per GPU as [start,
    size] pairs (an annotation without them, as written before they existed, reads as none)."""
    deadline = datetime.fromtimestamp(now_wall + hold.deadline - now_mono, timezone.utc)
    usage = {u: [a.slots, a.mem, a.cores] for u, a in sorted(hold.usage.devices.items())}
    out: dict[str, Any] = {"node": hold.node, "devices": sorted(hold.usage.devices), "usage": usage,
                           "victims": list(hold.victims), "priority": hold.priority,
                           "deadline": format_rfc3339(deadline)}
    if hold.usage.mig:
        out["mig"] = [[p, n] for p, n in hold.usage.mig]
    if hold.usage.mig_alloc:
        out["migPlacements"] = {u: [[pl.start, pl.size] for pl in pls]
                                for u, pls in sorted(hold.usage.mig_alloc.items())}
    return json.dumps(out, sort_keys=True)


def _hold_mig(h: dict) -> tuple[tuple[tuple[str, int], ...], dict[str, tuple[MigPlacement, ...]]]:
    """The MIG parts of a parsed ``hami.io/preemption-hold``; none when absent (an older annotation)."""
    mig = tuple((str(p), int(n)) for p, n in h.get("mig") or ())
    placements = {str(u): tuple(MigPlacement(int(s), int(z)) for s, z in pls)
                  for u, pls in (h.get("migPlacements") or {}).items()}
    return mig, placements


def rebuild_holds(holds: Holds, pending: list[dict], now_wall: float, now_mono: float) -> int:
    """A new leader's holds, from the ``hami.io/preemption-hold`` annotations of the pending pods (only the
    scheduler may write it: the admission policy). A malformed or expired one is skipped. Returns how many
    were rebuilt, MIG parts included (``hold_annotation``)."""
    n = 0
    for pod in pending:
        raw = annotations(pod).get(keys.PREEMPTION_HOLD)
        if not raw:
            continue
        uid, ns, name = pod_key(pod)
        try:
            h = json.loads(raw)
            left = parse_rfc3339(h["deadline"], "deadline").timestamp() - now_wall
            devices = {str(u): DeviceAmount(int(v[0]), int(v[1]), int(v[2])) for u, v in h["usage"].items()}
            mig, placements = _hold_mig(h)
            usage = PodUsage(uid=uid, namespace=ns, name=name, node=str(h["node"]), devices=devices,
                             mig=mig, mig_alloc=placements, **preemption_fields(pod))
            hold = Hold(usage, tuple(str(v) for v in h["victims"]), now_mono + left)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            logger.warning("preemption: pod %s/%s: ignoring %s: %s", ns, name, keys.PREEMPTION_HOLD, exc)
            continue
        if left > 0:
            holds.put(hold)
            n += 1
    return n


def held_copies(cache: UsageCache, held: dict[str, list[PodUsage]]) -> dict[str, NodeState]:
    """The held nodes with the holds that count for the preemptor added (on copies): capacity another
    preemptor of higher or equal priority waits for is not freed again. Call under ``cache.lock``."""
    out = {}
    for n, usages in held.items():
        st = cache.nodes.get(n)
        if st is not None:
            out[n] = st.copy()
            for u in usages:
                apply_pod(out[n], u, +1)
    return out


class Preemption:
    def __init__(self, cache: UsageCache, holds: Holds, *, rclient: Any, wclient: Any, gate: LeaderGate,
                 writer: WriteBehind, events: ev.EventSink | None, metrics: Any, scheduler_name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self.holds = holds
        self.rclient = rclient
        self.wclient = wclient
        self.gate = gate
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.scheduler_name = scheduler_name
        self.clock = clock
        # PodDisruptionBudgets for the dry run (state/sync.py ``pdb_violations``); None: none counted
        self.pdbs: Callable[[], pre.Pdb] | None = None
        # the namespace's GPU quota left, given the holds that count for the pod (the extender's
        # ``_budget``: an API read, cached); None: no quota (or none set)
        self.quota: Callable[[str, dict[str, list[PodUsage]]], QuotaBudget | None] | None = None

    def victims_gone(self, uid: str) -> bool:
        """The pod has a hold and none of its victims is counted any more. A /filter decision made a moment
        earlier may still have counted one (the informer's delete landed in between): the caller decides
        again before ``refused`` takes "victims gone, still no fit" to mean someone took the room."""
        own = self.holds.get(uid)
        if own is None:
            return False
        with self.cache.lock:
            return not any(v in self.cache.pods for v in own.victims)

    def refused(self, pod: dict, uid: str, names: list[str], preq: PodRequest, ctx: PodContext, rec: dict,
                failed: dict[str, str]) -> dict[str, str]:
        """/filter found no node for the pod: the ``FailedNodes`` to answer, after preempting when GPU
        victims make room. ``rec``: the pod's ``podinfo.preemption_fields``."""
        md = pod.get("metadata") or {}
        ns, name = md.get("namespace") or "default", md.get("name") or ""
        # the namespace quota, read outside the cache lock (its limits are an API read)
        budget = self.quota(ns, self.holds.against(uid, rec["priority"])) if self.quota is not None else None
        quota = None if budget is None else pre.Quota(ns, budget)
        own = self.holds.get(uid)
        if own is not None:
            with self.cache.lock:
                waiting = any(v in self.cache.pods for v in own.victims)
                # its victims went after this call's decision (the informer's delete in between): the room
                # is there now, and the next call takes it; only a node without it means someone took it
                room = not waiting and self._fits_held_node(own, uid, preq, ctx, rec["priority"], quota)
            if waiting or room:  # (a call without the held node: its own preemption still waits all the same)
                return {**failed, own.node: waiting_reason(own)} if own.node in names else failed
            self.holds.release(uid)  # its victims are gone and it still does not fit: someone took it
        if not pre.eligible(rec["preemption_policy"]):
            return failed
        # the dry run on a snapshot, outside the lock (it may take many fits: /filter must not wait on it)
        with self.cache.lock:
            nodes, pods = self._snapshot(uid, names, rec["priority"])
        pdb = self.pdbs() if self.pdbs is not None else ()
        v = pre.preempt(nodes, pods, names, preq, ctx, rec["priority"], rec["preemption_policy"], pdb,
                        quota=quota)
        if v is None:
            self._count("none")
            return failed
        with self.cache.lock:  # still true now? then the hold, before anyone else decides
            live = {p.uid for p in self.cache.settled_pods_on(v.node)}
            st = held_copies(self.cache, self.holds.against(uid, rec["priority"])).get(v.node) or (
                self.cache.nodes.get(v.node))
            fit = pre.fit_without(st, v.pods, preq, ctx, quota) if st is not None else None
            if fit is None or not fit.ok or any(p.uid not in live for p in v.pods):
                self._count("stale")
                return failed  # the node changed during the dry run: kube-scheduler retries the pod
            usage = PodUsage(uid=uid, namespace=ns, name=name, node=v.node,
                             devices=collapse(fit.containers, preq.n_init), mig=preq.mig,
                             mig_alloc=mig_reservations(fit.containers), **rec)
            now = self.clock()
            hold = Hold(usage, tuple(p.uid for p in v.pods), deadline_for(v.pods, now), since=now)
            cleared = self.holds.put(hold)
        for h in cleared:
            logger.info("preemption: hold of pod %s/%s on node %s cleared by higher-priority pod %s/%s",
                        h.usage.namespace, h.usage.name, h.node, ns, name)
        logger.info("preemption: pod %s/%s (priority %d) preempts %d pod(s) on node %s: %s", ns, name,
                    rec["priority"], len(v.pods), v.node,
                    ", ".join(f"{p.namespace}/{p.name}" for p in v.pods))
        self._count("preempted")
        if self.metrics is not None:
            self.metrics.preemption_victims.inc(len(v.pods))
        if self.writer.submit(lambda: self._act(pod, hold, v.pods, cleared)) is None:
            self._act(pod, hold, v.pods, cleared)  # the pool is full: inline (back-pressure)
        return {**failed, v.node: waiting_reason(hold)}

    def _fits_held_node(self, own: Hold, uid: str, preq: PodRequest, ctx: PodContext, priority: int,
                        quota: pre.Quota | None) -> bool:
        """The owner fits its held node now, with the other holds that count for it and within its namespace
        quota. Under ``cache.lock``."""
        st = held_copies(self.cache, self.holds.against(uid, priority)).get(own.node) or (
            self.cache.nodes.get(own.node))
        return st is not None and pre.fit_without(st, (), preq, ctx, quota).ok

    def _snapshot(self, uid: str, names: list[str],
                  priority: int) -> tuple[dict[str, NodeState], dict[str, list[PodUsage]]]:
        """Copies of the candidate nodes that have a potential victim (the holds that count for the pod
        added), and their bound pods. Call under ``cache.lock``."""
        held = self.holds.against(uid, priority)
        nodes: dict[str, NodeState] = {}
        pods: dict[str, list[PodUsage]] = {}
        for n in dict.fromkeys(names):
            st = self.cache.nodes.get(n)
            on = [p for p in self.cache.settled_pods_on(n) if p.bound] if st is not None else []
            if not pre.potential_victims(on, priority):
                continue
            nodes[n] = st.copy()
            for u in held.get(n, ()):
                apply_pod(nodes[n], u, +1)
            pods[n] = on
        return nodes, pods

    def _act(self, pod: dict, hold: Hold, victims: tuple[PodUsage, ...], cleared: list[Hold]) -> str:
        """The API calls of one preemption, in kube-scheduler's order. "" or the error that stopped it.
        ``cleared``: lower-priority holds this one replaced; their owners lose their nomination, as
        upstream's lower-priority nominations on the node do (``preemption.go`` ``prepareCandidate``)."""
        md = pod.get("metadata") or {}
        ns, name = md.get("namespace") or "default", md.get("name") or ""
        try:
            self.gate.check("preemption hold")
            self.wclient.patch_pod_metadata(ns, name, annotations={
                keys.PREEMPTION_HOLD: hold_annotation(hold, time.time(), self.clock())})
        except (NotLeader, KubeError) as exc:
            if self.holds.get(hold.owner) is hold:
                self.holds.release(hold.owner)
            logger.error("preemption: pod %s/%s: recording the hold failed, nothing preempted: %s", ns, name,
                         exc)
            self._count("error")
            return str(exc)
        try:
            self.wclient.patch_pod_status(ns, name, {"nominatedNodeName": hold.node})
        except KubeError as exc:  # the hold still keeps the capacity; kube-scheduler retries the pod anyway
            logger.warning("preemption: pod %s/%s: setting nominatedNodeName failed: %s", ns, name, exc)
        for v in victims:
            err = self._preempt_one(v, md.get("uid") or hold.owner, hold.node)
            if err:
                logger.warning("preemption: victim %s/%s: %s", v.namespace, v.name, err)
        for h in cleared:
            try:
                self.wclient.patch_pod_status(h.usage.namespace, h.usage.name, {"nominatedNodeName": None})
            except KubeError as exc:  # NotFound included: a deleted pod has no nomination to clear
                log.v(logger, 3, "preemption: clearing the nomination of %s/%s failed: %s", h.usage.namespace,
                      h.usage.name, exc)
        if self.events is not None:
            who = ", ".join(f"{v.namespace}/{v.name}" for v in victims)
            self.events.emit(pod, ev.NORMAL, PREEMPTING,
                             f"Preempting {len(victims)} pod(s) on node {hold.node}: {who}")
        return ""

    def _preempt_one(self, v: PodUsage, preemptor_uid: str, node: str) -> str:
        """Condition, then DELETE with a UID precondition, then the event; NotFound counts as done."""
        if v.terminating:
            return ""  # upstream: a victim already being deleted gets no call
        try:
            self.gate.check("preemption")
            cur = self.rclient.get_pod(v.namespace, v.name)
            cmd = cur.get("metadata") or {}
            if cmd.get("uid") != v.uid or cmd.get("deletionTimestamp"):
                return ""  # replaced by another pod of that name, or already going
            conds = [c for c in (cur.get("status") or {}).get("conditions") or []
                     if c.get("type") != "DisruptionTarget"]
            conds.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                          "message": f"{self.scheduler_name}: preempting to accommodate a higher "
                                     "priority pod",
                          "lastTransitionTime": format_rfc3339(datetime.now(timezone.utc))})
            self.wclient.patch_pod_status(v.namespace, v.name, {"conditions": conds})
            self.wclient.delete("pods", v.name, v.namespace, uid=v.uid)
        except NotFoundError:
            return ""
        except (NotLeader, KubeError) as exc:
            return str(exc)
        if self.events is not None:
            self.events.emit(cur, ev.NORMAL, PREEMPTED, f"Preempted by pod {preemptor_uid} on node {node}")
        return ""

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.preemptions.labels(result).inc()


# ------------------------------------------------------------------------------------------- /preempt
Candidates = dict[str, tuple[list[str], int]]  # node -> (victim UIDs, PDB violations)


def parse_candidates(args: dict) -> Candidates:
    """kube-scheduler's candidates from ``ExtenderPreemptionArgs`` (``extender.go`` ``ProcessPreemption``:
    ``NodeNameToMetaVictims`` with ``nodeCacheCapable``, else whole pods in ``NodeNameToVictims``)."""
    out: Candidates = {}
    for field in ("NodeNameToVictims", "NodeNameToMetaVictims"):
        for node, v in (field_ci(args, field) or {}).items():
            uids = []
            for p in field_ci(v, "Pods") or []:
                uid = field_ci(p, "UID") if field == "NodeNameToMetaVictims" else (
                    (p.get("metadata") or {}).get("uid"))
                if isinstance(uid, str) and uid:
                    uids.append(uid)
            out[node] = (uids, int(field_ci(v, "NumPDBViolations") or 0))
    return out


def meta_victims(cands: Candidates) -> dict:
    """``ExtenderPreemptionResult.NodeNameToMetaVictims``."""
    return {n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
            for n, (uids, pdb) in cands.items()}


def refine(prem: Preemption, uid: str, preq: PodRequest, ctx: PodContext, rec: dict,
           cands: Candidates) -> Candidates:
    """What /preempt answers for kube-scheduler's candidates (reached only where a framework resource is
    short too, docs/scheduler.md "Preemption"): none while the pod's own preemption is under way (a veto:
    kube-scheduler then keeps the nomination); otherwise each node keeps kube-scheduler's victims plus the
    fewest GPU victims that make HAMi's fit succeed, and a node where no GPU victims can make room is
    dropped. kube-scheduler checks none of this, so only bound, lower-priority pods of that node are
    added."""
    if prem.holds.get(uid) is not None:
        return {}
    if preq.empty:
        return cands
    held = prem.holds.against(uid, rec["priority"])
    out: Candidates = {}
    with prem.cache.lock:
        copies = held_copies(prem.cache, held)
        for node, (uids, pdb) in cands.items():
            st = copies.get(node) or prem.cache.nodes.get(node)
            if st is None:
                continue  # no GPUs this extender knows: the pod cannot fit there
            on_node = {p.uid: p for p in prem.cache.settled_pods_on(node)}
            theirs = set(uids)
            copy = st.copy()
            for u in theirs & on_node.keys():
                apply_pod(copy, on_node[u], -1)
            rest = [p for u, p in on_node.items() if u not in theirs and p.bound]
            v = pre.select_victims_on_node(copy, rest, preq, ctx, rec["priority"])
            if v is not None:
                out[node] = ([*uids, *(p.uid for p in v.pods)], pdb)
    return out


def preempt_unavailable(why: str) -> dict:
    """A follower that cannot forward /preempt: ``ExtenderPreemptionResult`` has no error field, so a 503
    (kube-scheduler: an error, nothing preempted)."""
    raise HTTPError(503, why)


def preempt_verb(ext: Any, args: dict) -> dict:
    """/preempt for ``Extender.preempt`` on the leader. With ``--preemption off`` kube-scheduler's candidates
    come back unchanged (as if no preemptVerb were configured). An error (the pod cannot be read or is not
    ours) raises, and the HTTP server answers 500: kube-scheduler then preempts nothing."""
    cands = parse_candidates(args)
    if ext.preemption is None:
        return {"NodeNameToMetaVictims": meta_victims(cands)}
    md = field_ci(args, "Pod").get("metadata") or {}
    ns, name, uid = md.get("namespace") or "default", md.get("name") or "", md.get("uid") or ""
    pod = ext.pods.schedulable(ns, name, uid)
    preq = pod_request(pod, ext.config.names)
    ctx = pod_context(annotations(pod), ext.config.node_policy, ext.config.gpu_policy)
    out = refine(ext.preemption, uid, preq, ctx, preemption_fields(pod), cands)
    log.v(logger, 3, "preempt pod %s/%s: %d candidate node(s) in, %d out", ns, name, len(cands), len(out))
    return {"NodeNameToMetaVictims": meta_victims(out)}

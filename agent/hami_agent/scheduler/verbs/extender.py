"""/filter and /bind (Project-HAMi/HAMi ``pkg/scheduler/scheduler.go``): what the extender may decide for, the
cache decision, the pod's annotations and the read-back of writes whose answer was lost. HTTP-free:
``server`` maps routes onto these methods; ``binder`` does /bind.

What /filter trusts (see docs/scheduler.md "What the extender trusts"): the request body names the pod
(namespace, name, uid) and the candidate nodes; the pod's state comes from the extender's informer of
pending pods or a GET (``podstate``), and only a pod that is pending for our scheduler is decided for.
The decision is reserved in the usage cache as an *assumption* before the annotation patch, which is
conditional on the resourceVersion the pod was read at; a failed patch is resolved from the API's truth
(``reconcile``), never by guessing that it did not happen.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hami_agent import log
from hami_agent.k8s.errors import KubeError
from hami_agent.protocol import ProtocolError, encode_pod_devices, keys
from hami_agent.protocol.annotations import DEFAULT_GPU_POLICY, DEFAULT_NODE_POLICY
from hami_agent.protocol.labels import vgpu_node_label
from hami_agent.protocol.mig import MigAllocation, encode_mig_allocations
from hami_agent.protocol.nodelock import DEFAULT_LOCK_EXPIRY
from hami_agent.protocol.quantity import quantity_int
from hami_agent.protocol.requests import RequestConfig, RequestSettings
from hami_agent.scheduler.core.fit import PodContext, QuotaBudget, pod_context
from hami_agent.scheduler.core.model import Picked, PodUsage
from hami_agent.scheduler.core.nodes import mig_capacity, node_devices, node_extras
from hami_agent.scheduler.core.requests import RequestError, pod_request
from hami_agent.scheduler.state import holds as holds_mod
from hami_agent.scheduler.state.busy import BusyNodes
from hami_agent.scheduler.state.cache import UsageCache, collapse, mig_reservations
from hami_agent.scheduler.state.decisions import DecisionLog, FilterDecision
from hami_agent.scheduler.state.heal import Healer
from hami_agent.scheduler.state.holds import Holds
from hami_agent.scheduler.state.nodelocks import NodeLocks
from hami_agent.scheduler.state.podinfo import annotations, preemption_fields, signature
from hami_agent.scheduler.state.podstate import PodRefused, PodStates
from hami_agent.scheduler.state.reconcile import APPLIED, NOT_APPLIED, Reconciler
from hami_agent.scheduler.verbs import events as ev
from hami_agent.scheduler.verbs.args import (
    BadRequest,
    BindArgs,
    FilterArgs,
    field_ci,
    parse_bind_args,
    parse_filter_args,
)
from hami_agent.scheduler.verbs.binder import Binder, definitive
from hami_agent.scheduler.verbs.leadership import LeaderGate, NotLeader
from hami_agent.scheduler.verbs.preemption import Preemption, preempt_unavailable, preempt_verb
from hami_agent.scheduler.verbs.writebehind import WriteBehind

logger = logging.getLogger(__name__)

__all__ = ["BadRequest", "Extender", "SchedulerConfig", "field_ci"]

STALE_KEYS = (keys.VGPU_NODE, keys.VGPU_TIME, keys.DEVICES_TO_ALLOCATE, keys.DEVICES_ALLOCATED,
              keys.MIG_ALLOCATIONS, keys.BIND_PHASE, keys.BIND_TIME)


@dataclass
class SchedulerConfig:
    scheduler_name: str = "hami-scheduler"
    node_policy: str = DEFAULT_NODE_POLICY
    gpu_policy: str = DEFAULT_GPU_POLICY
    # resource names and request defaults: hami_agent.config.NvidiaConfig (from --config) or the
    # protocol's stand-alone RequestConfig (HAMi chart defaults)
    names: RequestSettings = field(default_factory=RequestConfig)
    node_lock_timeout_s: float = DEFAULT_LOCK_EXPIRY.total_seconds()  # HAMi NodeLockTimeout (5 min)
    event_nodes: int = 50  # fit nodes listed in a FilteringSucceed event
    quota_ttl_s: float = 10.0
    sync_timeout_s: float = 10.0  # how long /filter waits for the caches before answering an error
    # API calls on the request paths: kube-scheduler gives an extender call 30 s (HAMi's chart); a
    # /filter makes at most a read, a write and a read-back, a /bind a few more.
    api_timeout_s: float = 4.0
    settle_s: float = 90.0  # after this, an unanswered write that left the pod unchanged counts as lost
    # a /bind that meets a node lock held by a pod still being allocated waits this long for its release
    # (scheduler/verbs/lockwait.py; kube-scheduler's extender httpTimeout is 30 s); 0: fail at once, as HAMi
    bind_lock_wait_s: float = 15.0
    # /filter prefers a fitting node where no other pod is being admitted (state/busy.py); False: the
    # best node by policy alone, as HAMi (its /bind then waits for the node lock)
    avoid_busy_nodes: bool = True
    # /filter answers once its decision is reserved and writes the pod's assignment behind, in a bounded
    # pool; /bind waits for that write (verbs/writebehind.py). False: /filter answers after the write,
    # as HAMi
    write_behind: bool = True
    # GPU preemption (issue 29, docs/scheduler.md "Preemption"): "off" = HAMi's answers (HAMi never evicts
    # for GPUs); "extender" = /filter preempts GPU pods itself (verbs/preemption.py); serve/cmd.py refuses
    # "kube-scheduler" (not built)
    preemption: str = "off"
    # webhook
    force_overwrite_default_scheduler: bool = True
    gpu_core_policy: str = "default"
    overwrite_env: bool = False
    runtime_class_name: str = ""
    dra: Any = None  # hami_agent.config.DraConfig from --config: GPUs assigned to the DRA driver


def mig_allocations_value(containers: list[list[Picked]]) -> str:
    """``hami.io/vgpu-mig-allocations`` of a decision (HAMi ``EncodeMigAllocations``,
    ``pkg/device/nvidia/mig_allocations.go``): one entry per device that got a MIG placement, indexed
    by container (init containers first, as in the pod device string) and device; "" when none did."""
    allocs = [MigAllocation(ci, di, p.uuid, p.mig_profile, p.mig_placement)
              for ci, c in enumerate(containers) for di, p in enumerate(c)
              if p.mig_profile and p.mig_placement is not None]
    return encode_mig_allocations(allocs) if allocs else ""


class Extender:
    def __init__(self, cache: UsageCache, config: SchedulerConfig | None = None, client: Any = None,
                 events: ev.EventSink | None = None, metrics: Any = None, *,
                 cached_pods: Any = None, gate: LeaderGate | None = None,
                 healer: Healer | None = None) -> None:
        """``cached_pods(ns, name)``: the informer of pending pods (None: every pod is read with a GET).
        ``gate``: leadership (None: always the leader). ``healer``: background repairs (one is made and
        started on first use when None; ``healer.stop()`` ends it)."""
        self.cache = cache
        self.config = config or SchedulerConfig()
        self.client = client
        self.events = events
        self.metrics = metrics
        self.synced = threading.Event()
        self._quota: dict[str, tuple[float, tuple[int | None, int | None] | None]] = {}
        # one bounded read view and one write view (no blind retries: a lost answer is read back)
        t = self.config.api_timeout_s
        views = hasattr(client, "with_options")
        self.rclient = client.with_options(timeout_s=t, attempts=2) if views else client
        self.wclient = client.with_options(timeout_s=t, attempts=1) if views else client
        self.pods = PodStates(self.rclient, cached_pods, self.config.scheduler_name)
        self.gate = gate or LeaderGate()
        self.healer = healer or Healer(autostart=True)
        self.decisions = DecisionLog(ttl_s=max(900.0, self.config.node_lock_timeout_s))
        self.reconciler = Reconciler(cache, self.rclient, self.healer, self.config.names,
                                     self.config.scheduler_name, settle_s=self.config.settle_s)
        self.binder = Binder(wclient=self.wclient, rclient=self.rclient, pods=self.pods, gate=self.gate,
                             healer=self.healer, decisions=self.decisions, config=self.config,
                             events=events, count=self._count)
        self.gate.on_lost(self.decisions.clear)
        self.requeue: Any = None  # scheduler/verbs/requeue.py Requeuer: told when /filter finds no node
        # scheduler/state/confirm.py GoneCheck: before a refusal, are the few pods in the way still there?
        self.gone_check: Any = None
        # every node's lock as the node watch shows it (state/nodelocks.py), and the nodes with a pod between
        # /filter and Allocate (state/busy.py), which read it
        self.node_locks = NodeLocks()
        self.busy = BusyNodes(self.node_locks)
        self.writer = WriteBehind()  # /filter's assignment writes when config.write_behind
        self.holds = Holds()  # GPU capacity kept for preemptors (state/holds.py)
        self.gate.on_lost(self.holds.clear)  # a new leader rebuilds them (verbs/preemption.rebuild_holds)
        self.binder.on_bound = self._preemptor_bound
        self.preemption = Preemption(
            cache, self.holds, rclient=self.rclient, wclient=self.wclient, gate=self.gate, writer=self.writer,
            events=events, metrics=metrics, scheduler_name=self.config.scheduler_name,
        ) if self.config.preemption == "extender" else None

    def _preemptor_bound(self, b: BindArgs) -> None:
        """Observe a preemptor's wait on its held node (``hami_scheduler_preemption_wait_seconds``)."""
        waited = self.holds.waited(b.uid, b.node)
        if waited is not None and self.metrics is not None:
            self.metrics.preemption_wait.observe(waited)

    # ----------------------------------------------------------------------------------- filter
    def filter(self, args: dict, *, write_behind: bool = False) -> dict:
        """/filter. ``write_behind``: answer once the decision is reserved and let the assignment write run
        behind (the HTTP route passes ``config.write_behind``: ``filter_route``); False: the answer reports
        the write's outcome, as HAMi's Filter."""
        fa = parse_filter_args(args)
        if not self.gate.is_leader():
            self._count("filter", "forwarded")
            return self.gate.forward("filter", args, lambda e: self._result(error=e))
        if not self.synced.wait(self.config.sync_timeout_s):
            return self._result(error="scheduler cache not synced yet (waiting for informers / leadership)")
        if not self.gate.wait_ready(self.config.sync_timeout_s):
            return self._result(error="this extender just became leader and is still reading the cluster's "
                                      "allocations: kube-scheduler will retry")
        ns, name = fa.namespace, fa.name
        log.v(logger, 5, "filter pod %s/%s uid %s on %d nodes", ns, name, fa.uid, len(fa.names))
        try:
            pod = self.pods.schedulable(ns, name, fa.uid)
            preq = pod_request(pod, self.config.names)
        except (PodRefused, RequestError) as exc:
            self._count("filter", "refused")
            return self._result(error=f"pod {ns}/{name}: {exc}; nothing written")
        except KubeError as exc:
            self._count("filter", "error")
            return self._result(error=f"pod {ns}/{name}: cannot read the pod: {exc}")
        if preq.empty:
            return self._result(names=fa.names, nodes_obj=fa.nodes)
        if self.binder.in_doubt(fa.uid):
            self._count("filter", "refused")
            return self._result(error=f"pod {ns}/{name}: an earlier binding of this pod is still being "
                                      "resolved; kube-scheduler will retry")
        earlier = self.decisions.get(fa.uid)
        if earlier is not None and earlier.write_error() is None:
            self._count("filter", "refused")
            return self._result(error=f"pod {ns}/{name}: the assignment of an earlier /filter of this pod is "
                                      "still being written; kube-scheduler will retry")
        try:
            ctx = pod_context(annotations(pod), self.config.node_policy, self.config.gpu_policy)
        except ProtocolError as exc:
            # HAMi: calcScore fails on an invalid hami.io/device-scoring-weights and Filter answers its
            # error, FilteringFailed event included (Project-HAMi/HAMi pkg/scheduler/scheduler.go Filter)
            self._count("filter", "refused")
            err = f"calcScore failed {exc} for pod {name}"
            if self.events:
                self.events.emit(pod, ev.WARNING, ev.FILTERING_FAILED, err)
            return self._result(error=err)
        return self._decide(fa, pod, preq, ctx, behind=write_behind)

    def preempt(self, args: dict) -> dict:
        """/preempt, kube-scheduler's preemptVerb (``verbs/preemption.py`` ``preempt_verb``)."""
        if not self.gate.is_leader():
            self._count("preempt", "forwarded")
            return self.gate.forward("preempt", args, preempt_unavailable)
        return preempt_verb(self, args)

    def filter_route(self, args: dict) -> dict:
        """/filter as served over HTTP: write-behind unless ``--sync-filter-write``."""
        return self.filter(args, write_behind=self.config.write_behind)

    def _decide(self, fa: FilterArgs, pod: dict, preq: Any, ctx: PodContext, confirmed: bool = False,
                behind: bool = False) -> dict:
        """Decide and reserve; write the assignment (``behind``: in the write-behind pool, see
        ``writebehind``). ``confirmed``: the pods in the way of a refusal were checked against the API
        already (decide once more at most)."""
        ns, name, uid = fa.namespace, fa.name, fa.uid
        limits = self._quota_limits(ns)  # API read (cached) outside the lock
        simulate = fa.nodes is not None
        avoid = self.busy.nodes() if self.config.avoid_busy_nodes and not simulate else frozenset()
        given = self._given_nodes(fa.nodes) if simulate else []
        encoded = vtime = mig = ""
        rec = preemption_fields(pod)
        held: dict = {}
        if len(self.holds) and not simulate:
            self.holds.expire()
            held = self.holds.against(uid, rec["priority"])
        with self.cache.lock:
            prev = None if simulate else self.cache.exclude(uid)  # a retry must not count the pod twice
            # budget under the lock: concurrent filters of one namespace must see each other's pods
            quota = self._budget(ns, limits, held)
            if simulate:
                dec = self.cache.simulate(given, preq, ctx, quota)
            else:
                dec = holds_mod.decide(self.cache, fa.names, held, preq, ctx, quota,
                                       event_nodes=self.config.event_nodes if self.events else 0,
                                       pod_name=name, avoid=avoid)
            if dec.node is not None and not simulate:
                encoded = encode_pod_devices(dec.fit.containers)  # Picked has ContainerDevice's fields
                mig = mig_allocations_value(dec.fit.containers)
                vtime = str(int(time.time()))
                self.cache.assume(uid, PodUsage(uid=uid, namespace=ns, name=name, node=dec.node,
                                                devices=collapse(dec.fit.containers, preq.n_init),
                                                mig=preq.mig,
                                                mig_alloc=mig_reservations(dec.fit.containers), **rec),
                                  (dec.node, encoded, vtime))
                self.holds.reserved(uid, dec.node)  # its own hold ends: the assumption counts the devices now
            elif not simulate:
                self.cache.restore(uid, prev)
        if dec.node is None and not simulate and not confirmed:
            # the cache may be behind the API (kube-scheduler saw a pod go and retried at once): the few pods
            # in the way are read back; or the informer removed a preemptor's last victim since the decision
            # (``refused`` would take the hold for taken and preempt again). Either way: decide once more.
            freed = self.gone_check.release(fa.names, preq, ctx, uid) if self.gone_check is not None else []
            for node in freed if self.requeue is not None else ():  # parked pods may want what freed
                self.requeue.freed(node)
            if freed or (self.preemption is not None and self.preemption.victims_gone(uid)):
                return self._decide(fa, pod, preq, ctx, confirmed=True, behind=behind)
        if dec.node is None and self.preemption is not None and not simulate and self.client is not None:
            dec.failed = self.preemption.refused(pod, uid, fa.names, preq, ctx, rec, dec.failed)
        if dec.node is None:
            self._count("filter", "unschedulable")
            if self.metrics is not None and not simulate:
                self.metrics.count_node_failures(dec.failed)
            if self.requeue is not None and not simulate:
                self.requeue.refused()
            logger.info("pod %s/%s: no node fits: %d nodes do not meet", ns, name, len(dec.failed))
            if self.events and not simulate:  # HAMi's simulation records no events (recordEvents false)
                for msg in ev.filtering_failed_messages(dec.failed):
                    self.events.emit(pod, ev.WARNING, ev.FILTERING_FAILED, msg)
            if not simulate:
                self.decisions.drop(uid)
                self._clear_stale_assignment(pod, ns, name)
            return self._result(failed=dec.failed)
        if log.enabled(logger, 2):
            self.cache.complete(dec)  # debug logging may pay for the counts on the request path
            log.v(logger, 2, "pod %s/%s: schedule to node %s (score %.2f, %d nodes fit, policy %s/%s)",
                  ns, name, dec.node, self.cache.nodes[dec.node].score if dec.node in self.cache.nodes else 0,
                  dec.n_fit, ctx.node_policy, ",".join(ctx.gpu_policy))
        if simulate:
            items = [n for n in (fa.nodes.get("items") or [])
                     if (n.get("metadata") or {}).get("name") == dec.node]
            return self._result(nodes_obj={"kind": "NodeList", "apiVersion": "v1", "items": items})
        n_names = len(fa.names)

        def commit() -> str:
            """Write the assignment; then count and announce the outcome. "" or the error."""
            err = self._write_assignment(pod, uid, dec.node, encoded, vtime, mig) if self.client else ""
            if err:
                self._count("filter", "error")
                return err
            self._count("filter", "scheduled")
            if self.events:
                def message() -> str:  # counts completed on the event thread (cache.complete)
                    d = self.cache.complete(dec)
                    return ev.filtering_succeed_message(d.node or "", n_names - d.n_fit, d.n_fit,
                                                        d.fit_nodes, d.scores)

                self.events.emit(pod, ev.NORMAL, ev.FILTERING_SUCCEED, message if dec.pending else message())
            return ""

        # a leader past its fence writes inline, so its refusal (and the rollback) is the answer; a full
        # pool too (back-pressure)
        self.busy.claim(dec.node, uid)  # before the write starts: a failed write settles it
        running = self.writer.submit(commit) if (
            behind and self.client is not None and self.gate.lease_valid()) else None
        if running is not None:
            # recorded before the answer, so the pod's /bind (which comes after it) finds the write
            self.decisions.put(FilterDecision(uid, ns, name, dec.node, encoded, vtime, running))
            running.add_done_callback(lambda f: self._written(uid, f))
            return self._result(names=[dec.node])
        err = commit()
        if err:
            self.busy.settle(uid)
            return self._result(error=err)
        self.decisions.put(FilterDecision(uid, ns, name, dec.node, encoded, vtime))
        return self._result(names=[dec.node])

    def _written(self, uid: str, write: Future) -> None:
        """A write-behind ended; after a failure no admission follows on its node."""
        exc = write.exception()
        if exc is not None:
            logger.error("assignment write of pod uid %s failed: %r", uid, exc)
        if exc is not None or write.result():
            self.busy.settle(uid)

    def _write_assignment(self, pod: dict, uid: str, node: str, encoded: str, vtime: str,
                          mig: str = "") -> str:
        """Patch the pod's assignment (conditional on the resourceVersion it was read at). "" on success
        (or when a lost answer is read back as applied), else the error for kube-scheduler. A decision
        without MIG reservations removes a stale ``hami.io/vgpu-mig-allocations`` (HAMi leaves it, and
        its placements would stay reserved)."""
        md = pod.get("metadata") or {}
        ns, name, rv = md.get("namespace") or "default", md.get("name"), str(md.get("resourceVersion") or "")
        ann: dict[str, str | None] = {keys.VGPU_NODE: node, keys.VGPU_TIME: vtime,
                                      keys.DEVICES_TO_ALLOCATE: encoded, keys.DEVICES_ALLOCATED: encoded}
        if mig or keys.MIG_ALLOCATIONS in annotations(pod):
            ann[keys.MIG_ALLOCATIONS] = mig or None
        if keys.PREEMPTION_HOLD in annotations(pod):
            ann[keys.PREEMPTION_HOLD] = None  # the assignment ends a preemptor's hold
        try:
            self.gate.check("pod annotations")
            self.pods.note_written(self.wclient.patch_pod_metadata(  # the pod's /bind reads the answer
                ns, name, annotations=ann, labels={keys.VGPU_NODE: vgpu_node_label(node)},
                resource_version=rv or None))
            return ""
        except NotLeader as exc:  # nothing was sent
            why: Exception = exc
            ambiguous = False
        except KubeError as exc:
            why = exc
            ambiguous = not definitive(exc)
        outcome = self.reconciler.after_write(uid, ns, name, rv, (node, encoded, vtime), ambiguous)
        if outcome == APPLIED:
            return ""
        logger.error("patch pod %s/%s annotations failed: %s (%s)", ns, name, why, outcome)
        if outcome == NOT_APPLIED:
            return f"patch pod error: {why}"
        return (f"patch pod error: {why}; its outcome is not known yet, so the devices stay reserved until "
                "the API answers")

    def _clear_stale_assignment(self, pod: dict, ns: str, name: str) -> None:
        """A pending pod retried after a failed bind still carries its old assignment, which no node
        holds for it any more: remove it, conditional on the resourceVersion it was read at (HAMi keeps
        it, so its next informer update re-counts the old assignment: accounting drift). The pod is
        pending for our scheduler here (``podstate``): a bound pod's annotations are never touched. The
        cache keeps counting the old assignment until the informer shows it gone."""
        ann = annotations(pod)
        if self.client is None or signature(pod) is None:
            return
        md = pod.get("metadata") or {}
        stale = {k: None for k in STALE_KEYS if k in ann}
        try:
            self.gate.check("pod annotations")
            self.wclient.patch_pod_metadata(ns, name, annotations=stale, labels={keys.VGPU_NODE: None},
                                            resource_version=str(md.get("resourceVersion") or "") or None)
            log.v(logger, 3, "pod %s/%s: cleared its stale assignment to node %s", ns, name,
                  ann[keys.VGPU_NODE])
        except (NotLeader, KubeError) as exc:  # the old assignment stays counted: safe either way
            logger.warning("pod %s/%s: clearing stale assignment failed: %s", ns, name, exc)

    @staticmethod
    def _result(names: list[str] | None = None, nodes_obj: dict | None = None,
                failed: dict[str, str] | None = None, error: str = "") -> dict:
        """ExtenderFilterResult as Go marshals it (no json tags: Go field names)."""
        if nodes_obj is not None:
            names = None
        return {"Nodes": nodes_obj, "NodeNames": names, "FailedNodes": failed or None,
                "FailedAndUnresolvableNodes": None, "Error": error}

    # ------------------------------------------------------------------------------------- bind
    def bind(self, args: dict) -> dict:
        """/bind, answered when done (a bind waiting for its node lock is waited for here)."""
        out = self.bind_async(args)
        if isinstance(out, Future):
            # a waiting bind resolves within the waiter's deadline plus the bind's own API calls
            # (plus the assignment write it may wait for: a write and a read-back of two attempts)
            return out.result(timeout=self.config.bind_lock_wait_s + 7 * self.config.api_timeout_s + 5)
        return out

    def bind_async(self, args: dict) -> dict | Future:
        """/bind for the HTTP server: a ``Future`` while the bind waits for its node lock."""
        b = parse_bind_args(args)
        if not self.gate.is_leader():
            self._count("bind", "forwarded")
            return self.gate.forward("bind", args, lambda e: {"Error": e})
        if not self.gate.wait_ready(self.config.sync_timeout_s):
            return {"Error": "this extender just became leader and is still reading the cluster's "
                             "allocations: kube-scheduler will retry"}
        rec = self.decisions.get(b.uid)
        if rec is not None and rec.written is not None and not rec.written.done():
            # its /filter's assignment write is still running (write-behind): bind when it ends (the write
            # is bounded by its API timeout and read-back, so no extra deadline is needed here)
            out: Future = Future()

            def resume(_f: Future) -> None:
                try:
                    res = self._bind_written(b)
                except Exception as exc:  # noqa: BLE001 - handed to the HTTP server as a 500 with an error id
                    out.set_exception(exc)
                    return
                if isinstance(res, Future):
                    res.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception()
                                          else out.set_result(f.result()))
                else:
                    out.set_result(res)

            rec.written.add_done_callback(resume)
            return out
        return self._bind_written(b)

    def _bind_written(self, b: Any) -> dict | Future:
        rec = self.decisions.get(b.uid)
        err = rec.write_error() if rec is not None and rec.node == b.node else ""
        if err:  # a FilteringFailed-like outcome surfacing at /bind: BindingFailed event, nothing written
            self.decisions.drop(b.uid)
            self.busy.settle(b.uid)
            return self.binder.fail(b, None, f"its assignment to node {b.node} was not written ({err}); "
                                     "nothing bound, kube-scheduler will schedule it again")
        out = self.binder.bind(b)
        if isinstance(out, Future):
            out.add_done_callback(lambda _f: self.busy.settle(b.uid))
        else:
            self.busy.settle(b.uid)
        return out

    def _quota_budget(self, ns: str, held: dict | None = None) -> QuotaBudget | None:
        return self._budget(ns, self._quota_limits(ns), held)  # held: the holds that use the quota too

    @staticmethod
    def _given_nodes(nodes: dict) -> list[tuple[str, list | None, Any, dict[str, int]]]:
        """The Node objects of a ``Nodes`` /filter, parsed as the node informer parses them."""
        out = []
        for n in nodes.get("items") or []:
            name = (n.get("metadata") or {}).get("name")
            if not isinstance(name, str) or not name:
                continue
            devs = node_devices(n)
            out.append((name, devs, node_extras(n), mig_capacity(devs or [])))
        return out

    def _budget(self, ns: str, limits: tuple[int | None, int | None] | None,
                held: dict | None = None) -> QuotaBudget | None:
        if limits is None:
            return None
        mem_limit, cores_limit = limits
        factor = max(1, int(getattr(self.config.names, "memory_factor", 1) or 1))
        if mem_limit is not None and factor > 1:
            # HAMi's FitQuota (pkg/device/quota.go): usage is in scaled MiB (gpumem x memoryFactor),
            # the ResourceQuota in the pod's units, so the limit is scaled the same way
            mem_limit *= factor
        used_mem, used_cores = self.cache.namespace_usage(ns)
        used_mem, used_cores = holds_mod.add_namespace_usage(held or {}, ns, used_mem, used_cores)
        return QuotaBudget(None if mem_limit is None else mem_limit - used_mem,
                           None if cores_limit is None else cores_limit - used_cores)

    def _quota_limits(self, ns: str) -> tuple[int | None, int | None] | None:
        if self.client is None or not hasattr(self.client, "list_resource_quotas"):
            return None
        now = time.monotonic()
        hit = self._quota.get(ns)
        if hit is not None and now - hit[0] < self.config.quota_ttl_s:
            return hit[1]
        mem_key = "limits." + self.config.names.resource_memory_name
        core_key = "limits." + self.config.names.resource_core_name
        value: tuple[int | None, int | None] | None = None
        try:
            mem = cores = None
            for q in self.client.list_resource_quotas(ns):
                hard = (q.get("spec") or {}).get("hard") or {}
                if mem_key in hard:
                    v = quantity_int(hard[mem_key], f"resourcequota {mem_key}")
                    mem = v if mem is None else min(mem, v)
                if core_key in hard:
                    v = quantity_int(hard[core_key], f"resourcequota {core_key}")
                    cores = v if cores is None else min(cores, v)
            if mem is not None or cores is not None:
                value = (mem, cores)
        except Exception as exc:  # quota is advisory here; the API server enforces it anyway
            log.v(logger, 3, "list resourcequotas in %s failed: %s", ns, exc)
        self._quota[ns] = (now, value)
        return value

    def _count(self, verb: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.requests.labels(verb, result).inc()

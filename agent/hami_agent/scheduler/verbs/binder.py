"""/bind (Project-HAMi/HAMi ``pkg/scheduler/scheduler.go`` ``Bind``): bind only what this extender decided,
keep the node lock exactly as long as the pod may still need it, and never guess the outcome of a binding.

* The request names the pod (namespace, name, uid) and a node. It is bound only if this extender's
  own /filter decided that node for that uid (``DecisionLog``), the pod is still pending for our
  scheduler (from the pending-pod informer when its copy already shows the decision, else read from
  the API; never from the request), and its annotations still carry that decision. Anything else is
  refused with the reason and nothing is written. The ``bind-phase`` write is conditional on the
  checked copy's resourceVersion: a copy older than the API meets a 409, and the pod is checked once
  more as the API has it before the bind goes on or fails (the lock released at once).
* Node lock → ``bind-phase=allocating`` (conditional on the pod's resourceVersion) → ``pods/binding``
  (with the uid as precondition); the leader's fence is checked before each write.
* A binding whose answer is lost (timeout, reset, 5xx) is read back: bound to our node → success, and
  the lock stays until the device plugin's Allocate releases it; bound elsewhere or gone → failure and
  the lock is released; still pending → the same binding is sent once more (the API refuses a second
  binding of a bound pod, so this cannot bind twice). If the truth is still unknown, the pod is marked
  *in doubt* (its /filter is refused meanwhile, so no second decision can race the first) and the
  ``Healer`` resolves it in the background; the lock is kept until the pod is provably not bound.
* A lock release that fails (409/5xx/timeout) is retried in the background until it succeeds or the
  lock is no longer this pod's — a lock is only ever released while the pod provably does not need it.
* A node locked by another pod that is still being allocated does not fail the bind at once: with a
  ``waiter`` (``lockwait.NodeLockWaiter``) the bind parks until the node watch shows the lock released
  (FIFO per node, bounded in number and time), then runs with the pod read afresh; the answer is a
  ``Future`` resolved then (no thread waits). Without one, or when it is full or the wait times out:
  HAMi's ``node lock contention`` error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from hami_agent import log
from hami_agent.k8s.errors import ConflictError, KubeError, NotFoundError
from hami_agent.k8s.nodelock import (
    CONTENTION,
    NodeLockError,
    WatchedPod,
    lock_node,
    owner_done,
    release_node_lock,
)
from hami_agent.protocol import ProtocolError, keys
from hami_agent.protocol.nodelock import parse_lock_value
from hami_agent.scheduler.core.requests import RequestError, pod_request
from hami_agent.scheduler.state.decisions import DecisionLog, FilterDecision
from hami_agent.scheduler.state.heal import Healer
from hami_agent.scheduler.state.podinfo import annotations
from hami_agent.scheduler.state.podstate import PodRefused, PodStates, pod_uid, refusal
from hami_agent.scheduler.verbs import events as ev
from hami_agent.scheduler.verbs.args import BindArgs
from hami_agent.scheduler.verbs.leadership import LeaderGate, NotLeader

logger = logging.getLogger(__name__)

GONE = "\x00gone"  # _bound_where: the pod (with this uid) no longer exists


def definitive(e: KubeError) -> bool:
    """True when the API server certainly did not apply the request (a 4xx, or it was never sent)."""
    if isinstance(e, (ConflictError, NotFoundError)) or 400 <= e.status < 500 or e.status == 503:
        return True  # a 4xx was refused; a 503 (and 429) is answered before the request is processed
    return e.status == 0 and e.reason in ("connection refused", "connect timeout")


def _rv(pod: dict) -> str:
    return str((pod.get("metadata") or {}).get("resourceVersion") or "")


def _carries(pod: dict, rec: FilterDecision) -> bool:
    """The pod's assignment annotations are still ``rec``, this extender's decision."""
    ann = annotations(pod)
    return ann.get(keys.VGPU_NODE) == rec.node and ann.get(keys.DEVICES_TO_ALLOCATE) == rec.devices


def _copy(src: Future, dst: Future) -> None:
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


class Binder:
    def __init__(self, *, wclient: Any, rclient: Any, pods: PodStates, gate: LeaderGate, healer: Healer,
                 decisions: DecisionLog, config: Any, events: Any = None, count: Any = None) -> None:
        self.wclient = wclient
        self.rclient = rclient
        self.pods = pods
        self.gate = gate
        self.healer = healer
        self.decisions = decisions
        self.config = config
        self.events = events
        self._count = count or (lambda _v, _r: None)
        self.waiter: Any = None  # lockwait.NodeLockWaiter: park binds that meet a busy lock
        # the node as the node watch shows it (name -> Node or None): the lock's first attempt skips a GET
        self.watched_node: Callable[[str], dict | None] | None = None
        # a pod as the pod watch shows it ((namespace, name) -> Pod or None): a lock's owner that still
        # needs it is judged without a GET (k8s/nodelock.py lock_node)
        self.watched_pod: WatchedPod | None = None
        self.on_bound: Callable[[BindArgs], object] | None = None  # a binding done (preemption's wait metric)
        # {node: lock value} of a pod's locks as the node watch shows them (state/nodelocks.py owned_by)
        self.locks_of: Callable[[str, str], dict[str, str]] | None = None
        self._lock = threading.Lock()
        self._active: set[str] = set()  # uids with a /bind in progress
        self._lock_waits: dict[str, tuple[float, int]] = {}  # uid -> (its wait's deadline, waits so far)
        # uid -> (node, when the node lock expires) of a binding whose outcome is unknown: resolved by a
        # repair task, or forgotten at that deadline (the repair queue may be full: a pod must not stay
        # refused for good, and the lock expiry frees the node anyway)
        self._in_doubt: dict[str, tuple[str, float]] = {}

    def in_doubt(self, uid: str) -> bool:
        with self._lock:
            return self._doubted(uid)

    def _doubted(self, uid: str) -> bool:
        """``uid``'s binding outcome is unknown and its node lock has not expired (caller holds the lock)."""
        entry = self._in_doubt.get(uid)
        if entry is None:
            return False
        if time.monotonic() > entry[1]:
            del self._in_doubt[uid]
            return False
        return True

    # --------------------------------------------------------------------------------- /bind
    def bind(self, b: BindArgs) -> dict | Future:
        """Bind ``b``: the answer, or a ``Future`` of it when the bind waits for the node lock."""
        if self.wclient is None:
            return {"Error": "no API client configured"}
        checked = self._checked(b, fresh=False)
        if isinstance(checked, dict):
            return checked
        pod, rec = checked
        if rec is None:  # no GPU: nothing to lock or check against a decision (kube-scheduler chose)
            return self._finish_binding(b, pod, None)
        with self._lock:
            if self._doubted(b.uid):
                return self._refuse(b, "an earlier binding of this pod is still being resolved")
            if b.uid in self._active:
                return self._refuse(b, "a bind of this pod is already in progress")
            self._active.add(b.uid)
        out: dict | Future = {"Error": "bind did not finish"}
        try:
            out = self._bind_gpu_pod(b, pod, rec)
            return out
        finally:
            if isinstance(out, Future):
                out.add_done_callback(lambda _f: self._inactive(b.uid))
            else:
                self._inactive(b.uid)

    def _inactive(self, uid: str) -> None:
        with self._lock:
            self._active.discard(uid)
            self._lock_waits.pop(uid, None)
        self.pods.forget_written(uid)  # bound or refused: kube-scheduler's next /bind comes after a /filter

    def _checked(self, b: BindArgs, fresh: bool) -> dict | tuple[dict, FilterDecision | None]:
        """The pod and this extender's decision for it, or the refusal to answer. ``fresh=False``: the
        pending-pod informer's copy when it already carries this extender's decision (the
        ``bind-phase`` write that follows is conditional on that copy's resourceVersion, so a copy older
        than the API fails that write, it never binds on stale state); otherwise, and for a pod without
        a device request, the pod is read from the API. What the copy refuses on (bound, terminating)
        never reverts, so a refusal from it stands."""
        try:
            pod = self.pods.schedulable(b.namespace, b.name, b.uid, fresh=fresh)
            preq = pod_request(pod, self.config.names)
        except (PodRefused, RequestError) as exc:
            return self._refuse(b, str(exc))
        except KubeError as exc:
            return self.fail(b, None, f"cannot read the pod: {exc}")
        if preq.empty:
            return self._checked(b, fresh=True) if not fresh else (pod, None)
        rec = self.decisions.get(b.uid)
        if rec is None:
            return self._refuse(b, "has no /filter decision of this extender (never filtered here, the "
                                   "decision expired, or it was made by a previous leader): kube-scheduler "
                                   "will filter it again")
        if rec.node != b.node:
            return self._refuse(b, f"this extender decided node {rec.node} for it, not {b.node}")
        if not _carries(pod, rec):
            if not fresh:  # the watch has not shown the assignment write yet: its answer, else the API
                written = self.pods.written(b.namespace, b.name, b.uid)
                if written is not None and _carries(written, rec):
                    return written, rec
                return self._checked(b, fresh=True)
            return self._refuse(b, f"its {keys.VGPU_NODE}/{keys.DEVICES_TO_ALLOCATE} annotations are not "
                                   "this extender's decision any more: kube-scheduler will filter it again")
        return pod, rec

    def _bind_gpu_pod(self, b: BindArgs, pod: dict, rec: FilterDecision) -> dict | Future:
        try:
            self.gate.check("the node lock")
            with self._lock:  # a bind's first attempt may judge a busy lock from the watches (no GET)
                first = self.waiter is not None and b.uid not in self._lock_waits
            value = lock_node(self.wclient, b.node, b.namespace, b.name,
                              expiry_s=self.config.node_lock_timeout_s,
                              cached=self.watched_node(b.node) if self.watched_node else None,
                              watched_pod=self.watched_pod, judge_cached_lock=first)
        except NodeLockError as exc:  # nothing written, or the lock is someone else's
            if self.waiter is not None and exc.holder and CONTENTION in str(exc):
                return self._wait_for_lock(b, exc)
            return self.fail(b, pod, str(exc))
        except NotLeader as exc:
            return self.fail(b, pod, str(exc))
        except KubeError as exc:  # the lock write may have been applied: release it if it is ours
            self._release_later(b)
            return self.fail(b, pod, f"node lock: {exc}")
        for attempt in (1, 2):
            try:
                self.gate.check(f"{keys.BIND_PHASE}")
                self.wclient.patch_pod_metadata(b.namespace, b.name, annotations={
                    keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING, keys.BIND_TIME: str(int(time.time()))},
                    resource_version=_rv(pod), decode=False)
                return self._finish_binding(b, pod, value)
            except ConflictError as exc:  # the pod changed since the copy we checked: check it afresh once
                why = f"patch pod {keys.BIND_PHASE}: {exc}"
                if attempt == 1:
                    current, changed = self._still_decided(b, rec)
                    if current is not None:
                        pod = current
                        continue
                    why += f"; read afresh, the pod {changed}"
                self.release(b, value)
                return self.fail(b, pod, why)
            except (NotLeader, KubeError) as exc:  # no binding was sent: the pod cannot need the lock
                self.release(b, value)
                return self.fail(b, pod, f"patch pod {keys.BIND_PHASE}: {exc}")
        raise AssertionError("unreachable")

    def _still_decided(self, b: BindArgs, rec: FilterDecision) -> tuple[dict | None, str]:
        """The pod read from the API when it is still pending for us and still carries ``rec``
        (None and why not otherwise)."""
        try:
            pod = self.pods.schedulable(b.namespace, b.name, b.uid, fresh=True)
        except (PodRefused, KubeError) as exc:
            return None, str(exc)
        if not _carries(pod, rec):
            return None, f"no longer carries this extender's decision in {keys.DEVICES_TO_ALLOCATE}"
        return pod, ""

    def _wait_for_lock(self, b: BindArgs, busy: NodeLockError) -> dict | Future:
        """Park the bind until the node's lock is released (``lockwait``); the Future resolves then."""
        fut: Future = Future()
        with self._lock:  # one deadline per bind, however often it meets the lock again
            deadline, attempt = self._lock_waits.get(b.uid) or (self.waiter.now() + self.waiter.wait_s, 0)
            self._lock_waits[b.uid] = (deadline, attempt + 1)
        log.v(logger, 4, "bind pod %s/%s: node %s is locked by %s; waiting for its release (wait %d)",
              b.namespace, b.name, b.node, busy.holder, attempt + 1)

        def resume(timed_out: bool) -> None:
            try:
                if timed_out:
                    out: dict | Future = self.fail(b, None, str(busy))
                else:
                    # the pod may have changed while it waited: the watch's copy has seen it change, and the
                    # bind-phase write is conditional on that copy's resourceVersion (a stale one: 409, and
                    # the pod is read afresh), as on the first attempt
                    checked = self._checked(b, fresh=False)
                    out = checked if isinstance(checked, dict) else self._bind_gpu_pod(b, *checked)
            except BaseException as exc:  # a bug: answer an error (the server logs it), never hang
                fut.set_exception(exc)
                self.waiter.done(b.node)
                return
            if isinstance(out, Future):  # met the lock again (someone else took it first): chain
                out.add_done_callback(lambda f: _copy(f, fut))
                return
            if out.get("Error"):
                self.waiter.done(b.node)  # the lock stays free: the next waiter may try
            fut.set_result(out)

        if not self.waiter.wait(b.node, self.waiter.lock_of(b.node), resume, deadline, attempt,
                                recheck=busy.from_watch):
            return self.fail(b, None, f"{busy} (and too many binds are already waiting)")
        return fut

    def _finish_binding(self, b: BindArgs, pod: dict, lock_value: str | None) -> dict:
        """POST pods/binding; resolve a lost answer by reading back (and sending again once)."""
        for attempt in (1, 2):
            try:
                self.gate.check("pods/binding")
                self.wclient.bind_pod(b.namespace, b.name, b.node, uid=b.uid)
                return self._bound(b, pod)
            except NotLeader as exc:
                self._unbound(b, lock_value)
                return self.fail(b, pod, str(exc))
            except KubeError as exc:
                err = exc
            try:
                where = self._bound_where(b)
            except KubeError as read_exc:
                logger.warning("pod %s/%s: binding failed (%s) and reading it back failed (%s)", b.namespace,
                               b.name, err, read_exc)
                where = None
            if where == b.node:
                logger.warning("pod %s/%s: the binding answer was lost (%s) but the pod is bound to %s",
                               b.namespace, b.name, err.summary, b.node)
                return self._bound(b, pod)
            if where is not None and where != "":  # bound elsewhere, or gone: provably not on our node
                self._unbound(b, lock_value)
                return self.fail(b, pod, str(err))
            if where == "" and definitive(err):
                self._unbound(b, lock_value)
                return self.fail(b, pod, str(err))
            if where is None or attempt == 2:
                break  # unknown: resolve in the background
            logger.warning("pod %s/%s: binding answer lost (%s) and the pod is not bound yet: sending the "
                           "binding again", b.namespace, b.name, err.summary)
        self._mark_in_doubt(b, lock_value)
        return self.fail(b, pod, f"the binding's outcome is unknown ({err.summary}); the node lock is "
                                  "kept until it is resolved in the background")

    def _bound_where(self, b: BindArgs) -> str:
        """Node the pod is bound to ("" when pending), or GONE when it (with this uid) no longer exists.
        Raises ``KubeError`` when the API cannot be read."""
        try:
            pod = self.rclient.get_pod(b.namespace, b.name)
        except NotFoundError:
            return GONE
        if pod_uid(pod) != b.uid:
            return GONE
        return (pod.get("spec") or {}).get("nodeName") or ""

    def _bound(self, b: BindArgs, pod: dict) -> dict:
        self.decisions.drop(b.uid)
        self._count("bind", "ok")
        self._announce(b)
        self._release_elsewhere(b)
        logger.info("pod %s/%s bound to node %s", b.namespace, b.name, b.node)
        if self.events:
            self.events.emit(pod, ev.NORMAL, ev.BINDING_SUCCEED,
                             ev.binding_succeed_message(b.node, b.namespace, b.name))
        return {"Error": ""}

    def _announce(self, b: BindArgs) -> None:
        if self.on_bound is not None:
            self.on_bound(b)

    def _refuse(self, b: BindArgs, why: str) -> dict:
        msg = f"pod {b.namespace}/{b.name} (uid {b.uid}) {why}; not bound, nothing written"
        logger.warning("bind refused: %s", msg)
        self._count("bind", "refused")
        return {"Error": msg}

    def fail(self, b: BindArgs, pod: dict | None, msg: str) -> dict:
        logger.error("bind pod %s/%s to node %s failed: %s", b.namespace, b.name, b.node, msg)
        self._count("bind", "error")
        if self.events:
            self.events.emit(pod or {"metadata": {"namespace": b.namespace, "name": b.name, "uid": b.uid}},
                             ev.WARNING, ev.BINDING_FAILED, msg)
        return {"Error": msg}

    # ------------------------------------------------------------------------- lock healing
    def _unbound(self, b: BindArgs, lock_value: str | None) -> None:
        """The pod is provably not bound to ``b.node``: its lock (if we took one) must go."""
        if lock_value is not None:
            self.release(b, lock_value)

    def release(self, b: BindArgs, lock_value: str | None) -> None:
        """Release this pod's lock now; if that fails, keep retrying in the background."""
        try:
            self.gate.check("the node lock release")
            release_node_lock(self.wclient, b.node, b.namespace, b.name, expected=lock_value)
        except NodeLockError as exc:  # held by another pod: not ours to release
            logger.info("node lock of %s: %s", b.node, exc)
        except (NotLeader, KubeError) as exc:
            logger.error("release node lock of %s after a failed bind: %s; retrying in the background",
                         b.node, exc)
            self._release_later(b, lock_value)

    def _release_later(self, b: BindArgs, lock_value: str | None = None) -> None:
        give_up_at = time.monotonic() + self.config.node_lock_timeout_s  # the lock has expired by then

        def task() -> float | None:
            if time.monotonic() > give_up_at:
                logger.error("node lock of %s for pod %s/%s: giving up the release; it has expired",
                             b.node, b.namespace, b.name)
                return None
            if not self.gate.lease_valid():
                return 2.0  # only the leader writes; the lock expiry is the backstop
            with self._lock:
                if b.uid in self._active or self._doubted(b.uid):
                    return 1.0  # a new bind of this pod may rely on this lock
            try:
                where = self._bound_where(b)
                if where == b.node:
                    ann_phase = annotations(self.rclient.get_pod(b.namespace, b.name)).get(keys.BIND_PHASE)
                    if ann_phase not in (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED):
                        return None  # bound here and not yet allocated: Allocate releases it
                release_node_lock(self.wclient, b.node, b.namespace, b.name, expected=lock_value)
                logger.info("node lock of %s for pod %s/%s released (background)", b.node, b.namespace,
                            b.name)
            except NodeLockError:
                pass  # the lock is no longer this pod's
            return None

        self.healer.submit(f"release:{b.node}:{b.namespace}/{b.name}", task, delay_s=0.2,
                           deadline_s=self.config.node_lock_timeout_s + 60)

    def _release_elsewhere(self, b: BindArgs) -> None:
        """The pod is bound to ``b.node``: a lock it holds on any other node is stale. E.g. a leader took
        one and died before binding; its successor filtered the pod again and bound it here. Released in
        the background (the audit would find it only at its next round, up to --audit-interval later; the
        node counts as busy for /filter meanwhile)."""
        if self.locks_of is None:
            return
        for node, value in self.locks_of(b.namespace, b.name).items():
            if node != b.node:
                logger.info("pod %s/%s is bound to %s: releasing its lock on node %s (%s)", b.namespace,
                            b.name, b.node, node, value)
                self._release_later(BindArgs(b.namespace, b.name, b.uid, node), value)

    def audit_locks(self, nodes: list[dict]) -> int:
        """Release node locks whose owner provably no longer needs them (gone, finished, bound to another
        node, already allocated: ``nodelock.owner_done``) — e.g. a lock a previous leader could not
        release before it died. Locks of pending owners are left alone (they may be mid-bind); expired
        ones are taken over by the next bind anyway. Returns how many were released."""
        released = 0
        for node in nodes:
            md = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
            raw = (md.get("annotations") or {}).get(keys.NODE_LOCK)
            if not raw or not self.gate.lease_valid():
                continue
            try:
                held = parse_lock_value(raw)
                if not held.has_owner:
                    continue
                why = owner_done(self.rclient, held.namespace, held.name, md.get("name", ""))
                if why and release_node_lock(self.wclient, md["name"], held.namespace, held.name,
                                             expected=raw):
                    released += 1
                    logger.info("node lock of %s released: %s/%s no longer needs it (%s)", md["name"],
                                held.namespace, held.name, why)
            except (ProtocolError, NodeLockError, KubeError) as exc:
                log.v(logger, 3, "lock audit of node %s: %s", md.get("name"), exc)
        return released

    # --------------------------------------------------------------------- in-doubt bindings
    def _mark_in_doubt(self, b: BindArgs, lock_value: str | None) -> None:
        give_up_at = time.monotonic() + self.config.node_lock_timeout_s
        with self._lock:
            for uid in list(self._in_doubt):
                self._doubted(uid)  # drops the expired ones (their repair was never queued)
            self._in_doubt[b.uid] = (b.node, give_up_at)

        def done() -> None:
            with self._lock:
                self._in_doubt.pop(b.uid, None)

        def task() -> float | None:
            if time.monotonic() > give_up_at:
                logger.error("pod %s/%s: binding outcome still unknown after %.0fs; the node lock expires",
                             b.namespace, b.name, self.config.node_lock_timeout_s)
                done()
                return None
            if not self.gate.lease_valid():
                return 2.0
            try:  # KubeError: the Healer retries with backoff
                pod = self.rclient.get_pod(b.namespace, b.name)
            except NotFoundError:
                pod = None
            where = GONE if pod is None or pod_uid(pod) != b.uid else (pod.get("spec") or {}).get("nodeName")
            if where == b.node:
                logger.info("pod %s/%s: in-doubt binding resolved: bound to %s (lock kept for Allocate)",
                            b.namespace, b.name, b.node)
                self._announce(b)
                done()
                return None
            why = f"bound to {where}" if where and where != GONE else "gone" if where else (
                refusal(pod, self.pods.scheduler_name) if pod is not None else "")
            if why:  # provably never going to be bound to our node
                logger.info("pod %s/%s: in-doubt binding resolved: not bound (%s)", b.namespace, b.name, why)
                done()
                self.release(b, lock_value)
                return None
            try:
                self.gate.check("pods/binding")
                self.wclient.bind_pod(b.namespace, b.name, b.node, uid=b.uid)
                logger.info("pod %s/%s: in-doubt binding completed: bound to %s", b.namespace, b.name, b.node)
                self._announce(b)
                done()
                return None
            except NotLeader:
                return 2.0
            except KubeError as exc:
                return 0.2 if definitive(exc) else 1.0  # next try reads the truth back

        self.healer.submit(f"bind:{b.uid}", task, delay_s=0.5,
                           deadline_s=self.config.node_lock_timeout_s + 60)

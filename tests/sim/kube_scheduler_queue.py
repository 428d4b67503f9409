"""SIMULATED kube-scheduler scheduling queue: activeQ, backoffQ and the unschedulable pod pool, with the
rules that decide when a pod an extender refused is tried again.

Modelled on kubernetes ``pkg/scheduler/backend/queue/scheduling_queue.go`` and ``backoff_queue.go``
(``PriorityQueue``), ``pkg/scheduler/schedule_one.go`` and ``pkg/scheduler/eventhandlers.go``:

* a new pending pod goes to **activeQ**; the scheduling cycle pops one pod at a time, the one of highest
  priority first (``spec.priority``, 0 when unset), then the one that entered the queue earliest
  (``queuesort/priority_sort.go`` ``Less``: priority, then ``QueuedPodInfo.Timestamp``);
* a pod that failed with an **error** (no plugin rejected it: an extender or API error, a failed bind)
  goes to **backoffQ** (``determineSchedulingHintForInFlightPod``: "No failed plugins are associated with
  this pod ... we should retry scheduling it");
* a pod that was **rejected** goes to the **unschedulable pool**, unless a cluster event it cares about
  arrived while it was being scheduled (``moveRequestCycle``) — then to backoffQ. When an extender
  filtered nodes out, kube-scheduler records the rejector as ``Extender``, and such a pod "will be
  requeued from unschedulable pod pool to activeQ/backoffQ by any kind of cluster events"
  (``findNodesThatFitPod`` in schedule_one.go, kubernetes issue #122019);
* backoff: ``initial × 2^(n-1)`` capped at ``max`` (1 s and 10 s by default), n = the pod's unschedulable
  attempts, or its consecutive errors; counted from the end of the last attempt; backoffQ is flushed into
  activeQ once a second (``flushBackoffQCompleted``);
* a pod stays in the unschedulable pool until a **cluster event** of interest moves it (to backoffQ while
  its backoff runs, else activeQ: ``MoveAllToActiveOrBackoffQueue``), until the pod itself is updated
  (``Update``: any change beyond status), or until it has been there longer than
  ``podMaxInUnschedulablePodsDuration`` (5 min; checked every 30 s: ``flushUnschedulablePodsLeftover``).

Cluster events (``eventhandlers.go``): a node added; a node update that changes ``spec.unschedulable``,
allocatable, labels, taints, conditions or annotations (``NodeSchedulingPropertiesChange``; annotations
since v1.28, kubernetes PR #118389); an assigned pod deleted — including one that turned Succeeded or
Failed, which leaves kube-scheduler's pod informer (it watches ``status.phase!=Succeeded,
status.phase!=Failed``); and, after a failed binding, the forgotten assumed pod (``handleBindingCycleError``
moves everything else). Updates of assigned pods move only pods with inter-pod affinity terms, which the
simulator does not model, so they move nothing here.

Plugins' interest: the ``Extender`` rejector is moved by every event above; ``NodeResourcesFit`` (the
extender-off mode's count check of extended resources) only by a node added, an allocatable change and an
assigned pod deleted.

A nominated pod's nomination changing or the pod going (``eventhandlers.go`` ``updatePodInSchedulingQueue``
and ``deletePodFromSchedulingQueue``) raises ``AssignedPodDelete`` for the pods of lower or equal priority
only (``getLEPriorityPreCheck``): ``move_all(ASSIGNED_POD_DELETE, max_priority=...)``.

``SchedulerPopFromBackoffQ`` (KEP-5142; beta and on by default since v1.33): with ``pop_from_backoff_q``,
a scheduling cycle that finds activeQ empty takes the head of backoffQ even while that pod is still backing
off (``active_queue.go`` ``unlockedPop``), so an idle scheduler retries a rejected pod at once. Only pods a
plugin rejected are taken early; pods that failed with an error wait in their own heap
(``podErrorBackoffQ``) for their backoff as before. With the gate, backoff expiries are truncated to the
flush window (``alignToWindow``), a pod whose expiry falls in the current window still backs off
(``isPodBackingoff``), the backoff heap is ordered by expiry then as activeQ (priority, then age:
``lessBackoffCompletedWithPriority``), the flush runs on whole windows
(``waitUntilAlignedWithOrderingWindow``) and a pod moved into backoffQ wakes a waiting cycle. Off (the
default here, and kube-scheduler before v1.33 or with the gate off): a backed-off pod waits for its
backoff, the harsher behaviour.

Gaps: no PreEnqueue/scheduling gates (async preemption's gate included: the simulator's preemption runs
synchronously).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

EXTENDER = "Extender"  # kube-scheduler's framework.ExtenderName
NODE_RESOURCES_FIT = "NodeResourcesFit"
# NodeUnschedulable and TaintToleration: both wait for a node added or changed (cordon, taints, Ready)
NODE_UNSCHEDULABLE = "NodeUnschedulable"
ANY_EVENT = "*"

# cluster events the simulator raises (labels as kube-scheduler logs them)
NODE_ADD = "NodeAdd"
NODE_UPDATE = "NodeUpdate"  # any scheduling-property change; the detail is in the event's ``what``
NODE_ALLOCATABLE = "NodeAllocatableChange"
ASSIGNED_POD_DELETE = "AssignedPodDelete"
UNSCHEDULABLE_TIMEOUT = "UnschedulableTimeout"

# which events move a pod rejected by a plugin (EventsToRegister; the extender registers for everything)
PLUGIN_EVENTS: dict[str, frozenset[str]] = {
    EXTENDER: frozenset({ANY_EVENT}),
    NODE_RESOURCES_FIT: frozenset({NODE_ADD, NODE_ALLOCATABLE, ASSIGNED_POD_DELETE}),
    NODE_UNSCHEDULABLE: frozenset({NODE_ADD, NODE_UPDATE}),
}

ACTIVE, BACKOFF, UNSCHEDULABLE, IN_FLIGHT = "Active", "Backoff", "Unschedulable", "InFlight"


def pod_priority(pod: dict) -> int:
    """``corev1helpers.PodPriority``: ``spec.priority``, 0 when unset."""
    value = ((pod or {}).get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class QueuedPod:
    key: str
    pod: dict
    timestamp: float  # added, or when its last attempt ended
    attempts: int = 0
    unschedulable_count: int = 0
    consecutive_errors: int = 0
    plugins: frozenset[str] = frozenset()
    cycle: int = 0  # scheduling cycle of its current/last attempt
    moved_while_in_flight: bool = False
    where: str = ACTIVE
    history: list[tuple[float, str, str]] = field(default_factory=list)  # (time, queue, why)


def _interested(plugins: frozenset[str], event: str) -> bool:
    if not plugins:
        return True
    for p in plugins:
        events = PLUGIN_EVENTS.get(p, frozenset({ANY_EVENT}))
        if ANY_EVENT in events or event in events:
            return True
    return False


class SchedulingQueue:
    """Thread-safe. ``pop()`` blocks until a pod is active (or ``close()``)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 10.0, max_in_unschedulable_s: float = 300.0,
                 unschedulable_flush_s: float = 30.0, backoff_flush_s: float = 1.0,
                 pop_from_backoff_q: bool = False) -> None:
        self.clock = clock
        self.pop_from_backoff_q = pop_from_backoff_q  # SchedulerPopFromBackoffQ (module docstring)
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_in_unschedulable_s = max_in_unschedulable_s
        self.unschedulable_flush_s = unschedulable_flush_s
        self.backoff_flush_s = backoff_flush_s
        self._cond = threading.Condition()
        self._pods: dict[str, QueuedPod] = {}  # every pod the queue knows, wherever it is
        # activeQ: a heap by (-priority, timestamp, seq); ``_active`` maps a key to its live entry's seq
        self._active: dict[str, int] = {}
        self._aheap: list[tuple[int, float, int, str]] = []
        self._aseq = itertools.count()
        # backoffQ: pods a plugin rejected (podBackoffQ) and pods that failed with an error
        # (podErrorBackoffQ), each a heap by (expiry, -priority, timestamp, seq, key); ``_in_backoff`` maps a
        # key to its live entry's seq. Without the gate the order is expiry then arrival (priority 0).
        self._backoff: list[tuple[float, int, float, int, str]] = []
        self._error_backoff: list[tuple[float, int, float, int, str]] = []
        self._in_backoff: dict[str, int] = {}
        self._seq = 0
        self.cycle = 0
        self.move_request_cycle = -1
        self._closed = False
        self._threads: list[threading.Thread] = []
        self.moves: list[tuple[float, str, int]] = []  # (time, event, pods moved), bounded

    # ------------------------------------------------------------------------------ lifecycle
    def run(self) -> SchedulingQueue:
        for name, every, fn in (("backoff-flush", self.backoff_flush_s, self.flush_backoff_completed),
                                ("unschedulable-flush", self.unschedulable_flush_s,
                                 self.flush_unschedulable_leftover)):
            t = threading.Thread(target=self._every, args=(every, fn), name=f"queue-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _every(self, seconds: float, fn: Callable[[], None]) -> None:
        aligned = self.pop_from_backoff_q and fn == self.flush_backoff_completed
        while True:
            with self._cond:
                if self._closed:
                    return
                # with the gate, the backoff flush runs on whole windows (waitUntilAlignedWithOrderingWindow)
                wait = seconds - (self.clock() % seconds) if aligned else seconds
                self._cond.wait(wait)
                if self._closed:
                    return
            fn()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(5)

    # ------------------------------------------------------------------------------ helpers
    def backoff_s(self, qp: QueuedPod) -> float:
        n = qp.consecutive_errors if qp.consecutive_errors > 0 else qp.unschedulable_count
        if n <= 0:
            return 0.0
        return min(self.initial_backoff_s * (2 ** (n - 1)), self.max_backoff_s)

    def _align(self, t: float) -> float:
        """``alignToWindow``: with the gate, ``t`` truncated to the flush window; without it, ``t``."""
        return t - (t % self.backoff_flush_s) if self.pop_from_backoff_q else t

    def _expiry(self, qp: QueuedPod) -> float:
        return self._align(qp.timestamp + self.backoff_s(qp)) if self.backoff_s(qp) > 0 else 0.0

    def _backing_off(self, qp: QueuedPod, now: float) -> bool:
        if self.backoff_s(qp) <= 0:
            return False  # never tried (or no penalty): no backoff at all
        if self.pop_from_backoff_q:  # an expiry inside the current window still backs off
            return self._expiry(qp) >= self._align(now)
        return now < self._expiry(qp)

    def _to_active(self, qp: QueuedPod, why: str) -> None:
        qp.where = ACTIVE
        seq = next(self._aseq)
        self._active[qp.key] = seq
        heapq.heappush(self._aheap, (-pod_priority(qp.pod), qp.timestamp, seq, qp.key))
        qp.history.append((self.clock(), ACTIVE, why))
        self._cond.notify_all()

    def _to_backoff(self, qp: QueuedPod, why: str) -> None:
        qp.where = BACKOFF
        self._seq += 1
        self._in_backoff[qp.key] = self._seq
        prio = -pod_priority(qp.pod) if self.pop_from_backoff_q else 0
        ts = qp.timestamp if self.pop_from_backoff_q else 0.0
        heap = self._backoff if qp.plugins else self._error_backoff  # backoff_queue.go ``add``
        heapq.heappush(heap, (self._expiry(qp), prio, ts, self._seq, qp.key))
        qp.history.append((self.clock(), BACKOFF, why))
        if self.pop_from_backoff_q and qp.plugins:
            self._cond.notify_all()  # a waiting cycle may take it now (movePodsToActiveOrBackoffQueue)

    def _to_unschedulable(self, qp: QueuedPod, why: str) -> None:
        qp.where = UNSCHEDULABLE
        qp.history.append((self.clock(), UNSCHEDULABLE, why))

    def _requeue(self, qp: QueuedPod, why: str, now: float) -> None:
        """activeQ, or backoffQ while its backoff runs (``requeuePodViaQueueingHint``)."""
        if self._backing_off(qp, now):
            self._to_backoff(qp, why)
        else:
            self._to_active(qp, why)

    # ------------------------------------------------------------------------------ pod events
    def add(self, key: str, pod: dict) -> None:
        """A new pending pod (``Add``): activeQ, unless the queue knows it already."""
        with self._cond:
            if key in self._pods:
                self._pods[key].pod = pod
                return
            qp = QueuedPod(key, pod, self.clock())
            self._pods[key] = qp
            self._to_active(qp, "PodAdd")

    def update(self, key: str, pod: dict, spec_changed: bool) -> None:
        """The pending pod changed (``Update``): an unschedulable pod whose change is more than its status
        is moved (``isPodUpdated``); elsewhere the queued copy is refreshed."""
        with self._cond:
            qp = self._pods.get(key)
            if qp is None:
                qp = QueuedPod(key, pod, self.clock())
                self._pods[key] = qp
                self._to_active(qp, "PodUpdate")
                return
            qp.pod = pod
            if not spec_changed:
                return
            if qp.where == IN_FLIGHT:
                qp.moved_while_in_flight = True  # its own update is an event for the attempt in flight
            elif qp.where == UNSCHEDULABLE:
                self._requeue(qp, "PodUpdate", self.clock())

    def delete(self, key: str) -> None:
        """The pending pod is gone or was bound by someone else."""
        with self._cond:
            qp = self._pods.pop(key, None)
            if qp is not None:
                self._active.pop(key, None)  # a backoffQ entry is skipped when it comes due
                self._in_backoff.pop(key, None)

    def pop(self, timeout: float | None = None) -> QueuedPod | None:
        """The next active pod, now in flight (None after ``close()`` or ``timeout``)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                while self._aheap:
                    _prio, _ts, seq, key = heapq.heappop(self._aheap)
                    if self._active.get(key) != seq:
                        continue  # left activeQ, or queued again under a newer entry
                    del self._active[key]
                    qp = self._pods.get(key)
                    if qp is None or qp.where != ACTIVE:
                        continue
                    return self._start_attempt(qp)
                qp = self._pop_backoff() if self.pop_from_backoff_q else None
                if qp is not None:
                    return qp
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left if left is not None else 0.5)
            return None

    def _live_backoff_head(self, heap: list) -> QueuedPod | None:
        """The head of a backoff heap that is still in backoffQ (stale entries dropped), left in place."""
        while heap:
            *_rest, seq, key = heap[0]
            qp = self._pods.get(key)
            if qp is not None and qp.where == BACKOFF and self._in_backoff.get(key) == seq:
                return qp
            heapq.heappop(heap)
        return None

    def _pop_backoff(self) -> QueuedPod | None:
        """activeQ is empty: the head of podBackoffQ, in flight now, backing off or not (``popBackoff``;
        never podErrorBackoffQ)."""
        qp = self._live_backoff_head(self._backoff)
        if qp is None:
            return None
        heapq.heappop(self._backoff)
        del self._in_backoff[qp.key]
        qp.history.append((self.clock(), IN_FLIGHT, "PopFromBackoffQ"))
        return self._start_attempt(qp)

    def _start_attempt(self, qp: QueuedPod) -> QueuedPod:
        """A popped pod's scheduling cycle begins: it is in flight now."""
        self.cycle += 1
        qp.cycle = self.cycle
        qp.attempts += 1
        qp.where = IN_FLIGHT
        qp.moved_while_in_flight = False
        return qp

    # ------------------------------------------------------------------------------ attempt outcomes
    def done(self, qp: QueuedPod) -> None:
        """Bound: the pod leaves the queue."""
        with self._cond:
            self._pods.pop(qp.key, None)

    def failed(self, qp: QueuedPod, plugins: frozenset[str] = frozenset()) -> str:
        """The attempt failed: ``plugins`` rejected it (empty: an error). Returns the queue it went to
        (``AddUnschedulablePodIfNotPresent``)."""
        with self._cond:
            if self._pods.get(qp.key) is not qp:
                return ""  # deleted (or bound by someone else) meanwhile
            now = self.clock()
            qp.timestamp = now
            qp.plugins = plugins
            if plugins:
                qp.unschedulable_count += 1
                qp.consecutive_errors = 0
            else:
                qp.consecutive_errors += 1
            if not plugins or qp.moved_while_in_flight or self.move_request_cycle >= qp.cycle:
                self._to_backoff(qp, "ScheduleAttemptFailure")
            else:
                self._to_unschedulable(qp, "ScheduleAttemptFailure")
            return qp.where

    # ------------------------------------------------------------------------------ cluster events
    def move_all(self, event: str, skip: str | None = None, max_priority: int | None = None) -> int:
        """A cluster event: every unschedulable pod whose rejector cares about it moves to backoffQ or
        activeQ; pods in flight go to backoffQ if their attempt fails (``moveRequestCycle``).
        ``max_priority``: only pods of at most that priority (a nomination that changed or went)."""
        with self._cond:
            now = self.clock()
            self.move_request_cycle = self.cycle
            moved = 0
            for qp in list(self._pods.values()):
                if qp.where != UNSCHEDULABLE or qp.key == skip or not _interested(qp.plugins, event):
                    continue
                if max_priority is not None and pod_priority(qp.pod) > max_priority:
                    continue
                self._requeue(qp, event, now)
                moved += 1
            self.moves.append((now, event, moved))
            del self.moves[:-1000]
            return moved

    def flush_backoff_completed(self) -> None:
        with self._cond:
            now = self.clock()
            for heap in (self._backoff, self._error_backoff):
                while (qp := self._live_backoff_head(heap)) is not None and not self._backing_off(qp, now):
                    heapq.heappop(heap)
                    del self._in_backoff[qp.key]
                    self._to_active(qp, "BackoffComplete")

    def flush_unschedulable_leftover(self) -> None:
        with self._cond:
            now = self.clock()
            for qp in list(self._pods.values()):
                if qp.where == UNSCHEDULABLE and now - qp.timestamp > self.max_in_unschedulable_s:
                    self._requeue(qp, UNSCHEDULABLE_TIMEOUT, now)

    # ------------------------------------------------------------------------------ introspection
    def where(self, key: str) -> str | None:
        with self._cond:
            qp = self._pods.get(key)
            return qp.where if qp is not None else None

    def get(self, key: str) -> QueuedPod | None:
        with self._cond:
            return self._pods.get(key)

    def counts(self) -> dict[str, int]:
        with self._cond:
            out: dict[str, int] = {}
            for qp in self._pods.values():
                out[qp.where] = out.get(qp.where, 0) + 1
            return out

    def empty(self) -> bool:
        with self._cond:
            return not self._pods


__all__ = ["ACTIVE", "ASSIGNED_POD_DELETE", "BACKOFF", "EXTENDER", "IN_FLIGHT", "NODE_ADD",
           "NODE_ALLOCATABLE", "NODE_RESOURCES_FIT", "NODE_UPDATE", "UNSCHEDULABLE",
           "UNSCHEDULABLE_TIMEOUT", "QueuedPod", "SchedulingQueue", "pod_priority"]

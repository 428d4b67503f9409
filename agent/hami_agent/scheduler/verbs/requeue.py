"""Make kube-scheduler retry the pods /filter refused once this extender frees GPU capacity.

Why: kube-scheduler parks a pod an extender refused in its unschedulable pool and tries it again only
after a cluster event (or after ``podMaxInUnschedulablePodsDuration``, 5 minutes): ``findNodesThatFitPod``
in ``pkg/scheduler/schedule_one.go`` records the rejector as ``Extender``, which any cluster event requeues
(kubernetes issue #122019). Freeing a GPU normally is such an event (the pod's deletion, or its turn to
Succeeded/Failed, which kube-scheduler's pod informer sees as a deletion). But kube-scheduler and this
extender watch the API separately: when kube-scheduler acts on the deletion first, the retried pod reaches
/filter while this cache still counts the GPU as used, is refused again, and waits 5 minutes
(Project-HAMi/HAMi#1368, #1875).

So when the cache stops counting a pod's GPUs and /filter refused a pod recently, this module writes one
annotation on the node whose capacity freed (``hami.io/capacity-freed: <RFC3339 time>``, unknown to HAMi
and ignored by it). A node annotation change is a node update kube-scheduler acts on (since v1.28,
kubernetes PR #118389), so the parked pods are tried again — now against a cache that has freed the GPU.
Cost: at most one small node write per node per ``min_interval_s``, only after a refusal within
``window_s``, within a client-side rate limit; only the leader writes.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hami_agent import log
from hami_agent.k8s.ratelimit import RateLimiter

logger = logging.getLogger(__name__)

ANNOTATION = "hami.io/capacity-freed"


def _now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Requeuer:
    """``refused()`` from /filter when no node fits; ``freed(node)`` from the cache's informer when a pod
    stops counting on ``node``. One background thread writes the annotations."""

    def __init__(self, client: Any, lease_valid: Callable[[], bool] = lambda: True, *, window_s: float = 60.0,
                 min_interval_s: float = 1.0, qps: float = 5.0, burst: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.lease_valid = lease_valid
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self.limiter = RateLimiter(qps, burst, clock=clock)
        self._clock = clock
        self._cond = threading.Condition()
        self._last_refusal: float | None = None
        self._due: OrderedDict[str, float] = OrderedDict()  # node -> when its kick may be written
        self._last_kick: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self.kicks = 0
        self.errors = 0

    def start(self) -> Requeuer:
        self._thread = threading.Thread(target=self._run, name="requeue-kicks", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def refused(self) -> None:
        with self._cond:
            self._last_refusal = self._clock()

    def freed(self, node: str) -> None:
        with self._cond:
            now = self._clock()
            if self._last_refusal is None or now - self._last_refusal > self.window_s or not node:
                return
            if node in self._due:
                return  # a kick of this node is already queued: it covers this free too
            last = self._last_kick.get(node)
            self._due[node] = now if last is None else max(now, last + self.min_interval_s)
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def _next(self) -> str | None:
        with self._cond:
            while not self._stop:
                now = self._clock()
                ready = next((n for n, t in self._due.items() if t <= now), None)
                if ready is not None:
                    del self._due[ready]
                    self._last_kick[ready] = now
                    if len(self._last_kick) > 100_000:  # bounded: forget the oldest
                        for k in list(self._last_kick)[:50_000]:
                            del self._last_kick[k]
                    return ready
                wait = min((t - now for t in self._due.values()), default=1.0)
                self._cond.wait(max(0.01, min(wait, 1.0)))
            return None

    def _run(self) -> None:
        while True:
            node = self._next()
            if node is None:
                return
            if not self.lease_valid():
                continue  # only the leader writes; a follower's refusals are forwarded anyway
            wait = self.limiter.reserve(10.0)
            if wait is None:
                log.v(logger, 3, "requeue kick of node %s dropped: rate limit", node)
                continue
            if wait:
                time.sleep(wait)
            try:
                self.client.patch_node_annotations(node, {ANNOTATION: _now_rfc3339()})
                self.kicks += 1
                log.v(logger, 3, "node %s: GPU capacity freed after a refusal; requeue event written", node)
            except Exception as exc:  # best effort: the 5-minute flush is the backstop
                self.errors += 1
                logger.warning("requeue kick of node %s failed: %s", node, exc)


__all__ = ["ANNOTATION", "Requeuer"]

"""Writes that record the truth after the kubelet was answered, retried off the RPC path.

Allocate must answer the kubelet within its deadline and must not sleep, but some writes have to land
eventually: the node lock release after a successful allocation, and after a failed one the pod's
``bind-phase=failed`` (with its allocation restored when a success write may have landed) and the lock
release. ``LateWriter`` runs them on one background thread: the first attempt at once, then retries
with exponential backoff and jitter until the write lands, turns out to be moot (pod re-created, lock
no longer ours), or ``give_up_after_s`` passes (a lock expires after 5 minutes anyway). The queue is
bounded; a full queue drops the new write with an error in the log.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.deviceplugin.podsource import PodSourceError
from hami_agent.k8s.backoff import Backoff

logger = logging.getLogger(__name__)


@dataclass(order=True)
class _Task:
    due: float
    seq: int
    what: str = field(compare=False)
    attempt: Callable[[float], None] = field(compare=False)
    created: float = field(compare=False)
    backoff: Backoff = field(compare=False)
    tries: int = field(default=0, compare=False)


class LateWriter:
    """One background thread; ``attempt(timeout_s)`` raises ``PodSourceError`` to be retried and returns
    when the write landed or is no longer needed."""

    def __init__(self, api_timeout_s: float, *, max_pending: int = 1024, give_up_after_s: float = 600.0,
                 first_retry_s: float = 0.1, max_retry_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_timeout_s = api_timeout_s
        self.max_pending = max_pending
        self.give_up_after_s = give_up_after_s
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[_Task] = []
        self._running = 0  # tasks taken off the heap and not finished yet
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.done = 0
        self.dropped = 0

    def submit(self, what: str, attempt: Callable[[float], None]) -> bool:
        """Queue a write (first attempt as soon as the thread is free). False when the queue is full."""
        with self._cond:
            if self._stop:
                logger.error("late write not started, plugin stopping: %s", what)
                return False
            if len(self._heap) + self._running >= self.max_pending:
                self.dropped += 1
                logger.error("late-write queue full (%d): dropped %s", self.max_pending, what)
                return False
            now = self._clock()
            bo = Backoff(duration_s=self.first_retry_s, factor=2.0, jitter=0.5, steps=1 << 30,
                         cap_s=self.max_retry_s)
            heapq.heappush(self._heap, _Task(now, next(self._seq), what, attempt, now, bo))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="late-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return True

    def pending(self) -> int:
        with self._cond:
            return len(self._heap) + self._running

    def wait_idle(self, timeout: float) -> bool:
        """True once every queued write has finished (landed, moot or given up)."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._heap or self._running:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    def stop(self, flush_s: float = 2.0) -> None:
        """Give queued writes ``flush_s`` to land, then stop; what is left is logged (locks expire)."""
        self.wait_idle(flush_s)
        with self._cond:
            self._stop = True
            left = [t.what for t in self._heap]
            self._heap.clear()
            self._cond.notify_all()
            thread = self._thread
        for what in left:
            logger.error("late write abandoned at shutdown: %s", what)
        if thread is not None:
            thread.join(self.api_timeout_s + 1.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._heap or self._heap[0].due > self._clock()):
                    wait = self._heap[0].due - self._clock() if self._heap else None
                    self._cond.wait(wait if wait is None else max(0.0, min(wait, 1.0)))
                if self._stop:
                    return
                task = heapq.heappop(self._heap)
                self._running += 1
            try:
                self._attempt(task)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def _attempt(self, task: _Task) -> None:
        task.tries += 1
        try:
            task.attempt(self.api_timeout_s)
        except PodSourceError as exc:
            age = self._clock() - task.created
            if age >= self.give_up_after_s:
                logger.error("giving up after %d attempts in %.0fs: %s: %s", task.tries, age, task.what, exc)
                return
            delay = task.backoff.next()
            log.v(logger, 3, "%s failed (attempt %d): %s; retrying in %.2fs", task.what, task.tries, exc,
                  delay)
            with self._cond:
                task.due = self._clock() + delay
                heapq.heappush(self._heap, task)
            return
        except Exception:  # a bug must not kill the thread that releases locks
            logger.exception("late write %s failed unexpectedly; not retried", task.what)
            return
        self.done += 1
        log.v(logger, 4, "%s done (attempt %d)", task.what, task.tries)

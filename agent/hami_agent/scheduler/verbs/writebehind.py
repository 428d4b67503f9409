"""/filter's assignment write, taken off kube-scheduler's serial scheduling cycle.

kube-scheduler runs one scheduling cycle at a time (Filter, Score, Reserve, Permit) and each pod's binding
cycle in its own goroutine (kubernetes/kubernetes ``pkg/scheduler/schedule_one.go``: ``ScheduleOne`` starts
``bindingCycle`` with ``go func``). HAMi's Filter patches the pod's assignment before it answers, so every
pod's scheduling cycle, and therefore every other pending pod, waits for that PATCH's round trip.

With write-behind, /filter answers as soon as its decision is reserved in the usage cache, and the PATCH
runs here, in a bounded pool. /bind, which runs in the pod's binding cycle, waits for the write and refuses
the bind if it failed (kube-scheduler then unreserves the pod and schedules it again). The annotations are
on the pod before its binding exists, which is all HAMi's protocol needs: the device plugin reads them at
Allocate, after the binding. Everything else is unchanged: a lost answer is read back (``reconcile``), and
a refusal of /filter writes nothing.

Bounded: ``threads`` workers and at most ``max_pending`` writes queued or running; when full, the caller
writes inline, as HAMi does (back-pressure instead of an unbounded queue).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class WriteBehind:
    def __init__(self, *, threads: int = 16, max_pending: int = 256) -> None:
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="filter-write")
        self._lock = threading.Lock()
        self._pending = 0
        self._stopped = False

    def submit(self, write: Callable[[], str]) -> Future | None:
        """Run ``write`` (which returns "" on success, else the error) in the pool; its ``Future``, or None
        when the pool is full or stopped (the caller then writes inline)."""
        with self._lock:
            if self._stopped or self._pending >= self.max_pending:
                return None
            self._pending += 1
        try:
            fut = self._pool.submit(write)
        except RuntimeError:  # shut down between the check and the submit
            self._done(None)
            return None
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _f: Future | None) -> None:
        with self._lock:
            self._pending -= 1

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def stop(self, wait: bool = True) -> None:
        """No new writes; with ``wait``, the queued ones finish first (each is bounded by its API timeout)."""
        with self._lock:
            self._stopped = True
        self._pool.shutdown(wait=wait)

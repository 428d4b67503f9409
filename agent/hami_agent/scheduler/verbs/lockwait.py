"""/bind waits for a busy node lock instead of failing: the next pod takes the lock the moment the
previous pod's Allocate releases it.

HAMi's node lock (``hami.io/mutex.lock``) is held from a pod's /bind until the device plugin's Allocate
for that pod: Allocate finds its pod through the lock, and the kubelet admits one pod at a time. So pods
bound to one node are serialized by design. HAMi's /bind fails at once with ``node lock contention`` when
the lock is held; kube-scheduler then retries the pod after its backoff (1 s doubling to 10 s), and a
40-pod job on one node takes minutes (Project-HAMi/HAMi#1367). Here a /bind that meets a lock held by a
pod that is still being allocated parks itself in a per-node FIFO and is woken by the scheduler's node
watch when the lock goes (or by its deadline); no handler thread waits meanwhile (the response is
deferred, ``httpserve``), so waiting binds cannot starve /filter.

Bounded: ``max_waiters`` in all (beyond: the contention error at once), each at most ``wait_s`` (then
the contention error; kube-scheduler's extender call times out at 30 s), continuations on ``threads``
threads. One waiter per node is woken per release: the others wait for the lock the woken one takes.
A bind that meets the lock again after a wake keeps its first deadline (``wait``'s ``deadline``), and
when the node watch does not show the lock it met (the watch lags: a dropped stream, an API outage) it is
tried again after a delay that doubles up to ``RETRY_MAX_S`` instead of at once: a lagging watch cannot
turn a wait into a loop of lock attempts.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hami_agent import log
from hami_agent.scheduler.state.nodelocks import NodeLocks

logger = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
RECHECK_S = 1.0  # a lock judged busy from the watches alone is read from the API if not released by then


@dataclass(order=True)
class _Waiter:
    deadline: float
    seq: int
    node: str = field(compare=False)
    resume: Callable[[bool], None] = field(compare=False)  # resume(timed_out)
    done: bool = field(default=False, compare=False)
    final: bool = field(default=True, compare=False)  # False: ``deadline`` is a retry, not the time-out
    until: float = field(default=0.0, compare=False)  # the time-out (``deadline`` when ``final``)
    watching: str | None = field(default=None, compare=False)  # a recheck's lock as the watch showed it


class NodeLockWaiter:
    def __init__(self, locks: NodeLocks, *, wait_s: float = 15.0, max_waiters: int = 4096, threads: int = 4,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``locks``: the node watch's locks (``state.nodelocks``): read here, and their releases wake us."""
        self.locks = locks
        self.wait_s = wait_s
        self.max_waiters = max_waiters
        self._clock = clock
        self._cond = threading.Condition()
        self._queues: dict[str, deque[_Waiter]] = {}
        self._deadlines: list[_Waiter] = []
        self._seq = itertools.count()
        self._count = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bind-resume")
        self._stop = False
        self._timer = threading.Thread(target=self._expire_loop, name="bind-lock-deadlines", daemon=True)
        self._timer.start()
        locks.subscribe(self._released, self._gone)
        self.waited = 0
        self.timeouts = 0
        self.refused = 0

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            waiters = [w for q in self._queues.values() for w in q if not w.done]
            self._queues.clear()
            self._cond.notify_all()
        for w in waiters:
            w.done = True
            self._pool.submit(w.resume, True)
        self._pool.shutdown(wait=False)
        self._timer.join(5)

    # ------------------------------------------------------------------------------ node watch
    def _released(self, node: str) -> None:
        """The watch shows ``node`` without a lock: wake its first waiter."""
        with self._cond:
            self._wake_one(node)

    def _gone(self, node: str) -> None:
        with self._cond:
            while node in self._queues:  # every waiter finds the node gone on its retry
                self._wake_one(node)

    def now(self) -> float:
        """The waiter's clock (deadlines passed to ``wait`` are on it)."""
        return self._clock()

    def lock_of(self, node: str) -> str | None:
        return self.locks.value(node)

    # ------------------------------------------------------------------------------ binds
    def wait(self, node: str, contended: str | None, resume: Callable[[bool], None],  # noqa: PLR0913
             deadline: float | None = None, attempt: int = 0, *, recheck: bool = False) -> bool:
        """Park a bind that met ``contended`` on ``node``; ``resume(timed_out)`` runs on a pool thread
        when the lock is gone (or at once if it already changed) or at ``deadline`` (default: ``wait_s``
        from now). ``attempt``: how many times this bind already waited (its first ``deadline`` is kept);
        from the second on, a watch that does not show ``contended`` means a retry after a growing delay.
        ``recheck``: the lock was judged busy from the watches' copies alone (``lock_node``'s
        ``judge_cached_lock``); unless the watch shows it released first, the bind is resumed after
        ``RECHECK_S`` to read the node itself, so a stale or stalled watch delays it by that at most. A
        watch that showed the lock change hands meanwhile is alive: the bind waits on, and is rechecked
        ``RECHECK_S`` after the last change it saw (a queue of binds behind one node costs no reads).
        False when full (nothing parked: the caller answers the contention error)."""
        with self._cond:
            if self._stop or self._count >= self.max_waiters:
                self.refused += 1
                return False
            now = self._clock()
            final = now + self.wait_s if deadline is None else deadline
            if final <= now:
                self.timeouts += 1
                self._pool.submit(resume, True)
                return True
            current = self.locks.value(node)
            moved = current is None or (contended is not None and current != contended)
            wake_at, is_final = final, True
            if moved and attempt > 0:  # the watch disagrees with the API again: retry later, not now
                retry = min(RETRY_FIRST_S * 2 ** (attempt - 1), RETRY_MAX_S)
                if now + retry < final:
                    wake_at, is_final = now + retry, False
            elif recheck and now + RECHECK_S < final:
                wake_at, is_final = now + RECHECK_S, False
            w = _Waiter(wake_at, next(self._seq), node, resume, final=is_final, until=final,
                        watching=current if recheck and not is_final else None)
            self._queues.setdefault(node, deque()).append(w)
            heapq.heappush(self._deadlines, w)
            self._count += 1
            self.waited += 1
            self._cond.notify_all()
            if moved and attempt == 0:
                self._wake_one(node)  # released (or taken by someone else) while we were parking
        return True

    def done(self, node: str) -> None:
        """A resumed bind finished without keeping the lock (it failed): let the next waiter try."""
        with self._cond:
            if self.locks.value(node) is None:
                self._wake_one(node)

    def waiting(self, node: str | None = None) -> int:
        with self._cond:
            if node is None:
                return self._count
            return sum(1 for w in self._queues.get(node, ()) if not w.done)

    # ------------------------------------------------------------------------------ machinery
    def _wake_one(self, node: str) -> None:
        q = self._queues.get(node)
        while q:
            w = q.popleft()
            if w.done:
                continue
            w.done = True
            self._count -= 1
            if not q:
                del self._queues[node]
            log.v(logger, 4, "node %s lock free: resuming a waiting bind", node)
            self._pool.submit(w.resume, False)
            return
        self._queues.pop(node, None)

    def _expire_loop(self) -> None:
        with self._cond:
            while not self._stop:
                now = self._clock()
                while self._deadlines and (self._deadlines[0].done or self._deadlines[0].deadline <= now):
                    w = heapq.heappop(self._deadlines)
                    if w.done:
                        continue
                    current = self.locks.value(w.node) if w.watching is not None and not w.final else None
                    if current is not None and current != w.watching:
                        # the watch showed the lock change hands: alive, no read needed; look again later
                        w.watching = current
                        w.deadline = min(now + RECHECK_S, w.until)
                        w.final = w.deadline >= w.until
                        heapq.heappush(self._deadlines, w)
                        continue
                    w.done = True
                    self._count -= 1
                    q = self._queues.get(w.node)
                    if q is not None:
                        try:
                            q.remove(w)
                        except ValueError:
                            pass
                        if not q:
                            del self._queues[w.node]
                    if w.final:
                        self.timeouts += 1
                    self._pool.submit(w.resume, w.final)
                wait = self._deadlines[0].deadline - now if self._deadlines else 1.0
                self._cond.wait(max(0.01, min(wait, 1.0)))


__all__ = ["NodeLockWaiter"]

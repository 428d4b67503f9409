"""``Healer``: one background thread that retries, with backoff, the repairs a request could not finish
within its own time budget: a node lock whose release failed, a write whose answer was lost, a usage
cache entry that waits for the API's truth.

Bounded on every axis: at most ``max_tasks`` tasks (a submit beyond that is refused and logged — the
lock expiry and the informer's resync remain as backstops), one thread, per-task exponential backoff with
jitter, and a deadline after which a task is abandoned (logged). A task is a callable that returns None
when it is done, or the seconds to wait before it should run again; an exception counts as a failed try
and is retried with the task's backoff. Tasks are keyed: submitting a key that is already queued
replaces the old task (the newest knowledge wins).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hami_agent.k8s.backoff import Backoff

logger = logging.getLogger(__name__)

Task = Callable[[], "float | None"]


@dataclass
class _Entry:
    key: str
    fn: Task
    deadline: float
    seq: int
    backoff: Backoff = field(default_factory=lambda: Backoff(duration_s=0.2, factor=2.0, jitter=0.5,
                                                             steps=1 << 30, cap_s=10.0))
    tries: int = 0
    periodic: bool = False


class Healer:
    def __init__(self, max_tasks: int = 1024, name: str = "extender-heal",
                 clock: Callable[[], float] = time.monotonic, autostart: bool = False) -> None:
        """``autostart``: start the thread on the first submit (for an owner without a lifecycle)."""
        self.max_tasks = max_tasks
        self.name = name
        self._clock = clock
        self._tasks: dict[str, _Entry] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.done = 0
        self.abandoned = 0
        self.refused = 0
        self._autostart = autostart

    def start(self) -> Healer:
        with self._cond:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def submit(self, key: str, fn: Task, *, delay_s: float = 0.0, deadline_s: float = 300.0,
               periodic: bool = False) -> bool:
        """Queue ``fn`` under ``key`` to run after ``delay_s``; False when the queue is full.
        ``periodic``: a task that never ends (an audit loop); :meth:`wait_idle` does not wait for it."""
        if self._autostart and self._thread is None and not self._stop.is_set():
            self.start()
        with self._cond:
            if key not in self._tasks and len(self._tasks) >= self.max_tasks:
                self.refused += 1
                logger.error("repair queue full (%d tasks): cannot queue %s; relying on expiry/resync",
                             self.max_tasks, key)
                return False
            self._seq += 1
            now = self._clock()
            self._tasks[key] = _Entry(key, fn, now + deadline_s, self._seq, periodic=periodic)
            heapq.heappush(self._heap, (now + delay_s, self._seq, key))
            self._cond.notify()
            return True

    def cancel(self, key: str) -> bool:
        with self._cond:
            return self._tasks.pop(key, None) is not None

    def pending(self, prefix: str = "") -> list[str]:
        with self._cond:
            return [k for k in self._tasks if k.startswith(prefix)]

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no repair (periodic tasks aside) is queued (tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if not any(not e.periodic for e in self._tasks.values()):
                    return True
            time.sleep(0.02)
        return False

    def _next(self) -> _Entry | None:
        with self._cond:
            while not self._stop.is_set():
                while self._heap:
                    due, seq, key = self._heap[0]
                    entry = self._tasks.get(key)
                    if entry is None or entry.seq != seq:
                        heapq.heappop(self._heap)  # replaced or cancelled
                        continue
                    wait = due - self._clock()
                    if wait <= 0:
                        heapq.heappop(self._heap)
                        return entry
                    self._cond.wait(min(wait, 1.0))
                    break
                else:
                    self._cond.wait(1.0)
            return None

    def _run(self) -> None:
        while True:
            entry = self._next()
            if entry is None:
                return
            entry.tries += 1
            try:
                again = entry.fn()
            except Exception as exc:
                again = entry.backoff.next()
                logger.warning("repair %s failed (try %d): %s; retrying in %.1fs", entry.key, entry.tries,
                               exc, again)
            with self._cond:
                if self._tasks.get(entry.key) is not entry:
                    continue  # replaced or cancelled while it ran
                if again is None:
                    del self._tasks[entry.key]
                    self.done += 1
                    continue
                if self._clock() + again > entry.deadline:
                    del self._tasks[entry.key]
                    self.abandoned += 1
                    logger.error("repair %s abandoned after %d tries (deadline reached)", entry.key,
                                 entry.tries)
                    continue
                heapq.heappush(self._heap, (self._clock() + again, entry.seq, entry.key))

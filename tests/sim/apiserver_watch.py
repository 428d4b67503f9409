"""Watch fan-out of the simulated API server: each write is pushed to the watches it may concern.

Why: with one condition variable for the whole store, every write woke every open watch, and each
re-scanned the history; a simulated fleet of a hundred nodes (three watches each) then spent its CPU
waking threads rather than serving requests. kube-apiserver's watch cache (``cacher.go``) likewise
dispatches each event to the interested watchers, indexed by the fields its trigger functions know
(``spec.nodeName`` for pods, ``metadata.name`` for nodes).

A subscription is keyed by resource and, when its field selector has ``spec.nodeName=<x>`` or
``metadata.name=<x>``, by that value: it then receives only writes whose old or new object has that
value (an object moving into or out of the selector included). The watch itself still applies its full
selectors (``apiserver._translate``).
"""

from __future__ import annotations

import threading
from collections import deque

from tests.sim.apiserver_store import HistoryEntry, field_value

INDEXED_FIELDS = ("metadata.name", "spec.nodeName")


def index_of(field_selector: str | None) -> tuple[str, str] | None:
    """(field, value) of the first equality term on an indexed field, else None."""
    for term in (field_selector or "").split(","):
        for op in ("==", "="):
            if op in term and "!=" not in term:
                path, _, value = term.partition(op)
                path, value = path.strip(), value.strip()
                if path in INDEXED_FIELDS and value:
                    return path, value
                break
    return None


class Subscription:
    def __init__(self, plural: str, index: tuple[str, str] | None) -> None:
        self.plural = plural
        self.index = index
        self._cond = threading.Condition()
        self._queue: deque[HistoryEntry] = deque()
        self.closed = False

    def push(self, entry: HistoryEntry) -> None:
        with self._cond:
            self._queue.append(entry)
            self._cond.notify()

    def empty(self) -> bool:
        with self._cond:
            return not self._queue

    def get(self, timeout: float) -> list[HistoryEntry]:
        """Everything queued, waiting up to ``timeout`` for the first entry (or ``close()``)."""
        with self._cond:
            if not self._queue and not self.closed:
                self._cond.wait(timeout)
            out = list(self._queue)
            self._queue.clear()
            return out

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def _relevant(entry: HistoryEntry, index: tuple[str, str]) -> bool:
    path, value = index
    if field_value(entry.new, path) == value:
        return True
    return entry.old is not None and field_value(entry.old, path) == value


class WatchHub:
    """Publish is called by the store under its lock, so a subscription made under that same lock sees
    every write after the moment it was made, and none before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, dict[tuple[str, str] | None, set[Subscription]]] = {}

    def subscribe(self, plural: str, index: tuple[str, str] | None) -> Subscription:
        sub = Subscription(plural, index)
        with self._lock:
            self._subs.setdefault(plural, {}).setdefault(index, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            by_index = self._subs.get(sub.plural, {})
            subs = by_index.get(sub.index)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del by_index[sub.index]

    def publish(self, entry: HistoryEntry) -> None:
        with self._lock:
            by_index = {k: list(v) for k, v in self._subs.get(entry.plural, {}).items()}
        for index, subs in by_index.items():
            if index is None or _relevant(entry, index):
                for sub in subs:
                    sub.push(entry)

    def close_all(self) -> None:
        with self._lock:
            subs = [s for by_index in self._subs.values() for v in by_index.values() for s in v]
        for s in subs:
            s.close()

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for by_index in self._subs.values() for v in by_index.values())


__all__ = ["INDEXED_FIELDS", "Subscription", "WatchHub", "index_of"]

"""The extender's record of its own recent /filter decisions, which is what /bind trusts.

kube-scheduler calls /bind right after /filter for the same pod (its binding cycle; a permit plugin can
delay it for at most 15 minutes: ``maxTimeout`` in kubernetes/kubernetes
``pkg/scheduler/framework/runtime/framework.go``), so a record is kept for
``ttl_s`` (default 15 min) and at most ``max_entries`` records are kept (oldest dropped first): bounded
memory whatever the request rate. A /bind that finds no record is refused and writes nothing.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FilterDecision:
    uid: str
    namespace: str
    name: str
    node: str
    devices: str  # the pod device string written as vgpu-devices-to-allocate / -allocated
    vgpu_time: str
    # write-behind (scheduler/verbs/writebehind.py): the assignment write, resolving to "" or its error; None
    # when it was written before /filter answered
    written: Future | None = field(default=None, compare=False)

    def write_error(self) -> str | None:
        """None while the write is in flight, "" once written, else why it failed."""
        if self.written is None:
            return ""
        if not self.written.done():
            return None
        exc = self.written.exception()
        return f"patch pod error: {exc!r}" if exc is not None else self.written.result()


class DecisionLog:
    def __init__(self, ttl_s: float = 900.0, max_entries: int = 20000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, FilterDecision]] = OrderedDict()

    def put(self, d: FilterDecision) -> None:
        with self._lock:
            now = self._clock()
            self._items.pop(d.uid, None)
            self._items[d.uid] = (now + self.ttl_s, d)
            # oldest first, and every record lives ttl_s: the expired ones are at the front. Without this, the
            # records of pods that never reach /bind (deleted while pending, refused) stayed until the cap
            while self._items and next(iter(self._items.values()))[0] <= now:
                self._items.popitem(last=False)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def get(self, uid: str) -> FilterDecision | None:
        with self._lock:
            item = self._items.get(uid)
            if item is None:
                return None
            if item[0] <= self._clock():
                del self._items[uid]
                return None
            return item[1]

    def drop(self, uid: str) -> None:
        with self._lock:
            self._items.pop(uid, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

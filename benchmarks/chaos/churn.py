"""Pod churn: create and delete the plan's pods at their time offsets, the way tenants do.

Pods are created and deleted with the API server's helpers (a user's ``kubectl``; deletion is immediate in
the simulator, as after a grace period). While the API server is down (an outage fault), a tenant's
request would fail: the action waits until the server is back, then happens.
"""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass, field

from benchmarks.chaos.cluster import Cluster
from benchmarks.chaos.plan import Plan, pod_object


@dataclass
class Churn:
    cluster: Cluster
    plan: Plan
    t0: float = 0.0
    created: int = 0
    deleted: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, name="chaos-churn", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        api = self.cluster.api
        assert api is not None
        # (time, order, action, pod index): order keeps creates before deletes at equal times
        todo: list[tuple[float, int, str, int]] = []
        for i, p in enumerate(self.plan.pods):
            todo.append((p.at, 0, "create", i))
            if p.delete_at is not None:
                todo.append((p.delete_at, 1, "delete", i))
        heapq.heapify(todo)
        while todo and not self._stop.is_set():
            at, _o, what, i = todo[0]
            left = self.t0 + at - time.monotonic()
            if left > 0:
                self._stop.wait(min(left, 0.5))
                continue
            if not api.running:  # a tenant cannot reach the API during an outage
                self._stop.wait(0.1)
                continue
            heapq.heappop(todo)
            p = self.plan.pods[i]
            try:
                if what == "create":
                    api.create(pod_object(p))
                    self.created += 1
                elif api.get("Pod", p.namespace, p.name) is not None:
                    api.delete("Pod", p.namespace, p.name)
                    self.deleted += 1
            except Exception as exc:  # noqa: BLE001 - e.g. already deleted by a lock-holder fault
                self.errors.append(f"{what} {p.namespace}/{p.name}: {exc!r}")

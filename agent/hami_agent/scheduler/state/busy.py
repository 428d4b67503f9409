"""Nodes with a pod between its /filter and its Allocate: /filter prefers another node that fits.

HAMi's node lock (``hami.io/mutex.lock``) is held from a pod's /bind until the device plugin's Allocate for
that pod releases it (Project-HAMi/HAMi ``pkg/util/nodelock``), so the pods bound to one node are admitted
one at a time: a hold takes a kubelet admission (~0.3 s in the simulated cluster, more on a loaded node).
kube-scheduler's scheduling cycle is serial and much faster, so under ``binpack`` every pod of a burst
picks the same fullest node and its /bind waits behind the previous pod's lock (scheduler/verbs/lockwait.py):
one pod per hold time, whatever the size of the fleet (Project-HAMi/HAMi#1367, #1577).

So /filter passes the nodes that are busy now to the node choice, which takes the best node by policy
among the others that fit, and the best busy one only when every fitting node is busy (a job for one
node still lands there and waits its turn). A node is busy while

* this extender chose it for a pod whose /bind has not finished (a claim, at most ``claim_ttl_s``), or
* the node watch shows its lock held (by anyone: our bind, a previous leader's, a stale lock).

This is a preference, never a constraint: a wrong answer (a watch event late, a claim expired early)
costs one /bind a wait for the lock, as before, and never changes what fits or what is allocated. State
comes only from this extender's own decisions, the node watch (read from ``state.nodelocks``, the one
copy of the locks) and, when a replica becomes the leader, the pending pods that carry an assignment (the
previous leader's claims: ``serve.app``). Bounded: at most ``max_claims`` claims (oldest dropped), each
expiring after ``claim_ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from hami_agent.scheduler.state.nodelocks import NodeLocks


class BusyNodes:
    def __init__(self, locks: NodeLocks | None = None, claim_ttl_s: float = 5.0, max_claims: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.locks = locks if locks is not None else NodeLocks()
        self.claim_ttl_s = claim_ttl_s
        self.max_claims = max_claims
        self._clock = clock
        self._lock = threading.Lock()
        self._claims: OrderedDict[str, tuple[str, float]] = OrderedDict()  # uid -> (node, expiry)
        self._claimed: dict[str, int] = {}  # node -> live claims

    # ------------------------------------------------------------------------------ /filter, /bind
    def claim(self, node: str, uid: str) -> None:
        """/filter chose ``node`` for pod ``uid`` (its assignment is being or has been written)."""
        with self._lock:
            self._drop(uid)
            self._claims[uid] = (node, self._clock() + self.claim_ttl_s)
            self._claimed[node] = self._claimed.get(node, 0) + 1
            while len(self._claims) > self.max_claims:
                self._drop(next(iter(self._claims)))

    def settle(self, uid: str) -> None:
        """The pod's /bind finished, bound or not: from now on the node watch's lock tells."""
        with self._lock:
            self._drop(uid)

    def nodes(self) -> set[str]:
        """The busy nodes now (a copy; O(busy nodes))."""
        with self._lock:
            now = self._clock()
            while self._claims:
                uid, (_node, expiry) = next(iter(self._claims.items()))
                if expiry > now:
                    break
                self._drop(uid)
            claimed = set(self._claimed)
        return claimed | self.locks.held()

    # ------------------------------------------------------------------------------ machinery
    def _drop(self, uid: str) -> None:
        item = self._claims.pop(uid, None)
        if item is None:
            return
        node = item[0]
        left = self._claimed.get(node, 0) - 1
        if left > 0:
            self._claimed[node] = left
        else:
            self._claimed.pop(node, None)


__all__ = ["BusyNodes"]

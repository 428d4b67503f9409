"""ResourceClaims for NodePrepareResources: the informer's cache first, one bounded API read on a miss.

The kubelet sends only ``namespace/name/uid`` (kubelet DRA API v1 ``Claim``); the allocation is in the
claim's status, written by kube-scheduler before the pod was bound. A cached claim is used when its uid
matches and its allocation names this driver; otherwise (not seen yet, re-created, cache lagging behind
the scheduler's status write) it is read from the API with what is left of the RPC's budget as timeout,
one attempt: the prepare path never waits longer than its deadline.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from hami_agent.deviceplugin.budget import BudgetExhausted, RpcBudget
from hami_agent.k8s.errors import KubeError, NotFoundError

Obj = dict[str, Any]


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimError(RuntimeError):
    """The claim cannot be used (missing, re-created, unreadable in time); the message names why."""


def has_results_for(claim: Obj, driver: str) -> bool:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    return any(r.get("driver") == driver for r in results)


class ClaimSource(Protocol):
    def claim(self, ref: ClaimRef, budget: RpcBudget) -> Obj: ...


class K8sClaimSource:
    """Claims from a ``resourceclaims`` informer, falling back to a GET within the budget."""

    def __init__(self, client: Any, informer: Any, driver: str) -> None:
        self.client = client  # single-attempt client (the budget, not retries, bounds the call)
        self.informer = informer
        self.driver = driver

    def claim(self, ref: ClaimRef, budget: RpcBudget) -> Obj:
        cached = self.informer.get(ref.namespace, ref.name) if self.informer is not None else None
        if cached is not None and _uid(cached) == ref.uid and has_results_for(cached, self.driver):
            return cached
        try:
            timeout = budget.call_timeout(f"reading resourceclaim {ref}")
        except BudgetExhausted as exc:
            raise ClaimError(f"resourceclaim {ref} is not in the cache and {exc}") from None
        try:
            obj = self.client.get("resourceclaims", ref.name, ref.namespace, timeout_s=timeout)
        except NotFoundError:
            raise ClaimError(f"resourceclaim {ref} not found (deleted?)") from None
        except KubeError as exc:
            raise ClaimError(f"cannot read resourceclaim {ref} within the deadline: {exc}") from None
        if _uid(obj) != ref.uid:
            raise ClaimError(f"resourceclaim {ref} has uid {_uid(obj)}, the kubelet asked for {ref.uid} "
                             "(deleted and re-created?)")
        return obj


class MemoryClaimSource:
    """Claims held in memory (tests; ``--standalone``)."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()

    def put(self, claim: Obj) -> None:
        md = claim["metadata"]
        with self._lock:
            self._claims[(md.get("namespace", "default"), md["name"])] = claim

    def claim(self, ref: ClaimRef, budget: RpcBudget) -> Obj:
        with self._lock:
            obj = self._claims.get((ref.namespace, ref.name))
        if obj is None:
            raise ClaimError(f"resourceclaim {ref} not found (deleted?)")
        if _uid(obj) != ref.uid:
            raise ClaimError(f"resourceclaim {ref} has uid {_uid(obj)}, the kubelet asked for {ref.uid} "
                             "(deleted and re-created?)")
        return obj


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")

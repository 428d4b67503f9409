"""Where Allocate finds pods and the node lock, and how it writes back: an interface, two implementations.

``PodSource`` keeps the allocator independent of the Kubernetes client: ``K8sPodSource`` reads the pod
and node informer caches of ``hami_agent.k8s`` and makes single-attempt API calls; ``MemoryPodSource``
keeps pods in a dict (unit tests, benchmarks, ``--standalone``). Every API call takes its timeout from
the caller (the RPC's remaining budget, or the background writer's own), and none sleeps or retries:
retries belong to the background writer (``latewriter.py``), never to the kubelet's RPC path; the
client given to ``K8sPodSource`` has no client-side rate limiter (``with_options(limiter=None)``).

Writes are conditional, so that a pod deleted and re-created under the same name, or changed since it
was read, is never written: pod patches are JSON patches (RFC 6902) whose ``test`` operations pin the
pod's ``metadata.uid`` and the annotation values the write was computed from (the API server answers
422 when a test fails and applies nothing: ``jsonPatcher.applyJSPatch`` in kubernetes
``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go``); the node lock is removed only if it
still holds the exact value that was read, by a JSON patch that tests that value.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami_agent.k8s.client import JSON_PATCH
from hami_agent.k8s.errors import NotFoundError
from hami_agent.protocol import keys


class PodSourceError(RuntimeError):
    """An API call on the allocation path failed or timed out (message names the call).

    ``unknown``: no answer came (timeout, connection lost, 5xx), so a write may or may not have been
    applied; otherwise the server refused the call and nothing was written."""

    def __init__(self, message: str, *, unknown: bool = False) -> None:
        super().__init__(message)
        self.unknown = unknown


class PodChanged(PodSourceError):
    """A conditional pod write was refused: the pod is gone, was re-created (another uid), or no longer
    holds the values the write was computed from. Nothing was written."""


@dataclass(frozen=True)
class PodRef:
    """One pod pinned by its uid: writes through a ref never touch a re-created pod of the same name."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodSource(Protocol):
    def pods_on_node(self) -> list[dict]:
        """Pods bound to this node, from a cache (never blocks on the network)."""

    def cached_node(self) -> dict | None:
        """This node from a cache (None when not seen yet); never blocks on the network."""

    def get_node(self, timeout_s: float) -> dict:
        """GET this node from the API (one attempt)."""

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> dict | None:
        """GET one pod from the API (one attempt); None when it does not exist."""

    def patch_pod_if(self, ref: PodRef, expect: dict[str, str], changes: dict[str, str],
                     timeout_s: float) -> None:
        """Set annotations ``changes`` on the pod if its uid is ``ref.uid`` and each annotation in
        ``expect`` has exactly the given value; raise ``PodChanged`` otherwise (one attempt)."""

    def release_lock_if(self, value: str, timeout_s: float) -> bool:
        """Remove this node's ``hami.io/mutex.lock`` if it is exactly ``value``. False when it is not
        (already released, or another pod's lock now); raises ``PodSourceError`` on API failures."""


def json_pointer(*parts: str) -> str:
    """RFC 6901 pointer (``hami.io/bind-phase`` -> ``hami.io~1bind-phase``)."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def conditional_patch(ref: PodRef, expect: dict[str, str], changes: dict[str, str]) -> list[dict]:
    """The JSON patch of ``patch_pod_if``: tests first (uid, expected annotation values), then adds
    (``add`` replaces an existing member)."""
    ops: list[dict] = [{"op": "test", "path": "/metadata/uid", "value": ref.uid}]
    ops += [{"op": "test", "path": json_pointer("metadata", "annotations", k), "value": v}
            for k, v in expect.items()]
    ops += [{"op": "add", "path": json_pointer("metadata", "annotations", k), "value": v}
            for k, v in changes.items()]
    return ops


@dataclass
class MemoryPodSource:
    """In-memory pods and node annotations (tests, benchmarks, standalone). Records every write and
    applies the same conditions as the API server does for ``K8sPodSource``."""

    node_name: str
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)
    node_annotations: dict[str, str] = field(default_factory=dict)
    patches: list[tuple[str, str, dict]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)  # lock values removed
    fail_writes: Exception | None = None  # every write raises an "unknown outcome" error
    api_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_pod(self, pod: dict) -> None:
        md = pod["metadata"]
        with self._lock:
            self.pods[(md.get("namespace", "default"), md["name"])] = pod

    def pods_on_node(self) -> list[dict]:
        with self._lock:
            return [copy.deepcopy(p) for p in self.pods.values()
                    if (p.get("spec") or {}).get("nodeName") == self.node_name]

    def _node(self) -> dict:
        with self._lock:
            return {"metadata": {"name": self.node_name, "annotations": dict(self.node_annotations)}}

    def cached_node(self) -> dict | None:
        return self._node()

    def get_node(self, timeout_s: float) -> dict:
        self.api_calls += 1
        return self._node()

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> dict | None:
        self.api_calls += 1
        with self._lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod else None

    def patch_pod_if(self, ref: PodRef, expect: dict[str, str], changes: dict[str, str],
                     timeout_s: float) -> None:
        self.api_calls += 1
        if self.fail_writes is not None:
            raise PodSourceError(f"patch pod error: {self.fail_writes}", unknown=True)
        with self._lock:
            pod = self.pods.get((ref.namespace, ref.name))
            if pod is None or (pod.get("metadata") or {}).get("uid") != ref.uid:
                raise PodChanged(f"patch pod error: pod {ref} with uid {ref.uid} not found")
            ann = pod.setdefault("metadata", {}).setdefault("annotations", {})
            for k, v in expect.items():
                if ann.get(k) != v:
                    raise PodChanged(f"patch pod error: pod {ref}: {k} is {ann.get(k)!r}, expected {v!r}")
            self.patches.append((ref.namespace, ref.name, dict(changes)))
            ann.update(changes)

    def release_lock_if(self, value: str, timeout_s: float) -> bool:
        self.api_calls += 1
        if self.fail_writes is not None:
            raise PodSourceError(f"release node lock error: {self.fail_writes}", unknown=True)
        with self._lock:
            if self.node_annotations.get(keys.NODE_LOCK) != value:
                return False
            del self.node_annotations[keys.NODE_LOCK]
            self.released.append(value)
            return True


def _error(prefix: str, exc: Exception) -> PodSourceError:
    """Classify a ``KubeError``: 404/409/422 on a conditional write mean "not applied, pod changed";
    no answer or 5xx mean "outcome unknown"."""
    status = getattr(exc, "status", None)
    text = f"{prefix}: {exc}"
    if status in (404, 409, 422):
        return PodChanged(text)
    return PodSourceError(text, unknown=status is None or status == 0 or status >= 500)


class K8sPodSource:
    """Pods and this node from ``hami_agent.k8s.Informer`` caches; API calls through ``client``
    (a ``KubeClient`` with a single attempt: ``client.with_options(attempts=1)``).

    ``pod_informer``: pods with ``spec.nodeName=<node>``; ``node_informer``: this node only (optional).
    """

    def __init__(self, node_name: str, client: Any, pod_informer: Any,
                 node_informer: Any | None = None) -> None:
        self.node_name = node_name
        self.client = client
        self.pod_informer = pod_informer
        self.node_informer = node_informer

    def pods_on_node(self) -> list[dict]:
        return [p for p in self.pod_informer.list()
                if (p.get("spec") or {}).get("nodeName") == self.node_name]

    def pods_synced(self) -> bool:
        """True once the pod informer has listed every pod of the node (dynamic MIG destroys nothing
        before: an incomplete cache cannot prove an instance unused)."""
        return bool(self.pod_informer.wait_synced(0))

    def cached_node(self) -> dict | None:
        if self.node_informer is None:
            return None
        return self.node_informer.get(None, self.node_name)

    def get_node(self, timeout_s: float) -> dict:
        try:
            return self.client.get("nodes", self.node_name, timeout_s=timeout_s)
        except Exception as exc:
            raise _error("get node error", exc) from exc

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> dict | None:
        try:
            return self.client.get("pods", name, namespace, timeout_s=timeout_s)
        except NotFoundError:
            return None
        except Exception as exc:
            raise _error(f"get pod {namespace}/{name} error", exc) from exc

    def patch_pod_if(self, ref: PodRef, expect: dict[str, str], changes: dict[str, str],
                     timeout_s: float) -> None:
        try:
            self.client.patch("pods", ref.name, conditional_patch(ref, expect, changes), ref.namespace,
                              content_type=JSON_PATCH, timeout_s=timeout_s, decode=False)
        except Exception as exc:
            raise _error("patch pod error", exc) from exc

    def release_lock_if(self, value: str, timeout_s: float) -> bool:
        """One request: a JSON patch that tests the lock's exact value and removes it (the API server
        applies both or nothing; 422 when the lock is gone or is another value). No GET first: the lock
        is released one round trip sooner, which is how long the next pod's /bind waits for it."""
        pointer = json_pointer("metadata", "annotations", keys.NODE_LOCK)
        ops = [{"op": "test", "path": pointer, "value": value}, {"op": "remove", "path": pointer}]
        try:
            self.client.patch("nodes", self.node_name, ops, content_type=JSON_PATCH, timeout_s=timeout_s,
                              decode=False)
        except Exception as exc:
            status = getattr(exc, "status", 0)
            if status in (404, 422):  # node gone, or the lock is not (any more) this value
                return False
            raise PodSourceError(f"release node lock error: {exc}",
                                 unknown=status in (0, None) or status >= 500) from exc
        return True

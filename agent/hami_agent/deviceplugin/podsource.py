"""Where Allocate finds pods, and how it writes back: a small interface with two implementations.

``PodSource`` keeps the allocator independent of the Kubernetes client: ``K8sPodSource`` uses the pod
(and node) informer caches of ``hami_agent.k8s`` plus short-timeout API calls; ``MemoryPodSource``
keeps pods in a dict (unit tests, benchmarks). Reads come from caches; only the fallbacks and the
write-backs touch the API, each with ``api_timeout_s``.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami_agent.protocol import keys
from hami_agent.protocol.nodelock import parse_lock_value

logger = logging.getLogger(__name__)


class PodSourceError(RuntimeError):
    """An API call on the allocation path failed or timed out (message names the call)."""


class PodSource(Protocol):
    def pods_on_node(self) -> list[dict]:
        """Pods bound to this node, from a cache (never blocks on the network)."""

    def lock_owner(self) -> tuple[str, str] | None:
        """(namespace, name) from this node's ``hami.io/mutex.lock``, from a cache; None when unknown."""

    def fetch_pod(self, namespace: str, name: str) -> dict | None:
        """Fallback: GET one pod from the API (short timeout)."""

    def fetch_lock_owner(self) -> tuple[str, str] | None:
        """Fallback: GET this node from the API (short timeout) and parse its lock."""

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        """Merge-patch pod annotations (short timeout)."""

    def release_node_lock(self, namespace: str, name: str) -> None:
        """Remove the node lock if ``namespace/name`` owns it (short timeout)."""


def owner_from_annotations(annotations: dict[str, str] | None) -> tuple[str, str] | None:
    value = (annotations or {}).get(keys.NODE_LOCK)
    if not value:
        return None
    try:
        lock = parse_lock_value(value)
    except ValueError as exc:
        logger.warning("ignoring unparsable node lock %r: %s", value, exc)
        return None
    return (lock.namespace, lock.name) if lock.has_owner else None


@dataclass
class MemoryPodSource:
    """In-memory pods and node annotations (tests and benchmarks). Records every write."""

    node_name: str
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)
    node_annotations: dict[str, str] = field(default_factory=dict)
    patches: list[tuple[str, str, dict]] = field(default_factory=list)
    released: list[tuple[str, str]] = field(default_factory=list)
    fail_writes: Exception | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_pod(self, pod: dict) -> None:
        md = pod["metadata"]
        with self._lock:
            self.pods[(md.get("namespace", "default"), md["name"])] = pod

    def pods_on_node(self) -> list[dict]:
        with self._lock:
            return [copy.deepcopy(p) for p in self.pods.values()
                    if p.get("spec", {}).get("nodeName") in (None, self.node_name)]

    def lock_owner(self) -> tuple[str, str] | None:
        return owner_from_annotations(self.node_annotations)

    def fetch_pod(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod else None

    def fetch_lock_owner(self) -> tuple[str, str] | None:
        return self.lock_owner()

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        if self.fail_writes is not None:
            raise PodSourceError(f"patch pod error: {self.fail_writes}")
        with self._lock:
            self.patches.append((namespace, name, dict(annotations)))
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise PodSourceError(f"patch pod error: pod {namespace}/{name} not found")
            ann = pod.setdefault("metadata", {}).setdefault("annotations", {})
            for k, v in annotations.items():
                if v is None:
                    ann.pop(k, None)
                else:
                    ann[k] = v

    def release_node_lock(self, namespace: str, name: str) -> None:
        if self.fail_writes is not None:
            raise PodSourceError(f"release node lock error: {self.fail_writes}")
        if self.lock_owner() == (namespace, name):
            self.node_annotations.pop(keys.NODE_LOCK, None)
        self.released.append((namespace, name))


class K8sPodSource:
    """Pods from ``hami_agent.k8s.Informer`` caches; fallbacks and writes via a short-timeout client.

    ``pod_informer``: pods with ``spec.nodeName=<node>``; ``node_informer``: this node only (optional).
    ``client``: a ``KubeClient`` created with ``timeout_s=api_timeout_s``.
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

    def lock_owner(self) -> tuple[str, str] | None:
        if self.node_informer is None:
            return None
        node = self.node_informer.get(None, self.node_name) or self.node_informer.get("", self.node_name)
        if not node:
            return None
        return owner_from_annotations((node.get("metadata") or {}).get("annotations"))

    def fetch_pod(self, namespace: str, name: str) -> dict | None:
        try:
            return self.client.get_pod(namespace, name)
        except Exception as exc:
            if type(exc).__name__ == "NotFoundError":
                return None
            raise PodSourceError(f"failed to get pending pod {namespace}/{name}: {exc}") from exc

    def fetch_lock_owner(self) -> tuple[str, str] | None:
        try:
            node = self.client.get_node(self.node_name)
        except Exception as exc:
            raise PodSourceError(f"get node error: {exc}") from exc
        return owner_from_annotations((node.get("metadata") or {}).get("annotations"))

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        try:
            self.client.patch_pod_metadata(namespace, name, annotations=annotations)
        except Exception as exc:
            raise PodSourceError(f"patch pod error: {exc}") from exc

    def release_node_lock(self, namespace: str, name: str) -> None:
        from hami_agent.k8s.nodelock import release_node_lock

        try:
            release_node_lock(self.client, self.node_name, namespace, name)
        except Exception as exc:
            raise PodSourceError(f"release node lock error: {exc}") from exc

"""SIMULATED device-plugin Allocate side, for scheduler tests that run without a kubelet simulator.

After the extender's /bind, the real device plugin finds the pod through the node lock, serves
Allocate, sets ``hami.io/bind-phase=success`` and releases ``hami.io/mutex.lock`` (Project-HAMi/HAMi
pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go ``Allocate``). This stub does only those
two API writes, for every bound pod in ``allocating`` phase, so that the next pod can take
the node lock. It does not allocate anything."""

from __future__ import annotations

import logging
import threading
from typing import Any

from hami_agent.protocol import keys

logger = logging.getLogger("tests.sim.kube_scheduler_allocator")


class AllocatorStub:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.informer: Any = None
        self.done: set[str] = set()
        self._lock = threading.Lock()

    def start(self) -> AllocatorStub:
        from hami_agent.k8s.informer import Informer

        self.informer = Informer(self.client, kind="pods", label_selector=keys.VGPU_NODE)
        self.informer.add_handler(on_add=self._on_pod, on_update=lambda _o, p: self._on_pod(p))
        self.informer.start()
        self.informer.wait_synced(10)
        return self

    def stop(self) -> None:
        if self.informer is not None:
            self.informer.stop()

    def _on_pod(self, pod: dict) -> None:
        from hami_agent.k8s.nodelock import release_node_lock

        md = pod.get("metadata") or {}
        ann = md.get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or ann.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING:
            return
        key = f"{md.get('namespace')}/{md.get('name')}"
        with self._lock:
            if key in self.done:
                return
            self.done.add(key)
        try:
            self.client.patch_pod_metadata(md["namespace"], md["name"],
                                           annotations={keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS})
            release_node_lock(self.client, node, md["namespace"], md["name"])
        except Exception as exc:
            logger.warning("allocator stub: pod %s on %s: %s", key, node, exc)

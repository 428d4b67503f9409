"""Keeps the usage cache in step with the cluster: a node informer (register annotation, cordon,
pair scores), a pod informer on pods labelled ``hami.io/vgpu-node`` (their allocations, counted by the
rules of ``podinfo``), an informer on pending pods of our scheduler (the trusted pod state /filter and
/bind read, see ``podstate``), with GPU preemption on a PodDisruptionBudget informer (``core.pdb``), and
the register loop that applies the handshake rules (Project-HAMi/HAMi
``pkg/device/devices.go`` ``CheckHealth``; usage: ``pkg/device/pods.go``) every 15 s, leader only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from hami_agent import log
from hami_agent.protocol import keys
from hami_agent.protocol.requests import RequestConfig, RequestSettings
from hami_agent.scheduler.core.dra import without_dra_managed
from hami_agent.scheduler.core.model import PodUsage
from hami_agent.scheduler.core.nodes import (
    DELETE,
    HandshakeTracker,
    annotations,
    mig_capacity,
    node_devices,
    node_extras,
)
from hami_agent.scheduler.core.pdb import Violations, budget
from hami_agent.scheduler.core.requests import RequestMemo
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.podinfo import countable_usage, is_terminated, pod_key

logger = logging.getLogger(__name__)

REGISTER_COALESCE_S = 0.25  # the register loop's pass after a node event gathers the events of this long


class ClusterSync:
    def __init__(self, client: Any, cache: UsageCache, names: RequestSettings | None = None, *,
                 is_leader: Callable[[], bool] = lambda: True, interval_s: float = 15.0,
                 now: Callable[[], datetime] = datetime.now, node_label_selector: str | None = None,
                 scheduler_name: str = "hami-scheduler", dra: Any = None, pdbs: bool = False) -> None:
        self.client = client
        self.pdbs = pdbs  # watch PodDisruptionBudgets (GPU preemption's dry run counts them; not when off)
        self.dra = dra  # hami_agent.config.DraConfig: GPUs assigned to the DRA driver are not ours
        self.scheduler_name = scheduler_name
        self.cache = cache
        self.names = names or RequestConfig()
        self._requests = RequestMemo(self.names)  # on_pod only: the pod informer delivers one event at a time
        self.is_leader = is_leader
        self.interval_s = interval_s
        self.coalesce_s = REGISTER_COALESCE_S
        self.now = now
        self.node_label_selector = node_label_selector
        self.tracker = HandshakeTracker(resource=self.names.resource_count_name)
        self.dropped: set[str] = set()  # nodes taken out by the handshake rules
        self._last_register: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._dirty: set[str] = set()  # nodes with an event since the register loop's last pass
        self._thread: threading.Thread | None = None
        self.node_informer: Any = None
        self.pod_informer: Any = None
        self.pending_informer: Any = None
        self.pdb_informer: Any = None
        self.on_freed: Callable[[str], None] | None = None  # node whose GPU capacity a pod stopped using
        # every node event, for the binds waiting on a node lock (scheduler/verbs/lockwait.py)
        self.on_node_seen: Callable[[dict], None] | None = None
        self.on_node_gone: Callable[[dict], None] | None = None
        self.on_pending_gone: Callable[[str], object] | None = None  # UID of a pending pod deleted (holds)

    # -------------------------------------------------------------------------------- lifecycle
    def start(self) -> ClusterSync:
        from hami_agent.k8s.informer import Informer

        self.node_informer = Informer(self.client, kind="nodes", label_selector=self.node_label_selector)
        self.pod_informer = Informer(self.client, kind="pods", label_selector=keys.VGPU_NODE)
        # pending pods of our scheduler: the pod state /filter and /bind trust (both field selectors are
        # supported by kube-apiserver for pods; kube-scheduler watches unassigned pods the same way)
        self.pending_informer = Informer(self.client, kind="pods", resync_s=0, name="pending-pods",
                                         field_selector=f"spec.schedulerName={self.scheduler_name},spec.nodeName=")
        self.node_informer.add_handler(on_add=self.on_node, on_update=lambda _o, n: self.on_node(n),
                                       on_delete=self.on_node_delete)
        self.pod_informer.add_handler(on_add=self.on_pod, on_update=lambda _o, p: self.on_pod(p),
                                      on_delete=self.on_pod_delete)
        self.pending_informer.add_handler(on_delete=self._pending_gone)
        self.node_informer.start()
        self.pod_informer.start()
        self.pending_informer.start()
        if self.pdbs:
            self.pdb_informer = Informer(self.client, kind="poddisruptionbudgets")
            self.pdb_informer.start()
        self._thread = threading.Thread(target=self._loop, name="register-loop", daemon=True)
        self._thread.start()
        return self

    def _informers(self) -> list[Any]:
        out = [self.node_informer, self.pod_informer, self.pending_informer]
        return [*out, self.pdb_informer] if self.pdbs else out

    def wait_synced(self, timeout: float) -> bool:
        # "is not None": an Informer has __len__, so an empty one is falsy
        if any(i is None for i in self._informers()):
            return False
        return all(i.wait_synced(timeout) for i in self._informers())

    def synced(self) -> bool:
        if any(i is None for i in self._informers()):
            return False
        return all(i.synced for i in self._informers())

    def pending_pod(self, namespace: str, name: str) -> dict | None:
        inf = self.pending_informer
        return inf.get(namespace, name) if inf is not None else None

    def pdb_violations(self) -> Violations:
        """The budgets as the PDB informer shows them now, and the victims' labels from the pod informer
        (for GPU preemption's dry run, ``core.pdb``)."""
        objs = self.pdb_informer.list() if self.pdb_informer is not None else []

        def labels_of(p: PodUsage) -> dict | None:
            pod = self.pod_informer.get(p.namespace, p.name) if self.pod_informer is not None else None
            md = (pod or {}).get("metadata") or {}
            return md.get("labels") if md.get("uid") == p.uid else None

        return Violations([budget(o) for o in objs], labels_of)

    def relist_pods(self, timeout: float) -> bool:
        """Bring the allocation informer up to the API's present (a new leader calls this first)."""
        return self.pod_informer is not None and self.pod_informer.relist(timeout)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for inf in self._informers():
            if inf is not None:
                inf.stop()
        if self._thread is not None:
            self._thread.join(5)

    # ------------------------------------------------------------------------------------ nodes
    def on_node(self, node: dict) -> None:
        name = (node.get("metadata") or {}).get("name")
        if not name:
            return
        if self.on_node_seen is not None:
            self.on_node_seen(node)
        with self._lock:
            self._dirty.add(name)
            self._register(name, node)
        self._wake.set()  # a node event triggers the register loop for this node (HAMi: on node add)

    def _register(self, name: str, node: dict) -> None:
        """The node's GPUs into the cache when its register annotation changed (caller holds the lock)."""
        if name in self.dropped:
            return
        raw = annotations(node).get(keys.NODE_REGISTER) or ""
        if raw != self._last_register.get(name):
            devs = without_dra_managed(name, node_devices(node), self.dra)
            self._last_register[name] = raw
            if not devs:
                if self.cache.remove_node(name):
                    logger.info("node %s: no GPUs registered (%s); removed from the cache", name,
                                keys.NODE_REGISTER)
                return
            self.cache.set_node(name, devs, node_extras(node), mig_capacity(devs))
            log.v(logger, 4, "node %s: %d GPUs registered", name, len(devs))
        else:
            self.cache.set_node_extras(name, node_extras(node))

    def on_node_delete(self, node: dict) -> None:
        name = (node.get("metadata") or {}).get("name")
        if self.on_node_gone is not None:
            self.on_node_gone(node)
        with self._lock:
            self._last_register.pop(name, None)
            self.dropped.discard(name)
            self.tracker.forget(name)
            self.cache.remove_node(name)

    def check_nodes(self, only: set[str] | None = None) -> None:
        """One pass of the register loop: handshake rules for every node with a register annotation
        (``only``: for these nodes alone, those an event changed)."""
        inf = self.node_informer
        if inf is None:
            return
        leader = self.is_leader()
        now = self.now()
        nodes = inf.list() if only is None else [n for n in (inf.get(None, x) for x in sorted(only)) if n]
        for node in nodes:
            name = (node.get("metadata") or {}).get("name")
            if not name or not annotations(node).get(keys.NODE_REGISTER):
                continue
            if name in self.dropped:
                if self._alloc_zero(node):
                    continue  # stays out while kubelet reports no GPUs (HAMi would flap it back in)
                logger.info("node %s: allocatable %s is back; re-adding its GPUs", name,
                            self.names.resource_count_name)
                with self._lock:
                    self.dropped.discard(name)
                    self._last_register.pop(name, None)
                self.on_node(node)
            verdict = self.tracker.check(node, now)
            if not verdict.healthy:
                logger.warning("node %s: GPU devices unhealthy (%s); removing them and deleting %s", name,
                               verdict.reason, keys.NODE_HANDSHAKE)
                with self._lock:
                    self.dropped.add(name)
                    self._last_register.pop(name, None)
                    self.cache.remove_node(name)
            if verdict.patch is not None and leader and self.is_leader():  # fencing: checked per write
                value = None if verdict.patch is DELETE else verdict.patch
                try:
                    self.client.patch_node_annotations(name, {keys.NODE_HANDSHAKE: value})
                except Exception as exc:
                    logger.error("patch node error: %s", exc)

    def _alloc_zero(self, node: dict) -> bool:
        from hami_agent.scheduler.core.nodes import allocatable_gpus

        return allocatable_gpus(node, self.names.resource_count_name) == 0

    def _loop(self) -> None:
        """Every node each ``interval_s`` (the handshake's timeouts); between, only the nodes an event
        changed: a pass over every node on each node event (two per pod: the node lock taken and
        released) made the extender's CPU per pod grow with the cluster (issue 31). A pass after an event
        waits ``coalesce_s`` first, so a burst of node events (a node locked and released within a bind)
        costs one pass, not one wake each; the handshake rules it applies run on a 15 s clock anyway."""
        next_full = 0.0
        while not self._stop.is_set():
            full = time.monotonic() >= next_full
            with self._lock:
                dirty, self._dirty = self._dirty, set()
            try:
                self.check_nodes(None if full else dirty)
            except Exception:
                logger.exception("register loop pass failed")
            if full:
                next_full = time.monotonic() + self.interval_s
            if self._wake.wait(max(0.0, next_full - time.monotonic())) and self.coalesce_s:
                self._stop.wait(self.coalesce_s)
            self._wake.clear()  # before the next swap: an event after this wakes the loop again

    # ------------------------------------------------------------------------------------- pods
    def on_pod(self, pod: dict) -> None:
        uid, _ns, _name = pod_key(pod)
        if is_terminated(pod):
            self._requests.forget(uid)
            self._freed(self.cache.observe_gone(uid))
            return
        usage, sig = countable_usage(pod, self.names, self.scheduler_name, self._requests)
        self.cache.observe(uid, usage, sig)

    def _pending_gone(self, pod: dict) -> None:
        if self.on_pending_gone is not None:
            self.on_pending_gone(pod_key(pod)[0])

    def on_pod_delete(self, pod: dict) -> None:
        uid = pod_key(pod)[0]
        self._requests.forget(uid)
        self._freed(self.cache.observe_gone(uid))

    def _freed(self, gone: Any) -> None:
        if gone is not None and gone.devices and self.on_freed is not None:
            self.on_freed(gone.node)  # scheduler/verbs/requeue.py

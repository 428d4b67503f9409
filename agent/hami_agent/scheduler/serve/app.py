"""Wiring of the scheduler process: API client, cache, informers, leader election, HTTP servers.

Used by ``cmd`` and by tests and the demo (``SchedulerApp(...).start()`` in-process)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from hami_agent.protocol import keys
from hami_agent.scheduler.serve.gctune import settle_heap
from hami_agent.scheduler.serve.guard import AllocationGuard
from hami_agent.scheduler.serve.metrics import SchedulerMetrics
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.serve.webhook import Webhook, quota_left_fn
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.confirm import GoneCheck
from hami_agent.scheduler.state.heal import Healer
from hami_agent.scheduler.state.sync import ClusterSync
from hami_agent.scheduler.verbs.events import EventSink
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from hami_agent.scheduler.verbs.leadership import (
    URL_ANNOTATION,
    Forwarder,
    ForwardSettings,
    LeaderGate,
    advertise_identity,
    default_advertise_url,
)
from hami_agent.scheduler.verbs.lockwait import NodeLockWaiter
from hami_agent.scheduler.verbs.preemption import rebuild_holds
from hami_agent.scheduler.verbs.requeue import Requeuer

logger = logging.getLogger(__name__)

AUDIT_INTERVAL_S = 60.0  # how often unconfirmed cache assumptions are checked against the API


class SchedulerApp:
    def __init__(self, client: Any, config: SchedulerConfig | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, cert_file: str | None = None, key_file: str | None = None,
                 leader_elect: bool = False, lease_namespace: str = "kube-system",
                 lease_name: str = "hami-scheduler", profiling: bool = False, max_body: int = 1 << 20,
                 metrics_bind: tuple[str, int] | None = None, register_interval_s: float = 15.0,
                 node_label_selector: str | None = None, leader_kwargs: dict | None = None,
                 tune_gc: bool = False, advertise_url: str | None = None,
                 forward: ForwardSettings | None = None, audit_interval_s: float = AUDIT_INTERVAL_S,
                 serving: dict | None = None, guard: AllocationGuard | None = None) -> None:
        self.client = client
        self.config = config or SchedulerConfig()
        self.cache = UsageCache()
        self.metrics = SchedulerMetrics(self.cache)
        self.events = EventSink(client, self.config.scheduler_name)
        self.healer = Healer()
        self.elector = None
        self.gate = LeaderGate()
        self.audit_interval_s = audit_interval_s
        if leader_elect:
            from hami_agent.k8s.leader import LeaderElector

            kw = dict(leader_kwargs or {})
            if advertise_url and "identity" not in kw:
                # the identity names the host of the URL followers forward to, which is a name the serving
                # certificate carries: a follower checks that the certificate names the Lease holder
                kw["identity"] = advertise_identity(advertise_url)
            self.elector = LeaderElector(client, lease_namespace, lease_name,
                                         on_started_leading=self.gate.started_leading,
                                         on_stopped_leading=self.gate.stopped_leading, **kw)
            self.gate.attach(self.elector, Forwarder(forward))
        self.sync = ClusterSync(client, self.cache, self.config.names, is_leader=self.gate.lease_valid,
                                interval_s=register_interval_s, node_label_selector=node_label_selector,
                                scheduler_name=self.config.scheduler_name, dra=self.config.dra,
                                pdbs=self.config.preemption != "off")
        self.gate.relist = self.sync.relist_pods  # a new leader relists before its first decision
        self.extender = Extender(self.cache, self.config, client, self.events, self.metrics,
                                 cached_pods=self.sync.pending_pod, gate=self.gate, healer=self.healer)
        # after a refusal, a GPU freed in the cache is announced to kube-scheduler (verbs/requeue.py)
        self.requeue = Requeuer(client, self.gate.lease_valid)
        self.extender.requeue = self.requeue
        self.sync.on_freed = self.requeue.freed
        self.sync.on_pending_gone = self.extender.holds.release  # a deleted preemptor holds nothing
        self.metrics.preemption_holds.set_function(lambda: len(self.extender.holds))
        if self.extender.preemption is not None:  # the dry run counts PodDisruptionBudgets (core/pdb.py)
            self.extender.preemption.pdbs = self.sync.pdb_violations
            # the dry run keeps to the namespace GPU quota as /filter does (holds use it too)
            self.extender.preemption.quota = self.extender._quota_budget
        # ... and before refusing, the few pods in the way are read back (scheduler/state/confirm.py)
        self.extender.gone_check = GoneCheck(self.cache, client)
        # a /bind meeting a busy node lock waits for its release (scheduler/verbs/lockwait.py), and /filter
        # prefers nodes without one (scheduler/state/busy.py): both read the locks of state/nodelocks.py
        self.lock_waiter = None
        if self.config.bind_lock_wait_s > 0:
            self.lock_waiter = NodeLockWaiter(self.extender.node_locks, wait_s=self.config.bind_lock_wait_s)
            self.extender.binder.waiter = self.lock_waiter

        def watched_node(name: str) -> dict | None:
            informer = self.sync.node_informer
            return informer.get(None, name) if informer is not None else None

        self.extender.binder.watched_node = watched_node
        self.extender.binder.locks_of = self.extender.node_locks.owned_by  # a bound pod's locks elsewhere

        def watched_pod(namespace: str, name: str) -> dict | None:
            informer = self.sync.pod_informer  # every pod with an assignment: a lock's owner has one
            return informer.get(namespace, name) if informer is not None else None

        self.extender.binder.watched_pod = watched_pod
        self.sync.on_node_seen = self.extender.node_locks.on_node
        self.sync.on_node_gone = self.extender.node_locks.on_node_delete
        self.webhook = Webhook(self.config, quota=quota_left_fn(self.extender),
                               namespace_labels=self._namespace_labels)
        # /validate: the admission policies' rules for clusters that cannot run them (serve/guard.py)
        self.guard = guard or AllocationGuard(scheduler_names=(self.config.scheduler_name,),
                                              names=self.config.names)
        self.server = ExtenderHTTPServer(self.extender, self.webhook, host=host, port=port,
                                         routes={"/validate": self.guard.review},
                                         cert_file=cert_file, key_file=key_file,
                                         registry=self.metrics.registry, ready=self.ready,
                                         profiling_enabled=profiling, max_body=max_body, metrics=self.metrics,
                                         # serving: extender auth, listeners, limits (scheduler/serve/cmd.py)
                                         metrics_bind=metrics_bind, **(serving or {}))
        self.advertise_url = advertise_url or default_advertise_url(host, self.server.port, bool(cert_file))
        if self.elector is not None:  # followers forward /filter and /bind to this URL while we lead
            self.elector.annotations[URL_ANNOTATION] = self.advertise_url
        self.gate.on_ready(lambda: self.healer.submit("audit-now", self._audit_once))
        # the nodes the previous leader chose for pods not bound yet are busy here too (state/busy.py)
        self.gate.on_ready(self._busy_from_pending)
        self.gate.on_ready(self._holds_from_pending)
        self.gate.on_refused = self._forward_refused
        self.lease_ref = (lease_namespace, lease_name)
        self.metrics_bind = metrics_bind
        self.tune_gc = tune_gc  # process-wide GC settings: the cmd (own process) turns it on, tests do not
        self._sync_waiter: threading.Thread | None = None
        self._stopped = threading.Event()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, config: SchedulerConfig, **kw: Any) -> SchedulerApp:
        from hami_agent.k8s.client import KubeClient

        return cls(KubeClient.from_kubeconfig(kubeconfig), config, **kw)

    def is_leader(self) -> bool:
        return self.gate.is_leader()

    def ready(self) -> bool:
        """Synced, and able to answer: the leader with relisted caches, or a follower that can forward."""
        return self.sync.synced() and (self.gate.wait_ready(0) or self.gate.can_forward())

    def _busy_from_pending(self) -> None:
        """A new leader's busy nodes: a pending pod of ours that carries an assignment was chosen by a leader
        and is not bound yet: its node is busy (a claim, which expires as its own would)."""
        informer = self.sync.pending_informer
        for pod in informer.list() if informer is not None else []:
            md = pod.get("metadata") or {}
            node = (md.get("annotations") or {}).get(keys.VGPU_NODE)
            if node and md.get("uid"):
                self.extender.busy.claim(node, md["uid"])

    def _holds_from_pending(self) -> None:
        """A new leader's preemption holds, from the pending pods' ``hami.io/preemption-hold``."""
        informer = self.sync.pending_informer
        if self.extender.preemption is None or informer is None:
            return
        n = rebuild_holds(self.extender.holds, informer.list(), time.time(), time.monotonic())
        if n:
            logger.info("preemption: %d hold(s) rebuilt from %s", n, keys.PREEMPTION_HOLD)

    def _forward_refused(self, why: str, url: str, holder: str) -> None:
        """A Warning event on the Lease: the operator sees that someone named a leader URL the followers do
        not trust (the event correlator bounds repeats to a count)."""
        ns, name = self.lease_ref
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"namespace": ns, "name": name}}
        self.events.emit(lease, "Warning", "ForwardingRefused",
                         f"follower {self.gate.identity} refused to forward kube-scheduler's requests to "
                         f"{url[:200]} (Lease holder {holder[:100] or 'none'}): {why}")

    def _namespace_labels(self, ns: str) -> dict:
        obj = self.client.get("namespaces", ns)
        return (obj.get("metadata") or {}).get("labels") or {}

    def start(self) -> SchedulerApp:
        self.events.start()
        self.requeue.start()
        self.healer.start()
        self.healer.submit("audit", self._audit, delay_s=self.audit_interval_s, deadline_s=1e12,
                           periodic=True)
        self.sync.start()
        if self.elector is not None:
            self.elector.start()
        self._sync_waiter = threading.Thread(target=self._await_sync, name="cache-sync", daemon=True)
        self._sync_waiter.start()
        self.server.start()  # every listener, the metrics one included
        return self

    def _audit(self) -> float:
        self._audit_once()
        return self.audit_interval_s

    def _audit_once(self) -> None:
        """Leader only: re-read cache assumptions the informer never confirmed, and release node locks
        whose owner no longer needs them (e.g. left by a previous leader that died mid-bind)."""
        if self.gate.lease_valid() and self.sync.node_informer is not None:
            self.extender.reconciler.audit()
            self.extender.binder.audit_locks(self.sync.node_informer.list())

    def _await_sync(self) -> None:
        while not self.sync.wait_synced(5.0):
            if self._stopped.wait(1.0):
                return
            logger.info("waiting for node and pod caches to sync")
        logger.info("node and pod caches synced: %d GPU nodes, %d GPU pods", len(self.cache.nodes),
                    len(self.cache.pods))
        if self.tune_gc:
            settle_heap()
        self.extender.synced.set()

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self._stopped.set()
        self.server.stop()
        if self.elector is not None:
            self.elector.stop()
        self.sync.stop()
        self.requeue.stop()
        if self.lock_waiter is not None:
            self.lock_waiter.stop()
        self.extender.writer.stop()  # queued assignment writes finish (each bounded by its API timeout)
        self.healer.stop()
        self.events.stop()
        if self.gate.forwarder is not None:
            self.gate.forwarder.close()

"""Wiring of the scheduler process: API client, cache, informers, leader election, HTTP servers.

Used by ``cmd`` and by tests and the demo (``SchedulerApp(...).start()`` in-process)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from hami_agent.scheduler.cache import UsageCache
from hami_agent.scheduler.events import EventSink
from hami_agent.scheduler.extender import Extender, SchedulerConfig
from hami_agent.scheduler.gctune import settle_heap
from hami_agent.scheduler.metrics import SchedulerMetrics
from hami_agent.scheduler.server import ExtenderHTTPServer
from hami_agent.scheduler.sync import ClusterSync
from hami_agent.scheduler.webhook import Webhook, quota_left_fn

logger = logging.getLogger(__name__)


class SchedulerApp:
    def __init__(self, client: Any, config: SchedulerConfig | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, cert_file: str | None = None, key_file: str | None = None,
                 leader_elect: bool = False, lease_namespace: str = "kube-system",
                 lease_name: str = "hami-scheduler", profiling: bool = False, max_body: int = 1 << 20,
                 metrics_bind: tuple[str, int] | None = None, register_interval_s: float = 15.0,
                 node_label_selector: str | None = None, leader_kwargs: dict | None = None,
                 tune_gc: bool = False, serving: dict | None = None) -> None:
        self.client = client
        self.config = config or SchedulerConfig()
        self.cache = UsageCache()
        self.metrics = SchedulerMetrics(self.cache)
        self.events = EventSink(client, self.config.scheduler_name)
        self.extender = Extender(self.cache, self.config, client, self.events, self.metrics)
        self.elector = None
        if leader_elect:
            from hami_agent.k8s.leader import LeaderElector

            self.elector = LeaderElector(client, lease_namespace, lease_name, **(leader_kwargs or {}))
        self.sync = ClusterSync(client, self.cache, self.config.names, is_leader=self.is_leader,
                                interval_s=register_interval_s, node_label_selector=node_label_selector)
        self.webhook = Webhook(self.config, quota=quota_left_fn(self.extender),
                               namespace_labels=self._namespace_labels)
        self.server = ExtenderHTTPServer(self.extender, self.webhook, host=host, port=port,
                                         cert_file=cert_file, key_file=key_file,
                                         registry=self.metrics.registry, ready=self.ready,
                                         profiling_enabled=profiling, max_body=max_body, metrics=self.metrics,
                                         # serving: extender auth, listeners, limits (scheduler/cmd.py)
                                         metrics_bind=metrics_bind, **(serving or {}))
        self.metrics_bind = metrics_bind
        self.tune_gc = tune_gc  # process-wide GC settings: the cmd (own process) turns it on, tests do not
        self._sync_waiter: threading.Thread | None = None
        self._stopped = threading.Event()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, config: SchedulerConfig, **kw: Any) -> SchedulerApp:
        from hami_agent.k8s.client import KubeClient

        return cls(KubeClient.from_kubeconfig(kubeconfig), config, **kw)

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def ready(self) -> bool:
        return self.sync.synced() and self.is_leader()

    def _namespace_labels(self, ns: str) -> dict:
        obj = self.client.get("namespaces", ns)
        return (obj.get("metadata") or {}).get("labels") or {}

    def start(self) -> SchedulerApp:
        self.events.start()
        if self.elector is not None:
            self.elector.start()
        self.sync.start()
        self._sync_waiter = threading.Thread(target=self._await_sync, name="cache-sync", daemon=True)
        self._sync_waiter.start()
        self.server.start()  # every listener, the metrics one included
        return self

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
        self.sync.stop()
        if self.elector is not None:
            self.elector.stop()
        self.events.stop()

"""A small simulated cluster for rollout tests, all in this process: the simulated API server with graceful
pod deletion, the simulated kube-scheduler (it binds pods that ask for no HAMi resource itself, so no
extender is needed), the sandbox's ReplicaSet controller, a pod runner that stands in for the kubelets
(a bound pod becomes Running and Ready after ``start_s``; a terminating pod is removed after ``stop_s``,
as a kubelet confirms a graceful deletion) and a budget monitor that sees every change of the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hami_agent.k8s.client import KubeClient
from sandbox.replicaset import ReplicaSetController
from tests.sim.apiserver import ApiServer
from tests.sim.apiserver_policy import pod_ready, selector_matches
from tests.sim.apiserver_store import HistoryEntry, resource_for_kind
from tests.sim.kube_scheduler import KubeSchedulerSim

PODS = resource_for_kind("pods")
NODES = resource_for_kind("nodes")
# not a HAMi-managed resource: the simulated kube-scheduler binds such pods without an extender, and
# the maintenance module's default prefix (nvidia.com/) still sees them as GPU pods
GPU_RESOURCE = "nvidia.com/mig-1g.10gb"


def node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpu": "on"}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def replicaset(name: str, replicas: int, gpu: bool = True, node: str | None = None) -> dict:
    """``node``: pods created already bound there (``spec.nodeName``), as a test that needs them on one
    node cannot rely on where the scheduler spreads them."""
    limits = {GPU_RESOURCE: "1"} if gpu else {"cpu": "1"}
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"schedulerName": "hami-scheduler",
                                           "terminationGracePeriodSeconds": 5,
                                           "containers": [{"name": "c", "image": "x",
                                                           "resources": {"limits": limits}}]}}}}
    if node:
        rs["spec"]["template"]["spec"]["nodeName"] = node
    return rs


def pdb(name: str, app: str, **spec: object) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}


@dataclass
class BudgetMonitor:
    """Healthy pods of one app after every change the store records (exact, not sampled)."""

    app: str
    healthy: dict[str, bool] = field(default_factory=dict)
    lowest: int | None = None
    cordoned: set[str] = field(default_factory=set)
    max_cordoned: int = 0
    armed: bool = False

    def __call__(self, e: HistoryEntry) -> None:
        if e.plural == "nodes":
            name = e.new["metadata"]["name"]
            if e.type != "DELETED" and (e.new.get("spec") or {}).get("unschedulable"):
                self.cordoned.add(name)
            else:
                self.cordoned.discard(name)
            self.max_cordoned = max(self.max_cordoned, len(self.cordoned))
            return
        if e.plural != "pods" or not selector_matches({"matchLabels": {"app": self.app}},
                                                      (e.new.get("metadata") or {}).get("labels") or {}):
            return
        key = e.new["metadata"]["uid"]
        self.healthy[key] = (e.type != "DELETED" and pod_ready(e.new)
                             and not e.new["metadata"].get("deletionTimestamp"))
        if self.armed:
            n = sum(self.healthy.values())
            self.lowest = n if self.lowest is None else min(self.lowest, n)

    def arm(self) -> None:
        self.armed = True
        self.lowest = sum(self.healthy.values())


class PodRunner:
    """Stands in for the nodes' kubelets: runs bound pods, confirms graceful deletions."""

    def __init__(self, api: ApiServer, start_s: float = 0.3, stop_s: float = 0.5) -> None:
        self.api = api
        self.start_s = start_s
        self.stop_s = stop_s
        self.stop = threading.Event()
        self._seen: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name="pod-runner", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            now = time.monotonic()
            for pod in self.api.list("pods"):
                md, spec = pod["metadata"], pod.get("spec") or {}
                key = md["uid"] + ("-stop" if md.get("deletionTimestamp") else "-start")
                if not spec.get("nodeName"):
                    continue
                first = self._seen.setdefault(key, now)
                try:
                    if md.get("deletionTimestamp") and now - first >= self.stop_s:
                        self.api.policy.delete_pod(md["namespace"], md["name"], {"gracePeriodSeconds": 0})
                    elif (not md.get("deletionTimestamp") and now - first >= self.start_s
                          and (pod.get("status") or {}).get("phase") == "Pending"):
                        self.api.patch("pods", md["namespace"], md["name"], {"status": {
                            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                            subresource="status")
                except Exception:  # noqa: BLE001 - the pod went away meanwhile
                    pass

    def __enter__(self) -> PodRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(5)


@dataclass
class Cluster:
    api: ApiServer
    client: KubeClient
    monitor: BudgetMonitor

    def pods(self, app: str) -> list[dict]:
        return [p for p in self.api.list("pods") if (p["metadata"].get("labels") or {}).get("app") == app]

    def ready_pods(self, app: str) -> list[dict]:
        return [p for p in self.pods(app) if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]

    def wait(self, pred, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if pred():
                return True
            time.sleep(0.05)
        return bool(pred())


@contextmanager
def cluster(nodes: list[str], app: str = "trainer") -> Iterator[Cluster]:
    api = ApiServer()
    api.policy.graceful_deletion = True
    monitor = BudgetMonitor(app)
    api.store.on_change.append(monitor)
    api.start()
    client = KubeClient.from_kubeconfig(api.kubeconfig_path, timeout_s=5)
    stop = threading.Event()
    rs_ctl = ReplicaSetController(client, interval_s=0.1, log=lambda _m: None)
    rs_thread = threading.Thread(target=rs_ctl.run, args=(stop,), daemon=True)
    for n in nodes:
        api.create(node(n))
    sched = KubeSchedulerSim(client, "http://127.0.0.1:9", initial_backoff_s=0.1, max_backoff_s=0.5,
                             post_events=False)
    try:
        sched.start()
        rs_thread.start()
        with PodRunner(api):
            yield Cluster(api, client, monitor)
    finally:
        stop.set()
        sched.stop()
        rs_thread.join(5)
        client.close()
        api.close()

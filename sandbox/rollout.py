"""The demo's rollout step: a driver pin change rolled over the sandbox's GPU nodes under a
PodDisruptionBudget, with a node an operator cordoned, a node that fails its gate, MIG and MPS drift on
nodes with running GPU pods, and a second run that must change nothing (docs/rollouts.md).

``BudgetWatch`` follows every change of the workload's pods and of the nodes through watches (every event,
in order: no sampling), so "the budget was never violated" and "at most ``serial`` nodes were cordoned by
the rollout at any moment" are measured, not assumed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.informer import Informer

NAMESPACE = "training"
APP = "trainer"
REPLICAS = 6
MIN_AVAILABLE = 5
NEW_DRIVER = "570.195.03"
OLD_DRIVER = "570.172.08"
MIG_NODE = "gpu-h20"  # gets MIG drift before the second run
MPS_NODE = "gpu-a100"  # gets MPS compute-mode drift before the second run
GATE_FAULT_NODE = "gpu-a100-2"  # loses a GPU: fails its NVML gate in the first run
OPERATOR_NODE = "gpu-a100-3"  # cordoned by "an operator" before the roll
CORDONED_BY = "hami.io/maintenance-cordoned-by"
FAILED_GATE = "hami.io/maintenance-failed-gate"
RUNBOOK = "hami.io/maintenance-runbook"
SERIAL = 1
ROLL_TAGS = "site_nvidia_driver,site_nvidia_mig,site_nvidia_mps"


def workload() -> tuple[dict, dict]:
    """A ReplicaSet of vGPU pods and a PodDisruptionBudget that allows one of them down at a time."""
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": APP}},
            "template": {
                "metadata": {"labels": {"app": APP}},
                "spec": {
                    "schedulerName": "hami-scheduler",
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "train",
                        "image": "registry.invalid/cuda-train:simulated",
                        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                                                 "nvidia.com/gpucores": "10"}},
                    }],
                },
            },
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {"minAvailable": MIN_AVAILABLE, "selector": {"matchLabels": {"app": APP}}},
    }
    return rs, pdb


def _ready(pod: dict) -> bool:
    md = pod.get("metadata") or {}
    if md.get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class BudgetWatch:
    """Healthy workload pods and cordoned nodes after every event the watches deliver."""

    client: KubeClient
    healthy: dict[str, bool] = field(default_factory=dict)
    by_rollout: set[str] = field(default_factory=set)
    by_anyone: set[str] = field(default_factory=set)
    armed: bool = False
    lowest: int | None = None
    violations: int = 0
    max_by_rollout: int = 0
    max_by_anyone: int = 0
    timeline: list[tuple[float, int, list[str]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _informers: list[Informer] = field(default_factory=list)

    def start(self) -> BudgetWatch:
        pods = Informer(self.client, "pods", namespace=NAMESPACE, label_selector=f"app={APP}", resync_s=0)
        nodes = Informer(self.client, "nodes", resync_s=0)
        pods.add_handler(self._pod, lambda _old, new: self._pod(new), self._pod_gone)
        nodes.add_handler(self._node, lambda _old, new: self._node(new), self._node_gone)
        self._informers = [pods.start(), nodes.start()]
        for inf in self._informers:
            inf.wait_synced(15)
        return self

    def stop(self) -> None:
        for inf in self._informers:
            inf.stop()

    def arm(self) -> None:
        with self._lock:
            self.armed = True
            self.lowest = sum(self.healthy.values())

    def _pod(self, pod: dict) -> None:
        self._set(pod["metadata"]["uid"], _ready(pod))

    def _pod_gone(self, pod: dict) -> None:
        self._set(pod["metadata"]["uid"], False)

    def _set(self, uid: str, ok: bool) -> None:
        with self._lock:
            before = sum(self.healthy.values())
            self.healthy[uid] = ok
            now = sum(self.healthy.values())
            if not self.armed:
                return
            self.lowest = now if self.lowest is None else min(self.lowest, now)
            if now < MIN_AVAILABLE <= before:
                self.violations += 1
            self._mark(now)

    def _node(self, node: dict) -> None:
        md = node.get("metadata") or {}
        name = md["name"]
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        ours = cordoned and (md.get("annotations") or {}).get(CORDONED_BY) == "hami.node"
        with self._lock:
            for group, member in ((self.by_anyone, cordoned), (self.by_rollout, ours)):
                if member:
                    group.add(name)
                else:
                    group.discard(name)
            if self.armed:
                self.max_by_rollout = max(self.max_by_rollout, len(self.by_rollout))
                self.max_by_anyone = max(self.max_by_anyone, len(self.by_anyone))
                self._mark(sum(self.healthy.values()))

    def _node_gone(self, node: dict) -> None:
        with self._lock:
            self.by_rollout.discard(node["metadata"]["name"])
            self.by_anyone.discard(node["metadata"]["name"])

    def _mark(self, healthy: int) -> None:
        if len(self.timeline) < 20000:  # bounded: a few hundred events per run are expected
            self.timeline.append((round(time.time(), 3), healthy, sorted(self.by_rollout)))


def requests_between(log: Path, t0: float, t1: float) -> list[dict]:
    """The API server's request log lines in [t0, t1]."""
    out = []
    if not log.exists():
        return out
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if t0 <= rec.get("t", 0) <= t1:
            out.append(rec)
    return out


def evictions(reqs: list[dict]) -> list[str]:
    return [r["path"] for r in reqs if r["method"] == "POST" and r["path"].endswith("/eviction")]


def sets_unschedulable(body: Any) -> bool:
    """A node write's body sets spec.unschedulable: a merge patch or object, or a JSON patch (a list of
    operations; the agents' lock writes are JSON patches)."""
    if isinstance(body, list):
        return any(isinstance(op, dict) and op.get("op") in ("add", "replace")
                   and op.get("path") == "/spec/unschedulable" and op.get("value") is True for op in body)
    if isinstance(body, dict):
        spec = body.get("spec")
        return isinstance(spec, dict) and bool(spec.get("unschedulable"))
    return False


def cordons(reqs: list[dict]) -> list[str]:
    """Node writes that set spec.unschedulable."""
    out = []
    for r in reqs:
        if r["method"] in ("PATCH", "PUT") and re.match(r"^/api/v1/nodes/[^/]+$", r["path"]):
            if sets_unschedulable(r.get("body")):
                out.append(r["path"].rsplit("/", 1)[1])
    return out


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """ansible-playbook's PLAY RECAP: {host: {ok, changed, failed, ...}}."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^(\S+)\s+:\s+(ok=.*)$", line.strip())
        if m:
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def records(directory: Path) -> dict[str, dict[str, Any]]:
    """The maintenance windows' records (node_maintenance_report_dir): {node: record}."""
    out = {}
    for f in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            rec = json.loads(f.read_text())
        except ValueError:
            continue
        out[rec.get("node", f.stem)] = rec
    return out


def batches(run: str, recs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch: nodes, evicted pods and gate results, for demo-output/report.json."""
    grouped: dict[int, dict[str, Any]] = {}
    for node, rec in sorted(recs.items(), key=lambda kv: int(kv[1].get("batch") or 0)):
        b = grouped.setdefault(int(rec.get("batch") or 0), {"run": run, "batch": int(rec.get("batch") or 0),
                                                            "nodes": [], "evicted": [], "gates": {},
                                                            "budget_refusals": 0})
        b["nodes"].append(node)
        b["evicted"] += list(rec.get("evicted") or [])
        b["budget_refusals"] += int(rec.get("budget_refusals") or 0)
        for gate, ok in (rec.get("gates") or {}).items():
            b["gates"][gate] = bool(b["gates"].get(gate, True)) and bool(ok)
        if rec.get("failed_gate"):
            b["gates"][rec["failed_gate"]] = False
            b["failed_gate"] = rec["failed_gate"]
    return [grouped[k] for k in sorted(grouped)]

"""SIMULATED ReplicaSet controller: keeps ``spec.replicas`` pods of each ``apps/v1`` ReplicaSet alive.

What kube-controller-manager's ReplicaSet controller does that a rollout depends on
(kubernetes ``pkg/controller/replicaset/replica_set.go``): pods it owns carry an ``ownerReferences``
entry with ``controller: true`` (the disruption controller counts a percentage budget against
``spec.replicas`` through it); a pod that is terminating (``deletionTimestamp``) or finished no longer
counts as active, so an evicted pod is replaced at once, while it is still shutting down; extra pods
are deleted; ``status.replicas`` / ``readyReplicas`` / ``availableReplicas`` / ``observedGeneration`` are
kept up to date. Pod creations per sync are bounded (the real controller's burst is 500).

Gaps: polls every ``interval_s`` instead of watching; no ``minReadySeconds``, no pod adoption or
release, no expectations cache, no Deployments above it.

Library: ``ReplicaSetController(client).run(stop_event)``; process:
``python -m sandbox.replicaset --kubeconfig PATH``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from hami_agent.k8s.client import KubeClient

RS_PATH = "/apis/apps/v1/replicasets"
MAX_CREATES_PER_SYNC = 20


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def controller_uid(pod: dict) -> str | None:
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def active(pod: dict) -> bool:
    """controller.FilterActivePods: not terminating, not finished."""
    return not _meta(pod).get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


def ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pod_from_template(rs: dict) -> dict:
    md = _meta(rs)
    tmpl = (rs.get("spec") or {}).get("template") or {}
    labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{md['name']}-",
            "namespace": md.get("namespace", "default"),
            "labels": labels,
            "annotations": dict((tmpl.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": md["name"],
                                 "uid": md["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": tmpl.get("spec") or {},
    }


class ReplicaSetController:
    def __init__(self, client: KubeClient, interval_s: float = 0.5, log: Any = None) -> None:
        self.client = client
        self.interval_s = interval_s
        self.log = log or (lambda msg: print(f"replicaset: {msg}", file=sys.stderr, flush=True))
        self.created = 0
        self.deleted = 0

    def sync_once(self) -> None:
        rss = self.client.call("GET", RS_PATH, verb="list", kind="replicasets").get("items") or []
        if not rss:
            return
        pods, _rv = self.client.list("pods")
        for rs in rss:
            self._sync(rs, [p for p in pods if controller_uid(p) == _meta(rs).get("uid")])

    def _sync(self, rs: dict, owned: list[dict]) -> None:
        md = _meta(rs)
        ns, name = md.get("namespace", "default"), md["name"]
        want = int((rs.get("spec") or {}).get("replicas", 1))
        live = [p for p in owned if active(p)]
        if len(live) < want:
            for _ in range(min(want - len(live), MAX_CREATES_PER_SYNC)):
                pod = self.client.create("pods", pod_from_template(rs), namespace=ns)
                self.created += 1
                self.log(f"{ns}/{name}: created pod {_meta(pod).get('name')} ({len(live) + 1}/{want})")
                live.append(pod)
        elif len(live) > want:
            # the real controller deletes unscheduled, then not-ready, then the newest pods first
            extra = sorted(live, key=lambda p: (bool((p.get("spec") or {}).get("nodeName")), ready(p),
                                                _meta(p).get("creationTimestamp", "")), )
            for pod in extra[: len(live) - want]:
                self.client.delete("pods", _meta(pod)["name"], ns)
                self.deleted += 1
                self.log(f"{ns}/{name}: deleted extra pod {_meta(pod)['name']}")
        status = {"replicas": len([p for p in owned if active(p)]),
                  "readyReplicas": len([p for p in owned if active(p) and ready(p)]),
                  "availableReplicas": len([p for p in owned if active(p) and ready(p)]),
                  "observedGeneration": int(md.get("generation") or 1)}
        if {k: (rs.get("status") or {}).get(k) for k in status} != status:
            self.client.call("PATCH", f"/apis/apps/v1/namespaces/{ns}/replicasets/{name}/status",
                             verb="patch", kind="replicaset", name=name, body={"status": status},
                             content_type="application/merge-patch+json")

    def run(self, stop: threading.Event) -> None:
        backoff = self.interval_s
        while not stop.is_set():
            try:
                self.sync_once()
                backoff = self.interval_s
            except Exception as exc:  # noqa: BLE001 - API outage: retry with backoff, never die
                self.log(f"sync failed: {exc}; retrying in {backoff:.1f}s")
                backoff = min(backoff * 2, 10.0)
            stop.wait(backoff)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.replicaset", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    client = KubeClient.from_kubeconfig(args.kubeconfig, timeout_s=5)
    ReplicaSetController(client, args.interval).run(stop)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SIMULATED kubelet for one sandbox node: the device manager of tests/sim/kubelet/ plus the two things a
real kubelet also does that the scheduler and the demo need:

* node status: ``status.capacity`` / ``status.allocatable`` of every device-plugin resource (counts of
  registered / Healthy devices, as the kubelet reports them), cpu/memory/pods, and the Ready condition,
  patched on change (at most every second) -- the scheduler's handshake needs
  ``allocatable[nvidia.com/gpu] > 0``;
* pod lifecycle: pods bound to this node are admitted one at a time (device manager: GetPreferredAllocation,
  Allocate); an admitted pod becomes ``Running`` (no container is started: there is no container
  runtime), a rejected one ``Failed`` with reason ``UnexpectedAdmissionError`` like the real kubelet; a
  pod being deleted gracefully (``deletionTimestamp``) is "stopped" after ``--termination-delay`` seconds
  (at most its grace period), its devices released, and its deletion confirmed with grace period 0, as
  the real kubelet does once the containers are gone; a deleted pod's devices are released.

Every admission result (with the Allocate envs and mounts each container received) is appended as one
JSON line to ``--results``; the demo reads it to show what each container got.

``python -m sandbox.node_sim --kubeconfig K --node-name N --root DIR --results FILE [-v 4]``
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

from hami_agent.k8s.client import KubeClient
from tests.sim.kubelet import AdmissionResult, SimulatedKubelet

BASE_CAPACITY = {"cpu": "64", "memory": "515396075520", "pods": "110", "ephemeral-storage": "1000Gi"}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeSim:
    def __init__(self, kubelet: SimulatedKubelet, client: KubeClient, node: str, results: str | None,
                 termination_delay_s: float = 1.0) -> None:
        self.kubelet = kubelet
        self.client = client
        self.node = node
        self.results = results
        self.termination_delay_s = termination_delay_s
        self._terminating: dict[str, float] = {}  # uid -> when we saw its deletionTimestamp
        self.stop = threading.Event()
        self._reported: dict[str, str] | None = None
        self._seen: dict[str, dict] = {}  # uid -> pod (admission submitted)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ node status
    def resources(self) -> tuple[dict[str, str], dict[str, str]]:
        cap, alloc = dict(BASE_CAPACITY), dict(BASE_CAPACITY)
        for res in sorted(self.kubelet.endpoints):
            cap[res] = str(self.kubelet.capacity(res))
            alloc[res] = str(self.kubelet.allocatable(res))
        return cap, alloc

    def sync_node(self) -> None:
        cap, alloc = self.resources()
        key = json.dumps([cap, alloc], sort_keys=True)
        if self._reported is not None and self._reported.get("key") == key:
            return
        gone = {}
        if self._reported is not None:
            old = json.loads(self._reported["key"])[0]
            gone = {r: None for r in old if r not in cap}
        status = {
            "capacity": {**gone, **cap},
            "allocatable": {**gone, **alloc},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status (simulated)",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                }
            ],
        }
        self.client.patch("nodes", self.node, {"status": status}, subresource="status")
        self._reported = {"key": key}
        gpu = alloc.get("nvidia.com/gpu", "0")
        print(
            f"node_sim: node {self.node} status synced: allocatable nvidia.com/gpu={gpu} "
            f"{ {k: v for k, v in alloc.items() if k.startswith('nvidia.com/mig-')} }",
            file=sys.stderr,
            flush=True,
        )

    # ------------------------------------------------------------------------------ pods
    def poll_pods(self) -> None:
        pods = self.client.list_pods(field_selector=f"spec.nodeName={self.node}")
        live = set()
        for pod in pods:
            md = pod.get("metadata") or {}
            uid = md.get("uid") or md.get("name")
            live.add(uid)
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if md.get("deletionTimestamp"):
                self._terminate(pod, uid)
                continue
            with self._lock:
                new = uid not in self._seen
                if new and phase == "Pending":
                    self._seen[uid] = pod
            if new and phase == "Pending":
                fut = self.kubelet.submit(pod)
                fut.add_done_callback(lambda f, p=pod: self._admitted(p, f.result()))
        with self._lock:
            for uid in [u for u in self._terminating if u not in live]:
                self._terminating.pop(uid, None)
            for uid in [u for u in self._seen if u not in live]:
                self._seen.pop(uid, None)
                self.kubelet.release(uid)

    def _terminate(self, pod: dict, uid: str) -> None:
        """Graceful deletion: stop the pod (nothing runs: just wait a little), then confirm it."""
        md = pod["metadata"]
        first = self._terminating.setdefault(uid, time.monotonic())
        grace = float(md.get("deletionGracePeriodSeconds") or 0)
        if time.monotonic() - first < min(self.termination_delay_s, grace):
            return
        with self._lock:
            if self._seen.pop(uid, None) is not None:
                self.kubelet.release(uid)
        ns = md.get("namespace", "default")
        try:
            self.client.delete("pods", md["name"], ns, uid=md.get("uid"), grace_period_s=0)
        except Exception as exc:  # noqa: BLE001 - gone already, or retried on the next poll
            print(f"node_sim: confirming the deletion of {ns}/{md['name']}: {exc}", file=sys.stderr,
                  flush=True)
            return
        self._terminating.pop(uid, None)
        print(f"node_sim: pod {ns}/{md['name']} terminated", file=sys.stderr, flush=True)

    def _admitted(self, pod: dict, r: AdmissionResult) -> None:
        md = pod["metadata"]
        if self.results:
            with open(self.results, "a") as fh:
                fh.write(
                    json.dumps(
                        {
                            "node": self.node,
                            "pod": r.pod,
                            "uid": r.uid,
                            "admitted": r.admitted,
                            "reason": r.reason,
                            "message": r.message,
                            "allocations": r.allocations,
                            "duration_s": round(r.duration_s, 6),
                            "time": time.time(),
                        }
                    )
                    + "\n"
                )
        try:
            if r.admitted:
                names = [c["name"] for c in pod["spec"].get("containers") or []]
                status: dict[str, Any] = {
                    "phase": "Running",
                    "startTime": _now(),
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
                    "containerStatuses": [
                        {
                            "name": n,
                            "ready": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": _now()}},
                        }
                        for n in names
                    ],
                }
                self.client.patch_pod_status(md.get("namespace", "default"), md["name"], status)
                self.client.create_event(
                    pod,
                    "Normal",
                    "Started",
                    "Started containers (simulated: devices allocated, no container runtime)",
                    "kubelet",
                )
            else:
                self.client.patch_pod_status(
                    md.get("namespace", "default"),
                    md["name"],
                    {"phase": "Failed", "reason": r.reason, "message": f"Pod was rejected: {r.message}"},
                )
                self.client.create_event(
                    pod, "Warning", r.reason or "UnexpectedAdmissionError", r.message or "", "kubelet"
                )
        except Exception as exc:  # noqa: BLE001 - the pod may be gone; keep admitting others
            print(f"node_sim: pod status update for {r.pod} failed: {exc}", file=sys.stderr, flush=True)

    def run(self, wait_resource: str, wait_timeout: float) -> None:
        end = time.monotonic() + wait_timeout
        while not self.stop.is_set() and time.monotonic() < end:
            if self.kubelet.wait_registered(wait_resource, 0.2):
                break
        backoff = 0.5
        while not self.stop.is_set():
            try:
                self.sync_node()
                self.poll_pods()
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - API outage: retry with backoff
                print(
                    f"node_sim: API call failed: {exc}; retrying in {backoff:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            self.stop.wait(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.node_sim", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--node-name", required=True)
    p.add_argument("--root", required=True, help="device-plugin directory (kubelet.sock is created here)")
    p.add_argument("--results", help="append one JSON line per admission here")
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=4)
    p.add_argument("--wait-resource", default="nvidia.com/gpu")
    p.add_argument("--wait-timeout", type=float, default=60.0)
    p.add_argument("--termination-delay", type=float, default=1.0,
                   help="seconds a pod being deleted takes to stop (at most its grace period)")
    args = p.parse_args(argv)
    kubelet = SimulatedKubelet(args.root, args.verbosity, sys.stderr, node_name=args.node_name)
    client = KubeClient.from_kubeconfig(args.kubeconfig, timeout_s=5)
    sim = NodeSim(kubelet, client, args.node_name, args.results, args.termination_delay)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sim.stop.set())
    kubelet.start()
    try:
        sim.run(args.wait_resource, args.wait_timeout)
    finally:
        # the admission thread may be stuck in an RPC without deadline (that is the point of seed 003):
        # do not wait for it
        threading.Thread(target=kubelet.close, daemon=True).start()
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

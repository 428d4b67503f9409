"""SIMULATED API server and kubelet (with its DRA manager) for the molecule `dra` scenario: not a
kube-apiserver, not a kubelet.

Runs tests/sim (copied to /opt/hami-sim on the test node): the API server on a fixed loopback port with the
node object, and the kubelet simulator whose DRA manager watches /var/lib/kubelet/plugins_registry (the
plugin watcher), registers hami-dra and wipes the node's ResourceSlices at start, as a kubelet does. A pod
loop plays the kubelet's pod worker: every Pending pod bound to this node is admitted once (DRA
NodePrepareResources before its containers), its phase is patched, and the admission result (with each
container's CDI device IDs) is appended as one JSON line to --results, for verify.yml to read. The store is
in memory: a restart forgets every object (the node is re-created, the driver publishes again).
"""

import argparse
import json
import os
import signal
import sys
import threading

sys.path.insert(0, "/opt/hami-sim")

from hami_agent.k8s.client import KubeClient  # noqa: E402
from tests.sim.apiserver import ApiServer  # noqa: E402
from tests.sim.kubelet import SimulatedKubelet  # noqa: E402
from tests.sim.kubelet.kubelet import AdmissionResult  # noqa: E402


def run_pods(kubelet: SimulatedKubelet, client: KubeClient, node: str, results: str,
             stop: threading.Event) -> None:
    """Admit each Pending pod bound to ``node`` once (polled every 0.5 s); a failed list waits 1 s."""
    seen: set[str] = set()
    while not stop.is_set():
        try:
            pods = client.list_pods(field_selector=f"spec.nodeName={node}")
        except Exception as exc:  # noqa: BLE001 - API outage: next round
            print(f"list pods failed: {exc}", file=sys.stderr, flush=True)
            stop.wait(1.0)
            continue
        for pod in pods:
            md = pod["metadata"]
            if md["uid"] in seen or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            seen.add(md["uid"])
            r: AdmissionResult = kubelet.submit(pod).result(timeout=120)
            phase = {"phase": "Running"} if r.admitted else {"phase": "Failed", "reason": r.reason,
                                                              "message": r.message[:1000]}
            try:
                client.patch_pod_status(md.get("namespace", "default"), md["name"], phase)
            except Exception as exc:  # noqa: BLE001 - the pod may be gone
                print(f"pod status failed: {exc}", file=sys.stderr, flush=True)
            with open(results, "a") as fh:
                fh.write(json.dumps({"pod": r.pod, "uid": r.uid, "admitted": r.admitted, "reason": r.reason,
                                     "message": r.message, "dra": r.dra}) + "\n")
        stop.wait(0.5)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--results", default="/run/hami-sim/admissions.jsonl")
    args = p.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    api = ApiServer(port=args.port).start()
    api.create({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": args.node, "labels": {"kubernetes.io/hostname": args.node}}})
    os.makedirs("/var/lib/kubelet/device-plugins", exist_ok=True)
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    kubelet = SimulatedKubelet("/var/lib/kubelet/device-plugins", node_name=args.node, dra_client=client,
                               dra_root="/var/lib/kubelet").start()
    pods = threading.Thread(target=run_pods, args=(kubelet, client, args.node, args.results, stop),
                            name="pod-worker", daemon=True)
    pods.start()
    print(f"simulated API server on {api.url}, kubelet (DRA) for node {args.node}", flush=True)
    stop.wait()
    pods.join(5.0)
    kubelet.close()
    api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

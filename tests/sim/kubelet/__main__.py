"""``python -m tests.sim.kubelet --root DIR [-v 4] [--pods pods.json] [--kubeconfig K --node-name N]``:
the SIMULATED kubelet as a process (SIGHUP restarts it, SIGTERM ends it)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from tests.sim.kubelet.kubelet import AdmissionResult, SimulatedKubelet


def _poll_api(kubelet: SimulatedKubelet, kubeconfig: str, node: str, stop: threading.Event) -> None:
    """Admit pods bound to ``node`` (polls the API server every 0.5 s)."""
    from hami_agent.k8s.client import KubeClient

    client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=5)
    seen: set[str] = set()
    while not stop.is_set():
        try:
            pods = client.list_pods(field_selector=f"spec.nodeName={node}")
        except Exception as exc:
            kubelet.log.log(0, "kubelet.go:2200", "list pods failed", err=str(exc), severity="E")
            stop.wait(1.0)
            continue
        for pod in pods:
            uid = pod.get("metadata", {}).get("uid") or pod["metadata"]["name"]
            if uid not in seen and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                seen.add(uid)
                kubelet.submit(pod)
        stop.wait(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.sim.kubelet",
        description="SIMULATED kubelet device manager (device plugin API v1beta1)",
    )
    p.add_argument("--root", required=True, help="device-plugin directory (kubelet.sock is created here)")
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=4, help="klog verbosity (default 4)")
    p.add_argument(
        "--pods", help="JSON file with a list of pods to admit once their resources are registered"
    )
    p.add_argument(
        "--wait-resources",
        default="nvidia.com/gpu",
        help="comma list of resources to wait for before admitting pods (default nvidia.com/gpu)",
    )
    p.add_argument("--wait-timeout", type=float, default=30.0)
    p.add_argument("--results", help="append one JSON line per admission result to this file")
    p.add_argument("--kubeconfig", help="poll this API server for pods bound to --node-name and admit them")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", "sim-node"))
    p.add_argument("--exit-after-pods", action="store_true", help="exit when all --pods are admitted")
    args = p.parse_args(argv)

    kubelet = SimulatedKubelet(args.root, args.verbosity, sys.stderr, node_name=args.node_name)
    stop = threading.Event()

    def write_result(r: AdmissionResult) -> None:
        line = json.dumps(
            {
                "pod": r.pod,
                "uid": r.uid,
                "admitted": r.admitted,
                "reason": r.reason,
                "message": r.message,
                "allocations": r.allocations,
                "duration_s": round(r.duration_s, 6),
            }
        )
        if args.results:
            with open(args.results, "a") as fh:
                fh.write(line + "\n")
        else:
            print(line, flush=True)

    kubelet.on_result = write_result
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=kubelet.restart, daemon=True).start())
    kubelet.start()
    # like a kubelet whose device plugins come up first: wait for them before admitting anything
    for res in filter(None, args.wait_resources.split(",")):
        end = time.monotonic() + args.wait_timeout
        while not stop.is_set() and time.monotonic() < end and not kubelet.wait_registered(res, 0.2):
            pass
        if not stop.is_set() and not kubelet.wait_registered(res, 0):
            kubelet.log.log(
                0, "manager.go:300", "resource not registered in time", resource=res, severity="E"
            )
    if args.kubeconfig:
        threading.Thread(
            target=_poll_api, args=(kubelet, args.kubeconfig, args.node_name, stop), daemon=True
        ).start()
    futures = []
    if args.pods:
        with open(args.pods) as fh:
            pods = json.load(fh)
        futures = [kubelet.submit(pod) for pod in pods]
    while not stop.is_set():
        if args.exit_after_pods and futures and all(f.done() for f in futures):
            break
        stop.wait(0.2)
    kubelet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SIMULATED Kubernetes API server for the molecule `agent` scenario (not a kube-apiserver).

Runs tests/sim/apiserver.py (copied to /opt/hami-sim on the test node) on a fixed loopback port and seeds
the node object, so hami-device-plugin can watch pods and patch its register annotation as on a real
node. The store is in memory: a restart forgets every object (the node is re-created).
"""

import argparse
import signal
import sys
import threading

sys.path.insert(0, "/opt/hami-sim")

from tests.sim.apiserver import ApiServer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--node", required=True)
    args = p.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    api = ApiServer(port=args.port).start()
    api.create({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": args.node, "labels": {"kubernetes.io/hostname": args.node}}})
    print(f"simulated API server on {api.url} with node {args.node}", flush=True)
    stop.wait()
    api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

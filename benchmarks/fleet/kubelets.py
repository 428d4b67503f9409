"""SIMULATED kubelets for a whole fleet in one process: ``python -m benchmarks.fleet.kubelets``.

One ``tests.sim.kubelet.SimulatedKubelet`` per node (the device manager: ``kubelet.sock``, registration,
ListAndWatch over the node's bind-mounted ``/var/lib/kubelet/device-plugins``), and the node status the
sandbox's ``node_sim`` writes (capacity/allocatable of every registered resource, Ready), patched on change
from one loop. What it leaves out against ``sandbox/node_sim.py`` (one process per node there): pod
admission and termination -- a converged run has no pods to admit, and 100 processes polling their pods
every 0.5 s would load the API server the benchmark measures. Requests carry the User-Agent component
``fleet-kubelets`` so the benchmark can tell them from Ansible's and the agents'.

``--nodes NAME=DIR,...`` (or ``--nodes-file``: one ``NAME DIR`` a line); writes ``--ready-file`` once every
kubelet listens; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import threading
import time

from hami_agent.k8s.client import KubeClient
from sandbox.node_sim import NodeSim
from tests.sim.kubelet import SimulatedKubelet


def parse_nodes(text: str) -> list[tuple[str, str]]:
    """``NAME DIR`` lines (or ``NAME=DIR`` items separated by commas) -> [(name, dir)]."""
    out = []
    for raw in text.replace(",", "\n").splitlines():
        item = raw.strip()
        if not item:
            continue
        name, _, path = item.partition("=") if "=" in item else item.partition(" ")
        out.append((name.strip(), path.strip()))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet.kubelets", description=__doc__.splitlines()[0]
    )
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", default="")
    p.add_argument("--nodes-file")
    p.add_argument("--ready-file")
    p.add_argument("--sync-interval", type=float, default=2.0)
    p.add_argument("-v", type=int, default=0, help="klog verbosity of the kubelets (stderr)")
    args = p.parse_args(argv)
    nodes = parse_nodes(args.nodes)
    if args.nodes_file:
        with open(args.nodes_file) as fh:
            nodes += parse_nodes(fh.read())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    client = KubeClient.from_kubeconfig(args.kubeconfig, timeout_s=5, component="fleet-kubelets")
    stream = sys.stderr if args.v > 0 else io.StringIO()
    sims = []
    for name, root in nodes:
        kubelet = SimulatedKubelet(root, args.v, stream, node_name=name).start()
        sims.append(NodeSim(kubelet, client, name, None))
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{os.getpid()} {len(sims)}\n")
        os.replace(tmp, args.ready_file)
    print(f"fleet-kubelets: {len(sims)} SIMULATED kubelets listening", file=sys.stderr, flush=True)
    backoff = args.sync_interval
    while not stop.wait(backoff):
        backoff = args.sync_interval
        for sim in sims:
            if stop.is_set():
                break
            if not sim.kubelet.endpoints:
                continue  # nothing registered yet: the real kubelet reports no device resources either
            try:
                sim.sync_node()
            except Exception as exc:  # noqa: BLE001 - API outage: retry on the next round, later
                print(f"fleet-kubelets: status of {sim.node}: {exc}", file=sys.stderr, flush=True)
                backoff = min(10.0, args.sync_interval * 4)
    # an RPC without deadline may hang a close: never wait for it
    for sim in sims:
        threading.Thread(target=sim.kubelet.close, daemon=True).start()
    time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scheduler extender benchmark: /filter latency and throughput at 500 and 5,000 nodes.

Setup (per size): N simulated nodes x 8 GPUs (80 GiB, 10 slots) and 4 running pods per node placed
directly in the usage cache (no API server: the cache is what /filter reads). Each measured request
is a real HTTP POST of kube-scheduler's ExtenderArgs (the pod + every node name) to the real /filter
handler over keep-alive, and every successful filter reserves the pod (so the cache keeps changing,
as in production). The pod annotation patch is skipped (no API client): its cost is the API
server's, not ours. The extender takes the pod's state from its pending-pod informer (not from the
request body), so every measured pod is in a dict behind a lock, as the informer's cache is.

"bare" is the same HTTP server with a /filter that only parses the same body and answers the same
result shape: the floor any extender pays. Figures are printed, never asserted.

Run: ``python -m benchmarks.scheduler.bench`` (or ``make bench``); ``--quick`` for a short run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time

from hami_agent.scheduler.cache import UsageCache, collapse
from hami_agent.scheduler.extender import Extender, SchedulerConfig
from hami_agent.scheduler.gctune import settle_heap
from hami_agent.scheduler.model import DeviceUsage, Picked, PodUsage
from hami_agent.scheduler.server import ExtenderHTTPServer

GPUS_PER_NODE = 8
PODS_PER_NODE = 4
SHAPES = [  # (gpus, gpumem MiB, gpucores)
    (1, 8000, 10), (1, 16000, 25), (1, 4000, 0), (2, 10000, 20), (1, 20000, 50), (1, 2000, 0),
]


def build_cache(n_nodes: int, rng: random.Random) -> UsageCache:
    cache = UsageCache()
    for i in range(n_nodes):
        name = f"gpu-node-{i:05d}"
        devs = [DeviceUsage(id=f"GPU-{i:05d}-{g}", index=g, type="NVIDIA-A100-SXM4-80GB", count=10,
                            totalmem=81920, totalcore=100, numa=g // 4, health=True, mode="hami-core")
                for g in range(GPUS_PER_NODE)]
        cache.set_node(name, devs)
        for k in range(PODS_PER_NODE):
            g = rng.randrange(GPUS_PER_NODE)
            mem, cores = rng.choice(((4000, 10), (8000, 20), (16000, 0), (2000, 5)))
            cache.add_pod(PodUsage(uid=f"run-{i}-{k}", namespace="default", name=f"run-{i}-{k}", node=name,
                                   devices=collapse([[Picked(devs[g].id, "NVIDIA", mem, cores)]], 0)))
    return cache


def pod_json(j: int, shape: tuple[int, int, int]) -> dict:
    gpus, mem, cores = shape
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"bench-{j}", "namespace": "default", "uid": f"bench-uid-{j}",
                         "labels": {"app": "bench"}, "annotations": {}},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{
                "name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                "command": ["python", "train.py"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(mem),
                                         "nvidia.com/gpucores": str(cores), "cpu": "4", "memory": "16Gi"}}}]},
            "status": {"phase": "Pending"}}


def bare_filter(args: dict) -> dict:
    """Parse-and-answer floor: what any extender must do with the same request."""
    names = args.get("NodeNames") or []
    pod = args.get("Pod") or {}
    _ = pod.get("metadata", {}).get("name")
    return {"Nodes": None, "NodeNames": names[:1], "FailedNodes": None, "FailedAndUnresolvableNodes": None,
            "Error": ""}


def _post(conn: http.client.HTTPConnection, body: bytes) -> float:
    t0 = time.perf_counter()
    conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    dt = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"/filter answered {resp.status}: {data[:200]!r}")
    return dt


def run_requests(port: int, bodies: list[bytes],
                 bare_port: int | None = None) -> tuple[list[float], list[float]]:
    """POST every body to ``port``; with ``bare_port``, the same body right after to the bare server, so
    both series see the same machine noise (the development machine's CPUs are shared)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    bare = http.client.HTTPConnection("127.0.0.1", bare_port, timeout=60) if bare_port else None
    lat: list[float] = []
    bare_lat: list[float] = []
    for b in bodies:
        lat.append(_post(conn, b))
        if bare is not None:
            bare_lat.append(_post(bare, b))
    conn.close()
    if bare is not None:
        bare.close()
    return lat, bare_lat


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def bench_size(n_nodes: int, n_requests: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    cache = build_cache(n_nodes, rng)
    build_s = time.perf_counter() - t0
    settle_heap()  # what `hami-agent scheduler` does once its caches are synced
    informer: dict[tuple[str, str], dict] = {}  # the pending-pod informer's cache, as the extender reads it
    informer_lock = threading.RLock()

    def cached_pod(ns: str, name: str) -> dict | None:
        with informer_lock:
            return informer.get((ns, name))

    ext = Extender(cache, SchedulerConfig(event_nodes=0), cached_pods=cached_pod)
    ext.synced.set()
    srv = ExtenderHTTPServer(ext, None, port=0).start()
    bare = ExtenderHTTPServer(routes={"/filter": bare_filter}, port=0).start()
    names = sorted(cache.nodes)
    try:
        # warm-up: one request per shape fills the fit memo (a "cold" request fits every node)
        warm_pods = [pod_json(-1 - k, s) for k, s in enumerate(SHAPES)]
        pods = [pod_json(j, rng.choice(SHAPES)) for j in range(n_requests)]
        for p in warm_pods + pods:
            informer[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
        warm = [json.dumps({"Pod": p, "NodeNames": names}).encode() for p in warm_pods]
        cold, _ = run_requests(srv.port, warm)
        bodies = [json.dumps({"Pod": p, "NodeNames": names}).encode() for p in pods]
        t1 = time.perf_counter()
        lat, _ = run_requests(srv.port, bodies[: len(bodies) // 2])
        wall = time.perf_counter() - t1  # throughput: filter calls back to back
        lat2, bare_lat = run_requests(srv.port, bodies[len(bodies) // 2:], bare.port)
        lat += lat2
    finally:
        srv.stop()
        bare.stop()
    mean, bare_mean = statistics.mean(lat), statistics.mean(bare_lat)
    return {"nodes": n_nodes, "gpus": n_nodes * GPUS_PER_NODE, "running_pods": n_nodes * PODS_PER_NODE,
            "requests": n_requests, "build_s": build_s, "body_kib": len(bodies[0]) / 1024,
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "mean_ms": mean * 1e3,
            "pods_per_s": (n_requests // 2) / wall, "cold_max_ms": max(cold) * 1e3,
            "bare_p50_ms": pct(bare_lat, 0.5) * 1e3, "bare_p99_ms": pct(bare_lat, 0.99) * 1e3,
            "ratio_p50": pct(lat, 0.5) / pct(bare_lat, 0.5), "ratio_mean": mean / bare_mean,
            "pods_in_cache": len(cache.pods)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    n = args.requests or (200 if args.quick else 2000)
    results = [bench_size(500, n), bench_size(5000, n)]
    small, big = results
    growth = big["p99_ms"] / small["p99_ms"]
    bare_growth = big["bare_p99_ms"] / small["bare_p99_ms"]
    if args.json:
        print(json.dumps({"sizes": results, "p99_growth_500_to_5000": growth,
                          "bare_p99_growth_500_to_5000": bare_growth}, indent=2))
        return 0
    print("scheduler extender /filter benchmark (SIMULATED cluster in the usage cache, real HTTP handler)")
    hdr = (f"{'nodes':>6} {'GPUs':>6} {'pods':>6} {'body KiB':>8} {'p50 ms':>7} {'p99 ms':>7} {'pods/s':>7} "
           f"{'bare p50':>8} {'bare p99':>8} {'x bare p50':>10} {'x bare mean':>11} {'cold ms':>8}")
    print(hdr)
    for r in results:
        print(f"{r['nodes']:>6} {r['gpus']:>6} {r['running_pods']:>6} {r['body_kib']:>8.1f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['pods_per_s']:>7.1f} {r['bare_p50_ms']:>8.2f} "
              f"{r['bare_p99_ms']:>8.2f} {r['ratio_p50']:>10.2f} {r['ratio_mean']:>11.2f} "
              f"{r['cold_max_ms']:>8.1f}")
    print(f"p99 growth 500 -> 5000 nodes: {growth:.2f}x (goal < 2x; the bare parse-and-answer floor grew "
          f"{bare_growth:.2f}x in the same run); filter/bare at 5000 nodes: {big['ratio_p50']:.2f}x p50, "
          f"{big['ratio_mean']:.2f}x mean (goal <= 3x)")
    print("cold = first request of a new request shape (fits every node once; later requests of that "
          "shape re-fit only nodes whose usage changed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

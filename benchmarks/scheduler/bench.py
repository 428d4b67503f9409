"""Scheduler extender benchmark: /filter latency of a realistic request trace at 500 and 5,000 nodes.

Setup (per size): a SIMULATED fleet of N nodes x 8 GPUs in the usage cache (A100 and H100 nodes with
0-12 running pods each, and A100 nodes in dynamic-MIG mode; ``trace.py``) — no API server: the cache is
what /filter reads. The trace: a few thousand requests drawn with a Zipf popularity from 240 distinct pod
shapes (1-8 GPUs, memory in MiB or percent, gpucores, exclusive, MIG profiles, init containers, NUMA and
policy annotations). Each request is a real HTTP POST of kube-scheduler's ExtenderArgs (the pod + every
node name) to the real /filter handler over keep-alive; every successful filter reserves the pod (the
cache keeps changing, as in production). The pod's state comes from the pending-pod informer's cache (a
dict behind a lock), as in production; the annotation patch is skipped (no API client: its cost is the
API server's); the events go through the production event sink (10 events/s, burst 50, a queue of
10,000, correlator) whose worker builds each message (the FilteringSucceed counts are completed there)
and then drops it instead of posting it.

A request is *cold* when its shape had no fit memo (first seen, or evicted from the shape LRU), else
*warm*. "bare" is the same HTTP server with a /filter that only parses the body and answers the same
result shape: the floor any extender pays. RSS is this process's after the 5,000-node run. Figures are
printed, never asserted.

Run: ``python -m benchmarks scheduler`` (or ``make bench``); ``--quick`` for a short run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time

from benchmarks import goals
from benchmarks.scheduler.trace import GPUS_PER_NODE
from hami_agent.scheduler.serve.gctune import settle_heap
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.state.busy import BusyNodes
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig


def bare_filter(args: dict) -> dict:
    """Parse-and-answer floor: what any extender must do with the same request."""
    names = args.get("NodeNames") or []
    pod = args.get("Pod") or {}
    _ = pod.get("metadata", {}).get("name")
    return {
        "Nodes": None,
        "NodeNames": names[:1],
        "FailedNodes": None,
        "FailedAndUnresolvableNodes": None,
        "Error": "",
    }


FITS_NOWHERE: list[bool] = []  # per request of the last run_requests: answered FailedNodes (fits nowhere)


def _post(conn: http.client.HTTPConnection, body: bytes) -> float:
    t0 = time.perf_counter()
    conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    dt = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"/filter answered {resp.status}: {data[:200]!r}")
    FITS_NOWHERE.append(bool(json.loads(data).get("FailedNodes")))  # after the clock stopped
    return dt


def run_requests(
    port: int, bodies: list[bytes], bare_port: int | None = None
) -> tuple[list[float], list[float]]:
    """POST every body to ``port``; with ``bare_port``, the same body right after to the bare server, so
    both series see the same machine noise (the development machine's CPUs are shared)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    bare = http.client.HTTPConnection("127.0.0.1", bare_port, timeout=60) if bare_port else None
    lat: list[float] = []
    bare_lat: list[float] = []
    FITS_NOWHERE.clear()
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


class _NoApi:
    """Events go nowhere (their API cost is the API server's), but they are built: the FilteringSucceed
    counts are completed on the event thread, as in production."""

    def create_event(self, *_a: object, **_k: object) -> None:
        return None


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def bench_size(n_nodes: int, requests: list, seed: int = 1) -> dict:
    """The trace against a fleet of ``n_nodes``; each request is cold when its shape (request, context)
    had no fit memo yet."""
    from benchmarks.scheduler.trace import build_fleet
    from hami_agent.scheduler.state.cache import UsageCache
    from hami_agent.scheduler.verbs.events import EventSink

    t0 = time.perf_counter()
    cache = build_fleet(n_nodes, seed)
    build_s = time.perf_counter() - t0
    settle_heap()  # what `hami-agent scheduler` does once its caches are synced
    informer: dict[tuple[str, str], dict] = {}  # the pending-pod informer's cache, as the extender reads it
    informer_lock = threading.RLock()

    def cached_pod(ns: str, name: str) -> dict | None:
        with informer_lock:
            return informer.get((ns, name))

    sink = EventSink(_NoApi(), "hami-scheduler")  # the production sink: 10 events/s, burst 50, 10,000 queued
    sink.start()
    ext = Extender(cache, SchedulerConfig(event_nodes=50), events=sink, cached_pods=cached_pod)
    # no /bind follows here: each pod is taken as bound at once (kube-scheduler binds right after /filter)
    ext.busy = BusyNodes(claim_ttl_s=0.0)
    ext.synced.set()
    cold_flags: list[bool] = []
    real_decide = UsageCache.decide

    def decide(self, names, preq, ctx, quota=None, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        cold_flags.append(quota is None and (preq, ctx) not in self._memo)
        return real_decide(self, names, preq, ctx, quota, *a, **kw)

    srv = ExtenderHTTPServer(ext, None, port=0).start()
    bare = ExtenderHTTPServer(routes={"/filter": bare_filter}, port=0).start()
    names = sorted(cache.nodes)
    pods = [shape.pod(j) for j, shape in enumerate(requests)]
    for p in pods:
        informer[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
    bodies = [json.dumps({"Pod": p, "NodeNames": names}).encode() for p in pods]
    UsageCache.decide = decide  # type: ignore[method-assign]
    try:
        t1 = time.perf_counter()
        lat, _ = run_requests(srv.port, bodies)
        wall = time.perf_counter() - t1
        nowhere = list(FITS_NOWHERE)
        bare_lat, _ = run_requests(bare.port, bodies[:200])
    finally:
        UsageCache.decide = real_decide  # type: ignore[method-assign]
        srv.stop()
        bare.stop()
        sink.stop()
    cold = [x for x, c in zip(lat, cold_flags, strict=True) if c]
    # the first request of a shape that fits nowhere: every node's reason (one fit per node class)
    cold_nowhere = [x for x, c, f in zip(lat, cold_flags, nowhere, strict=True) if c and f]
    warm = [x for x, c in zip(lat, cold_flags, strict=True) if not c]
    ms = 1e3
    return {
        "nodes": n_nodes,
        "gpus": n_nodes * GPUS_PER_NODE,
        "requests": len(lat),
        "build_s": build_s,
        "shapes": len({(s.gpus, s.mem, s.pct, s.cores, s.mig, s.init, s.annotations) for s in requests}),
        "body_kib": len(bodies[0]) / 1024,
        "cold": len(cold),
        "warm": len(warm),
        "p50_ms": pct(lat, 0.5) * ms,
        "p99_ms": pct(lat, 0.99) * ms,
        "warm_p50_ms": pct(warm, 0.5) * ms,
        "warm_p99_ms": pct(warm, 0.99) * ms,
        "cold_p50_ms": pct(cold, 0.5) * ms if cold else 0.0,
        "cold_p99_ms": pct(cold, 0.99) * ms if cold else 0.0,
        "cold_max_ms": max(cold) * ms if cold else 0.0,
        "cold_nowhere": len(cold_nowhere),
        "cold_nowhere_max_ms": max(cold_nowhere) * ms if cold_nowhere else 0.0,
        "pods_per_s": len(lat) / wall,
        "bare_p50_ms": pct(bare_lat, 0.5) * ms,
        "lazy_fits": cache.lazy_fits,
        "pods_in_cache": len(cache.pods),
        "rss_mb": rss_mb(),
        "events_posted": sink.posted,
        "events_dropped": sink.dropped,
    }


SUMMARY: list[tuple[str, str, str, bool]] = []  # the last run's figures, for make bench's table


def figures(results: list[dict]) -> list[tuple[str, str, str, bool]]:
    by = {r["nodes"]: r for r in results}
    small, big = by[min(by)], by[max(by)]
    growth = big["p99_ms"] / small["p99_ms"]
    return [
        (
            f"filter: p99 growth {small['nodes']} -> {big['nodes']} nodes (trace, all requests)",
            f"{growth:.2f}x",
            "<= 2x",
            growth <= 2.0,
        ),
        (
            f"filter: warm p50 / p99 at {big['nodes']} nodes",
            f"{big['warm_p50_ms']:.2f} / {big['warm_p99_ms']:.2f} ms",
            "-",
            True,
        ),
        (
            f"filter: cold p50 / p99 at {big['nodes']} nodes ({big['cold']} cold of {big['requests']})",
            f"{big['cold_p50_ms']:.2f} / {big['cold_p99_ms']:.2f} ms",
            "cold p99 <= 20 ms",
            big["cold_p99_ms"] <= 20.0,
        ),
        (
            f"filter: extender RSS with {big['nodes']} nodes x {GPUS_PER_NODE} GPUs",
            f"{big['rss_mb']:.0f} MB",
            "<= 500 MB",
            big["rss_mb"] <= 500.0,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.scheduler.trace import shapes, trace

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--shapes", type=int, default=240, help="distinct request shapes in the trace")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    goals.add_flag(p)
    args = p.parse_args(argv)
    n = args.requests or (400 if args.quick else 3000)
    reqs = trace(shapes(args.shapes), n)
    # the big fleet first: its RSS is then not inflated by the small one's leftovers
    results = sorted([bench_size(5000, reqs), bench_size(500, reqs)], key=lambda r: r["nodes"])
    SUMMARY[:] = figures(results)
    if args.json:
        print(json.dumps({"sizes": results, "figures": SUMMARY}, indent=2))
        return goals.exit_code(SUMMARY, args.no_goals)
    print(
        f"scheduler extender /filter, realistic trace: {results[0]['shapes']} distinct shapes in {n} "
        "requests (Zipf popularity), SIMULATED fleet (A100, H100 and MIG nodes, 0-12 running pods each) in "
        "the usage cache, real HTTP handler, production event sink (messages built, not posted)"
    )
    hdr = (
        f"{'nodes':>6} {'GPUs':>6} {'cold':>5} {'p50 ms':>7} {'p99 ms':>7} {'warm p50':>8} {'warm p99':>8} "
        f"{'cold p50':>8} {'cold p99':>8} {'cold max':>8} {'pods/s':>7} {'bare p50':>8} {'RSS MB':>7}"
    )
    print(hdr)
    for r in results:
        print(
            f"{r['nodes']:>6} {r['gpus']:>6} {r['cold']:>5} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['warm_p50_ms']:>8.2f} {r['warm_p99_ms']:>8.2f} "
            f"{r['cold_p50_ms']:>8.2f} {r['cold_p99_ms']:>8.2f} "
            f"{r['cold_max_ms']:>8.1f} {r['pods_per_s']:>7.1f} {r['bare_p50_ms']:>8.2f} {r['rss_mb']:>7.0f}"
        )
    for r in results:
        print(f"{r['nodes']:>6} nodes: {r['cold_nowhere']} cold request(s) that fit nowhere, slowest "
              f"{r['cold_nowhere_max_ms']:.1f} ms (every node's reason in FailedNodes)")
    for name, value, goal, ok in SUMMARY:
        print(f"{'ok ' if ok else 'MISS'} {name}: {value} (goal {goal})")
    print(
        "cold = the first request of a shape, or of a shape evicted from the fit memo (LRU of 64 shapes): "
        "fitted best-first until a node fits; warm = re-fits only nodes whose usage changed"
    )
    return goals.exit_code(SUMMARY, args.no_goals)


if __name__ == "__main__":
    raise SystemExit(main())

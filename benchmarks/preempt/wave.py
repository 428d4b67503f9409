"""GPU preemption end to end (issue 29 item 4): a wave of high-priority vGPU pods onto a SIMULATED cluster
whose GPUs are all held by low-priority pods; ``python -m benchmarks preempt --wave``.

The cluster is ``benchmarks/e2e_schedule/cluster.py``'s: the simulated API server (graceful deletion on),
the real extender as its own process with ``--preemption extender``, the kube-scheduler simulator (v1.35.4's
queue and preemption, upstream's default backoff of 1-10 s, ``preemptVerb: preempt`` as the role writes it
when preemption is on), per node a simulated kubelet device manager and the real device plugin. A deleted
pod's kubelet lets its containers run the whole grace period (they ignore SIGTERM: the worst case), then
confirms the deletion.

Workload: ``nodes`` x 8 GPUs (80 GiB, split 10). Every GPU holds one low-priority pod (priority 0, 1 GPU x
60 GiB, ``terminationGracePeriodSeconds`` = ``grace``). Then ``wave`` pods of priority 1000 asking 1 GPU x
60 GiB are created at once (16 creates in flight). No GPU has room for one without a victim, and one
victim frees room for exactly one preemptor (the 20 GiB left cannot take a second), so the exact minimum is
one victim per preemptor.

Figures:

* time from a preemptor's create to ``Running``, p50 / p99; goal p99 <= grace + 5 s;
* victims (low pods deleted) per preemptor, against the minimum 1.0; goal: equal;
* over-commit samples: every 100 ms during the wave, per GPU, the memory, cores and slots of the pods bound
  and not yet gone (terminating victims count until their delete is seen) against the GPU's capacity, from
  the benchmark's own pod watch; goal 0;
* victims' termination, from the deletion seen to the pod gone (the kubelet honours the grace period):
  min / max; goal min >= grace - 0.5 s (the benchmark's watch and the kubelet's see the deletion at
  slightly different moments).
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchmarks.e2e_schedule.cluster import SimCluster, wait_for
from hami_agent.k8s.informer import Informer
from hami_agent.protocol import decode_pod_devices, keys

GPU_MEM = 81920  # MiB, the cluster's simulated A100-80GB
GPU_CORES = 100
SPLIT = 10
POD_MEM = 61440  # both the fill and the preemptors: one per GPU
HIGH = 1000


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class OverCommit:
    """Samples per-GPU usage of the bound, not yet deleted pods from the cluster's pod watch."""

    cluster: SimCluster
    interval_s: float = 0.1
    samples: int = 0
    over: int = 0
    peak_mem: int = 0
    worst: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        assert self.cluster._pods is not None
        use: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # uuid -> [slots, MiB, cores]
        for pod in self.cluster._pods.list():
            ann = (pod.get("metadata") or {}).get("annotations") or {}
            value = ann.get(keys.DEVICES_ALLOCATED) or ann.get(keys.DEVICES_TO_ALLOCATE)
            if not (pod.get("spec") or {}).get("nodeName") or not value:
                continue
            for container in decode_pod_devices(value):
                for dev in container:
                    u = use[dev.uuid]
                    u[0] += 1
                    u[1] += dev.usedmem
                    u[2] += dev.usedcores
        bad = [f"{uuid}: {s} slots, {m} MiB, {c} cores" for uuid, (s, m, c) in use.items()
               if s > SPLIT or m > GPU_MEM or c > GPU_CORES]
        self.samples += 1
        self.peak_mem = max([self.peak_mem, *(m for _s, m, _c in use.values())])
        if bad:
            self.over += 1
            self.worst = self.worst or bad[:3]

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> OverCommit:
        self._thread = threading.Thread(target=self._run, name="overcommit", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()  # one last look at the end state


def settled(cluster: SimCluster, keys_: list[str], timeout_s: float) -> bool:
    """Every pod Running, or one Failed (no need to wait out the timeout then); False on the timeout."""
    return wait_for(lambda: all(k in cluster.running_at for k in keys_) or bool(cluster.failed), timeout_s,
                    step=0.05)


class HoldWatch:
    """When each preemptor's ``hami.io/preemption-hold`` first appears (its preemption decided), and for
    which victims: a watch on the preemptors, pending ones included."""

    def __init__(self, cluster: SimCluster) -> None:
        assert cluster.client is not None
        self.at: dict[str, float] = {}
        self.victims: dict[str, list[str]] = {}
        self.node: dict[str, str] = {}  # the held node
        self._lock = threading.Lock()
        self._inf = Informer(cluster.client, "pods", label_selector="job=high", resync_s=0)
        self._inf.add_handler(on_add=self._seen, on_update=lambda _o, p: self._seen(p))

    def _seen(self, pod: dict) -> None:
        md = pod.get("metadata") or {}
        raw = (md.get("annotations") or {}).get(keys.PREEMPTION_HOLD)
        key = f"{md.get('namespace')}/{md.get('name')}"
        if raw:
            with self._lock:
                if key not in self.at:
                    self.at[key] = time.monotonic()
                    hold = json.loads(raw)
                    self.victims[key] = list(hold.get("victims") or [])
                    self.node[key] = hold.get("node", "")

    def __enter__(self) -> HoldWatch:
        self._inf.start()
        if not self._inf.wait_synced(30):
            raise RuntimeError("the preemptors' watch did not sync")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._inf.stop()


def run_wave(nodes: int, wave: int, grace: int, *, hosts: int, timeout_s: float,
             pop_from_backoff_q: bool = True) -> dict[str, Any]:
    """``pop_from_backoff_q``: the simulated kube-scheduler's SchedulerPopFromBackoffQ gate (on by default
    since kube-scheduler v1.33; off: older releases, a harsher requeue)."""
    if wave > nodes * 8:
        raise ValueError(f"--wave-pods {wave}: at most one preemptor per GPU ({nodes * 8}); lower it")
    cluster = SimCluster(nodes, gpus=8, split=SPLIT, hosts=hosts, graceful_deletion=True,
                         extender_args=["--preemption", "extender"],
                         queue_kw={"preempt_verb": "preempt", "pop_from_backoff_q": pop_from_backoff_q})
    try:
        t0 = time.monotonic()
        cluster.start()
        print(f"cluster of {nodes} nodes up in {time.monotonic() - t0:.1f}s", flush=True)
        t0 = time.monotonic()
        low = cluster.create_pods("low", nodes * 8, mem=POD_MEM, cores=None, priority=0, grace_s=grace)
        if not settled(cluster, low, timeout_s) or cluster.failed:
            failed = dict(list(cluster.failed.items())[:3])
            raise RuntimeError(f"fill: {sum(k in cluster.running_at for k in low)}/{len(low)} Running "
                               f"(timeout {timeout_s:.0f}s); failed: {failed}")
        print(f"fill: {len(low)} low-priority pods Running in {time.monotonic() - t0:.1f}s", flush=True)
        with OverCommit(cluster) as sampler, HoldWatch(cluster) as holds:
            t0 = time.monotonic()
            high = cluster.create_pods("high", wave, mem=POD_MEM, cores=None, priority=HIGH)
            ok = settled(cluster, high, timeout_s) and all(k in cluster.running_at for k in high)
            wall = time.monotonic() - t0
            time.sleep(1.0)  # late evictions (a victim deleted after its preemptor ran) still get counted
        assert cluster._pods is not None
        bound = {k: (p.get("spec") or {}).get("nodeName") for k in high
                 if (p := cluster._pods.get("default", k.split("/", 1)[1])) is not None}
        elsewhere = [k for k in high if k in holds.node and bound.get(k) != holds.node[k]]
        victims = [k for k in low if k in cluster.terminating_at]
        started = sorted(cluster.terminating_at[k] - t0 for k in victims)
        terms = [cluster.gone_at[k] - cluster.terminating_at[k] for k in victims if k in cluster.gone_at]
        return {
            "ok": ok, "wall": wall,
            "ttr": [cluster.running_at[k] - cluster.created_at[k] for k in high if k in cluster.running_at],
            # per preemptor: create -> its hold recorded, and hold -> Running
            "decided": [holds.at[k] - cluster.created_at[k] for k in high if k in holds.at],
            "after_hold": [cluster.running_at[k] - holds.at[k] for k in high
                           if k in holds.at and k in cluster.running_at],
            "running": sum(k in cluster.running_at for k in high), "wave": wave,
            "victims": len(victims), "terms": terms, "started": started,
            "samples": sampler.samples, "over": sampler.over, "elsewhere": elsewhere,
            "worst": sampler.worst, "peak_mem": sampler.peak_mem,
            "failed": dict(list(cluster.failed.items())[:3]),
            "stuck": [k for k in high if k not in cluster.running_at][:5],
            "holds_left": holds_left(cluster),
        }
    finally:
        cluster.stop()


def holds_left(cluster: SimCluster) -> list[str]:
    """Pods still carrying ``hami.io/preemption-hold`` at the end (the assignment removes it): their nodes."""
    assert cluster.client is not None
    pods, _rv = cluster.client.list("pods", "default")
    return [json.loads(ann[keys.PREEMPTION_HOLD]).get("node", "?") for ann in
            ((p["metadata"].get("annotations") or {}) for p in pods) if keys.PREEMPTION_HOLD in ann]


def report(r: dict[str, Any], grace: int, nodes: int, queue: str = "") -> list[tuple[str, str, str, bool]]:
    """Print the wave's figures; return them as goal rows (``queue``: the kube-scheduler queue, in the
    row names)."""
    ttr, terms = r["ttr"], r["terms"]
    p50, p99 = pct(ttr, 0.5), pct(ttr, 0.99)
    per = r["victims"] / r["running"] if r["running"] else float("inf")
    print(f"wave: {r['running']}/{r['wave']} preemptors Running in {r['wall']:.1f}s "
          f"(all: {r['ok']}); not Running: {r['stuck']}; failed: {r['failed']}")
    print(f"create -> Running: p50 {p50:.2f}s, p99 {p99:.2f}s, max {max(ttr, default=float('nan')):.2f}s "
          f"(victims' grace {grace}s)")
    if r["decided"]:
        d, a = r["decided"], r["after_hold"]
        print(f"create -> hold recorded: p50 {pct(d, 0.5):.2f}s, max {max(d):.2f}s; hold -> Running: "
              f"p50 {pct(a, 0.5):.2f}s, p99 {pct(a, 0.99):.2f}s, max {max(a, default=float('nan')):.2f}s")
    if r["started"]:
        print(f"victims' deletions seen from {r['started'][0]:.2f}s to {r['started'][-1]:.2f}s after the "
              f"first create (the wave's preemptions, one /filter at a time)")
    print(f"victims: {r['victims']} for {r['running']} preemptors Running ({per:.2f} per preemptor; "
          f"minimum 1.00); preemptors bound off their held node: {len(r['elsewhere'])} {r['elsewhere'][:3]}; "
          f"holds left on pods: {len(r['holds_left'])}")
    print(f"over-commit: {r['over']} of {r['samples']} samples (peak GPU memory {r['peak_mem']} of "
          f"{GPU_MEM} MiB){'; ' + str(r['worst']) if r['worst'] else ''}")
    if terms:
        print(f"victim termination (deletion seen -> gone): min {min(terms):.2f}s, "
              f"p50 {pct(terms, 0.5):.2f}s, max {max(terms):.2f}s")
    size = f"{nodes} nodes x 8 GPUs, {r['wave']} preemptors{', ' + queue if queue else ''}"
    return [
        (f"preemption wave ({size}): create -> Running p50 / p99", f"{p50:.1f} / {p99:.1f} s",
         f"p99 <= {grace + 5} s (grace {grace} s + 5)", r["ok"] and p99 <= grace + 5),
        ("preemption wave: from the hold to Running p50 / p99 (the victims' grace and the requeue)",
         f"{pct(r['after_hold'], 0.5):.1f} / {pct(r['after_hold'], 0.99):.1f} s", "-", True),
        ("preemption wave: victims per preemptor (exact minimum 1.00); bound off the held node",
         f"{per:.2f}; {len(r['elsewhere'])}", "1.00; 0",
         r["ok"] and r["victims"] == r["running"] and not r["elsewhere"]),
        ("preemption wave: over-commit samples (per GPU, every 100 ms)", f"{r['over']} of {r['samples']}",
         "0", r["over"] == 0 and r["samples"] > 0),
        ("preemption wave: victim termination min / max (kubelet honours the grace period)",
         f"{min(terms, default=0):.1f} / {max(terms, default=0):.1f} s", f">= {grace - 0.5:.1f} s",
         bool(terms) and min(terms) >= grace - 0.5),
    ]

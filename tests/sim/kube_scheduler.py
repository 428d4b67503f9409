"""SIMULATED kube-scheduler that drives a scheduler extender the way kube-scheduler does.

This is not kube-scheduler. It reproduces the part of its behaviour that an extender sees, with the
extender configured as in HAMi's chart (``filterVerb: filter``, ``bindVerb: bind``,
``nodeCacheCapable: true``, HAMi resources as ``managedResources`` with ``ignoredByScheduler: true``):

* it watches pods whose ``spec.schedulerName`` is ours and that have no ``spec.nodeName``;
* one scheduling cycle at a time per worker: the candidate nodes are the Ready, schedulable nodes; a
  pod that asks for a managed resource is sent to ``POST <extender>/filter`` as ``ExtenderArgs``
  (``{"Pod": ..., "NodeNames": [...]}`` — Go field names, like kube-scheduler's JSON);
* an empty answer makes the pod unschedulable: a ``FailedScheduling`` event
  ``0/N nodes are available: <count> <reason>, ...`` and a retry with backoff (1 s doubling to 10 s,
  kube-scheduler's pod backoff; configurable);
* a node is then bound with ``POST <extender>/bind`` (``ExtenderBindingArgs``); an error answer is
  reported as ``binding rejected: <error>`` (event ``FailedScheduling``) and the pod is retried;
* a pod without managed resources is bound by the simulator itself (``pods/binding``) to the
  candidate node with the fewest pods, without calling the extender (``IsInterested`` false).

Gaps: no kube-scheduler plugins (resources, affinity, taints...), no preemption, no prioritize calls,
no scheduling queue semantics beyond per-pod backoff. Pods with ``spec.resourceClaims`` go to the DRA
allocator when one is given (``dra=DraAllocator(client)``, ``tests/sim/dra_allocator.py``); such a pod
that also asks for HAMi resources is not sent to the extender.

Library: ``KubeSchedulerSim(client, extender_url).start()`` (a list of URLs: replicas behind a
Service, each request to the next one, see ``ExtenderPool``); process:
``python -m tests.sim.kube_scheduler --kubeconfig PATH --extender URL [--scheduler-name NAME]``.
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import logging
import signal
import ssl
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("tests.sim.kube_scheduler")

MANAGED_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                     "nvidia.com/gpucores", "nvidia.com/priority")
COMPONENT = "default-scheduler"  # kube-scheduler's event source, whatever the profile name


class ExtenderClient:
    """One keep-alive HTTP(S) connection to the extender (one per worker, like a Go http.Client)."""

    def __init__(self, url: str, timeout_s: float = 30.0, verify: bool = False) -> None:
        u = urlsplit(url)
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname or "127.0.0.1", u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self.ctx = ssl.create_default_context() if self.https else None
        if self.ctx is not None and not verify:
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                                         context=self.ctx)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return self._conn

    def post(self, verb: str, body: Any) -> Any:
        data = json.dumps(body).encode()
        for attempt in (1, 2):  # one reconnect: the server may have closed an idle keep-alive
            conn = self._connection()
            try:
                conn.request("POST", f"{self.prefix}/{verb}", data, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            if resp.status != 200:
                raise RuntimeError(f"extender {verb}: HTTP {resp.status}: {payload[:300]!r}")
            return json.loads(payload)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class ExtenderPool:
    """Several extender replicas behind one name, like a Kubernetes Service in front of a 2-replica
    Deployment: every request (each /filter and each /bind, separately) goes to the next replica in
    turn, so a pod's /filter and /bind usually reach different replicas. A replica that cannot be
    reached fails that request (kube-scheduler retries the pod) and is taken out of the rotation until
    its ``/readyz`` answers 200 again, probed at most every ``probe_s`` (the Service drops an endpoint
    whose readiness probe fails and adds it back once the probe passes)."""

    def __init__(self, urls: list[str], timeout_s: float = 30.0, probe_s: float = 2.0) -> None:
        self.urls = urls
        self.clients = [ExtenderClient(u, timeout_s) for u in urls]
        self.probe_s = probe_s
        self._down = [False] * len(urls)
        self._next_probe = [0.0] * len(urls)
        self._next = 0
        self._lock = threading.Lock()

    def _ready(self, i: int) -> bool:
        if not self._down[i]:
            return True
        now = time.monotonic()
        if now < self._next_probe[i]:
            return False
        self._next_probe[i] = now + self.probe_s
        u = urlsplit(self.urls[i])
        conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        kw: dict = {"context": self.clients[i].ctx} if u.scheme == "https" else {}
        conn = conn_cls(u.hostname or "127.0.0.1", u.port or 80, timeout=1.0, **kw)
        try:
            conn.request("GET", f"{u.path.rstrip('/')}/readyz")
            self._down[i] = conn.getresponse().status != 200
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        return not self._down[i]

    def post(self, verb: str, body: Any) -> Any:
        with self._lock:
            order = [(self._next + i) % len(self.clients) for i in range(len(self.clients))]
            self._next += 1
        i = next((j for j in order if self._ready(j)), order[0])
        try:
            return self.clients[i].post(verb, body)
        except (OSError, http.client.HTTPException):
            self._down[i] = True
            self._next_probe[i] = time.monotonic() + self.probe_s
            raise

    def close(self) -> None:
        for c in self.clients:
            c.close()


def wants_extender(pod: dict, managed: tuple[str, ...] = MANAGED_RESOURCES) -> bool:
    spec = pod.get("spec") or {}
    for c in (*(spec.get("initContainers") or []), *(spec.get("containers") or [])):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if any(k in managed for k in (res.get(part) or {})):
                return True
    return False


def node_ready(node: dict) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conds = (node.get("status") or {}).get("conditions")
    if not conds:
        return True  # simulated nodes often carry no conditions
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def fit_error_message(total: int, failed: dict[str, str]) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: <count> <reason>, ...``."""
    counts = Counter(failed.values())
    parts = sorted(f"{n} {reason}" for reason, n in counts.items())
    return f"0/{total} nodes are available: {', '.join(parts)}."


def _get(obj: dict, name: str) -> Any:
    """Go-style case-insensitive field lookup of extender answers."""
    if name in obj:
        return obj[name]
    for k, v in obj.items():
        if k.lower() == name.lower():
            return v
    return None


class KubeSchedulerSim:
    """SIMULATED kube-scheduler (see module docstring)."""

    def __init__(self, client: Any, extender_url: str | list[str], scheduler_name: str = "hami-scheduler", *,
                 workers: int = 1, initial_backoff_s: float = 1.0, max_backoff_s: float = 10.0,
                 http_timeout_s: float = 30.0, post_events: bool = True, dra: Any = None) -> None:
        self.client = client
        self.dra = dra  # tests/sim/dra_allocator.DraAllocator: pods with spec.resourceClaims
        self.extender_url = extender_url
        self.scheduler_name = scheduler_name
        self.workers = workers
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.http_timeout_s = http_timeout_s
        self.post_events = post_events
        self._heap: list[tuple[float, int, str]] = []  # (due, seq, "ns/name"): per-pod backoff
        self._seq = 0
        self._cond = threading.Condition()
        self._queued: set[str] = set()
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.pod_informer: Any = None
        self.node_informer: Any = None
        self.bound: dict[str, str] = {}  # "ns/name" -> node
        self.failures: list[tuple[str, str]] = []  # ("ns/name", message)
        self.filter_calls = 0
        self.bind_calls = 0

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> KubeSchedulerSim:
        from hami_agent.k8s.informer import Informer

        self.node_informer = Informer(self.client, kind="nodes")
        self.pod_informer = Informer(self.client, kind="pods")
        self.pod_informer.add_handler(on_add=self._maybe_enqueue,
                                      on_update=lambda _o, p: self._maybe_enqueue(p))
        self.node_informer.start()
        self.pod_informer.start()
        if self.dra is not None:
            self.dra.start()
        self.node_informer.wait_synced(10)
        self.pod_informer.wait_synced(10)
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"kube-scheduler-sim-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        logger.info("simulated kube-scheduler %r started with extender %s", self.scheduler_name,
                    self.extender_url)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join(5)
        for inf in (self.pod_informer, self.node_informer):
            if inf is not None:
                inf.stop()
        if self.dra is not None:
            self.dra.stop()

    def __enter__(self) -> KubeSchedulerSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------------------------- queueing
    def _pending(self, pod: dict) -> bool:
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return (spec.get("schedulerName") == self.scheduler_name and not spec.get("nodeName")
                and phase == "Pending" and not (pod.get("metadata") or {}).get("deletionTimestamp"))

    def _maybe_enqueue(self, pod: dict, delay_s: float = 0.0) -> None:
        if not self._pending(pod):
            return
        md = pod["metadata"]
        key = f"{md.get('namespace')}/{md.get('name')}"
        with self._lock:
            if key in self._queued:
                return
            self._queued.add(key)
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + delay_s, self._seq, key))
            self._cond.notify()

    def _next(self) -> str | None:
        with self._cond:
            while not self._stop.is_set():
                if self._heap:
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self._heap)[2]
                    self._cond.wait(wait)
                else:
                    self._cond.wait(0.5)
            return None

    def _worker(self) -> None:
        urls = self.extender_url
        ext: Any = (ExtenderPool(urls, self.http_timeout_s) if isinstance(urls, list)
                    else ExtenderClient(urls, self.http_timeout_s))
        try:
            while not self._stop.is_set():
                key = self._next()
                if key is None:
                    return
                with self._lock:
                    self._queued.discard(key)
                ns, name = key.split("/", 1)
                pod = self.pod_informer.get(ns, name)
                if pod is None or not self._pending(pod):
                    continue
                try:
                    ok = self.schedule_one(pod, ext)
                except Exception as exc:  # an extender/API failure: kube-scheduler retries with backoff
                    logger.warning("Error scheduling pod %s: %s", key, exc)
                    self._record_failure(pod, f"{exc}")
                    ok = False
                if ok:
                    with self._lock:
                        self._attempts.pop(key, None)
                else:
                    self._requeue(pod, key)
        finally:
            ext.close()

    def _requeue(self, pod: dict, key: str) -> None:
        with self._lock:
            n = self._attempts.get(key, 0)
            self._attempts[key] = n + 1
        delay = min(self.initial_backoff_s * (2 ** n), self.max_backoff_s)
        fresh = self.pod_informer.get(*key.split("/", 1)) or pod
        self._maybe_enqueue(fresh, delay)

    # ------------------------------------------------------------------------------- scheduling
    def candidate_nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.node_informer.list() if node_ready(n))

    def schedule_one(self, pod: dict, ext: ExtenderClient | ExtenderPool) -> bool:
        md = pod["metadata"]
        ns, name = md.get("namespace", "default"), md["name"]
        names = self.candidate_nodes()
        if not names:
            self._record_failure(pod, "0/0 nodes are available: no nodes available to schedule pods.")
            return False
        if self.dra is not None and self.dra.wants(pod):
            return bool(self.dra.schedule(self, pod, names))  # DRA claims: tests/sim/dra_allocator.py
        if not wants_extender(pod):
            counts = Counter((p.get("spec") or {}).get("nodeName") for p in self.pod_informer.list())
            node = min(names, key=lambda n: (counts.get(n, 0), n))
            self.client.bind_pod(ns, name, node, uid=md.get("uid"))
            self._bound(pod, node)
            return True
        self.filter_calls += 1
        result = ext.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        err = _get(result, "Error")
        if err:
            self._record_failure(pod, err)
            return False
        chosen = _get(result, "NodeNames") or []
        if not chosen:
            failed = dict(_get(result, "FailedNodes") or {})
            failed.update(_get(result, "FailedAndUnresolvableNodes") or {})
            self._record_failure(pod, fit_error_message(len(names), failed))
            return False
        node = chosen[0]  # with one extender and no scorers, the single node it returns wins
        self.bind_calls += 1
        res = ext.post("bind", {"PodName": name, "PodNamespace": ns, "PodUID": md.get("uid", ""),
                                "Node": node})
        err = _get(res, "Error")
        if err:
            self._record_failure(pod, f"binding rejected: {err}")
            return False
        self._bound(pod, node)
        return True

    def _bound(self, pod: dict, node: str) -> None:
        md = pod["metadata"]
        with self._lock:
            self.bound[f"{md.get('namespace')}/{md['name']}"] = node
        logger.info("Successfully bound pod to node pod=%s/%s node=%s", md.get("namespace"), md["name"], node)
        if self.post_events:
            self._event(pod, "Normal", "Scheduled",
                        f"Successfully assigned {md.get('namespace')}/{md['name']} to {node}")

    def _record_failure(self, pod: dict, message: str) -> None:
        md = pod["metadata"]
        key = f"{md.get('namespace')}/{md['name']}"
        with self._lock:
            self.failures.append((key, message))
        logger.info("Unable to schedule pod; waiting pod=%s err=%s", key, message)
        if self.post_events:
            self._event(pod, "Warning", "FailedScheduling", message)

    def _event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        try:
            self.client.create_event({"kind": "Pod", "apiVersion": "v1", "metadata": pod["metadata"]},
                                     type_, reason, message, COMPONENT)
        except Exception as exc:
            logger.warning("event %s for %s failed: %s", reason, pod["metadata"].get("name"), exc)

    def wait_idle(self, timeout_s: float, expect_bound: int | None = None) -> bool:
        """Wait until ``expect_bound`` pods are bound (or the queue drained)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                n = len(self.bound)
            if expect_bound is not None and n >= expect_bound:
                return True
            if expect_bound is None and not self._heap:
                return True
            time.sleep(0.05)
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.kube_scheduler",
                                description="SIMULATED kube-scheduler driving a scheduler extender")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--extender", required=True, help="extender URL prefix, e.g. http://127.0.0.1:8080")
    p.add_argument("--scheduler-name", default="hami-scheduler")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--initial-backoff", type=float, default=1.0)
    p.add_argument("--max-backoff", type=float, default=10.0)
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=0)
    args = p.parse_args(argv)
    from hami_agent import log
    from hami_agent.k8s.client import KubeClient

    log.setup(args.verbosity)
    logging.getLogger("tests").addHandler(logging.getLogger("hami_agent").handlers[0])
    logging.getLogger("tests").setLevel(logging.INFO)
    client = KubeClient.from_kubeconfig(args.kubeconfig)
    sim = KubeSchedulerSim(client, args.extender, args.scheduler_name, workers=args.workers,
                           initial_backoff_s=args.initial_backoff, max_backoff_s=args.max_backoff)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sim.start()
    stop.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

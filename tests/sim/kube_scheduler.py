"""SIMULATED kube-scheduler that drives a scheduler extender the way kube-scheduler does.

This is not kube-scheduler. It reproduces the part of its behaviour that an extender sees, with the
extender configured as in HAMi's chart (``filterVerb: filter``, ``bindVerb: bind``,
``nodeCacheCapable: true``, HAMi resources as ``managedResources`` with ``ignoredByScheduler: true``):

* it watches pods whose ``spec.schedulerName`` is ours and that have no ``spec.nodeName``;
* one scheduling cycle at a time per worker: the candidate nodes are the Ready nodes that pass
  kube-scheduler's NodeUnschedulable and TaintToleration filters (a cordoned node, ``spec.unschedulable``,
  is skipped unless the pod tolerates ``node.kubernetes.io/unschedulable:NoSchedule``; a ``NoSchedule`` or
  ``NoExecute`` taint the pod does not tolerate skips the node), each with kube-scheduler's reason; a
  pod that asks for a managed resource is sent to ``POST <extender>/filter`` as ``ExtenderArgs``
  (``{"Pod": ..., "NodeNames": [...]}`` — Go field names, like kube-scheduler's JSON);
* an empty answer makes the pod unschedulable: a ``FailedScheduling`` event
  ``0/N nodes are available: <count> <reason>, ...``, and the pod waits in the **unschedulable pool** of
  the faithful scheduling queue (``kube_scheduler_queue.py``) until a cluster event moves it (a node
  added or changed, an assigned pod deleted or finished) or 5 minutes pass; an error answer (or a
  transport failure) sends it to backoffQ instead (1 s doubling to 10 s);
* the binding cycle runs concurrently with the next scheduling cycles, as kube-scheduler's binding
  goroutine: ``POST <extender>/bind`` (``ExtenderBindingArgs``); an error answer is reported as
  ``binding rejected: <error>`` (event ``FailedScheduling``), the pod goes to backoffQ and every other
  unschedulable pod is moved (the forgotten assumed pod freed its node);
* a pod without managed resources is bound by the simulator itself (``pods/binding``) to the
  candidate node with the fewest pods, without calling the extender (``IsInterested`` false);
* without an extender (``extender_url=None``), pods asking for ``nvidia.com/gpu`` are placed on its
  count (allocatable minus the requests of bound and assumed pods; least allocated first), rejected with
  ``Insufficient nvidia.com/gpu`` by NodeResourcesFit otherwise.

* NodeResourcesFit on cpu, memory and the pod count (where the node's allocatable names them; the
  extender's managed resources are ``ignoredByScheduler``, the count resource is checked without an
  extender); the queue pops the pod of highest priority first;
* preemption as kube-scheduler v1.35.4's DefaultPreemption, PostFilter after a failed cycle, the
  extender's ``preemptVerb`` (``preempt_verb=``) included, nominated pods counted by later cycles
  (``kube_scheduler_preemption.py``; ``preemption=False`` turns it off).

Gaps: no other kube-scheduler plugins (affinity, volumes, ...), no prioritize calls; the preemption
simplifications are listed in ``kube_scheduler_preemption.py`` and docs/testing.md. Pods with
``spec.resourceClaims`` go to the DRA allocator when one is given (``dra=DraAllocator(client)``,
``tests/sim/dra_allocator.py``); such a pod that also asks for HAMi resources is not sent to the extender.

Library: ``KubeSchedulerSim(client, extender_url).start()`` (a list of URLs: replicas behind a
Service, each request to the next one, see ``ExtenderPool``); process:
``python -m tests.sim.kube_scheduler --kubeconfig PATH --extender URL [--scheduler-name NAME]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import queue as queue_mod
import signal
import ssl
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from tests.sim import kube_scheduler_preemption as pre
from tests.sim import kube_scheduler_queue as qu

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


UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
# the node lifecycle controller taints a NotReady node with this (simulated nodes carry no such taint)
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
# kube-scheduler's reason (pkg/scheduler/framework/plugins/nodeunschedulable)
REASON_UNSCHEDULABLE = "node(s) were unschedulable"


def node_ready(node: dict) -> bool:
    conds = (node.get("status") or {}).get("conditions")
    if not conds:
        return True  # simulated nodes often carry no conditions
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def tolerates(pod: dict, taint: dict) -> bool:
    """v1.Toleration.ToleratesTaint: effect (empty = any), key (empty + Exists = any), operator."""
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def node_filter_reason(pod: dict, node: dict) -> str | None:
    """Why kube-scheduler's own filters drop ``node`` for ``pod`` (None: it passes)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    want = (pod.get("spec") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in want.items()):  # NodeAffinity (spec.nodeSelector only)
        return "node(s) didn't match Pod's node affinity/selector"
    if (node.get("spec") or {}).get("unschedulable") and not tolerates(pod, UNSCHEDULABLE_TAINT):
        return REASON_UNSCHEDULABLE
    taints = list((node.get("spec") or {}).get("taints") or [])
    if not node_ready(node):
        taints.append(NOT_READY_TAINT)
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(pod, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    return None


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


def pod_key(pod: dict) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', 'default')}/{md.get('name')}"


def _spec_changed(old: dict, new: dict) -> bool:
    """kube-scheduler's ``isPodUpdated``: anything but status, resourceVersion, generation, managedFields."""
    def strip(p: dict) -> dict:
        md = {k: v for k, v in (p.get("metadata") or {}).items()
              if k not in ("resourceVersion", "generation", "managedFields")}
        return {**{k: v for k, v in p.items() if k not in ("status", "metadata")}, "metadata": md}
    return strip(old) != strip(new)


def _conditions(node: dict) -> dict:
    return {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []}


def node_change(old: dict, new: dict) -> str | None:
    """``NodeSchedulingPropertiesChange``: the event a node update raises, or None."""
    o_spec, n_spec = old.get("spec") or {}, new.get("spec") or {}
    if (o_spec.get("unschedulable") or False) != (n_spec.get("unschedulable") or False):
        return qu.NODE_UPDATE
    if (old.get("status") or {}).get("allocatable") != (new.get("status") or {}).get("allocatable"):
        return qu.NODE_ALLOCATABLE
    o_md, n_md = old.get("metadata") or {}, new.get("metadata") or {}
    if (o_md.get("labels") or {}) != (n_md.get("labels") or {}):
        return qu.NODE_UPDATE
    if (o_spec.get("taints") or []) != (n_spec.get("taints") or []):
        return qu.NODE_UPDATE
    if _conditions(old) != _conditions(new):
        return qu.NODE_UPDATE
    if (o_md.get("annotations") or {}) != (n_md.get("annotations") or {}):
        return qu.NODE_UPDATE  # since v1.28 (kubernetes PR #118389)
    return None


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def pod_requests(pod: dict, resource: str) -> int:
    """Effective request of ``resource`` (max of any init container, sum of the app containers)."""
    spec = pod.get("spec") or {}

    def req(c: dict) -> int:
        res = c.get("resources") or {}
        limit = (res.get("limits") or {}).get(resource, 0)
        return _quantity((res.get("requests") or {}).get(resource, limit))

    init = max((req(c) for c in spec.get("initContainers") or []), default=0)
    return max(init, sum(req(c) for c in spec.get("containers") or []))


class KubeSchedulerSim:
    """SIMULATED kube-scheduler (see module docstring). ``extender_url=None`` runs it without an extender:
    pods are placed on the count of ``nvidia.com/gpu`` (allocatable minus what bound and assumed pods
    request), the way kube-scheduler's NodeResourcesFit treats an extended resource."""

    def __init__(self, client: Any, extender_url: str | list[str] | None,
                 scheduler_name: str = "hami-scheduler", *, workers: int = 1, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 10.0, max_in_unschedulable_s: float = 300.0,
                 unschedulable_flush_s: float = 30.0, backoff_flush_s: float | None = None,
                 http_timeout_s: float = 30.0, post_events: bool = True, max_binding: int = 256,
                 count_resource: str = "nvidia.com/gpu", dra: Any = None, preemption: bool = True,
                 preempt_verb: str | None = None, preemption_offset: int = 0,
                 managed_resources: tuple[str, ...] = MANAGED_RESOURCES,
                 pop_from_backoff_q: bool = False) -> None:
        self.client = client
        # the extender's managedResources, all ignoredByScheduler (a cluster with static MIG resources behind
        # the extender lists its nvidia.com/mig-<profile> names too)
        self.managed_resources = managed_resources
        self.dra = dra  # tests/sim/dra_allocator.DraAllocator: pods with spec.resourceClaims
        self.extender_url = extender_url
        self.scheduler_name = scheduler_name
        self.workers = workers  # kube-scheduler runs one scheduling cycle at a time; >1 is a test knob
        self.http_timeout_s = http_timeout_s
        self.post_events = post_events
        self.count_resource = count_resource
        if backoff_flush_s is None:  # 1 s as kube-scheduler; tests that shrink the backoff shrink it too
            backoff_flush_s = min(1.0, initial_backoff_s)
        self.queue = qu.SchedulingQueue(initial_backoff_s=initial_backoff_s, max_backoff_s=max_backoff_s,
                                        max_in_unschedulable_s=max_in_unschedulable_s,
                                        unschedulable_flush_s=unschedulable_flush_s,
                                        backoff_flush_s=backoff_flush_s,
                                        pop_from_backoff_q=pop_from_backoff_q)
        # binding cycles run concurrently (kube-scheduler starts one goroutine per pod); bounded here
        self._binding = threading.BoundedSemaphore(max_binding)
        self._clients: queue_mod.LifoQueue = queue_mod.LifoQueue()  # idle extender connections
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._assumed: dict[str, tuple[str, int]] = {}  # key -> (node, count request) while binding
        self._assumed_pods: dict[str, dict] = {}  # key -> the assumed pod (its requests hold the node)
        # the nominator (backend/queue/nominator.go): key -> (nominated node, pod)
        self.nominator: dict[str, tuple[str, dict]] = {}
        # DefaultPreemption (kube_scheduler_preemption.py); ``preempt_verb``: the extender's preemptVerb
        self.preempt_verb = preempt_verb
        self._cycle = threading.local()  # the scheduling cycle's snapshot of pods per node
        self.preemption = pre.Evaluator(self, preemption_offset) if preemption else None
        self.pod_informer: Any = None
        self.node_informer: Any = None
        self.bound: dict[str, str] = {}  # "ns/name" -> node
        self.bound_at: dict[str, float] = {}  # "ns/name" -> monotonic time the binding succeeded
        self.failures: list[tuple[str, str]] = []  # ("ns/name", message)
        self.filter_calls = 0
        self.bind_calls = 0

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> KubeSchedulerSim:
        from hami_agent.k8s.informer import Informer

        self.node_informer = Informer(self.client, kind="nodes", resync_s=0)
        # kube-scheduler's pod informer leaves out finished pods: one turning Succeeded/Failed is a delete
        self.pod_informer = Informer(self.client, kind="pods", resync_s=0,
                                     field_selector="status.phase!=Succeeded,status.phase!=Failed")
        self.node_informer.add_handler(on_add=lambda _n: self.queue.move_all(qu.NODE_ADD),
                                       on_update=self._on_node_update)
        self.pod_informer.add_handler(on_add=self._on_pod_add, on_update=self._on_pod_update,
                                      on_delete=self._on_pod_delete)
        self.node_informer.start()
        self.pod_informer.start()
        if self.dra is not None:
            self.dra.start()
        self.node_informer.wait_synced(10)
        self.pod_informer.wait_synced(10)
        self.queue.run()
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"kube-scheduler-sim-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        logger.info("simulated kube-scheduler %r started with extender %s", self.scheduler_name,
                    self.extender_url)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.queue.close()
        for t in self._threads:
            t.join(5)
        for inf in (self.pod_informer, self.node_informer):
            if inf is not None:
                inf.stop()
        while not self._clients.empty():
            self._clients.get_nowait().close()
        if self.dra is not None:
            self.dra.stop()

    def __enter__(self) -> KubeSchedulerSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------- informer events
    def _pending(self, pod: dict) -> bool:
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return (spec.get("schedulerName") == self.scheduler_name and not spec.get("nodeName")
                and phase == "Pending" and not (pod.get("metadata") or {}).get("deletionTimestamp"))

    def _on_pod_add(self, pod: dict) -> None:
        if self._pending(pod):
            self.queue.add(pod_key(pod), pod)

    def _on_pod_update(self, old: dict, new: dict) -> None:
        key = pod_key(new)
        if (new.get("spec") or {}).get("nodeName"):
            with self._lock:  # the informer confirms an assumed pod (cache.AddPod/UpdatePod)
                self._assumed.pop(key, None)
                self._assumed_pods.pop(key, None)
                self.nominator.pop(key, None)
            if not (old.get("spec") or {}).get("nodeName"):
                self.queue.delete(key)  # bound (by us, or by someone else)
            return  # assigned-pod updates move only pods with affinity terms: none modelled
        with self._lock:
            assumed = key in self._assumed
        if assumed:
            # eventhandlers.go updatePodInSchedulingQueue: an assumed pod's updates are not queued (its
            # binding is under way, or done and not yet seen by the informer); a failed binding forgets it
            return
        if self._pending(new):
            self.queue.update(key, new, _spec_changed(old, new))
            self._update_nominator(key, old, new)
        else:
            self.queue.delete(key)
            self._forget_nomination(key, old)

    def _on_pod_delete(self, pod: dict) -> None:
        with self._lock:
            self._assumed.pop(pod_key(pod), None)
            self._assumed_pods.pop(pod_key(pod), None)
        if (pod.get("spec") or {}).get("nodeName"):
            self.queue.move_all(qu.ASSIGNED_POD_DELETE)
        else:
            self.queue.delete(pod_key(pod))
            self._forget_nomination(pod_key(pod), pod)

    # ------------------------------------------------------------------------------- nominations
    def _update_nominator(self, key: str, old: dict, new: dict) -> None:
        """``nominator.UpdateNominatedPod`` and ``updatePodInSchedulingQueue``: the status decides, except
        that an update without a nomination on either side keeps the one held in memory; a nomination
        that changed moves the pods of lower or equal priority (eventhandlers.go)."""
        was = (old.get("status") or {}).get("nominatedNodeName") or ""
        now = (new.get("status") or {}).get("nominatedNodeName") or ""
        with self._lock:
            if not was and not now:
                if key in self.nominator:
                    self.nominator[key] = (self.nominator[key][0], new)
            elif now:
                self.nominator[key] = (now, new)
            else:
                self.nominator.pop(key, None)
        if was and was != now:
            self.queue.move_all(qu.ASSIGNED_POD_DELETE, max_priority=qu.pod_priority(old))

    def _forget_nomination(self, key: str, pod: dict) -> None:
        """A nominated pending pod went (``deletePodFromSchedulingQueue``)."""
        with self._lock:
            held = self.nominator.pop(key, None)
        if held is not None or (pod.get("status") or {}).get("nominatedNodeName"):
            self.queue.move_all(qu.ASSIGNED_POD_DELETE, max_priority=qu.pod_priority(pod))

    def nominated_pods(self, node: str) -> list[dict]:
        with self._lock:
            return [p for n, p in self.nominator.values() if n == node]

    def set_nomination(self, pod: dict, node: str) -> None:
        """``AddNominatedPod``, then the status patch of ``handleSchedulingFailure`` or
        ``clearNominatedNodeName`` (``""`` clears). The in-memory nomination first, so the next cycle
        sees it before the watch does."""
        key = pod_key(pod)
        with self._lock:
            if node:
                self.nominator[key] = (node, pod)
            else:
                self.nominator.pop(key, None)
        if ((pod.get("status") or {}).get("nominatedNodeName") or "") == node or self.client is None:
            return
        md = pod["metadata"]
        try:
            self.client.patch_pod_status(md.get("namespace", "default"), md["name"],
                                         {"nominatedNodeName": node or None})
        except Exception as exc:  # noqa: BLE001 - upstream logs it and goes on
            logger.warning("Error updating pod %s: %s", key, exc)

    # ------------------------------------------------------------------------------- node views
    def pods_by_node(self) -> dict[str, list[dict]]:
        """The pods the scheduler's cache holds per node: bound ones as the informer shows them (the
        terminating included) and assumed ones it does not show bound yet. One pass over the pods."""
        held: dict[str, list[dict]] = {}
        seen = set()
        for p in self.pod_informer.list():
            n = (p.get("spec") or {}).get("nodeName")
            if n:
                held.setdefault(n, []).append(p)
                seen.add(pod_key(p))
        with self._lock:
            for key, (n, _count) in self._assumed.items():
                if key not in seen and key in self._assumed_pods:
                    held.setdefault(n, []).append(self._assumed_pods[key])
        return held

    def node_pods(self, node: str) -> list[dict]:
        """``pods_by_node()[node]``, from the scheduling cycle's snapshot while one runs (as upstream's
        ``nodeInfoSnapshot``), else computed now."""
        snap = getattr(self._cycle, "pods", None)
        return list((snap if snap is not None else self.pods_by_node()).get(node, []))

    def checked_resources(self) -> tuple[str, ...]:
        """What NodeResourcesFit looks at: the extender's managed resources are ``ignoredByScheduler``."""
        return ("pods", "cpu", "memory") + ((self.count_resource,) if self.extender_url is None else ())

    def framework_fit(self, pod: dict, node: dict, held: list[dict]) -> pre.Status | None:
        """``RunFilterPluginsWithNominatedPods``: NodeUnschedulable and TaintToleration
        (UnschedulableAndUnresolvable), then NodeResourcesFit over ``held`` plus the pods nominated to the
        node with a priority at least the pod's (not the pod itself). None: the node passes."""
        reason = node_filter_reason(pod, node)
        if reason is not None:
            return pre.Status(pre.UNRESOLVABLE, [reason])
        key, prio = pod_key(pod), qu.pod_priority(pod)
        nominated = [p for p in self.nominated_pods(node["metadata"]["name"])
                     if qu.pod_priority(p) >= prio and pod_key(p) != key]
        return pre.resource_fit(pod, node, held + nominated, self.checked_resources())

    def interested(self, pod: dict) -> bool:
        return wants_extender(pod, self.managed_resources)

    def post_extender(self, verb: str, body: Any) -> Any:
        ext = self._extender()
        try:
            return ext.post(verb, body)
        finally:
            self._clients.put(ext)

    def list_pdbs(self) -> list[dict]:
        """policy/v1 PodDisruptionBudgets (listed at each preemption; upstream reads an informer)."""
        if self.client is None:
            return []
        try:
            return self.client.call("GET", "/apis/policy/v1/poddisruptionbudgets", verb="list",
                                    kind="poddisruptionbudgets").get("items") or []
        except Exception as exc:  # noqa: BLE001
            logger.warning("listing PodDisruptionBudgets failed: %s", exc)
            return []

    def _on_node_update(self, old: dict, new: dict) -> None:
        event = node_change(old, new)
        if event is not None:
            self.queue.move_all(event)

    # --------------------------------------------------------------------------------- scheduling
    def _extender(self) -> Any:
        try:
            return self._clients.get_nowait()
        except queue_mod.Empty:
            urls = self.extender_url
            return (ExtenderPool(urls, self.http_timeout_s) if isinstance(urls, list)
                    else ExtenderClient(str(urls), self.http_timeout_s))

    def _worker(self) -> None:
        while not self._stop.is_set():
            qp = self.queue.pop(timeout=0.5)
            if qp is None:
                continue
            ns, name = qp.key.split("/", 1)
            pod = self.pod_informer.get(ns, name) or qp.pod
            with self._lock:
                assumed = qp.key in self._assumed
            if assumed or not self._pending(pod):  # schedule_one.go skipPodSchedule: assumed pods
                self.queue.done(qp)
                continue
            try:
                self.schedule_one(pod, qp)
            except Exception as exc:  # an extender/API failure: kube-scheduler retries after backoff
                logger.warning("Error scheduling pod %s: %s", qp.key, exc)
                self.queue.failed(qp)
                self.set_nomination(pod, "")  # not a FitError: no PostFilter, nomination cleared
                self._record_failure(pod, f"{exc}")

    def filter_nodes(self, pod: dict) -> tuple[list[str], dict[str, str]]:
        """kube-scheduler's own filters: (nodes that pass, {node: reason} for those that do not)."""
        passed, failed = [], {}
        for n in self.node_informer.list():
            name = n["metadata"]["name"]
            reason = node_filter_reason(pod, n)
            if reason is None:
                passed.append(name)
            else:
                failed[name] = reason
        return sorted(passed), failed

    def _count_used(self) -> dict[str, int]:
        """Bound pods as the informer shows them, plus assumed pods it does not show bound yet (an
        assumed pod stays counted after its binding until the informer confirms it, as in the
        scheduler cache)."""
        used: dict[str, int] = {}
        seen_bound = set()
        for p in self.pod_informer.list():
            node = (p.get("spec") or {}).get("nodeName")
            if node:
                used[node] = used.get(node, 0) + pod_requests(p, self.count_resource)
                seen_bound.add(pod_key(p))
        with self._lock:
            for key, (node, n) in self._assumed.items():
                if key not in seen_bound:
                    used[node] = used.get(node, 0) + n
        return used

    def _fit_counts(self, pod: dict, names: list[str]) -> tuple[str | None, dict[str, str]]:
        """NodeResourcesFit on the extended resource's count; the least allocated node wins."""
        want = pod_requests(pod, self.count_resource)
        used = self._count_used()
        nodes = {n["metadata"]["name"]: n for n in self.node_informer.list()}
        fits, failed = [], {}
        for name in names:
            alloc = _quantity(((nodes.get(name) or {}).get("status") or {}).get("allocatable", {}).get(
                self.count_resource, 0))
            if alloc - used.get(name, 0) >= want:
                fits.append((used.get(name, 0), name))
            else:
                failed[name] = f"Insufficient {self.count_resource}"
        return (min(fits)[1] if fits else None), failed

    def schedule_one(self, pod: dict, qp: qu.QueuedPod | None = None) -> bool:
        """One scheduling cycle; the binding cycle runs on its own thread. False when the cycle failed."""
        self._cycle.pods = self.pods_by_node()
        try:
            return self._schedule_one(pod, qp)
        finally:
            self._cycle.pods = None

    def _schedule_one(self, pod: dict, qp: qu.QueuedPod | None) -> bool:
        md = pod["metadata"]
        nodes = {n["metadata"]["name"]: n for n in self.node_informer.list()}
        total = len(nodes)
        if not total:
            self._record_failure(pod, "0/0 nodes are available: no nodes available to schedule pods.")
            if qp is not None:
                self.queue.failed(qp)
            return False
        if self.dra is not None and self.dra.wants(pod):  # DRA claims: tests/sim/dra_allocator.py
            names, filtered = self.filter_nodes(pod)
            if not names:
                self._record_failure(pod, fit_error_message(total, filtered))
                if qp is not None:
                    self.queue.failed(qp, frozenset({qu.NODE_UNSCHEDULABLE}))
                return False
            ok = bool(self.dra.schedule(self, pod, names))
            if qp is not None:
                (self.queue.done if ok else self.queue.failed)(qp)
            return ok
        use_extender = self.extender_url is not None and wants_extender(pod, self.managed_resources)
        node = self._evaluate_nominated(pod, nodes, use_extender)
        statuses: dict[str, pre.Status] = {}
        plugins: set[str] = set()
        if node is None:
            for name, n in nodes.items():  # the framework's filters
                st = self.framework_fit(pod, n, self.node_pods(name))
                if st is not None:
                    statuses[name] = st
                    plugins.add(qu.NODE_UNSCHEDULABLE if st.code == pre.UNRESOLVABLE and not any(
                        r.startswith(("Insufficient ", "Too many pods")) for r in st.reasons)
                                else qu.NODE_RESOURCES_FIT)
            names = sorted(n for n in nodes if n not in statuses)
            if names and use_extender:
                self.filter_calls += 1
                result = self.post_extender("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
                err = _get(result, "Error")
                if err:  # not a FitError: no PostFilter, the nomination is cleared, backoffQ
                    if qp is not None:
                        self.queue.failed(qp)
                    self.set_nomination(pod, "")
                    self._record_failure(pod, err)
                    return False
                chosen = _get(result, "NodeNames") or []
                if chosen:
                    node = chosen[0]  # with one extender and no scorers, the single node it returns wins
                else:  # FailedNodes: Unschedulable; FailedAndUnresolvableNodes: UnschedulableAndUnresolvable
                    for name, why in (_get(result, "FailedNodes") or {}).items():
                        statuses[name] = pre.Status(pre.UNSCHEDULABLE, [why])
                    for name, why in (_get(result, "FailedAndUnresolvableNodes") or {}).items():
                        statuses[name] = pre.Status(pre.UNRESOLVABLE, [why])
                    plugins.add(qu.EXTENDER)
            elif names and wants_extender(pod, (self.count_resource,)):
                node, _failed = self._fit_counts(pod, names)  # least allocated of the nodes that fit
                node = node or names[0]
            elif names:
                counts = Counter((p.get("spec") or {}).get("nodeName") for p in self.pod_informer.list())
                node = min(names, key=lambda n: (counts.get(n, 0), n))
        if node is None:
            self._fit_failure(pod, qp, total, statuses, frozenset(plugins))
            return False
        key = pod_key(pod)
        with self._lock:
            self._assumed[key] = (node, pod_requests(pod, self.count_resource))
            self._assumed_pods[key] = pod
            self.nominator.pop(key, None)  # schedule_one.go assume: DeleteNominatedPodIfExists
        self._binding.acquire()
        threading.Thread(target=self._binding_cycle, args=(pod, node, qp, use_extender),
                         name=f"bind-{md['name']}", daemon=True).start()
        return True

    def _evaluate_nominated(self, pod: dict, nodes: dict[str, dict], use_extender: bool) -> str | None:
        """``evaluateNominatedNode``: a pod nominated by an earlier preemption tries that node first, with
        the framework's filters and the extender (given that one node); a failure here is only logged."""
        name = (pod.get("status") or {}).get("nominatedNodeName")
        if not name or name not in nodes:
            return None
        if self.framework_fit(pod, nodes[name], self.node_pods(name)) is not None:
            return None
        if not use_extender:
            return name
        try:
            self.filter_calls += 1
            result = self.post_extender("filter", {"Pod": pod, "Nodes": None, "NodeNames": [name]})
        except Exception as exc:  # noqa: BLE001 - "Evaluation failed on nominated node"
            logger.warning("Evaluation failed on nominated node pod=%s node=%s: %s", pod_key(pod), name, exc)
            return None
        if _get(result, "Error"):
            return None
        return name if name in (_get(result, "NodeNames") or []) else None

    def _fit_failure(self, pod: dict, qp: qu.QueuedPod | None, total: int, statuses: dict[str, pre.Status],
                     plugins: frozenset[str]) -> None:
        """A ``FitError``: PostFilter (DefaultPreemption), then ``handleSchedulingFailure``: the queue, the
        nomination (kept, cleared or set as PostFilter says), the ``FailedScheduling`` event whose text
        is ``FitError.Error()`` with the PostFilter message at its end."""
        post_msg = ""
        outcome = None
        if self.preemption is not None:
            outcome = self.preemption.post_filter(pod, statuses, total)
            post_msg = outcome.status.message
        if qp is not None:
            self.queue.failed(qp, plugins)
        if outcome is not None and outcome.nominate is not None:
            md = pod["metadata"]
            latest = self.pod_informer.get(md.get("namespace", "default"), md["name"])
            self.set_nomination(latest or pod, outcome.nominate)
        self._record_failure(pod, pre.fit_error(total, statuses, post_filter=post_msg))

    def _binding_cycle(self, pod: dict, node: str, qp: qu.QueuedPod | None, use_extender: bool) -> None:
        md = pod["metadata"]
        ns, name, key = md.get("namespace", "default"), md["name"], pod_key(pod)
        try:
            if use_extender:
                ext = self._extender()
                try:
                    self.bind_calls += 1
                    res = ext.post("bind", {"PodName": name, "PodNamespace": ns, "PodUID": md.get("uid", ""),
                                            "Node": node})
                finally:
                    self._clients.put(ext)
                err = _get(res, "Error")
                if err:
                    raise RuntimeError(f"binding rejected: {err}")
            else:
                self.client.bind_pod(ns, name, node, uid=md.get("uid"))
        except Exception as exc:
            with self._lock:
                self._assumed.pop(key, None)
                self._assumed_pods.pop(key, None)
            self._record_failure(pod, str(exc) if str(exc).startswith("binding rejected") else
                                 f"binding rejected: {exc}")
            if qp is not None:
                self.queue.failed(qp)
            # the forgotten assumed pod frees its node: everything else may fit now (handleBindingCycleError)
            self.queue.move_all(qu.ASSIGNED_POD_DELETE, skip=key)
            return
        finally:
            self._binding.release()
        self._bound(pod, node)  # stays assumed until the informer shows it bound (_on_pod_update)
        if qp is not None:
            self.queue.done(qp)

    def _bound(self, pod: dict, node: str) -> None:
        md = pod["metadata"]
        with self._lock:
            self.bound[f"{md.get('namespace')}/{md['name']}"] = node
            self.bound_at[f"{md.get('namespace')}/{md['name']}"] = time.monotonic()
        logger.info("Successfully bound pod to node pod=%s/%s node=%s", md.get("namespace"), md["name"], node)
        if self.post_events:
            self._event(pod, "Normal", "Scheduled",
                        f"Successfully assigned {md.get('namespace')}/{md['name']} to {node}")

    def _record_failure(self, pod: dict, message: str) -> None:
        md = pod["metadata"]
        key = f"{md.get('namespace')}/{md['name']}"
        with self._lock:
            self.failures.append((key, message))
            del self.failures[:-10000]
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
        """Wait until ``expect_bound`` pods are bound (or, without it, until the queue is empty)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                n = len(self.bound)
            if expect_bound is not None and n >= expect_bound:
                return True
            if expect_bound is None and self.queue.empty():
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
    p.add_argument("--max-in-unschedulable", type=float, default=300.0,
                   help="podMaxInUnschedulablePodsDuration in seconds (default 300)")
    p.add_argument("--preempt-verb", default=None, help="the extender's preemptVerb (default: none, as HAMi)")
    p.add_argument("--no-preemption", action="store_true", help="no DefaultPreemption PostFilter")
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=0)
    args = p.parse_args(argv)
    from hami_agent import log
    from hami_agent.k8s.client import KubeClient

    log.setup(args.verbosity)
    logging.getLogger("tests").addHandler(logging.getLogger("hami_agent").handlers[0])
    logging.getLogger("tests").setLevel(logging.INFO)
    client = KubeClient.from_kubeconfig(args.kubeconfig)
    sim = KubeSchedulerSim(client, args.extender, args.scheduler_name, workers=args.workers,
                           initial_backoff_s=args.initial_backoff, max_backoff_s=args.max_backoff,
                           max_in_unschedulable_s=args.max_in_unschedulable,
                           preemption=not args.no_preemption, preempt_verb=args.preempt_verb)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sim.start()
    stop.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

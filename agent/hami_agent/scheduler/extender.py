"""/filter and /bind (reference §4.3-4.6): request parsing, the cache decision, pod annotations,
node lock, binding and events. HTTP-free: ``server`` maps routes onto these methods."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hami_agent import log
from hami_agent.protocol import ProtocolError, encode_pod_devices, keys
from hami_agent.protocol.annotations import DEFAULT_GPU_POLICY, DEFAULT_NODE_POLICY
from hami_agent.protocol.nodelock import DEFAULT_LOCK_EXPIRY
from hami_agent.protocol.quantity import quantity_int
from hami_agent.protocol.requests import RequestConfig, RequestSettings
from hami_agent.scheduler import events as ev
from hami_agent.scheduler.cache import UsageCache, collapse
from hami_agent.scheduler.fit import PodContext, QuotaBudget, pod_context
from hami_agent.scheduler.model import PodUsage
from hami_agent.scheduler.requests import RequestError, pod_request

logger = logging.getLogger(__name__)


class BadRequest(ValueError):
    """Malformed extender arguments; the message names the field (HTTP 400)."""


@dataclass
class SchedulerConfig:
    scheduler_name: str = "hami-scheduler"
    node_policy: str = DEFAULT_NODE_POLICY
    gpu_policy: str = DEFAULT_GPU_POLICY
    # resource names and request defaults: hami_agent.config.NvidiaConfig (from --config) or the
    # protocol's stand-alone RequestConfig (HAMi chart defaults)
    names: RequestSettings = field(default_factory=RequestConfig)
    node_lock_timeout_s: float = DEFAULT_LOCK_EXPIRY.total_seconds()  # HAMi NodeLockTimeout (5 min)
    event_nodes: int = 50  # fit nodes listed in a FilteringSucceed event
    quota_ttl_s: float = 10.0
    sync_timeout_s: float = 10.0  # how long /filter waits for the caches before answering an error
    # webhook
    force_overwrite_default_scheduler: bool = True
    gpu_core_policy: str = "default"
    overwrite_env: bool = False
    runtime_class_name: str = ""


def field_ci(obj: dict, name: str) -> Any:
    """Go's encoding/json matches keys case-insensitively: kube-scheduler sends ``Pod``/``NodeNames``
    (the extender/v1 structs have no json tags) while hand-written clients send ``pod``/``nodenames``."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if k.lower() == low:
            return v
    return None


class Extender:
    def __init__(self, cache: UsageCache, config: SchedulerConfig | None = None, client: Any = None,
                 events: ev.EventSink | None = None, metrics: Any = None) -> None:
        self.cache = cache
        self.config = config or SchedulerConfig()
        self.client = client
        self.events = events
        self.metrics = metrics
        self.synced = threading.Event()
        self._quota: dict[str, tuple[float, tuple[int | None, int | None] | None]] = {}

    # ----------------------------------------------------------------------------------- filter
    def filter(self, args: dict) -> dict:
        if not isinstance(args, dict):
            raise BadRequest("ExtenderArgs: body must be a JSON object")
        pod = field_ci(args, "Pod")
        if not isinstance(pod, dict):
            raise BadRequest("ExtenderArgs.Pod: missing or not an object")
        names, nodes_obj = self._names(args)
        md = pod.get("metadata") or {}
        ns, name, uid = md.get("namespace") or "default", md.get("name") or "", md.get("uid") or ""
        if not name:
            raise BadRequest("ExtenderArgs.Pod.metadata.name: missing")
        log.v(logger, 5, "filter pod %s/%s uid %s on %d nodes", ns, name, uid, len(names))
        try:
            preq = pod_request(pod, self.config.names)
        except RequestError as exc:
            return self._result(error=f"pod {ns}/{name}: {exc}")
        if preq.empty:
            return self._result(names=names, nodes_obj=nodes_obj)
        if not self.synced.wait(self.config.sync_timeout_s):
            return self._result(error="scheduler cache not synced yet (waiting for informers / leadership)")
        try:
            ctx = pod_context(md.get("annotations") or {}, self.config.node_policy, self.config.gpu_policy)
        except ProtocolError as exc:  # HAMi: an invalid scoring-weights annotation fails the filter
            return self._result(error=f"pod {ns}/{name}: {exc}")
        limits = self._quota_limits(ns)  # API read (cached) outside the lock
        simulate = nodes_obj is not None
        key = uid or f"{ns}/{name}"
        with self.cache.lock:
            if not simulate:
                self.cache.remove_pod(key)  # a retry must not count the pod twice
            # budget under the lock: concurrent filters of one namespace must see each other's pods
            quota = self._budget(ns, limits)
            try:
                dec = self.cache.decide(names, preq, ctx, quota,
                                        self.config.event_nodes if self.events else 0, pod_name=name)
            except ValueError as exc:
                raise BadRequest(f"ExtenderArgs.NodeNames: {exc}") from exc
            if dec.node is not None and not simulate:
                self.cache.add_pod(PodUsage(uid=key, namespace=ns, name=name, node=dec.node,
                                            devices=collapse(dec.fit.containers, preq.n_init), mig=preq.mig))
        if dec.node is None:
            self._count("filter", "unschedulable")
            logger.info("pod %s/%s: no node fits: %d nodes do not meet", ns, name, len(dec.failed))
            if self.events:
                for msg in ev.filtering_failed_messages(dec.failed):
                    self.events.emit(pod, ev.WARNING, ev.FILTERING_FAILED, msg)
            if not simulate:
                self._clear_stale_assignment(pod, ns, name)
            return self._result(failed=dec.failed)
        if log.enabled(logger, 2):
            log.v(logger, 2, "pod %s/%s: schedule to node %s (score %.2f, %d nodes fit, policy %s/%s)",
                  ns, name, dec.node, self.cache.nodes[dec.node].score if dec.node in self.cache.nodes else 0,
                  dec.n_fit, ctx.node_policy, ",".join(ctx.gpu_policy))
        if simulate:
            items = [n for n in (nodes_obj.get("items") or [])
                     if (n.get("metadata") or {}).get("name") == dec.node]
            return self._result(nodes_obj={"kind": "NodeList", "apiVersion": "v1", "items": items})
        if self.client is not None:
            encoded = encode_pod_devices(dec.fit.containers)  # Picked has ContainerDevice's fields
            ann = {keys.VGPU_NODE: dec.node, keys.VGPU_TIME: str(int(time.time())),
                   keys.DEVICES_TO_ALLOCATE: encoded, keys.DEVICES_ALLOCATED: encoded}
            try:
                self.client.patch_pod_metadata(ns, name, annotations=ann, labels={keys.VGPU_NODE: dec.node})
            except Exception as exc:
                self.cache.remove_pod(key)
                self._count("filter", "error")
                logger.error("patch pod %s/%s annotations failed: %s", ns, name, exc)
                return self._result(error=f"patch pod error: {exc}")
        self._count("filter", "scheduled")
        if self.events:
            self.events.emit(pod, ev.NORMAL, ev.FILTERING_SUCCEED, ev.filtering_succeed_message(
                dec.node, len(names) - dec.n_fit, dec.n_fit, dec.fit_nodes, dec.scores))
        return self._result(names=[dec.node])

    def _clear_stale_assignment(self, pod: dict, ns: str, name: str) -> None:
        """A pod retried after a failed bind still carries its old assignment. It no longer holds
        those GPUs (we removed it from the cache), so remove the annotations too: otherwise the next
        informer update of the pod would count the old assignment again (HAMi keeps it: accounting drift).
        """
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if self.client is None or keys.VGPU_NODE not in ann:
            return
        stale = {k: None for k in (keys.VGPU_NODE, keys.VGPU_TIME, keys.DEVICES_TO_ALLOCATE,
                                   keys.DEVICES_ALLOCATED, keys.BIND_PHASE, keys.BIND_TIME) if k in ann}
        try:
            self.client.patch_pod_metadata(ns, name, annotations=stale, labels={keys.VGPU_NODE: None})
            log.v(logger, 3, "pod %s/%s: cleared its stale assignment to node %s", ns, name,
                  ann[keys.VGPU_NODE])
        except Exception as exc:
            logger.warning("pod %s/%s: clearing stale assignment failed: %s", ns, name, exc)

    def _names(self, args: dict) -> tuple[list[str], dict | None]:
        raw = field_ci(args, "NodeNames")
        if raw is not None:
            if type(raw) is not list:  # element types are checked where names are hashed (decide)
                raise BadRequest("ExtenderArgs.NodeNames: must be a list of strings")
            return raw, None
        nodes = field_ci(args, "Nodes")
        if nodes is None:
            return [], None
        if not isinstance(nodes, dict) or not isinstance(nodes.get("items", []), list):
            raise BadRequest("ExtenderArgs.Nodes: must be a NodeList object with items")
        out = []
        for i, n in enumerate(nodes.get("items") or []):
            nm = (n.get("metadata") or {}).get("name") if isinstance(n, dict) else None
            if not isinstance(nm, str):
                raise BadRequest(f"ExtenderArgs.Nodes.items[{i}].metadata.name: missing")
            out.append(nm)
        return out, nodes

    @staticmethod
    def _result(names: list[str] | None = None, nodes_obj: dict | None = None,
                failed: dict[str, str] | None = None, error: str = "") -> dict:
        """ExtenderFilterResult as Go marshals it (no json tags: Go field names)."""
        if nodes_obj is not None:
            names = None
        return {"Nodes": nodes_obj, "NodeNames": names, "FailedNodes": failed or None,
                "FailedAndUnresolvableNodes": None, "Error": error}

    def _quota_budget(self, ns: str) -> QuotaBudget | None:
        return self._budget(ns, self._quota_limits(ns))

    def _budget(self, ns: str, limits: tuple[int | None, int | None] | None) -> QuotaBudget | None:
        if limits is None:
            return None
        mem_limit, cores_limit = limits
        used_mem, used_cores = self.cache.namespace_usage(ns)
        return QuotaBudget(None if mem_limit is None else mem_limit - used_mem,
                           None if cores_limit is None else cores_limit - used_cores)

    def _quota_limits(self, ns: str) -> tuple[int | None, int | None] | None:
        if self.client is None or not hasattr(self.client, "list_resource_quotas"):
            return None
        now = time.monotonic()
        hit = self._quota.get(ns)
        if hit is not None and now - hit[0] < self.config.quota_ttl_s:
            return hit[1]
        mem_key = "limits." + self.config.names.resource_memory_name
        core_key = "limits." + self.config.names.resource_core_name
        value: tuple[int | None, int | None] | None = None
        try:
            mem = cores = None
            for q in self.client.list_resource_quotas(ns):
                hard = (q.get("spec") or {}).get("hard") or {}
                if mem_key in hard:
                    v = quantity_int(hard[mem_key], f"resourcequota {mem_key}")
                    mem = v if mem is None else min(mem, v)
                if core_key in hard:
                    v = quantity_int(hard[core_key], f"resourcequota {core_key}")
                    cores = v if cores is None else min(cores, v)
            if mem is not None or cores is not None:
                value = (mem, cores)
        except Exception as exc:  # quota is advisory here; the API server enforces it anyway
            log.v(logger, 3, "list resourcequotas in %s failed: %s", ns, exc)
        self._quota[ns] = (now, value)
        return value

    def context_for(self, pod: dict) -> PodContext:
        return pod_context(((pod.get("metadata") or {}).get("annotations")) or {},
                           self.config.node_policy, self.config.gpu_policy)

    # ------------------------------------------------------------------------------------- bind
    def bind(self, args: dict) -> dict:
        if not isinstance(args, dict):
            raise BadRequest("ExtenderBindingArgs: body must be a JSON object")
        vals = {}
        for f in ("PodName", "PodNamespace", "Node"):
            v = field_ci(args, f)
            if not isinstance(v, str) or not v:
                raise BadRequest(f"ExtenderBindingArgs.{f}: missing or not a string")
            vals[f] = v
        uid = field_ci(args, "PodUID") or None
        ns, name, node = vals["PodNamespace"], vals["PodName"], vals["Node"]
        if self.client is None:
            return {"Error": "no API client configured"}
        from hami_agent.k8s.nodelock import lock_node, release_node_lock

        locked = False
        pod: dict = {"metadata": {"namespace": ns, "name": name, "uid": uid}}
        try:
            pod = self.client.get_pod(ns, name)
            has_devices = keys.DEVICES_TO_ALLOCATE in ((pod.get("metadata") or {}).get("annotations") or {})
            if has_devices:
                lock_node(self.client, node, ns, name, expiry_s=self.config.node_lock_timeout_s)
                locked = True
                self.client.patch_pod_metadata(ns, name, annotations={
                    keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING, keys.BIND_TIME: str(int(time.time()))})
            self.client.bind_pod(ns, name, node, uid=uid)
        except Exception as exc:
            msg = str(exc)
            logger.error("bind pod %s/%s to node %s failed: %s", ns, name, node, msg)
            if locked:
                try:
                    release_node_lock(self.client, node, ns, name)
                except Exception as rel_exc:
                    logger.error("release node lock of %s after failed bind: %s", node, rel_exc)
            self._count("bind", "error")
            if self.events:
                self.events.emit(pod, ev.WARNING, ev.BINDING_FAILED, msg)
            return {"Error": msg}
        self._count("bind", "ok")
        logger.info("pod %s/%s bound to node %s", ns, name, node)
        if self.events:
            self.events.emit(pod, ev.NORMAL, ev.BINDING_SUCCEED, ev.binding_succeed_message(node, ns, name))
        return {"Error": ""}

    def _count(self, verb: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.requests.labels(verb, result).inc()

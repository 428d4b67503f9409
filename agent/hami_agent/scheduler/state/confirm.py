"""Before /filter refuses a pod for capacity, ask the API whether the few pods in the way still exist.

Why: kube-scheduler and this extender watch the API separately. When kube-scheduler acts on a pod's
deletion (or its turn to Succeeded/Failed) first, it retries the pods it parked at once, and this
extender's cache may still count the GPU the gone pod held: the retried pod is refused, and kube-scheduler
adds a backoff (1 s doubling per refusal) before the next try — 2-5 s after the GPU freed, even with the
freed-capacity announcement of ``requeue.py`` (Project-HAMi/HAMi#1368, #1875). Avoiding that refusal is
the only way to run the pod within a second or two.

How: on a refusal (and only then: nothing changes on the path that places a pod), the pods counted on
the candidate nodes are *suspects* when they alone stand between the pod and a node — the node would fit
the pod if they counted nothing (checked on a copy of the node's state) — and the node has at most
``max_gets`` of them. Each is read with one GET (a consistent read by name, never a list); one the API no
longer has (404, or the name now belongs to another UID) or that has finished is no longer counted, and
/filter decides once more. A pod that still exists keeps counting, whatever its state (a terminating pod's
containers may still run), so the cache never counts less than the API shows: no GPU is over-committed.

A node with more pods than one refusal may read is looked at GPU by GPU when every container of the pod
asks one GPU at most: the pods of one GPU are suspects when they alone keep the pod off the node, the
GPUs with the fewest pods first, within ``max_gets`` in all (the default split of 10 lets ten pods share
a GPU: ``max_gets`` covers one such GPU, or an 8-GPU node with a pod on each GPU).

Cost, bounded: at most ``max_gets`` GETs per refusal (a cluster whose candidate nodes, and GPUs, hold more
pods than that each is not checked at all: no request), each with a short timeout inside one ``budget_s``
for the whole check, and a client-side rate limit shared by all refusals (a refusal that finds no token
does not check). The informer stays the source of truth: its later events for a pod forgotten here change
nothing (the pod is gone), and an older event it replays first can only count the pod again for a moment
(over-counting is safe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from hami_agent import log
from hami_agent.k8s.errors import KubeError, NotFoundError
from hami_agent.k8s.ratelimit import RateLimiter
from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import PodRequest, PodUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.podinfo import is_terminated

logger = logging.getLogger(__name__)

MAX_GETS = 10  # GETs per refusal at most: every pod that one GPU holds at the default split of 10
MAX_FITS = 64  # candidate nodes examined per refusal at most (a fit on a copy each: ~0.1 ms)


class GoneCheck:
    """``release(names, preq, ctx, uid)`` from /filter when no node fits: the nodes whose capacity it
    freed (then /filter decides again), or [] (refuse as before)."""

    def __init__(self, cache: UsageCache, client: Any, *, max_gets: int = MAX_GETS, budget_s: float = 1.0,
                 qps: float = 20.0, burst: int = 40, max_fits: int = MAX_FITS) -> None:
        self.cache = cache
        # one attempt, within the check's budget: kube-scheduler's scheduling cycle waits for this answer
        self.client = client
        self._views = hasattr(client, "with_options")
        self.max_gets = max_gets
        self.budget_s = budget_s
        self.max_fits = max_fits
        self.limiter = RateLimiter(qps, burst)
        self.gets = 0  # GETs made (tests, benchmarks)
        self.released = 0  # pods the API said were gone while the cache still counted them

    def suspects(self, names: Iterable[str], preq: PodRequest, ctx: PodContext,
                 uid: str) -> list[PodUsage]:
        """The counted pods that alone keep the pod off a candidate node, fewest per node first, at most
        ``max_gets`` of them."""
        per_node: list[tuple[int, str, list[PodUsage]]] = []
        # nodes with nothing to confirm, or more pods than one refusal may read, are passed over here
        few = self.cache.few_settled_pods(names, self.max_gets, skip=uid)
        for node, pods in sorted(few.items(), key=lambda kv: (len(kv[1]), kv[0]))[:self.max_fits]:
            if self.cache.fits_without(node, pods, preq, ctx):
                per_node.append((len(pods), node, pods))
        if not per_node and not preq.mig and all(c is None or c.nums <= 1 for c in preq.containers):
            per_node = self._one_gpu_suspects(names, set(few), preq, ctx, uid)
        out: list[PodUsage] = []
        for _n, _node, pods in sorted(per_node, key=lambda t: (t[0], t[1])):
            if len(out) + len(pods) > self.max_gets:
                break
            out.extend(pods)
        return out

    def _one_gpu_suspects(self, names: Iterable[str], seen: set[str], preq: PodRequest, ctx: PodContext,
                          uid: str) -> list[tuple[int, str, list[PodUsage]]]:
        """For a one-GPU pod, on busy nodes (more pods than one refusal may read): per GPU, its pods, when
        they alone keep the pod off the node. At most ``max_fits`` nodes walked and fits on a copy, as above;
        which GPU freed is not known here, so the GPUs with the fewest pods are read first."""
        out: list[tuple[int, str, list[PodUsage]]] = []
        fits = walked = 0
        for node in dict.fromkeys(names):
            if node in seen:
                continue
            if walked >= self.max_fits:  # each node's pods are walked: a refusal at 5,000 nodes walks few
                return out
            walked += 1
            for pods in self.cache.few_settled_pods_per_gpu(node, self.max_gets, skip=uid):
                if fits >= self.max_fits:
                    return out
                fits += 1
                if self.cache.fits_without(node, pods, preq, ctx):
                    out.append((len(pods), node, pods))  # read fewest first, within max_gets in all
        return out

    def release(self, names: Iterable[str], preq: PodRequest, ctx: PodContext, uid: str) -> list[str]:
        with self.cache.lock:
            suspects = self.suspects(names, preq, ctx, uid)
        if not suspects or not self.limiter.try_accept():
            return []
        deadline = time.monotonic() + self.budget_s
        gone: list[PodUsage] = []
        for i, pod in enumerate(suspects):
            left = deadline - time.monotonic()
            if i and (left <= 0.01 or not self.limiter.try_accept()):
                break
            client = (self.client.with_options(timeout_s=left, attempts=1, limiter=None) if self._views
                      else self.client)
            try:
                self.gets += 1
                obj = client.get_pod(pod.namespace, pod.name)
            except NotFoundError:
                gone.append(pod)
                continue
            except KubeError as exc:  # the API is slow or failing: refuse as before, the informer catches up
                log.v(logger, 3, "confirming pod %s/%s before a refusal failed: %s", pod.namespace, pod.name,
                      exc)
                break
            if str((obj.get("metadata") or {}).get("uid") or "") != pod.uid or is_terminated(obj):
                gone.append(pod)
        freed: list[str] = []
        for pod in gone:
            if self.cache.forget_gone(pod.uid, pod) is not None:
                self.released += 1
                freed.append(pod.node)
                log.v(logger, 3, "pod %s/%s on node %s is gone in the API but still counted: no longer "
                      "counted (the informer is behind)", pod.namespace, pod.name, pod.node)
        return list(dict.fromkeys(freed))


__all__ = ["MAX_GETS", "GoneCheck"]

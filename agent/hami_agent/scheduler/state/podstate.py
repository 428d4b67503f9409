"""Where the extender takes a pod's state from, and which pods it may decide for.

The body of a /filter or /bind request gives the pod's identity only (namespace, name, uid): anyone
who can reach the extender can write a body, and kube-scheduler's copy of the pod may be older than the
API's. The pod's spec and annotations come from the extender's own informer of pending pods with our
``schedulerName`` or, on a miss (the informer has not seen the pod yet, or holds an older pod of the
same name), from a GET — always matched on namespace, name *and* uid. Between the two, for /bind: the API's
answer to this extender's own assignment write (``note_written``), which is the pod as a GET would have
read it at that moment; /bind usually follows that write by milliseconds, before the watch shows it.

A pod may be decided for only while it is pending for this scheduler: not bound (``spec.nodeName``),
not terminating (``metadata.deletionTimestamp``), phase Pending, ``spec.schedulerName`` ours. Anything
else is refused with a reason and nothing is written.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hami_agent.k8s.errors import KubeError, NotFoundError


class PodRefused(Exception):
    """The extender may not decide for this pod; the message says why (it goes into ``Error``)."""


def pod_uid(pod: dict) -> str:
    md = pod.get("metadata")
    return str(md.get("uid") or "") if isinstance(md, dict) else ""


def refusal(pod: dict, scheduler_name: str) -> str:
    """Why the extender must not decide for ``pod`` ("" when it may)."""
    md = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    if md.get("deletionTimestamp"):
        return f"is terminating (deletionTimestamp {md['deletionTimestamp']}): nothing to schedule"
    if spec.get("nodeName"):
        return f"is already bound to node {spec['nodeName']}: the extender decides only for pending pods"
    phase = status.get("phase") or "Pending"
    if phase != "Pending":
        return f"is {phase}, not Pending: the extender decides only for pending pods"
    if spec.get("schedulerName") != scheduler_name:
        return (f"has schedulerName {spec.get('schedulerName')!r}, not {scheduler_name!r}: this extender "
                "decides only for its own scheduler's pods")
    return ""


WRITTEN_KEPT = 256  # answers to our own assignment writes kept for /bind (~6 KB each)


class PodStates:
    """Trusted pod state for the request paths. ``cached``: the informer's ``get(ns, name)`` (None to
    always GET). ``client``: an API client view with the request path's timeout."""

    def __init__(self, client: Any, cached: Callable[[str, str], dict | None] | None,
                 scheduler_name: str) -> None:
        self.client = client
        self.cached = cached
        self.scheduler_name = scheduler_name
        self.hits = 0
        self.gets = 0
        self.written_hits = 0
        self._written: OrderedDict[str, dict] = OrderedDict()  # uid -> the answer to our own write
        self._written_lock = threading.Lock()

    def note_written(self, pod: object) -> None:
        """Keep the API's answer to this extender's write of ``pod`` for the pod's /bind (the newest
        ``WRITTEN_KEPT`` answers: a /bind comes within a second of its /filter's write)."""
        uid = pod_uid(pod) if isinstance(pod, dict) else ""
        if not uid:
            return
        with self._written_lock:
            self._written[uid] = pod
            self._written.move_to_end(uid)
            while len(self._written) > WRITTEN_KEPT:
                self._written.popitem(last=False)

    def written(self, ns: str, name: str, uid: str) -> dict | None:
        """The answer to this extender's own write of the pod when it is the same pod (namespace, name and
        uid) and pending for this scheduler; else None (ask the API). A write that a later change overtook
        is caught by the conditional write made on this copy. Kept until ``forget_written`` (the bind
        ended): a bind that waited for a node lock reads it again."""
        with self._written_lock:
            pod = self._written.get(uid)
        if pod is None:
            return None
        md = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        if md.get("namespace") != ns or md.get("name") != name or refusal(pod, self.scheduler_name):
            return None
        self.written_hits += 1
        return pod

    def forget_written(self, uid: str) -> None:
        with self._written_lock:
            self._written.pop(uid, None)

    def get(self, ns: str, name: str, uid: str, fresh: bool = False) -> dict:
        """The pod with this namespace, name and uid; raises ``PodRefused`` when it does not exist (any
        more) or ``KubeError`` when the API cannot be read. ``fresh``: skip the informer."""
        if not fresh and self.cached is not None:
            pod = self.cached(ns, name)
            if pod is not None and pod_uid(pod) == uid:
                self.hits += 1
                return pod
        if self.client is None:
            raise PodRefused("not found in the scheduler's pod cache (no API client to ask)")
        self.gets += 1
        try:
            pod = self.client.get_pod(ns, name)
        except NotFoundError:
            raise PodRefused("not found: it was deleted (or never existed)") from None
        have = pod_uid(pod)
        if have != uid:
            raise PodRefused(f"has uid {have}, not {uid}: the pod named in the request was deleted and "
                             "replaced")
        return pod

    def schedulable(self, ns: str, name: str, uid: str, fresh: bool = False) -> dict:
        """:meth:`get`, then refused unless the pod is pending for this scheduler."""
        pod = self.get(ns, name, uid, fresh)
        why = refusal(pod, self.scheduler_name)
        if why:
            raise PodRefused(why)
        return pod


__all__ = ["KubeError", "PodRefused", "PodStates", "pod_uid", "refusal"]

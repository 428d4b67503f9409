"""After a pod write whose outcome is not known to have happened, set the usage cache from the API's
truth — never from a guess.

/filter reserves a pod's devices in the cache (an *assumption*, see ``UsageCache``) before it patches the
pod's annotations. If that patch fails, the reservation must not simply be dropped: a timeout, a
connection reset or a 5xx can come *after* the API server applied the write (the finding this module
fixes: the pod kept its allocation, the cache no longer counted it, and the next pod over-committed the
GPU). So the pod is read back:

* the API shows our annotations → the write happened: keep counting it;
* the API shows something else at a newer resourceVersion → our conditional write (it carried the
  resourceVersion we read) can never apply any more: count what the API shows;
* the API still shows the resourceVersion we wrote against → the write may still be in flight: keep
  counting our reservation (over-counting is safe, under-counting is not) and let the ``Healer`` look
  again with backoff until the resourceVersion moves or ``settle_s`` (longer than kube-apiserver's
  ``--request-timeout``, default 1m0s, after which the server abandons a request) has passed;
* the read itself fails → same as in flight.

Every repair applies only while the cache still holds the assumption it was made for, so a late repair
never overwrites a newer decision for the same pod.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hami_agent.k8s.errors import KubeError, NotFoundError
from hami_agent.scheduler.state.cache import Signature, UsageCache
from hami_agent.scheduler.state.heal import Healer
from hami_agent.scheduler.state.podinfo import countable_usage, is_terminated, signature
from hami_agent.scheduler.state.podstate import pod_uid

logger = logging.getLogger(__name__)

APPLIED, NOT_APPLIED, UNKNOWN = "applied", "not applied", "unknown"


def _rv(pod: dict) -> str:
    return str((pod.get("metadata") or {}).get("resourceVersion") or "")


class Reconciler:
    def __init__(self, cache: UsageCache, client: Any, healer: Healer, names: Any, scheduler_name: str, *,
                 settle_s: float = 90.0, assume_ttl_s: float = 300.0) -> None:
        self.cache = cache
        self.client = client
        self.healer = healer
        self.names = names
        self.scheduler_name = scheduler_name
        self.settle_s = settle_s
        self.assume_ttl_s = assume_ttl_s

    def after_write(self, uid: str, ns: str, name: str, sent_rv: str, expected: Signature,
                    ambiguous: bool) -> str:
        """Resolve a failed annotation write of ``expected``; returns APPLIED, NOT_APPLIED or UNKNOWN
        (then the cache keeps the reservation and a background repair finishes the job)."""
        settle_at = time.monotonic() + self.settle_s
        out = self._check(uid, ns, name, sent_rv, expected, ambiguous, settle_at)
        if out == UNKNOWN:
            self._queue(uid, ns, name, sent_rv, expected, ambiguous, settle_at)
        return out

    def _queue(self, uid: str, ns: str, name: str, sent_rv: str, expected: Signature,  # noqa: PLR0917
               ambiguous: bool, settle_at: float) -> None:
        def task() -> float | None:
            out = self._check(uid, ns, name, sent_rv, expected, ambiguous, settle_at)
            return 1.0 if out == UNKNOWN else None

        self.healer.submit(f"reconcile:{uid}", task, delay_s=0.5, deadline_s=self.settle_s + 120.0)

    def _check(self, uid: str, ns: str, name: str, sent_rv: str, expected: Signature,  # noqa: PLR0917
               ambiguous: bool, settle_at: float) -> str:
        a = self.cache.assumption(uid)
        if a is None or a.signature != expected:
            return NOT_APPLIED if a is not None else APPLIED  # superseded or confirmed meanwhile
        try:
            truth = self.client.get_pod(ns, name)
        except NotFoundError:
            self.cache.drop_assumption(uid, expected)
            return NOT_APPLIED
        except KubeError as exc:
            logger.warning("pod %s/%s: cannot read back after a failed write (%s); keeping the "
                           "reservation until the API answers", ns, name, exc)
            return UNKNOWN
        if pod_uid(truth) != uid or is_terminated(truth):
            self.cache.drop_assumption(uid, expected)
            return NOT_APPLIED
        if signature(truth) == expected:
            logger.info("pod %s/%s: the annotation write whose answer was lost was applied; counting it",
                        ns, name)
            return APPLIED
        if ambiguous and _rv(truth) == sent_rv and time.monotonic() < settle_at:
            return UNKNOWN  # not applied yet, but the request may still be in flight
        usage, sig = countable_usage(truth, self.names, self.scheduler_name)
        self.cache.replace_assumption(uid, expected, usage, sig, self.assume_ttl_s)
        logger.info("pod %s/%s: annotation write not applied; the cache now counts the API's state (%s)",
                    ns, name, "assigned to " + sig[0] if sig else "no assignment")
        return NOT_APPLIED

    def audit(self) -> None:
        """Re-read pods whose assumption the informer has not confirmed within its TTL (e.g. the watch
        skipped that state in a relist) and count what the API shows."""
        for uid in self.cache.stale_assumptions():
            a = self.cache.assumption(uid)
            usage = self.cache.pods.get(uid)
            if a is None:
                continue
            if usage is None:  # "nothing assumed" and never confirmed: the informer's delete covers it
                self.cache.drop_assumption(uid, a.signature)
                continue
            try:
                truth = self.client.get_pod(usage.namespace, usage.name)
            except NotFoundError:
                self.cache.drop_assumption(uid, a.signature)
                continue
            except KubeError as exc:
                logger.warning("audit of pod %s/%s failed: %s", usage.namespace, usage.name, exc)
                continue
            if pod_uid(truth) != uid or is_terminated(truth):
                self.cache.drop_assumption(uid, a.signature)
                continue
            u, _sig = countable_usage(truth, self.names, self.scheduler_name)
            self.cache.settle(uid, a.signature, u)

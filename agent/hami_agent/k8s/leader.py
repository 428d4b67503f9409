"""``LeaderElector``: leader election on a coordination.k8s.io/v1 Lease, with client-go's rules.

* A candidate takes the Lease when it does not exist, is released (empty ``holderIdentity``), or has not
  been renewed for ``leaseDurationSeconds`` *as observed on this candidate's own clock* — we time from
  when we last saw the record change, never from the holder's timestamps, so clock skew between nodes
  cannot cause two leaders.
* Every write is a conditional update (``metadata.resourceVersion``): two candidates racing for an
  expired Lease cannot both win (the loser gets 409 Conflict).
* The leader renews every ``retry_period_s``; if it cannot renew for ``renew_deadline_s`` it steps down
  (``on_stopped_leading``) before anyone else may take over (lease duration > renew deadline).
* ``stop()`` releases the Lease (empty holder, duration 1 s) so a successor takes over at once.
* **Fencing**: ``lease_valid()`` is true only until ``renew_deadline_s`` after the *start* of the last
  successful renew, on this process's monotonic clock. Another candidate can take over only
  ``lease_duration_s`` after it saw that renew, which it saw after we sent it; so a leader that checks
  ``lease_valid()`` before each write stops writing at least ``lease_duration_s - renew_deadline_s``
  before anyone else can lead, even when its own renew loop is stuck (a deposed leader that has not
  noticed yet). Writes that could still be in flight across that margin must be conditional
  (resourceVersion preconditions) — the elector cannot fence those by itself.
* ``annotations`` are written on the Lease with every acquire and renew, in the same conditional update
  as the holder, so a reader always sees them together with the holder that wrote them (the scheduler
  publishes its extender URL this way: followers forward to the leader).

Defaults are client-go's / kube-scheduler's: lease 15 s, renew deadline 10 s, retry 2 s.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from hami_agent import log
from hami_agent.k8s.client import KubeClient, now_micro
from hami_agent.k8s.errors import ConflictError, KubeError, NotFoundError

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
JITTER = 1.2  # client-go's JitterFactor for the acquire loop


def default_identity() -> str:
    return f"{os.environ.get('NODE_NAME') or socket.gethostname()}_{uuid.uuid4()}"


class LeaderElector:
    def __init__(self, client: KubeClient, namespace: str, name: str, identity: str | None = None, *,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None,
                 on_new_leader: Callable[[str], None] | None = None,
                 release_on_stop: bool = True, clock: Callable[[], float] = time.monotonic,
                 annotations: dict[str, str] | None = None) -> None:
        if not lease_duration_s > renew_deadline_s > retry_period_s * JITTER:
            raise ValueError("leader election needs lease_duration_s > renew_deadline_s > "
                             f"retry_period_s*{JITTER} (got {lease_duration_s}, {renew_deadline_s}, "
                             f"{retry_period_s})")
        # One bounded attempt per try: the loop itself retries every retry period, and a renew must
        # never outlive the renew deadline (client-go bounds it with a context the same way).
        self._client = client.with_options(timeout_s=min(client.timeout_s, renew_deadline_s / 2), attempts=1)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._release_on_stop = release_on_stop
        self._clock = clock
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._observed_duration_s = lease_duration_s
        self._observed_transitions = 0
        self._last_renew = 0.0
        self._valid_until = 0.0  # fencing deadline (monotonic): see lease_valid()
        # The Lease carries whole seconds: never trust our writes longer than what others will wait.
        self._fence_s = min(renew_deadline_s, float(max(1, round(lease_duration_s))))
        self._leader = ""
        self.annotations = dict(annotations or {})
        self._leader_record: tuple[str, dict[str, str]] = ("", {})  # (holder, its Lease annotations)
        self._rng = random.Random()

    # -- public API
    def start(self) -> LeaderElector:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def is_leader(self) -> bool:
        return self._leading.is_set()

    def leader(self) -> str:
        """Identity of the current holder as last observed ("" when unknown or released)."""
        return self._leader

    def lease_valid(self) -> bool:
        """True while this candidate leads *and* its last successful renew started less than
        ``renew_deadline_s`` ago (monotonic clock). Check it right before every write a leader makes."""
        return self._leading.is_set() and self._clock() < self._valid_until

    def leader_annotation(self, key: str) -> str | None:
        """Annotation ``key`` of the Lease as written by its current holder (None when there is no
        holder or it did not write one). Holder and annotations come from the same read of the Lease."""
        holder, ann = self._leader_record
        return ann.get(key) if holder else None

    # -- loop
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.is_leader():
                    started = self._clock()
                    ok = self._try_acquire_or_renew()
                    now = self._clock()
                    if ok:
                        self._last_renew = now
                        self._valid_until = started + self._fence_s
                    elif now - self._last_renew >= self.renew_deadline_s:
                        logger.error("failed to renew lease %s/%s: timed out after %.1fs; stepping down",
                                     self.namespace, self.name, now - self._last_renew)
                        self._step_down()
                        continue
                    self._stop.wait(self.retry_period_s)
                else:
                    started = self._clock()
                    if self._try_acquire_or_renew():
                        self._last_renew = self._clock()
                        self._valid_until = started + self._fence_s
                        logger.info("successfully acquired lease %s/%s as %s", self.namespace, self.name,
                                    self.identity)
                        self._leading.set()
                        if self._on_started is not None:
                            threading.Thread(target=self._safe, args=(self._on_started,),
                                             name="on-started-leading", daemon=True).start()
                        continue
                    self._stop.wait(self.retry_period_s * (1 + JITTER * self._rng.random()))
        finally:
            if self.is_leader():
                if self._release_on_stop:
                    self._release()
                self._step_down()

    def _step_down(self) -> None:
        self._leading.clear()
        if self._on_stopped is not None:
            self._safe(self._on_stopped)

    def _safe(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            logger.exception("leader election callback failed")

    def _record(self, holder: str, acquire: str, renew: str, transitions: int, duration_s: int) -> Obj:
        return {"holderIdentity": holder, "leaseDurationSeconds": duration_s, "acquireTime": acquire,
                "renewTime": renew, "leaseTransitions": transitions}

    def _observe(self, spec: Obj, meta: Obj | None = None) -> None:
        holder = spec.get("holderIdentity") or ""
        self._leader_record = (holder, dict((meta or {}).get("annotations") or {}))
        key = (holder, str(spec.get("renewTime") or ""))
        if key != self._observed:
            self._observed = key
            self._observed_at = self._clock()
            self._observed_duration_s = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            self._observed_transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self._leader:
            self._leader = holder
            if holder:
                log.v(logger, 4, "new leader for lease %s/%s: %s", self.namespace, self.name, holder)
                if self._on_new_leader is not None:
                    cb = self._on_new_leader
                    self._safe(lambda: cb(holder))

    def _lease_seconds(self) -> int:
        # The Lease field is whole seconds; tests use sub-second durations locally.
        return max(1, round(self.lease_duration_s))

    def _try_acquire_or_renew(self) -> bool:
        now = now_micro()
        try:
            lease = self._client.get_lease(self.namespace, self.name)
        except NotFoundError:
            meta: Obj = {"name": self.name, "namespace": self.namespace}
            if self.annotations:
                meta["annotations"] = dict(self.annotations)
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                    "spec": self._record(self.identity, now, now, 0, self._lease_seconds())}
            try:
                created = self._client.create("leases", body, self.namespace)
            except KubeError as e:
                log.v(logger, 4, "cannot create lease %s/%s: %s", self.namespace, self.name, e)
                return False
            self._observe(created.get("spec") or {}, created.get("metadata"))
            return True
        except KubeError as e:
            logger.warning("error retrieving lease %s/%s: %s", self.namespace, self.name, e)
            return False
        spec = lease.get("spec") or {}
        self._observe(spec, lease.get("metadata"))
        holder = spec.get("holderIdentity") or ""
        i_hold = holder == self.identity
        if holder and not i_hold and self._clock() < self._observed_at + self._observed_duration_s:
            return False  # held by someone else and not expired (by our clock)
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire = str(spec.get("acquireTime") or now)
        if not i_hold:
            transitions += 1
            acquire = now
        new = dict(lease)
        new["metadata"] = dict(lease.get("metadata") or {})  # carries resourceVersion → conditional
        if self.annotations:
            ann = dict(new["metadata"].get("annotations") or {})
            ann.update(self.annotations)
            new["metadata"]["annotations"] = ann
        new["spec"] = self._record(self.identity, acquire, now, transitions, self._lease_seconds())
        try:
            updated = self._client.replace("leases", new)
        except ConflictError:
            log.v(logger, 4, "lease %s/%s changed under us (409 Conflict)", self.namespace, self.name)
            return False
        except KubeError as e:
            logger.warning("failed to update lease %s/%s: %s", self.namespace, self.name, e)
            return False
        self._observe(updated.get("spec") or {}, updated.get("metadata"))
        return True

    def _release(self) -> None:
        try:
            lease = self._client.get_lease(self.namespace, self.name)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            new = dict(lease)
            now = now_micro()
            new["spec"] = self._record("", now, now, int(spec.get("leaseTransitions") or 0), 1)
            self._client.with_options(attempts=2).replace("leases", new)
            logger.info("released lease %s/%s", self.namespace, self.name)
        except KubeError as e:
            logger.warning("failed to release lease %s/%s: %s", self.namespace, self.name, e)


__all__ = ["LeaderElector", "default_identity"]

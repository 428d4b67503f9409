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
                 release_on_stop: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
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
        self._leader = ""
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

    def wait_for_leadership(self, timeout: float) -> bool:
        return self._leading.wait(timeout)

    # -- loop
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.is_leader():
                    ok = self._try_acquire_or_renew()
                    now = self._clock()
                    if ok:
                        self._last_renew = now
                    elif now - self._last_renew >= self.renew_deadline_s:
                        logger.error("failed to renew lease %s/%s: timed out after %.1fs; stepping down",
                                     self.namespace, self.name, now - self._last_renew)
                        self._step_down()
                        continue
                    self._stop.wait(self.retry_period_s)
                else:
                    if self._try_acquire_or_renew():
                        self._last_renew = self._clock()
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

    def _observe(self, spec: Obj) -> None:
        holder = spec.get("holderIdentity") or ""
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
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._record(self.identity, now, now, 0, self._lease_seconds())}
            try:
                created = self._client.create("leases", body, self.namespace)
            except KubeError as e:
                log.v(logger, 4, "cannot create lease %s/%s: %s", self.namespace, self.name, e)
                return False
            self._observe(created.get("spec") or {})
            return True
        except KubeError as e:
            logger.warning("error retrieving lease %s/%s: %s", self.namespace, self.name, e)
            return False
        spec = lease.get("spec") or {}
        self._observe(spec)
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
        new["spec"] = self._record(self.identity, acquire, now, transitions, self._lease_seconds())
        try:
            updated = self._client.replace("leases", new)
        except ConflictError:
            log.v(logger, 4, "lease %s/%s changed under us (409 Conflict)", self.namespace, self.name)
            return False
        except KubeError as e:
            logger.warning("failed to update lease %s/%s: %s", self.namespace, self.name, e)
            return False
        self._observe(updated.get("spec") or {})
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

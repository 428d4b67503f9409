"""HAMi's node lock (``hami.io/mutex.lock``, Project-HAMi/HAMi ``pkg/util/nodelock/nodelock.go``) over the
API.

The scheduler's ``/bind`` takes it before binding a pod to a node; the device plugin finds the pod via
the lock's owner and releases it after Allocate. Compatible with HAMi's value and rules:

* value ``<RFC3339>,<namespace>,<pod>`` (legacy: a bare RFC3339 time, no owner);
* written with a JSON merge-patch that carries the node's ``resourceVersion`` (optimistic concurrency:
  of two racing schedulers exactly one wins, the other sees 409 and re-reads);
* 409 conflicts are retried with HAMi's backoff (5 steps, 100 ms, factor 2, jitter 0.5);
* the same pod locking again counts as acquired;
* a lock older than the expiry (default 5 min), or one whose owner pod is gone (NotFound), is taken over
  — in one conditional patch, so there is no window where a third party could slip in between a
  release and a set (HAMi does release + set as two writes);
* so is a lock whose owner provably no longer needs it (deliberate difference from HAMi, so a lock whose
  release failed heals at the next bind instead of blocking the node until expiry): the owner is bound
  to *another* node, has finished (Succeeded/Failed), or is bound to this node with its Allocate done
  (``hami.io/bind-phase`` ``success``/``failed``). An owner that is still pending is never taken over: it
  may be between its lock and its binding;
* a busy node gives exactly HAMi's ``node <n> has been locked within 5m0s: node lock contention``;
* release removes the annotation only when its ``,<ns>,<pod>`` owner suffix matches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from hami_agent import log
from hami_agent.k8s.backoff import Backoff, hami_nodelock_backoff
from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.errors import ConflictError, NotFoundError
from hami_agent.protocol import keys
from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.nodelock import NodeLockValue, format_lock_value, parse_lock_value
from hami_agent.protocol.timefmt import format_go_duration

logger = logging.getLogger(__name__)

DEFAULT_EXPIRY_S = 300.0
WatchedPod = Callable[[str, str], "dict | None"]  # (namespace, name) -> the pod as a watch shows it
CONTENTION = "node lock contention"


class NodeLockError(Exception):
    """The lock could not be taken or released; the message says why in HAMi's words."""

    def __init__(self, message: str, node: str = "", holder: str = "", *, from_watch: bool = False) -> None:
        super().__init__(message)
        self.node = node
        self.holder = holder
        self.from_watch = from_watch  # judged busy from the watches' copies alone (no read): may be stale


def contention_message(node_name: str, expiry_s: float) -> str:
    return f"node {node_name} has been locked within {format_go_duration(expiry_s)}: {CONTENTION}"


def _lock_annotation(node: dict) -> str | None:
    return ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_LOCK)


def _rv(node: dict) -> str:
    return str((node.get("metadata") or {}).get("resourceVersion", ""))


def lock_node(client: KubeClient, node_name: str, namespace: str, pod_name: str,  # noqa: PLR0913
              expiry_s: float = DEFAULT_EXPIRY_S, *, now: Callable[[], datetime] | None = None,
              backoff: Backoff | None = None, cached: dict | None = None,
              watched_pod: WatchedPod | None = None, judge_cached_lock: bool = False) -> str:
    """Take the node lock for pod ``namespace/pod_name`` and return the lock value now on the node;
    raise ``NodeLockError`` if the node is busy (or conflicts persist through the backoff).
    ``KubeError`` propagates for API failures (after a timeout the lock may or may not be set: the
    caller reads it back, e.g. with :func:`release_node_lock`, which only removes its owner's lock).

    ``cached``: the node as a watch last showed it. When it shows no lock, the first attempt patches
    against its resourceVersion instead of reading the node first (HAMi's LockNode GETs it every time);
    the patch is conditional, so a stale copy costs one 409, after which the node is read as usual.
    A lock in the cached copy is always read afresh before it is judged.

    ``watched_pod(namespace, name)``: the lock owner as a watch shows it. When that copy says the owner
    still needs the lock (the common case: it is being bound or allocated), the node is busy without a
    GET of the owner; only a copy that says it is done, or none, is confirmed from the API before the
    lock is taken over (a watch may lag, and a live lock is never taken on a stale copy).

    ``judge_cached_lock``: a lock in the cached copy whose owner the pod watch shows still needing it (and
    that is not expired) makes the node busy without reading it: ``NodeLockError`` with ``from_watch``. Only
    for a caller that then waits for the node watch to show the release and reads the node itself if the
    watch does not show it soon (``lockwait``): the copies may be stale, so this judgement may only ever
    delay a bind, never let one take or skip a lock."""
    clock = now or (lambda: datetime.now(timezone.utc))
    bo = backoff or hami_nodelock_backoff()
    if judge_cached_lock and cached is not None and watched_pod is not None:
        _busy_in_copies(cached, node_name, namespace, pod_name, expiry_s, clock(), watched_pod)
    if cached is not None and _rv(cached) and not _lock_annotation(cached):
        try:
            return _patch_lock(client, node_name, namespace, pod_name, _rv(cached), clock())
        except ConflictError as e:  # the copy was stale: read the node (no backoff: nothing contended yet)
            log.v(logger, 4, "node lock on %s from the watch's copy: %s; reading the node", node_name,
                  e.summary)
    while True:
        try:
            return _try_lock(client, node_name, namespace, pod_name, expiry_s, clock, watched_pod)
        except ConflictError as e:
            if bo.exhausted:
                raise NodeLockError(f"node {node_name} lock failed after {bo.steps} retries: {e}",
                                    node_name) from e
            delay = bo.next()
            log.v(logger, 4, "node lock on %s: %s; retrying in %.3fs", node_name, e.summary, delay)
            time.sleep(delay)


def _busy_in_copies(cached: dict, node_name: str, namespace: str, pod_name: str,  # noqa: PLR0913, PLR0917
                    expiry_s: float, now: datetime, watched_pod: WatchedPod) -> None:
    """Raise the contention error when the watches' copies show another pod's live lock on the node that
    its owner still needs; return (nothing judged) in every other case, the API then decides."""
    current = _lock_annotation(cached)
    if not current:
        return
    try:
        held = parse_lock_value(current)
    except ProtocolError:
        return
    if (not held.has_owner or held.owned_by(namespace, pod_name)
            or held.expired(now, timedelta(seconds=expiry_s))):
        return
    if not _watch_shows_needed(watched_pod, held, node_name):
        return
    raise NodeLockError(contention_message(node_name, expiry_s), node_name, f"{held.namespace}/{held.name}",
                        from_watch=True)


def _try_lock(client: KubeClient, node_name: str, namespace: str, pod_name: str, expiry_s: float,  # noqa: PLR0917
              clock: Callable[[], datetime], watched_pod: WatchedPod | None = None) -> str:
    node = client.get_node(node_name)
    current = _lock_annotation(node)
    now = clock()
    if current:
        try:
            held: NodeLockValue | None = parse_lock_value(current)
        except ProtocolError as e:
            # A value nobody can parse would block the node forever (HAMi returns the parse error on
            # every bind); treat it like an orphaned lock and take it over, loudly.
            logger.warning("node lock on %s has an unparsable value %r (%s); taking it over", node_name,
                           current, e)
            held = None
        if held is not None:
            if held.owned_by(namespace, pod_name):
                log.v(logger, 4, "node %s already locked by %s/%s", node_name, namespace, pod_name)
                return current
            expired = held.expired(now, timedelta(seconds=expiry_s))
            stale = _owner_stale(client, held, node_name, watched_pod) if (
                held.has_owner and not expired) else ""
            if expired:
                logger.info("Node lock expired: node=%s lockTime=%s timeout=%s; releasing and taking over",
                            node_name, held.when.isoformat(), format_go_duration(expiry_s))
            elif stale == OWNER_GONE:
                logger.info("Previous pod of NodeLock not found, releasing lock: node=%s pod=%s/%s",
                            node_name, held.namespace, held.name)
            elif stale:
                logger.info("Previous pod of NodeLock no longer needs it (%s), releasing lock: node=%s "
                            "pod=%s/%s", stale, node_name, held.namespace, held.name)
            else:
                owner = f"{held.namespace}/{held.name}" if held.has_owner else ""
                raise NodeLockError(contention_message(node_name, expiry_s), node_name, owner)
    return _patch_lock(client, node_name, namespace, pod_name, _rv(node), now)


def _owner_stale(client: KubeClient, held: NodeLockValue, node_name: str,
                 watched_pod: WatchedPod | None) -> str:
    """:func:`owner_done`, asked of the API only when the watch's copy does not already show the owner
    still needing the lock."""
    if _watch_shows_needed(watched_pod, held, node_name):
        return ""
    return owner_done(client, held.namespace, held.name, node_name)


def _watch_shows_needed(watched_pod: WatchedPod | None, held: NodeLockValue, node_name: str) -> bool:
    """The pod watch's copy of the lock's owner says it still needs the lock (no copy: not known)."""
    seen = watched_pod(held.namespace, held.name) if watched_pod is not None else None
    return seen is not None and not pod_done_with(seen, node_name)


def _patch_lock(client: KubeClient, node_name: str, namespace: str, pod_name: str, rv: str,  # noqa: PLR0917
                now: datetime) -> str:
    value = format_lock_value(now, namespace, pod_name)
    client.patch_node_annotations(node_name, {keys.NODE_LOCK: value}, resource_version=rv, decode=False)
    log.v(logger, 3, "node %s locked for pod %s/%s", node_name, namespace, pod_name)
    return value


OWNER_GONE = "owner pod not found"


def owner_done(client: KubeClient, namespace: str, name: str, node_name: str) -> str:
    """Why the lock owner ``namespace/name`` provably no longer needs node ``node_name``'s lock, or ""
    when it may still need it (pending: between its lock and its binding; or bound here and not yet
    allocated). API errors other than NotFound propagate: an unknown owner is never judged stale."""
    try:
        pod = client.get_pod(namespace, name)
    except NotFoundError:
        return OWNER_GONE
    return pod_done_with(pod, node_name)


def pod_done_with(pod: dict, node_name: str) -> str:
    """:func:`owner_done`'s judgement of one copy of the owner pod."""
    bound = (pod.get("spec") or {}).get("nodeName") or ""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return f"owner pod {phase}"
    if bound and bound != node_name:
        return f"owner pod bound to node {bound}"
    bind_phase = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.BIND_PHASE)
    if bound == node_name and bind_phase in (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED):
        return f"owner pod allocated ({keys.BIND_PHASE}={bind_phase})"
    return ""


def release_node_lock(client: KubeClient, node_name: str, namespace: str, pod_name: str, *,
                      force: bool = False, backoff: Backoff | None = None,
                      expected: str | None = None) -> bool:
    """Remove the lock if pod ``namespace/pod_name`` holds it. Returns True when removed, False when
    there was no lock. A lock held by another pod raises ``NodeLockError`` (unless ``force``).
    ``expected``: release only that exact value (a lock the same pod took again later is left alone:
    returns False)."""
    bo = backoff or hami_nodelock_backoff()
    while True:
        node = client.get_node(node_name)
        current = _lock_annotation(node)
        if not current:
            log.v(logger, 4, "node %s has no lock to release", node_name)
            return False
        if expected is not None and current != expected and current.endswith(f",{namespace},{pod_name}"):
            log.v(logger, 4, "node %s lock %r is a newer lock of %s/%s, not %r: left alone", node_name,
                  current, namespace, pod_name, expected)
            return False
        if not force and not current.endswith(f",{namespace},{pod_name}"):
            owner = _owner_of(current)
            raise NodeLockError(f"node {node_name} lock is held by {owner}, not by "
                                f"{namespace}/{pod_name}: refusing to release it", node_name, owner)
        try:
            client.patch_node_annotations(node_name, {keys.NODE_LOCK: None}, resource_version=_rv(node),
                                          decode=False)
            log.v(logger, 3, "node lock on %s released by %s/%s", node_name, namespace, pod_name)
            return True
        except ConflictError as e:
            if bo.exhausted:
                raise NodeLockError(f"node {node_name} lock release failed after {bo.steps} retries: {e}",
                                    node_name) from e
            time.sleep(bo.next())


def _owner_of(value: str) -> str:
    parts = value.split(",")
    return f"{parts[1]}/{parts[2]}" if len(parts) == 3 else f"an owner-less lock ({value})"


def read_node_lock(node: dict) -> NodeLockValue | None:
    """The parsed lock of a node object (None when absent); raises ``ProtocolError`` when malformed."""
    value = _lock_annotation(node)
    return parse_lock_value(value) if value else None


__all__ = ["CONTENTION", "DEFAULT_EXPIRY_S", "OWNER_GONE", "NodeLockError", "contention_message", "lock_node",
           "owner_done", "read_node_lock", "release_node_lock"]

"""Scheduler events (Project-HAMi/HAMi ``pkg/scheduler/event.go``), posted off the request path by one worker
thread.

Why a worker: an event is a write to the API; /filter must answer kube-scheduler without waiting for
it (HAMi also records events asynchronously through client-go's broadcaster).

Before posting, events go through ``EventCorrelator``, client-go's ``EventCorrelator``
(``staging/src/k8s.io/client-go/tools/record/events_cache.go``) with its defaults: a source may post 25
events about one object, then one more every 5 minutes (spam filter); more than 10 events about one
object that differ only in their message within 10 minutes become one event "(combined from similar
events): <latest message>" whose count goes up (aggregation); an identical event bumps the count of the
existing one (``KubeClient.create_event``). The worker has its own client-side rate limit (the
request paths have none), so a burst of events cannot slow binding: HAMi's events shared the client's
limiter with its binds (Project-HAMi/HAMi#745). A full queue drops events (``dropped``)."""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hami_agent.k8s.ratelimit import RateLimiter
from hami_agent.protocol import ProtocolError, parse_reason

logger = logging.getLogger(__name__)

FILTERING_FAILED = "FilteringFailed"
FILTERING_SUCCEED = "FilteringSucceed"
BINDING_FAILED = "BindingFailed"
BINDING_SUCCEED = "BindingSucceed"
WARNING = "Warning"
NORMAL = "Normal"


def filtering_failed_messages(failed: dict[str, str]) -> list[str]:
    """One message per reason type, ``"<k> nodes <Reason>(<node1,node2>)"``; the generic
    ``"no available node, <N> nodes do not meet"`` when no reason can be attributed."""
    by_reason: dict[str, list[str]] = {}
    parsed: dict[str, list[str]] = {}  # thousands of nodes share a few texts: each is parsed once
    for node, reason in failed.items():
        words = parsed.get(reason)
        if words is None:
            try:
                words = [w for w in parse_reason(reason) if w]  # "<n>/<m> <Reason>, ...": the protocol
            except ProtocolError:  # bare reasons such as NodeInsufficientDevice or "node unregistered"
                words = [reason] if reason else []
            parsed[reason] = words
        for word in words:
            by_reason.setdefault(word, []).append(node)
    if not by_reason:
        return [f"no available node, {len(failed)} nodes do not meet"]
    return [_listed(f"{len(nodes)} nodes {reason}(", sorted(nodes), ")")
            for reason, nodes in sorted(by_reason.items())]


def _listed(head: str, names: list[str], tail: str) -> str:
    """``head`` + the names joined by commas + ``tail``, within ``MESSAGE_MAX``: the names that do not fit
    become ``...(+<n> more)``. HAMi lists every node; at thousands of nodes that is ~60-100 KB per event,
    which ``KubeClient.create_event`` cut anyway, while up to 10,000 such messages could wait in the queue
    and 9 per pod in the aggregation cache."""
    full = head + ",".join(names) + tail
    if len(full) <= MESSAGE_MAX:
        return full
    out: list[str] = []
    size = len(head) + len(tail)
    for i, name in enumerate(names):
        need = len(name) + (1 if out else 0) + len(f",...(+{len(names) - i - 1} more)")
        if size + need > MESSAGE_MAX:
            break
        size += len(name) + (1 if out else 0)
        out.append(name)
    return f"{head}{','.join(out)}{',' if out else ''}...(+{len(names) - len(out)} more){tail}"


def filtering_succeed_message(node: str, n_unfit: int, n_fit: int, fit_nodes: list[str],
                              scores: dict[str, float]) -> str:
    listed = ",".join(f"{n}:{scores.get(n, 0.0):.2f}" for n in fit_nodes)
    if n_fit > len(fit_nodes):
        listed += f",...(+{n_fit - len(fit_nodes)} more)"  # capped: an event is not a node dump
    return f"find fit node({node}), {n_unfit} nodes not fit, {n_fit} nodes fit({listed})"


def binding_succeed_message(node: str, namespace: str, name: str) -> str:
    return f"Successfully binding node [{node}] to {namespace}/{name}"


MESSAGE_MAX = 1024  # what KubeClient.create_event keeps of a message (events.k8s.io's limit on a note)

# client-go tools/record/events_cache.go
MAX_LRU_ENTRIES = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL_S = 600.0
SPAM_BURST = 25
SPAM_QPS = 1.0 / 300.0
COMBINED_PREFIX = "(combined from similar events): "


@dataclass
class _Similar:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass(frozen=True)
class Correlated:
    """What to post: ``skip`` (spam), else ``message`` and, for an aggregate, the ``key`` of the one
    event that all similar events update (None: identical events are counted by their message)."""

    skip: bool
    message: str = ""
    key: tuple[str, ...] | None = None


class EventCorrelator:
    """Spam filter + aggregation of events about one object (see the module docstring). Thread-safe;
    every cache is an LRU of ``MAX_LRU_ENTRIES``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, max_events: int = AGGREGATE_MAX_EVENTS,
                 interval_s: float = AGGREGATE_INTERVAL_S, spam_burst: int = SPAM_BURST,
                 spam_qps: float = SPAM_QPS) -> None:
        self._clock = clock
        self.max_events = max_events
        self.interval_s = interval_s
        self.spam_burst = spam_burst
        self.spam_qps = spam_qps
        self._lock = threading.Lock()
        self._spam: collections.OrderedDict[tuple[str, ...], RateLimiter] = collections.OrderedDict()
        self._similar: collections.OrderedDict[tuple[str, ...], _Similar] = collections.OrderedDict()
        self.filtered = 0
        self.aggregated = 0

    @staticmethod
    def _lru_get(cache: collections.OrderedDict, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        value = cache.get(key)
        if value is None:
            value = cache[key] = make()
            while len(cache) > MAX_LRU_ENTRIES:
                cache.popitem(last=False)
        cache.move_to_end(key)
        return value

    def correlate(self, meta: dict, kind: str, type_: str, reason: str, message: str,
                  component: str) -> Correlated:
        obj = (component, kind, meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or "")
        with self._lock:
            bucket = self._lru_get(self._spam, obj, lambda: RateLimiter(self.spam_qps, self.spam_burst,
                                                                        clock=self._clock))
            if not bucket.try_accept():
                self.filtered += 1
                return Correlated(skip=True)
            key = (*obj, type_, reason)
            now = self._clock()
            rec = self._lru_get(self._similar, key, _Similar)
            if now - rec.last > self.interval_s:
                rec.messages = set()
            rec.messages.add(message)
            rec.last = now
            if len(rec.messages) < self.max_events:
                return Correlated(skip=False, message=message)
            rec.messages.pop()  # keep the set at its maximum (client-go's PopAny)
            self.aggregated += 1
            return Correlated(skip=False, message=COMBINED_PREFIX + message, key=key)


class EventSink:
    """Queues events and posts them with ``client.create_event``; bounded, drops when full.
    ``qps``/``burst``: the worker's own client-side rate limit (events only)."""

    def __init__(self, client: Any, component: str, maxsize: int = 10000, *, qps: float = 10.0,
                 burst: int = 50, correlator: EventCorrelator | None = None) -> None:
        self.client = client
        self.component = component
        self._q: queue.Queue = queue.Queue(maxsize=maxsize)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.correlator = correlator or EventCorrelator()
        self.limiter = RateLimiter(qps, burst)
        self.dropped = 0
        self.posted = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-sink", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._q.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def emit(self, pod: dict, type_: str, reason: str, message: str | Callable[[], str]) -> None:
        """Queue an event; ``message`` may be a function, called on the worker thread (work the request
        path should not wait for, e.g. counting every fitting node)."""
        try:
            self._q.put_nowait((pod, type_, reason, message))
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until queued events are posted (tests)."""
        done = threading.Event()
        try:
            self._q.put((None, None, None, done), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._q.get()
            if item is None:
                return
            pod, type_, reason, message = item
            if pod is None:
                message.set()
                continue
            if callable(message):
                try:
                    message = message()
                except Exception:  # a bug must not kill the worker
                    logger.exception("building the %s event message failed", reason)
                    continue
            # events are about pods, except the few about the Lease (a refused forward)
            kind = pod.get("kind") if pod.get("kind") == "Lease" else "Pod"
            ref = {"kind": kind, "apiVersion": pod.get("apiVersion", "v1") if kind != "Pod" else "v1",
                   "metadata": pod.get("metadata") or {}}
            verdict = self.correlator.correlate(ref["metadata"], kind, type_, reason, message,
                                                self.component)
            if verdict.skip:
                continue
            wait = self.limiter.reserve(float("inf"))
            if wait:
                self._stop.wait(wait)
            try:
                extra = {"key": verdict.key} if verdict.key is not None else {}
                self.client.create_event(ref, type_, reason, verdict.message, self.component, **extra)
                self.posted += 1
            except Exception as exc:  # an event is best effort; never kill the worker
                logger.warning("create event %s for %s %s/%s failed: %s", reason, kind.lower(),
                               ref["metadata"].get("namespace"), ref["metadata"].get("name"), exc)

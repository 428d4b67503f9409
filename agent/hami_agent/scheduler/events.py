"""Scheduler events (reference §4.5), posted off the request path by one worker thread.

Why a worker: an event is a write to the API; /filter must answer kube-scheduler without waiting for
it (HAMi also records events asynchronously through client-go's broadcaster)."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

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
    for node, reason in failed.items():
        try:
            words = list(parse_reason(reason))  # "<n>/<m> <Reason>, ..." (the protocol's format)
        except ProtocolError:  # bare reasons such as NodeInsufficientDevice or "node unregistered"
            words = [reason]
        for word in words:
            if word:
                by_reason.setdefault(word, []).append(node)
    if not by_reason:
        return [f"no available node, {len(failed)} nodes do not meet"]
    return [f"{len(nodes)} nodes {reason}({','.join(sorted(nodes))})"
            for reason, nodes in sorted(by_reason.items())]


def filtering_succeed_message(node: str, n_unfit: int, n_fit: int, fit_nodes: list[str],
                              scores: dict[str, float]) -> str:
    listed = ",".join(f"{n}:{scores.get(n, 0.0):.2f}" for n in fit_nodes)
    if n_fit > len(fit_nodes):
        listed += f",...(+{n_fit - len(fit_nodes)} more)"  # capped: an event is not a node dump
    return f"find fit node({node}), {n_unfit} nodes not fit, {n_fit} nodes fit({listed})"


def binding_succeed_message(node: str, namespace: str, name: str) -> str:
    return f"Successfully binding node [{node}] to {namespace}/{name}"


class EventSink:
    """Queues events and posts them with ``client.create_event``; bounded, drops when full."""

    def __init__(self, client: Any, component: str, maxsize: int = 10000) -> None:
        self.client = client
        self.component = component
        self._q: queue.Queue = queue.Queue(maxsize=maxsize)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
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

    def emit(self, pod: dict, type_: str, reason: str, message: str) -> None:
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
            ref = {"kind": "Pod", "apiVersion": "v1", "metadata": pod.get("metadata") or {}}
            try:
                self.client.create_event(ref, type_, reason, message, self.component)
                self.posted += 1
            except Exception as exc:  # an event is best effort; never kill the worker
                logger.warning("create event %s for pod %s/%s failed: %s", reason,
                               ref["metadata"].get("namespace"), ref["metadata"].get("name"), exc)

"""Every node's lock (``hami.io/mutex.lock``) as the node watch shows it: the one copy of that state.

Three parts of the extender follow the locks: /filter prefers nodes without one (``state.busy``), a
/bind that meets a held lock waits for its release (``verbs.lockwait``), and a bind done releases the
pod's locks on other nodes (``verbs.binder``). They read it here; the waiter
also hears, through ``subscribe``, when the watch shows a node without its lock or shows it gone. The
value is stored before the listeners run, so a reader that registers its interest first and reads the
value after cannot miss a release.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from hami_agent.protocol import keys

Listener = Callable[[str], None]


class NodeLocks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}  # node -> lock value, for nodes whose lock the watch shows held
        self._released: list[Listener] = []
        self._gone: list[Listener] = []

    def subscribe(self, released: Listener, gone: Listener) -> None:
        """``released(node)`` on every watch event that shows ``node`` without a lock; ``gone(node)`` when
        the node is deleted. Called on the watch's thread, after the value is stored."""
        with self._lock:
            self._released.append(released)
            self._gone.append(gone)

    # ------------------------------------------------------------------------------ node watch
    def on_node(self, node: dict) -> None:
        md = node.get("metadata") or {}
        name = md.get("name")
        if not name:
            return
        value = (md.get("annotations") or {}).get(keys.NODE_LOCK)
        with self._lock:
            if value:
                self._held[name] = value
            else:
                self._held.pop(name, None)
            listeners = () if value else tuple(self._released)
        for fn in listeners:
            fn(name)

    def on_node_delete(self, node: dict) -> None:
        name = (node.get("metadata") or {}).get("name")
        if not name:
            return
        with self._lock:
            self._held.pop(name, None)
            listeners = tuple(self._gone)
        for fn in listeners:
            fn(name)

    # ------------------------------------------------------------------------------ readers
    def value(self, node: str) -> str | None:
        """The lock value the watch shows on ``node``; None when free (or the node is unknown)."""
        with self._lock:
            return self._held.get(node)

    def held(self) -> set[str]:
        """The nodes whose lock is held now (a copy)."""
        with self._lock:
            return set(self._held)

    def owned_by(self, namespace: str, name: str) -> dict[str, str]:
        """{node: lock value} of the locks the watch shows held by pod ``namespace/name``. A scan: locks
        live from a bind to its Allocate, so few are held at any time."""
        suffix = f",{namespace},{name}"
        with self._lock:
            return {node: value for node, value in self._held.items() if value.endswith(suffix)}


__all__ = ["NodeLocks"]

"""``Informer``: a list+watch cache of pods or nodes (client-go's reflector + indexer, in small).

* list, then watch from the list's resourceVersion; the watch is re-opened from the last seen
  resourceVersion when it ends (server timeout) or breaks (connection lost, API server restarting),
  with exponential backoff and jitter between failed attempts; bookmarks keep that resourceVersion
  fresh while nothing changes, so a re-opened watch does not fall out of the server's history;
* lists are cheap for the API server, as client-go's reflector makes them (``tools/cache/reflector.go``
  ``relistResourceVersion``): the first list asks for ``resourceVersion=0`` (served from the watch cache,
  no etcd read), a relist after an expired watch for the last seen resourceVersion (also the cache); only
  when that is refused, or a consumer asks for the present (``relist()``), is a consistent list read,
  paginated (``limit``/``continue``, client-go's pager);
* 410 Gone / Expired (our resourceVersion left the server's history) → relist at once; the relist is
  diffed against the cache so handlers see the adds, updates and deletes they missed;
* the server-side watch timeout is drawn between ``watch_timeout_s`` and twice that (the reflector's
  ``minWatchTimeout * (1 + rand)``), so thousands of agents started together do not re-open their
  watches in the same second;
* every ``resync_s`` the cached objects are re-delivered to ``on_update(old, new)`` with old is new,
  so level-triggered consumers converge even if they dropped an event;
* the cache is safe to read from any thread; handlers run on the informer's threads, one at a time;
* ``relist(timeout)`` makes the informer list again *now* and waits until its handlers have seen that
  list: a consumer that must not act on a lagging cache (a scheduler that just became leader) gets a
  view at least as new as the moment it asked, delivered in order (the watch then continues from the
  list's resourceVersion, so no older event can arrive afterwards).

Objects are the API's JSON dicts; treat what ``list()``/``get()`` return as read-only.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hami_agent import log
from hami_agent.k8s.backoff import Backoff
from hami_agent.k8s.client import KubeClient, WatchStream, kind_info, too_large_rv
from hami_agent.k8s.errors import ExpiredError, KubeError

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]


@dataclass(frozen=True)
class _Handler:
    on_add: Callable[[Obj], None] | None
    on_update: Callable[[Obj, Obj], None] | None
    on_delete: Callable[[Obj], None] | None


def object_key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _replaced(prev: Obj, obj: Obj) -> bool:
    """Another object under the same name: deleted and created again (a StatefulSet's pod, a re-registered
    Node) while the watch did not see it. Handlers keyed by UID get the old one's delete and the new one's
    add, as an unbroken watch would have shown; client-go's Replace hands them an update across the two
    UIDs, which a UID-keyed handler misreads (the old pod's GPUs would stay counted)."""
    old_uid, uid = (prev.get("metadata") or {}).get("uid"), (obj.get("metadata") or {}).get("uid")
    return bool(old_uid and uid and old_uid != uid)


class Informer:
    """Watch-backed cache of ``kind`` ("pods" or "nodes"; any kind ``KubeClient`` knows works).

    ``field_selector="spec.nodeName=<node>"`` gives the device plugin's own-node pod cache; no selector
    gives the scheduler's all-pods / all-nodes caches."""

    def __init__(self, client: KubeClient, kind: str = "pods", field_selector: str | None = None,
                 label_selector: str | None = None, resync_s: float = 300.0, *, namespace: str | None = None,
                 watch_timeout_s: float = 300.0, backoff: Backoff | None = None,
                 name: str | None = None) -> None:
        kind_info(kind)  # validate early: a typo should fail at construction, not in a thread
        self._client = client
        self.kind = kind
        self.name = name or kind  # its threads' names: informer-<name> (py-spy, per-thread CPU)
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self._backoff = backoff or Backoff(duration_s=0.2, factor=2.0, jitter=0.5, steps=1 << 30, cap_s=10.0)
        self._cache: dict[Key, Obj] = {}
        self._cache_lock = threading.RLock()
        self._deliver_lock = threading.Lock()  # serializes handler calls across the two threads
        self._handlers: list[_Handler] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._threads: list[threading.Thread] = []
        self.resource_version = ""
        self._relist_cond = threading.Condition()
        self._relist_wanted = 0  # generation of the latest relist() request
        self._relist_done = 0  # newest request generation a completed list started after
        self.last_error: str | None = None
        self.relists = 0
        self.watch_restarts = 0
        self.consistent_lists = 0  # lists read from etcd (not the watch cache): relist() and fallbacks
        self._rv_unavailable = False  # the last resourceVersion was refused: the next list is consistent

    # -- public API
    def add_handler(self, on_add: Callable[[Obj], None] | None = None,
                    on_update: Callable[[Obj, Obj], None] | None = None,
                    on_delete: Callable[[Obj], None] | None = None) -> None:
        """Register callbacks. Added after the first sync, ``on_add`` is replayed for cached objects."""
        handler = _Handler(on_add, on_update, on_delete)
        with self._deliver_lock:
            self._handlers.append(handler)
            if self._synced.is_set() and on_add is not None:
                for obj in self.list():
                    self._call(on_add, obj)

    def start(self) -> Informer:
        if self._threads:
            return self
        self._stop.clear()
        name = f"informer-{self.name}"
        self._threads = [threading.Thread(target=self._run, name=name, daemon=True)]
        if self.resync_s and self.resync_s > 0:
            self._threads.append(threading.Thread(target=self._resync_loop, name=name + "-resync",
                                                  daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._relist_cond:
            self._relist_cond.notify_all()
        stream = self._stream
        if stream is not None:
            stream.close()
        for t in self._threads:
            t.join(timeout)
        self._threads = []

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def relist(self, timeout: float) -> bool:
        """List again now and wait until the handlers saw the result. True when done in time."""
        with self._relist_cond:
            self._relist_wanted += 1
            want = self._relist_wanted
        stream = self._stream
        if stream is not None:
            stream.close()  # ends the blocked watch read; the run loop then relists
        with self._relist_cond:
            return self._relist_cond.wait_for(lambda: self._relist_done >= want or self._stop.is_set(),
                                              timeout) and self._relist_done >= want

    def _relist_pending(self) -> bool:
        return self._relist_wanted > self._relist_done

    def list(self) -> list[Obj]:
        with self._cache_lock:
            return list(self._cache.values())

    def get(self, namespace: str | None, name: str) -> Obj | None:
        with self._cache_lock:
            return self._cache.get((namespace or "", name))

    def __len__(self) -> int:
        with self._cache_lock:
            return len(self._cache)

    # -- machinery
    def _run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or self._relist_pending():
                    self._relist()
                    need_list = False
                started = time.monotonic()
                delivered = self._watch_once()
                if self._relist_pending():
                    continue  # relist() closed the watch on purpose: no backoff
                if delivered or time.monotonic() - started >= 1.0:
                    self._backoff.reset()
                else:
                    # A watch that ends at once with nothing in it (a misbehaving proxy, say) must not
                    # turn this loop into a busy loop of requests.
                    self._stop.wait(self._backoff.next())
            except ExpiredError as e:
                logger.info("watch of %s expired (%s): relisting", self.kind, e.message or e.reason)
                self.last_error = str(e)
                need_list = True
            except KubeError as e:
                self.last_error = str(e)
                delay = self._backoff.next()
                logger.warning("%s; retrying in %.1fs", e, delay)
                self._stop.wait(delay)
            except Exception as e:  # never let the cache thread die silently
                self.last_error = f"{type(e).__name__}: {e}"
                delay = self._backoff.next()
                logger.exception("informer for %s failed; retrying in %.1fs", self.kind, delay)
                self._stop.wait(delay)

    def _relist(self) -> None:
        with self._relist_cond:
            gen = self._relist_wanted  # requests made before this LIST are answered by it
        items, rv = self._list(consistent=gen > self._relist_done)
        self.relists += 1
        fresh = {object_key(o): o for o in items}
        with self._cache_lock:
            old = self._cache
            self._cache = fresh
            self.resource_version = rv
        added: list[Obj] = []
        replaced: list[tuple[Obj, Obj]] = []
        updated: list[tuple[Obj, Obj]] = []
        for k, o in fresh.items():
            prev = old.get(k)
            if prev is None:
                added.append(o)
            elif _replaced(prev, o):
                replaced.append((prev, o))
            elif _rv(prev) != _rv(o):
                updated.append((prev, o))
        deleted = [o for k, o in old.items() if k not in fresh]
        with self._deliver_lock:
            for o in added:
                self._fire("add", o)
            for prev, o in replaced:
                self._fire("delete", prev)
                self._fire("add", o)
            for prev, o in updated:
                self._fire("update", o, prev)
            for o in deleted:
                self._fire("delete", o)
        self.last_error = None
        with self._relist_cond:
            self._relist_done = max(self._relist_done, gen)
            self._relist_cond.notify_all()
        if not self._synced.is_set():
            log.v(logger, 4, "informer for %s synced: %d objects at resourceVersion %s", self.kind,
                  len(fresh), rv)
        self._synced.set()

    def _list(self, consistent: bool) -> tuple[list[Obj], str]:
        """One (possibly paginated) list, from the cheapest source that is new enough (see the module
        docstring): ``consistent`` when a consumer asked for the present."""
        sel = (self.kind, self.namespace, self.label_selector, self.field_selector)
        if consistent or self._rv_unavailable:
            self.consistent_lists += 1
            items, rv = self._client.list(*sel, resource_version="")
            self._rv_unavailable = False
            return items, rv
        if not self.resource_version:
            return self._client.list(*sel, resource_version="0")
        try:
            # not older than what we saw: the watch cache answers it whole (no limit, no etcd read)
            return self._client.list(*sel, resource_version=self.resource_version, page_size=None)
        except KubeError as e:
            if not (isinstance(e, ExpiredError) or too_large_rv(e)):
                raise
            logger.info("list of %s at resourceVersion %s refused (%s): reading the present", self.kind,
                        self.resource_version, e.message or e.reason)
            self._rv_unavailable = True
            self.consistent_lists += 1
            items, rv = self._client.list(*sel, resource_version="")
            self._rv_unavailable = False
            return items, rv

    def _watch_once(self) -> int:
        """Run one watch until it ends; returns the number of events it delivered."""
        stream = self._client.watch(self.kind, self.resource_version, self.namespace,
                                    label_selector=self.label_selector, field_selector=self.field_selector,
                                    timeout_s=self.watch_timeout_s * (1.0 + random.random()))  # noqa: S311
        self._stream = stream
        self.watch_restarts += 1
        delivered = 0
        try:
            if self._stop.is_set() or self._relist_pending():
                return delivered
            for type_, obj in stream:
                if self._stop.is_set():
                    return delivered
                self._apply(type_, obj)
                delivered += 1
            return delivered
        finally:
            self._stream = None
            stream.close()

    def _apply(self, type_: str, obj: Obj) -> None:
        rv = _rv(obj)
        if type_ == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        key = object_key(obj)
        with self._cache_lock:
            prev = self._cache.get(key)
            if type_ == "DELETED":
                self._cache.pop(key, None)
            else:
                self._cache[key] = obj
            if rv:
                self.resource_version = rv
        with self._deliver_lock:
            if type_ == "DELETED":
                self._fire("delete", obj)
            elif prev is None:
                self._fire("add", obj)
            else:
                self._fire("update", obj, prev)

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.resync_s):
            if not self._synced.is_set():
                continue
            with self._deliver_lock:
                for obj in self.list():
                    self._fire("update", obj, obj)

    def _fire(self, what: str, obj: Obj, prev: Obj | None = None) -> None:
        """Call every handler for one event (caller holds ``_deliver_lock``)."""
        for h in self._handlers:
            if what == "add" and h.on_add is not None:
                self._call(h.on_add, obj)
            elif what == "update" and h.on_update is not None:
                self._call(h.on_update, prev if prev is not None else obj, obj)
            elif what == "delete" and h.on_delete is not None:
                self._call(h.on_delete, obj)

    def _call(self, fn: Callable[..., None], *args: Obj) -> None:
        try:
            fn(*args)
        except Exception:
            logger.exception("informer handler %s for %s failed", getattr(fn, "__name__", fn), self.kind)


__all__ = ["Informer", "object_key"]

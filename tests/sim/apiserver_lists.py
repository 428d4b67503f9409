"""List semantics of the simulated API server, and per-client request accounting.

What a real kube-apiserver does with a LIST depends on ``resourceVersion`` and ``limit`` (Kubernetes docs
"API Concepts", resource versions and "Retrieving large results sets in chunks"; the code is
``staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go`` ``GetList`` and ``storage/etcd3/store.go``
``GetList``). Modelled here:

* ``resourceVersion=0`` (any ``limit``): the watch cache; everything now, in one page (the cache ignores
  ``limit``);
* ``resourceVersion=N``, no ``limit``: the watch cache, once it has seen N; everything now. N newer than
  the server: it waits up to 3 s, then **504** ``Too large resource version``;
* ``resourceVersion=N`` with ``limit``: etcd, exactly at revision N, in pages; N compacted: **410**
  ``too old resource version``;
* no ``resourceVersion`` (a consistent read): etcd at the newest revision; pages of ``limit`` items with
  ``metadata.continue`` until the last page;
* ``continue=<token>``: etcd at the token's revision, the next page; that revision compacted meanwhile:
  **410** ``Expired`` with the "continue parameter is too old" text; ``continue`` together with a
  ``resourceVersion``: **400**.

Pages are read at the first page's revision, so objects created, changed or deleted while a client
pages through a list do not show up in it (etcd's MVCC snapshot): the store's event history is rolled
back to that revision. The first page's selection (sorted) is kept for the continue pages that follow
(a few lists per store), so a page costs O(page) as etcd's range read does, not a copy and sort of the
whole collection per page. A page holds exactly ``limit`` matching objects (the real server may return fewer
and a continue token when a selector filters many out; clients must and do handle both).

``RequestAccounting`` counts every request by client (User-Agent and user) and verb (the RBAC verb:
get, list, watch, create, update, patch, delete), with request and response bytes; lists are split by
where they were served from (``list`` from the watch cache, ``list-etcd`` for consistent or exact reads),
which is what makes a list expensive for a real control plane.
"""

from __future__ import annotations

import base64
import bisect
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.sim.apiserver_store import (
    ApiError,
    Obj,
    ResourceType,
    Store,
    bad_request,
    parse_field_selector,
    parse_label_selector,
)

TOO_LARGE_WAIT_S = 3.0  # the cacher waits this long for a resourceVersion it has not seen yet
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - "
    "objects that were created, modified, or deleted between the time the first chunk was returned and now "
    "may show up in the list.")


def _key(obj: Obj) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def encode_continue(rv: int, start: str) -> str:
    """The etcd3 store's token: base64 of ``{"v":"meta.k8s.io/v1","rv":<rev>,"start":"<key>\\x00"}``."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if data.get("v") != "meta.k8s.io/v1":
            raise ValueError(f"unknown version {data.get('v')!r}")
        return int(data["rv"]), str(data["start"]).rstrip("\x00")
    except (ValueError, KeyError, TypeError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from None


def _state_at(store: Store, rt: ResourceType, rv: int) -> list[Obj]:
    """The objects of ``rt`` as they were at revision ``rv`` (caller holds ``store.condition``): the
    current objects with every later change undone (MVCC read at an old revision)."""
    if store.expired(rv):
        raise ApiError(410, "Expired", f"too old resource version: {rv} ({store.oldest_rv()})")
    objs = {k: o for k, o in store._objects.items() if k[0] == rt.plural}  # noqa: SLF001 - same package
    for e in reversed(store.entries_after(rv)):
        if e.plural != rt.plural:
            continue
        md = e.new.get("metadata") or {}
        key = (rt.plural, md.get("namespace", "") if rt.namespaced else "", md.get("name", ""))
        if e.type == "ADDED":
            objs.pop(key, None)
        else:  # MODIFIED or DELETED: the object as it was before
            objs[key] = e.old
    return list(objs.values())


def _select(items: list[Obj], rt: ResourceType, ns: str | None, query: dict[str, str]) -> list[Obj]:
    lp = parse_label_selector(query.get("labelSelector"))
    fp = parse_field_selector(query.get("fieldSelector"), rt)
    out = [o for o in items
           if (not ns or (o.get("metadata") or {}).get("namespace") == ns) and lp(o) and fp(o)]
    out.sort(key=_key)
    return out


# Selected, sorted lists kept per store (``Store.list_snapshots``, by plural, namespace, selectors and
# revision) for the continue pages that follow. The state at a revision never changes (MVCC), so a later
# page is cut from the same selection: re-reading and sorting every object for each page of 500 made a
# 10,000-pod list cost O(objects) per page (O(objects²) in all), where etcd's range read costs O(page).
SNAPSHOTS_KEPT = 8

Snapshot = tuple[list[Obj], list[str]]  # the selected objects, sorted, and their keys


def _remember(store: Store, key: tuple, items: list[Obj]) -> Snapshot:
    snap = (items, [_key(o) for o in items])
    with store.condition:
        cache = store.list_snapshots
        cache[key] = snap
        while len(cache) > SNAPSHOTS_KEPT:
            cache.popitem(last=False)
    return snap


@dataclass(frozen=True)
class ListOutcome:
    payload: Obj
    source: str  # "cache" or "etcd"


def serve_list(store: Store, rt: ResourceType, ns: str | None, query: dict[str, str]) -> ListOutcome:
    """Answer one LIST request (see the module docstring for the rules)."""
    rv_param = query.get("resourceVersion") or ""
    token = query.get("continue") or ""
    limit_raw = query.get("limit") or ""
    try:
        limit = int(limit_raw) if limit_raw else 0
    except ValueError:
        raise bad_request(f"limit: Invalid value: {limit_raw!r}: must be an integer") from None
    if limit < 0:
        raise bad_request(f"limit: Invalid value: {limit}: must be >= 0")
    if rv_param and not rv_param.isdigit():
        raise bad_request(f"invalid resource version {rv_param!r}")
    if token and rv_param:
        raise bad_request("specifying resource version is not allowed when using continue")
    selection = (rt.plural, ns, query.get("labelSelector") or "", query.get("fieldSelector") or "")
    if token:
        at, start = decode_continue(token)
        source = "etcd"
        with store.condition:
            if store.expired(at):
                raise ApiError(410, "Expired", EXPIRED_CONTINUE)
            snap = store.list_snapshots.get((*selection, at))
            if snap is None:
                state = _state_at(store, rt, at)
        if snap is None:
            snap = _remember(store, (*selection, at), _select(state, rt, ns, query))
        items, keys = snap
        return _page(rt, query, items[bisect.bisect_right(keys, start):], at, limit, source)
    if rv_param == "0" or (rv_param and not limit):
        source = "cache"
        want = int(rv_param)
        deadline = time.monotonic() + TOO_LARGE_WAIT_S
        with store.condition:
            while store.current_rv() < want:
                left = deadline - time.monotonic()
                if left <= 0:
                    cause = {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                    raise ApiError(504, "Timeout", f"Too large resource version: {want}, current: "
                                   f"{store.current_rv()}", {"causes": [cause], "retryAfterSeconds": 1})
                store.condition.wait(min(left, 0.2))
            items, at = store.list(rt, ns)
        return _page(rt, query, _select(items, rt, ns, query), at, 0, source)  # the cache ignores limit
    source = "etcd"
    if rv_param:  # an exact revision, paginated: etcd at that revision
        at = int(rv_param)
        with store.condition:
            items = _state_at(store, rt, at)
    else:  # consistent read: etcd at the newest revision
        with store.condition:
            items, at = store.list(rt, ns)
    items = _select(items, rt, ns, query)
    if limit and len(items) > limit:  # continue pages will follow: keep the selection for them
        _remember(store, (*selection, at), items)
    return _page(rt, query, items, at, limit, source)


def _page(rt: ResourceType, query: dict[str, str], items: list[Obj], at: int, limit: int,
          source: str) -> ListOutcome:
    """The answer: ``items`` (selected, sorted, from the continue point on), cut to ``limit``."""
    meta: Obj = {"resourceVersion": str(at)}
    if limit and len(items) > limit:
        page = items[:limit]
        meta["continue"] = encode_continue(at, _key(page[-1]))
        if not query.get("labelSelector") and not query.get("fieldSelector"):
            meta["remainingItemCount"] = len(items) - limit
        items = page
    return ListOutcome({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                        "items": items}, source)


# ------------------------------------------------------------------------------------ accounting
@dataclass
class Tally:
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    codes: dict[int, int] = field(default_factory=dict)


ClientKey = tuple[str, str, str]  # (user agent, user, verb)


class RequestAccounting:
    """Requests per (User-Agent, user, verb), with bytes in and out. Thread-safe; ``reset()`` starts a
    new measurement window (benchmarks skip the start-up this way)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tally: dict[ClientKey, Tally] = defaultdict(Tally)
        self.since = time.monotonic()

    def record(self, user_agent: str, user: str, verb: str, code: int, bytes_in: int, bytes_out: int) -> None:
        with self._lock:
            t = self._tally[(user_agent or "", user or "", verb)]
            t.requests += 1
            t.bytes_in += bytes_in
            t.bytes_out += bytes_out
            t.codes[code] = t.codes.get(code, 0) + 1

    def add_bytes_out(self, user_agent: str, user: str, verb: str, n: int) -> None:
        """Bytes streamed after the request was counted (watch events)."""
        with self._lock:
            self._tally[(user_agent or "", user or "", verb)].bytes_out += n

    def reset(self) -> None:
        with self._lock:
            self._tally = defaultdict(Tally)
            self.since = time.monotonic()

    def snapshot(self) -> dict[ClientKey, Tally]:
        with self._lock:
            return {k: Tally(v.requests, v.bytes_in, v.bytes_out, dict(v.codes))
                    for k, v in self._tally.items()}

    def by(self, *, user_agent: str | None = None, user: str | None = None,
           agent_contains: str | None = None) -> dict[str, Tally]:
        """Tallies per verb for the clients matching the filters (exact UA / user, or a UA substring)."""
        out: dict[str, Tally] = defaultdict(Tally)
        for (ua, u, verb), t in self.snapshot().items():
            if user_agent is not None and ua != user_agent:
                continue
            if user is not None and u != user:
                continue
            if agent_contains is not None and agent_contains not in ua:
                continue
            o = out[verb]
            o.requests += t.requests
            o.bytes_in += t.bytes_in
            o.bytes_out += t.bytes_out
            for c, n in t.codes.items():
                o.codes[c] = o.codes.get(c, 0) + n
        return dict(out)


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def verb_of(method: str, query: dict[str, str], named: bool) -> str:
    """The RBAC verb of a request (``k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``)."""
    if method == "GET":
        if query.get("watch") in ("1", "true"):
            return "watch"
        return "get" if named else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}.get(method, method.lower())


def hook_info(attrs: Any) -> tuple[str, bool]:
    """(resource, named) from the RBAC request attributes the server computed, for ``verb_of``."""
    if attrs is None:
        return "", False
    return str(getattr(attrs, "resource", "") or ""), bool(getattr(attrs, "name", ""))


__all__ = ["EXPIRED_CONTINUE", "WRITE_VERBS", "ListOutcome", "RequestAccounting", "Tally", "decode_continue",
           "encode_continue", "serve_list", "verb_of"]

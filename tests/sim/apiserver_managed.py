"""``metadata.managedFields`` as kube-apiserver keeps it on every write (kubernetes
``staging/src/k8s.io/apimachinery/pkg/util/managedfields``): one entry per field manager, operation and
subresource, each listing the fields that manager set last (``fieldsV1``). Every client reads them in
every watch event and answer — they are most of a real pod's size — so the simulator keeps them too.

The manager is the request's ``fieldManager`` parameter, else its User-Agent up to the first ``/``
(``prefixFromUserAgent``). Writes of update/patch operations (``operation: Update``; server-side apply is
not served here) take the fields they change from every other manager, as the real field manager does for
updates. An update that sends no managedFields keeps the stored ones (``decodeLiveOrNew``); a subresource
always does. A write that changes nothing changes no entry (no new resourceVersion). ``pods/binding``
writes none: its REST handler updates storage directly.

Simplified (docs/testing.md): lists are associative by ``name`` (containers, volumes, env, ports keyed
so in kube too) or ``type`` (conditions), every other list is atomic; the ``.`` marker is written on list
items only.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from tests.sim.apiserver_store import now_rfc3339

Obj = dict[str, Any]
Path = tuple[str, ...]

_local = threading.local()
_SKIP_META = {"managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "name",
              "namespace", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"}


def set_manager(name: str | None) -> None:
    """The field manager of this thread's writes (None: writes that keep managedFields as they are)."""
    _local.manager = name


def manager() -> str | None:
    return getattr(_local, "manager", "sim-test")


def manager_from(query: dict[str, str], user_agent: str) -> str:
    return query.get("fieldManager") or user_agent.split("/", maxsplit=1)[0] or "unknown"


def track(rt: Any, old: Obj | None, new: Obj, subresource: str | None) -> None:
    """Set ``new``'s managedFields for this write (an on_write hook: ``new`` is a fresh copy). ``rt``: the
    ResourceType; the main resource of one with a status subresource records no status field (its
    status is reset by the server)."""
    who = manager()
    meta = new.get("metadata")
    if not isinstance(meta, dict):
        return
    old_meta = (old or {}).get("metadata") or {}
    live = old_meta.get("managedFields") or []
    given = meta.get("managedFields")
    entries = live if (subresource or not given) else given
    if who is None or subresource == "binding":
        if entries:
            meta["managedFields"] = entries
        return
    skip_status = subresource is None and "status" in rt.subresources
    before, after = _leaves(old or {}, skip_status), _leaves(new, skip_status)
    changed = {p for p, v in after.items() if before.get(p, _MISSING) != v}
    removed = set(before) - set(after)
    if not changed and not removed:
        if entries:
            meta["managedFields"] = entries
        else:
            meta.pop("managedFields", None)
        return
    out: list[Obj] = []
    mine: Obj | None = None
    for e in entries:
        if not isinstance(e, dict):
            continue
        fields = _paths(e.get("fieldsV1") or {}) - changed - removed
        if (e.get("manager"), e.get("operation"), e.get("subresource")) == (who, "Update", subresource):
            mine = {**e, "fields": fields}
            out.append(mine)
        elif fields:
            out.append({**e, "fieldsV1": _tree(fields)})
    if mine is None:
        mine = {"manager": who, "operation": "Update", "fields": set()}
        if subresource:
            mine["subresource"] = subresource
        out.append(mine)
    fields = mine.pop("fields") | changed
    mine.update({"apiVersion": rt.api_version, "time": now_rfc3339(), "fieldsType": "FieldsV1",
                 "fieldsV1": _tree(fields)})
    out = [e for e in out if e.get("fieldsV1")]
    if out:
        meta["managedFields"] = out
    else:
        meta.pop("managedFields", None)


_MISSING = object()


def _leaves(obj: Obj, skip_status: bool) -> dict[Path, Any]:
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind") or (skip_status and key == "status"):
            continue
        if key == "metadata" and isinstance(value, dict):
            _walk({k: v for k, v in value.items() if k not in _SKIP_META}, ("f:metadata",), out)
        else:
            _walk(value, (f"f:{key}",), out)
    return out


def _walk(value: Any, path: Path, out: dict[Path, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _walk(v, (*path, f"f:{k}"), out)
    elif field := _list_key(value):
        for item in value:
            item_path = (*path, "k:" + json.dumps({field: item[field]}, separators=(",", ":")))
            out[(*item_path, ".")] = True
            _walk(item, item_path, out)
    else:
        out[path] = value  # a scalar, an empty map, or an atomic list


def _list_key(value: Any) -> str:
    """The key of an associative list (every item a map with a ``name``, else with a ``type``); "" for
    anything else, an atomic list included."""
    if not isinstance(value, list) or not value or not all(isinstance(i, dict) for i in value):
        return ""
    return next((k for k in ("name", "type") if all(k in i for i in value)), "")


def _tree(paths: set[Path]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for part in path:
            node = node.setdefault(part, {})
    return root


def _paths(tree: Obj, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out |= _paths(v, (*prefix, k))
        else:
            out.add((*prefix, k))
    return out


__all__ = ["manager", "manager_from", "set_manager", "track"]

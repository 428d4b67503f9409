"""TokenReview and SubjectAccessReview for the SIMULATED API server (``tests/sim/apiserver.py`` calls
``answer`` first in its request handling: one line).

What the real kube-apiserver does (``authentication.k8s.io/v1`` ``tokenreviews`` and
``authorization.k8s.io/v1`` ``subjectaccessreviews``, both create-only and answered in the response
body, never stored): a TokenReview answers ``status.authenticated`` and ``status.user`` (username, uid,
groups, extra) for ``spec.token``, ``status.audiences`` when ``spec.audiences`` was given, and
``status.error`` when not authenticated; a SubjectAccessReview answers ``status.allowed`` (and
``denied``/``reason``) for ``spec.user``/``groups`` and ``resourceAttributes`` or
``nonResourceAttributes``. Malformed reviews are 400 like the real server's validation; any other verb
on these resources is 405.

Driven by a table the test sets with ``configure(api, tokens=..., allow=...)`` (a token not in it is
looked up in the simulator's request authentication, ``api.auth.lookup``, when there is one):
``tokens`` maps token → user (a dict ``{"username", "groups", "uid"}`` or any object with
``to_dict()``, e.g. the simulator's ``UserInfo``); ``allow`` is a set of
``(username_or_group, verb, group, resource, subresource, name)`` tuples (``"*"`` matches anything), a
callable ``(spec) -> bool``, or None (the default): the simulator's own RBAC authorizer decides
(``ApiServer(rbac=True)``), and without one nothing is allowed (harsh, never kinder than a real server).
Unconfigured, a token is known only to the simulator's request authentication. Gaps: no token expiry
or audience binding beyond equality with a token's registered audiences, no authorizer chain (Node,
webhook), no ``selfsubjectaccessreviews``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.sim.apiserver_store import ApiError, bad_request

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Rule = tuple[str, str, str, str, str, str]


@dataclass
class ReviewTable:
    tokens: dict[str, dict] = field(default_factory=dict)
    token_audiences: dict[str, tuple[str, ...]] = field(default_factory=dict)
    allow: set[Rule] | Callable[[dict], bool] | None = None  # None: the simulator's RBAC, when it has one
    calls: list[tuple[str, dict]] = field(default_factory=list)  # (kind, spec) of every review answered
    lock: threading.Lock = field(default_factory=threading.Lock)

    def allowed(self, spec: dict, api: Any = None) -> bool:
        if self.allow is None:
            return _rbac_allows(api, spec)
        if callable(self.allow):
            return bool(self.allow(spec))
        ra = spec.get("resourceAttributes") or {}
        who = {spec.get("user") or ""} | set(spec.get("groups") or [])
        want = (ra.get("verb") or "", ra.get("group") or "", ra.get("resource") or "",
                ra.get("subresource") or "", ra.get("name") or "")
        for rule in self.allow:
            subject, *attrs = rule
            matches = all(a in ("*", w) for a, w in zip(attrs, want, strict=True))
            if (subject == "*" or subject in who) and matches:
                return True
        return False


def _rbac_allows(api: Any, spec: dict) -> bool:
    """The simulator's own RBAC authorizer (``ApiServer(rbac=True)``), when there is one; else deny."""
    rbac = getattr(api, "rbac", None)
    if rbac is None or not hasattr(rbac, "authorize"):
        return False
    from tests.sim.apiserver_auth import UserInfo
    from tests.sim.apiserver_rbac import RequestAttributes

    user = UserInfo(spec.get("user") or "", tuple(spec.get("groups") or ()), spec.get("uid") or "")
    ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if ra:
        attrs = RequestAttributes(verb=ra.get("verb", ""), group=ra.get("group", ""),
                                  version=ra.get("version", ""), resource=ra.get("resource", ""),
                                  subresource=ra.get("subresource", ""), namespace=ra.get("namespace", ""),
                                  name=ra.get("name", ""))
    else:
        attrs = RequestAttributes(verb=nra.get("verb", ""), path=nra.get("path", ""))
    return bool(rbac.authorize(user, attrs)[0])


def _user_dict(user: Any) -> dict:
    if hasattr(user, "to_dict"):
        return dict(user.to_dict())
    return {"username": user["username"], "uid": user.get("uid", ""), "groups": list(user.get("groups", []))}


def configure(api: Any, tokens: Mapping[str, Any] | None = None,
              allow: Iterable[Rule] | Callable[[dict], bool] | None = None,
              token_audiences: Mapping[str, Iterable[str]] | None = None) -> ReviewTable:
    """Set (replace) the review table of ``api``; returns it (its ``calls`` record the reviews)."""
    table = ReviewTable(
        tokens={t: _user_dict(u) for t, u in (tokens or {}).items()},
        token_audiences={t: tuple(a) for t, a in (token_audiences or {}).items()},
        allow=allow if callable(allow) or allow is None else set(allow))
    api._reviews = table
    return table


def answer(api: Any, method: str, path: str, body: Any) -> tuple[int, dict] | None:
    """The response to a review request, or None when ``path`` is not a review resource."""
    if path.rstrip("/") not in (TOKENREVIEWS, SUBJECTACCESSREVIEWS):
        return None
    if method != "POST":
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested "
                                                f"resource ({method} {path}: reviews are create-only)")
    table: ReviewTable = getattr(api, "_reviews", None) or configure(api)
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise bad_request("the review must be a JSON object with a spec")
    spec = body["spec"]
    if path.rstrip("/") == TOKENREVIEWS:
        return 201, _token_review(api, table, spec)
    return 201, _access_review(api, table, spec)


def _token_review(api: Any, table: ReviewTable, spec: dict) -> dict:
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise ApiError(422, "Invalid", 'TokenReview.authentication.k8s.io "" is invalid: spec.token: '
                                       "Required value")
    with table.lock:
        table.calls.append(("TokenReview", {k: v for k, v in spec.items() if k != "token"}))
        user = table.tokens.get(token)
        audiences = table.token_audiences.get(token, ())
    if user is None and hasattr(getattr(api, "auth", None), "lookup"):
        # the simulator's own request authentication (ApiServer(auth=TokenTable)), when it has one
        found = api.auth.lookup(token)
        user = _user_dict(found) if found is not None else None
    status: dict[str, Any] = {"authenticated": False, "user": {}}
    wanted = spec.get("audiences") or []
    if user is None:
        status["error"] = "invalid bearer token"
    elif wanted and not set(wanted) & set(audiences):
        status["error"] = "token audiences do not match"
    else:
        status = {"authenticated": True, "user": user}
        if wanted:
            status["audiences"] = sorted(set(wanted) & set(audiences))
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}


def _access_review(api: Any, table: ReviewTable, spec: dict) -> dict:
    if not spec.get("user") and not spec.get("groups"):
        raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: '
                                       "Invalid value: \"\": at least one of user or group must be specified")
    if bool(spec.get("resourceAttributes")) == bool(spec.get("nonResourceAttributes")):
        raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is invalid: '
                                       "spec.resourceAttributes: Invalid value: exactly one of "
                                       "nonResourceAttributes or resourceAttributes must be specified")
    with table.lock:
        table.calls.append(("SubjectAccessReview", spec))
    ok = table.allowed(spec, api)
    status: dict[str, Any] = {"allowed": ok}
    if not ok:
        status["reason"] = "no RBAC policy matched"
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

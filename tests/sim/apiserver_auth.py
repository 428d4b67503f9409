"""Identities for the simulated API server: bearer token -> user info, as a real kube-apiserver's
authenticators produce it.

One table, shared by everything in the simulator that needs to know *who* is calling:

* request authentication (``ApiServer(auth=...)``): a request's ``Authorization: Bearer <token>`` is
  looked up here; no or an unknown token is answered 401 (``Unauthorized``) when authentication is on;
* TokenReview (``tests/sim/apiserver_reviews.py``): ``status.user`` is the same :class:`UserInfo`;
* SubjectAccessReview and the RBAC authorizer (``tests/sim/apiserver_rbac.py``) match subjects against
  ``UserInfo.username`` / ``UserInfo.groups``;
* admission (``tests/sim/apiserver_admission.py``): ``request.userInfo`` of a ValidatingAdmissionPolicy.

The user info has the shape of ``authentication.k8s.io/v1`` ``UserInfo`` (username, uid, groups, extra).
Service-account users are spelled as the real ServiceAccount token authenticator spells them
(kubernetes/kubernetes ``pkg/serviceaccount/util.go`` ``UserInfo`` and
``staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go``):
``system:serviceaccount:<ns>:<name>``, groups ``system:serviceaccounts``,
``system:serviceaccounts:<ns>`` and (added by the authenticator union) ``system:authenticated``.

Usage::

    tokens = TokenTable()
    sched = tokens.add_service_account("kube-system", "hami-scheduler")   # returns the token
    tenant = tokens.add("tenant-token", UserInfo("alice", ("tenants",)))
    with ApiServer(auth=tokens) as api:
        path = api.kubeconfig_for(sched)                                    # a kubeconfig with that token
"""

from __future__ import annotations

import secrets
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
MASTERS = "system:masters"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"


@dataclass(frozen=True)
class UserInfo:
    """``authentication.k8s.io/v1`` UserInfo. ``groups`` should include ``system:authenticated`` for
    any authenticated user (the helpers below add it, as the real authenticator union does)."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The wire form (TokenReview ``status.user``, AdmissionReview ``request.userInfo``)."""
        out: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out

    @property
    def service_account(self) -> tuple[str, str] | None:
        """``(namespace, name)`` of a service-account user, else ``None``."""
        if not self.username.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        rest = self.username[len(SERVICE_ACCOUNT_PREFIX):]
        ns, sep, name = rest.partition(":")
        return (ns, name) if sep and ns and name else None


def service_account_user(namespace: str, name: str, uid: str | None = None) -> UserInfo:
    """The user a ServiceAccount token authenticates as."""
    return UserInfo(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
                    (SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}", AUTHENTICATED),
                    uid or str(uuid.uuid4()))


def node_user(node: str) -> UserInfo:
    """A kubelet's identity (``system:node:<name>`` in ``system:nodes``; the Node authorizer's input)."""
    return UserInfo(f"system:node:{node}", ("system:nodes", AUTHENTICATED))


def user(name: str, *groups: str, uid: str = "") -> UserInfo:
    """A plain (e.g. OIDC / client-certificate) user; ``system:authenticated`` is added."""
    gs = tuple(g for g in groups if g != AUTHENTICATED) + (AUTHENTICATED,)
    return UserInfo(name, gs, uid)


# The identity of today's unauthenticated simulator (and of the default kubeconfig's token when auth is
# on): an admin in system:masters, which the RBAC authorizer always allows, as the real one does.
ADMIN = UserInfo("kubernetes-admin", (MASTERS, AUTHENTICATED), "admin")
ADMIN_TOKEN = "simulated-token"  # noqa: S105 (a test value; the default kubeconfig's token)
ANONYMOUS = UserInfo("system:anonymous", (UNAUTHENTICATED,))


class TokenTable:
    """Bearer token -> :class:`UserInfo`. Thread-safe; tokens may be added or revoked while serving."""

    def __init__(self, include_admin: bool = True) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, UserInfo] = {}
        if include_admin:
            self._tokens[ADMIN_TOKEN] = ADMIN

    def add(self, token: str, info: UserInfo) -> str:
        if not token:
            raise ValueError("token: must not be empty")
        with self._lock:
            self._tokens[token] = info
        return token

    def add_user(self, info: UserInfo, token: str | None = None) -> str:
        """Register ``info`` under ``token`` (a fresh random one by default); returns the token."""
        return self.add(token or secrets.token_urlsafe(24), info)

    def add_service_account(self, namespace: str, name: str, token: str | None = None) -> str:
        return self.add_user(service_account_user(namespace, name), token)

    def revoke(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)

    def lookup(self, token: str) -> UserInfo | None:
        with self._lock:
            return self._tokens.get(token)

    def authenticate(self, authorization: str | None) -> UserInfo | None:
        """The user of an ``Authorization`` header value, or ``None`` (missing, not Bearer, unknown)."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.lookup(token.strip())

    def token_of(self, username: str) -> str | None:
        """The (first) token registered for ``username``; handy in tests."""
        with self._lock:
            return next((t for t, u in self._tokens.items() if u.username == username), None)


__all__ = ["ADMIN", "ADMIN_TOKEN", "ANONYMOUS", "AUTHENTICATED", "MASTERS", "SERVICE_ACCOUNTS_GROUP",
           "SERVICE_ACCOUNT_PREFIX", "UNAUTHENTICATED", "TokenTable", "UserInfo", "node_user",
           "service_account_user", "user"]

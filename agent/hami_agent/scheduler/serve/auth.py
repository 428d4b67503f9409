"""Who may call the extender verbs (/filter, /prioritize, /bind, /preempt): only kube-scheduler.

Three modes (``--extender-auth``):

``loopback`` (default)
    The verbs are served only on a loopback listener: kube-scheduler and the extender share a host (the
    role's deployment: both on the control node) or a pod. Every process on that host can call them,
    nothing else can. The webhook, which the API server must reach over the network, is served on its
    own listener that does not serve the verbs.
``mtls``
    TLS with a client certificate signed by ``--client-ca-file`` (optionally only the subject CNs in
    ``--extender-allowed-cns``). kube-scheduler presents one through its extender ``tlsConfig``
    (``certFile``/``keyFile``/``caFile``: ``ExtenderTLSConfig`` in
    kubernetes/kubernetes staging/src/k8s.io/kube-scheduler/config/v1/types.go, applied by
    ``makeTransport`` in pkg/scheduler/extender.go).
``token``
    ``Authorization: Bearer <token>`` checked with a TokenReview, then a SubjectAccessReview for
    ``create`` on ``schedulerextenders/<verb>`` in API group ``hami.io`` named after the scheduler
    (``--scheduler-name``): an RBAC rule grants it. kube-scheduler's extender client sends no token
    (``makeTransport`` builds a TLS-only transport), so this mode is for callers that can: an
    authenticating proxy or sidecar in front of the extender, or another scheduler.

A refused caller gets 401 (no or unverifiable credentials) or 403 (a known identity without the right),
with a message naming the mode and what was missing; the handler is not called, nothing is written."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from hami_agent import log
from hami_agent.httpserve import HTTPError, Request, listener_is_loopback
from hami_agent.httpserve.tls import common_name

logger = logging.getLogger(__name__)

MODES = ("loopback", "mtls", "token")
SAR_GROUP = "hami.io"
SAR_RESOURCE = "schedulerextenders"
SAR_VERB = "create"


@dataclass(frozen=True)
class AuthConfig:
    mode: str = "loopback"
    client_ca_file: str = ""  # mtls
    allowed_cns: tuple[str, ...] = ()  # mtls: empty = any certificate the CA signed
    token_audiences: tuple[str, ...] = ()  # token: TokenReview spec.audiences ('' = the API server's)
    scheduler_name: str = "hami-scheduler"  # token: the SubjectAccessReview's resource name
    review_timeout_s: float = 3.0  # token: deadline for TokenReview + SubjectAccessReview together
    allow_ttl_s: float = 10.0  # token: how long an allowed token is remembered
    deny_ttl_s: float = 2.0  # token: how long a refused token is remembered (bounds API load)
    cache_size: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--extender-auth {self.mode!r}: choose one of {', '.join(MODES)}")


class Authenticator:
    """``check(request, verb)`` returns the caller's name or raises ``HTTPError(401|403)``."""

    mode = "none"

    def check(self, req: Request, verb: str) -> str:
        raise NotImplementedError


class LoopbackAuth(Authenticator):
    mode = "loopback"

    def check(self, req: Request, verb: str) -> str:
        # The listener is loopback-only (checked at start); the peer check is defence in depth.
        if not listener_is_loopback(req.peer[0]):
            raise HTTPError(403, f"--extender-auth=loopback: /{verb} is served to local callers only, "
                                 f"not {req.peer[0]}")
        return f"loopback:{req.peer[0]}"


class MTLSAuth(Authenticator):
    mode = "mtls"

    def __init__(self, allowed_cns: tuple[str, ...] = ()) -> None:
        self.allowed_cns = frozenset(allowed_cns)

    def check(self, req: Request, verb: str) -> str:
        if not req.tls or not req.peer_cert:
            raise HTTPError(401, f"--extender-auth=mtls: /{verb} needs a client certificate signed by the "
                                 "extender's client CA; configure kube-scheduler's extenders[].tlsConfig "
                                 "certFile/keyFile", [("WWW-Authenticate", "Mutual")])
        cn = common_name(req.peer_cert) or ""
        if self.allowed_cns and cn not in self.allowed_cns:
            raise HTTPError(403, f"--extender-auth=mtls: client certificate CN {cn!r} is not in "
                                 f"--extender-allowed-cns")
        return f"cn:{cn}"


@dataclass
class _Cached:
    user: str
    error: HTTPError | None
    expires: float


@dataclass
class TokenAuth(Authenticator):
    """TokenReview + SubjectAccessReview through the scheduler's own API client, with a small cache."""

    client: Any
    config: AuthConfig = field(default_factory=AuthConfig)

    mode = "token"

    def __post_init__(self) -> None:
        self._cache: OrderedDict[tuple[str, str], _Cached] = OrderedDict()
        self._lock = threading.Lock()
        # one attempt each, within the review deadline: a slow API server makes callers retry, it never
        # holds a handler thread for long
        self._api = self.client.with_options(timeout_s=self.config.review_timeout_s, attempts=1)

    def check(self, req: Request, verb: str) -> str:
        header = req.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise HTTPError(401, f"--extender-auth=token: /{verb} needs an 'Authorization: Bearer <token>' "
                                 "header with a token the API server accepts",
                            [("WWW-Authenticate", "Bearer")])
        key = (hashlib.sha256(token.encode()).hexdigest(), verb)  # never keep the token itself
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit.expires > now:
                self._cache.move_to_end(key)
                if hit.error is not None:
                    raise hit.error
                return hit.user
        user, error = self._review(token, verb)
        ttl = self.config.deny_ttl_s if error is not None else self.config.allow_ttl_s
        if error is None or error.status in (401, 403):  # API trouble (503) is not remembered
            with self._lock:
                self._cache[key] = _Cached(user, error, now + ttl)
                self._cache.move_to_end(key)
                while len(self._cache) > self.config.cache_size:
                    self._cache.popitem(last=False)
        if error is not None:
            raise error
        return user

    def _review(self, token: str, verb: str) -> tuple[str, HTTPError | None]:
        deadline = time.monotonic() + self.config.review_timeout_s
        spec: dict[str, Any] = {"token": token}
        if self.config.token_audiences:
            spec["audiences"] = list(self.config.token_audiences)
        try:
            tr = self._api.call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", verb="create",
                                kind="tokenreview",
                                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                      "spec": spec})
        except Exception as exc:
            logger.warning("extender auth: TokenReview failed: %s", exc)
            return "", HTTPError(503, "--extender-auth=token: cannot review the token now (TokenReview "
                                      "failed); retry", [("Retry-After", "1")])
        status = tr.get("status") or {}
        if not status.get("authenticated"):
            return "", HTTPError(401, "--extender-auth=token: the API server did not authenticate the bearer "
                                      "token" + (f" ({status['error']})" if status.get("error") else ""),
                                 [("WWW-Authenticate", "Bearer")])
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        left = deadline - time.monotonic()
        if left <= 0:
            return "", HTTPError(503, "--extender-auth=token: review deadline passed; retry",
                                 [("Retry-After", "1")])
        sar_spec: dict[str, Any] = {
            "user": username, "groups": list(user.get("groups") or []), "uid": str(user.get("uid") or ""),
            "resourceAttributes": {"group": SAR_GROUP, "resource": SAR_RESOURCE, "subresource": verb,
                                   "verb": SAR_VERB, "name": self.config.scheduler_name}}
        if user.get("extra"):
            sar_spec["extra"] = user["extra"]
        try:
            sar = self._api.with_options(timeout_s=max(0.1, left)).call(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", verb="create",
                kind="subjectaccessreview",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": sar_spec})
        except Exception as exc:
            logger.warning("extender auth: SubjectAccessReview failed: %s", exc)
            return "", HTTPError(503, "--extender-auth=token: cannot authorize the caller now "
                                      "(SubjectAccessReview failed); retry", [("Retry-After", "1")])
        if not (sar.get("status") or {}).get("allowed"):
            return username, HTTPError(
                403, f"--extender-auth=token: user {username!r} may not {SAR_VERB} "
                     f"{SAR_RESOURCE}/{verb} (group {SAR_GROUP}, name {self.config.scheduler_name}); "
                     "grant it with an RBAC ClusterRole")
        log.v(logger, 4, "extender auth: %s allowed /%s", username, verb)
        return f"user:{username}", None


def build(config: AuthConfig, client: Any = None) -> Authenticator:
    if config.mode == "loopback":
        return LoopbackAuth()
    if config.mode == "mtls":
        if not config.client_ca_file:
            raise ValueError("--extender-auth=mtls needs --client-ca-file (the CA that signed "
                             "kube-scheduler's client certificate) and --cert-file/--key-file")
        return MTLSAuth(config.allowed_cns)
    if client is None:
        raise ValueError("--extender-auth=token needs an API client (TokenReview and SubjectAccessReview)")
    return TokenAuth(client, config)

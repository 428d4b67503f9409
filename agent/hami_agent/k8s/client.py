# Over 500 lines on purpose: the only code that talks to the API (auth, retries, every verb).
"""``KubeClient``: the only code that talks to the Kubernetes API.

Built on the official ``kubernetes`` client for what it is good at (kubeconfig / in-cluster loading,
auth incl. exec plugins and token refresh, its TLS and proxy settings), but with raw JSON bodies: objects
stay plain dicts in the API's JSON form (camelCase), which is both what the rest of the agent uses and
several times faster than model deserialization. Requests and watches go out on ``http1`` (a keep-alive
HTTP/1.1 client over llhttp, ~4x less CPU per request than urllib3 + ``http.client``) with the client's
headers, token and TLS settings; every request of a proxied configuration on the client's own urllib3
pool.

Every call has a (connect, read) timeout. Transient failures (no response, 429, 5xx) are retried with
exponential backoff and jitter; 4xx are not retried. Calls that create something (POST) are retried only
when the request cannot have been processed: connection refused / connect timeout, 429, 503.

Lists are paginated like client-go's pager (``tools/pager/pager.go``: ``limit`` 500, ``continue`` until
done, a full list when a continue token expired); an optional client-side rate limit (``ratelimit``)
throttles every request of a client, never those of a view made with ``with_options(limiter=None)``.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from hami_agent import __version__, log
from hami_agent.k8s import http1, wirejson
from hami_agent.k8s.backoff import Backoff
from hami_agent.k8s.errors import (
    ExpiredError,
    KubeConfigError,
    KubeError,
    KubeTimeoutError,
    NotFoundError,
    ThrottledError,
    error_for,
)
from hami_agent.k8s.ratelimit import RateLimiter

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 (a path, not a secret)
PAGE_SIZE = 500  # client-go pager's defaultPageSize
# client-go logs a throttled request at V(3) beyond 50 ms and always beyond 1 s (rest/request.go)
LONG_THROTTLE_S = 0.05
EXTRA_LONG_THROTTLE_S = 1.0
_KEEP = object()  # with_options: keep the limiter of the client the view is made from


@dataclass(frozen=True)
class KindInfo:
    plural: str
    singular: str
    prefix: str
    namespaced: bool


KINDS: dict[str, KindInfo] = {k.plural: k for k in (
    KindInfo("pods", "pod", "/api/v1", True),
    KindInfo("nodes", "node", "/api/v1", False),
    KindInfo("events", "event", "/api/v1", True),
    KindInfo("namespaces", "namespace", "/api/v1", False),
    KindInfo("resourcequotas", "resourcequota", "/api/v1", True),
    KindInfo("configmaps", "configmap", "/api/v1", True),
    KindInfo("leases", "lease", "/apis/coordination.k8s.io/v1", True),
    # GPU preemption's dry run counts PodDisruptionBudgets (scheduler/core/pdb.py)
    KindInfo("poddisruptionbudgets", "poddisruptionbudget", "/apis/policy/v1", True),
    # Dynamic Resource Allocation, resource.k8s.io/v1 (Kubernetes >= 1.34): the DRA driver (hami_agent.dra)
    KindInfo("resourceslices", "resourceslice", "/apis/resource.k8s.io/v1", False),
    KindInfo("resourceclaims", "resourceclaim", "/apis/resource.k8s.io/v1", True),
    KindInfo("resourceclaimtemplates", "resourceclaimtemplate", "/apis/resource.k8s.io/v1", True),
    KindInfo("deviceclasses", "deviceclass", "/apis/resource.k8s.io/v1", False),
    # the allocation guard (doctor cluster's ALLOCATION_GUARD_MISSING): policies bound, or the guard webhook
    KindInfo("validatingadmissionpolicybindings", "validatingadmissionpolicybinding",
             "/apis/admissionregistration.k8s.io/v1", False),
    KindInfo("validatingwebhookconfigurations", "validatingwebhookconfiguration",
             "/apis/admissionregistration.k8s.io/v1", False),
)}


def kind_info(kind: str) -> KindInfo:
    k = kind.lower()
    for info in KINDS.values():
        if k in (info.plural, info.singular):
            return info
    raise ValueError(f"unsupported kind {kind!r}: use one of {', '.join(sorted(KINDS))}")


def api_path(kind: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    info = kind_info(kind)
    path = info.prefix
    if info.namespaced and namespace:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{info.plural}"
    if name:
        path += f"/{quote(name, safe='')}"
        if subresource:
            path += f"/{subresource}"
    return path


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one API call: ``attempts`` in total, sleeping ``base_s * 2^n`` (+ up to 50 % jitter,
    capped at ``cap_s``; a server's Retry-After is honoured up to the cap) between them."""

    attempts: int = 5
    base_s: float = 0.2
    cap_s: float = 5.0


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """metav1.MicroTime, as used by Lease renewTime/acquireTime."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _transport_error(exc: Exception, verb: str, kind: str, name: str, timeout_s: float) -> KubeError:
    import urllib3.exceptions as ue

    inner = getattr(exc, "reason", None)
    if isinstance(exc, ue.MaxRetryError) and isinstance(inner, Exception):
        return _transport_error(inner, verb, kind, name, timeout_s)
    # NewConnectionError subclasses ConnectTimeoutError in urllib3 2.x: test it first.
    if isinstance(exc, (ue.NewConnectionError, ConnectionRefusedError, http1.ConnectFailed)):
        return KubeError(0, "connection refused", str(exc), verb, kind, name)
    if isinstance(exc, (ue.ConnectTimeoutError, http1.ConnectTimeout)):
        return KubeTimeoutError(0, "connect timeout", f"no connection within {timeout_s:g}s ({exc})",
                                verb, kind, name)
    if isinstance(exc, (ue.ReadTimeoutError, TimeoutError)):
        return KubeTimeoutError(0, "timeout", f"no answer within {timeout_s:g}s ({exc})", verb, kind, name)
    return KubeError(0, "connection error", f"{type(exc).__name__}: {exc}", verb, kind, name)


class ThrottledRefresh:
    """The credential loaders' ``refresh_api_key_hook``, run at most once per ``period_s``.

    The kubernetes client calls the hook before every request. The kubeconfig loader's hook re-applies
    the whole configuration each time (``KubeConfigLoader._set_config``: its ``host`` setter re-reads the
    proxy environment), a fifth of a small request's client CPU. A token only needs reloading near its
    expiry, and both loaders already refresh early: kubeconfig tokens 5 minutes before ``expiry``
    (``EXPIRY_SKEW_PREVENTION_DELAY``), the in-cluster token file every minute; so a hook run every
    ``period_s`` (far below those margins) never lets a token lapse."""

    def __init__(self, hook: Any, period_s: float = 10.0, clock: Any = time.monotonic) -> None:
        self.hook = hook
        self.period_s = period_s
        self.clock = clock
        self._next = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, configuration: Any) -> None:
        with self._lock:
            now = self.clock()
            if now < self._next:
                return
            self.hook(configuration)
            self._next = now + self.period_s
            # the kubeconfig loader's hook installs itself again as it runs: keep the throttle in front
            installed = getattr(configuration, "refresh_api_key_hook", self)
            if installed is not self and installed is not None:
                self.hook = installed
                configuration.refresh_api_key_hook = self


def user_agent(component: str | None = None) -> str:
    """``hami-agent/<version> (<os>/<arch>) <component>``, client-go's layout
    (``rest.DefaultKubernetesUserAgent``): API server metrics and audit logs tell components apart by it."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine() or "unknown")
    ua = f"hami-agent/{__version__} ({platform.system().lower() or 'linux'}/{arch})"
    return f"{ua} {component}" if component else ua


def too_large_rv(e: KubeError) -> bool:
    """The API server's "Too large resource version" (504 Timeout, cause ResourceVersionTooLarge): a
    list at a resourceVersion its cache has not reached yet."""
    return e.status == 504 and "too large resource version" in (e.message or "").lower()


def _not_processed(e: KubeError) -> bool:
    """True when the server cannot have acted on the request, so even a POST may be retried."""
    return e.status in (429, 503) or (e.status == 0 and e.reason in ("connection refused", "connect timeout"))


class _SharedPool:
    """The lean HTTP/1.1 pool of a client and its views, and the TLS settings it was made for."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: http1.Pool | None = None
        self.key: tuple[Any, ...] | None = None


def _query_string(query: dict[str, str] | None) -> str:
    """``?k=v&...`` with values quoted as the kubernetes client's ``parameters_to_url_query`` does."""
    if not query:
        return ""
    return "?" + "&".join(f"{k}={quote(str(v))}" for k, v in query.items())


class KubeClient:
    """Dicts in, dicts out. Thread-safe (both connection pools are); create one per process and share it."""

    def __init__(self, api_client: Any, timeout_s: float = 10.0, retry: RetryPolicy | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self._api = api_client
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.limiter = limiter
        self._http1 = _SharedPool()  # shared with the views of with_options()
        self._event_lock = threading.Lock()
        self._event_names: collections.OrderedDict[tuple[str, ...], tuple[str, float, int]] = (
            collections.OrderedDict())

    # -- construction
    @classmethod
    def from_kubeconfig(cls, path: str | None = None, timeout_s: float = 10.0,
                        retry: RetryPolicy | None = None, *, component: str | None = None,
                        qps: float | None = None, burst: int | None = None) -> KubeClient:
        """``path`` (``--kubeconfig``), else in-cluster, else ``$KUBECONFIG``, else ``~/.kube/config``.
        ``component`` goes into the User-Agent; ``qps``/``burst``: a client-side rate limit of every
        request (none when ``qps`` is None; ``burst`` defaults to twice ``qps``, at least 1)."""
        from kubernetes import client as kclient
        from kubernetes import config as kconfig

        cfg = kclient.Configuration()
        source = ""
        try:
            if path:
                source = f"kubeconfig {path}"
                kconfig.load_kube_config(config_file=path, client_configuration=cfg)
            elif os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN):
                source = "in-cluster service account"
                kconfig.load_incluster_config(client_configuration=cfg)
            else:
                env = os.environ.get("KUBECONFIG")
                default = os.path.expanduser("~/.kube/config")
                if env:
                    source = f"$KUBECONFIG={env}"
                    kconfig.load_kube_config(config_file=env, client_configuration=cfg)
                elif os.path.exists(default):
                    source = f"kubeconfig {default}"
                    kconfig.load_kube_config(config_file=default, client_configuration=cfg)
                else:
                    raise KubeConfigError(
                        "no Kubernetes credentials found: pass --kubeconfig PATH, run in a pod with a "
                        "service account (in-cluster), set $KUBECONFIG, or create ~/.kube/config")
        except KubeConfigError:
            raise
        except Exception as exc:  # the loaders raise ConfigException, OSError, yaml errors...
            raise KubeConfigError(f"cannot load Kubernetes credentials from {source}: {exc}") from exc
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook = ThrottledRefresh(cfg.refresh_api_key_hook)
        # Our own retry loop handles failures; urllib3's silent immediate retries would hide them.
        cfg.retries = False
        cfg.connection_pool_maxsize = 16
        api = kclient.ApiClient(cfg)
        api.user_agent = user_agent(component)
        log.v(logger, 4, "kubernetes API %s (credentials: %s)", cfg.host, source)
        limiter = None
        if qps is not None:
            limiter = RateLimiter(qps, burst if burst is not None else max(1, int(2 * qps)))
        return cls(api, timeout_s=timeout_s, retry=retry, limiter=limiter)

    def with_options(self, timeout_s: float | None = None, attempts: int | None = None,
                     limiter: Any = _KEEP) -> KubeClient:
        """A view sharing the connection pool with a different timeout / retry budget (e.g. for the
        kubelet's Allocate path, where a bounded answer matters more than persistence). ``limiter``:
        another rate limiter for the view, or None for a view that is never throttled (request paths
        with their own bound: the kubelet admits one pod at a time, kube-scheduler waits for each call)."""
        other = KubeClient.__new__(KubeClient)
        other.__dict__.update(self.__dict__)
        if timeout_s is not None:
            other.timeout_s = timeout_s
        if attempts is not None:
            other.retry = replace(self.retry, attempts=max(1, attempts))
        if limiter is not _KEEP:
            other.limiter = limiter
        return other

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        with self._http1.lock:
            if self._http1.pool is not None:
                self._http1.pool.close()
            self._http1.pool, self._http1.key = None, None
        self._api.close()

    # -- transport
    def _headers(self, body: Any, content_type: str | None) -> dict[str, str]:
        api = self._api
        headers = {"Accept": "application/json", **api.default_headers}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        token = api.configuration.auth_settings().get("BearerToken")
        if token and token.get("value"):
            headers[token["key"]] = token["value"]
        return headers

    def _send(self, method: str, path: str, query: dict[str, str] | None, body: Any, *,
              content_type: str | None, timeout: tuple[float, float]) -> Any:
        """One request on the ``kubernetes`` client's urllib3 pool (its TLS, client certificate and proxy
        settings) with its bearer token (``auth_settings()`` runs the token refresh hook), without its
        generic request building (``param_serialize`` + ``call_api``: ~0.3 ms CPU per call, issue 31).
        The request is the same: URL and query quoted as its ``parameters_to_url_query`` does, JSON body,
        its default headers (User-Agent). Used where ``http1`` cannot go (``_http1_pool``: a proxy)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException
        from kubernetes.client.rest import RESTResponse

        api = self._api
        url = api.configuration.host + path + _query_string(query)
        try:
            r = api.rest_client.pool_manager.request(
                method, url, body=None if body is None else json.dumps(body),
                headers=self._headers(body, content_type),
                timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]), preload_content=False)
        except urllib3.exceptions.SSLError as e:  # as the kubernetes client reports it
            raise ApiException(status=0, reason=f"{type(e).__name__}\n{e}") from e
        return RESTResponse(r)

    def _unary(self, method: str, path: str, query: dict[str, str] | None, body: Any, *,
               content_type: str | None, timeout: tuple[float, float]) -> Any:
        """A request with a bounded answer, on the lean HTTP/1.1 client (``http1``: ~4x less CPU per call
        than urllib3 + ``http.client``), with the same headers, token, TLS settings and timeouts as
        ``_send``; through ``_send`` when the configuration needs what ``http1`` leaves out (a proxy)."""
        pool = self._http1_pool()
        if pool is None:
            return self._send(method, path, query, body, content_type=content_type, timeout=timeout)
        data = None if body is None else json.dumps(body).encode()
        return pool.request(method, path + _query_string(query), self._headers(body, content_type), data,
                            timeout[0], timeout[1])

    def _http1_pool(self) -> http1.Pool | None:
        """The lean client's pool for the configuration as it is now (the token refresh hook of an exec
        credential plugin may point it at new client certificate files: changed TLS settings get a new
        pool). None where the kubernetes client's own pool does what ``http1`` does not: a proxy (HTTP or
        SOCKS), or ``assert_hostname`` naming another host than the one connected to."""
        import urllib3

        cfg = self._api.configuration
        if type(self._api.rest_client.pool_manager) is not urllib3.PoolManager or isinstance(
                cfg.assert_hostname, str):
            return None
        options = cfg.socket_options
        if options is None and getattr(cfg, "keep_alive", False):
            from kubernetes.client import rest

            options = rest.tcp_keepalive_socket_options()
        key = (cfg.host, cfg.ssl_ca_cert, getattr(cfg, "ca_cert_data", None), cfg.cert_file, cfg.key_file,
               cfg.verify_ssl, cfg.assert_hostname, cfg.tls_server_name, repr(options))
        shared = self._http1
        with shared.lock:
            if shared.key != key:
                if shared.pool is not None:
                    shared.pool.close()
                https = cfg.host.startswith("https:")
                shared.pool = http1.Pool(cfg.host, http1.ssl_context_for(cfg) if https else None,
                                         server_hostname=cfg.tls_server_name or None,
                                         maxsize=cfg.connection_pool_maxsize or 16, socket_options=options)
                shared.key = key
            return shared.pool

    def _timeouts(self, timeout_s: float | None) -> tuple[float, float]:
        t = timeout_s if timeout_s is not None else self.timeout_s
        return (min(t, 5.0), t)

    def _throttle(self, method: str, path: str, verb: str, kind: str, name: str, deadline_s: float) -> None:
        """Wait for the rate limiter's token (client-go ``tryThrottle``); a wait beyond the call's own
        timeout fails the call instead of sleeping past it."""
        limiter = self.limiter
        if limiter is None:
            return
        wait = limiter.reserve(deadline_s)
        if wait is None:
            raise ThrottledError(0, "client-side throttling",
                                   f"the client's rate limit (QPS {limiter.qps:g}, burst {limiter.burst}) "
                                   f"would delay the request beyond its {deadline_s:g}s timeout",
                                   verb, kind, name)
        if wait > 0:
            msg = (f"Waited for {wait:.3f}s due to client-side throttling, not priority and fairness, "
                   f"request: {method}:{path}")
            if wait > EXTRA_LONG_THROTTLE_S:
                logger.info("%s", msg)
            elif wait > LONG_THROTTLE_S:
                log.v(logger, 3, "%s", msg)
            time.sleep(wait)

    def _once(self, method: str, path: str, query: dict[str, str] | None, body: Any, *,  # noqa: PLR0913
              content_type: str | None, verb: str, kind: str, name: str, timeout_s: float | None,
              decode: bool = True) -> Obj:
        timeout = self._timeouts(timeout_s)
        self._throttle(method, path, verb, kind, name, timeout[1])
        try:
            resp = self._unary(method, path, query, body, content_type=content_type, timeout=timeout)
            data = resp.read()
        except KubeError:
            raise
        except Exception as exc:  # urllib3 / socket / ssl failures: no (complete) response
            from kubernetes.client.exceptions import ApiException

            if isinstance(exc, ApiException):
                raise KubeError(exc.status or 0, "connection error", str(exc.reason), verb, kind,
                                name) from exc
            raise _transport_error(exc, verb, kind, name, timeout[1]) from exc
        if 200 <= resp.status < 300:
            return wirejson.loads(data) if data and decode else {}
        raise _status_error(resp.status, data, resp.getheader("Retry-After"), verb=verb, kind=kind, name=name)

    def call(self, method: str, path: str, *, verb: str, kind: str, name: str = "",  # noqa: PLR0913
             query: dict[str, str] | None = None, body: Any = None, content_type: str | None = None,
             timeout_s: float | None = None, idempotent: bool = True, decode: bool = True) -> Obj:
        """One API call with the retry policy. ``verb``/``kind``/``name`` only shape error messages.
        ``decode=False``: a write whose answer the caller does not read returns ``{}`` without decoding
        it (a pod or node answer is 5-15 KB of JSON: ~0.1 ms of CPU each); errors are decoded as ever."""
        attempts = max(1, self.retry.attempts)
        backoff = Backoff(self.retry.base_s, 2.0, 0.5, attempts, self.retry.cap_s)
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, path, query, body, content_type=content_type, verb=verb,
                                  kind=kind, name=name, timeout_s=timeout_s, decode=decode)
            except KubeError as e:
                retry = e.transient if idempotent else _not_processed(e)
                if not retry or attempt == attempts:
                    raise
                delay = backoff.next()
                if e.retry_after_s is not None:
                    delay = max(delay, min(e.retry_after_s, self.retry.cap_s))
                log.v(logger, 3, "%s; retrying in %.2fs (attempt %d/%d)", e, delay, attempt + 1, attempts)
                time.sleep(delay)
        raise AssertionError("unreachable")

    # -- generic verbs
    def get(self, kind: str, name: str, namespace: str | None = None, timeout_s: float | None = None) -> Obj:
        info = kind_info(kind)
        return self.call("GET", api_path(kind, namespace, name), verb="get", kind=info.singular,
                         name=_display(namespace, name, info), timeout_s=timeout_s)

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, timeout_s: float | None = None, *,
             resource_version: str | None = None, page_size: int | None = PAGE_SIZE) -> tuple[list[Obj], str]:
        """Items and the list's resourceVersion (the point a watch continues from).

        Paginated like client-go's pager: ``limit=page_size`` and ``continue`` until the last page (the
        resourceVersion is the first page's; later pages are read at that same revision). A continue
        token that expired meanwhile (410) falls back to one full list, as the pager's
        ``FullListIfExpired``. ``resource_version``: None or "" = the newest data (a consistent read);
        "0" = any data the API server's watch cache holds (cheap: no etcd read; the cache ignores
        ``limit``); "N" = data at least as new as N. ``page_size=None``: one request, no ``limit``."""
        info = kind_info(kind)
        query: dict[str, str] = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if resource_version:
            query["resourceVersion"] = resource_version
        if page_size:
            query["limit"] = str(int(page_size))
        path = api_path(kind, namespace)
        items: list[Obj] = []
        list_rv: str | None = None
        page = dict(query)
        while True:
            try:
                out = self.call("GET", path, verb="list", kind=info.plural, name=namespace or "", query=page,
                                timeout_s=timeout_s)
            except ExpiredError:
                if "continue" not in page:
                    raise
                # the revision of the first page was compacted away while we paged: one full list
                log.v(logger, 3, "list of %s: continue token expired after %d items; listing in full",
                      info.plural, len(items))
                full = {k: v for k, v in query.items() if k != "limit"}
                out = self.call("GET", path, verb="list", kind=info.plural, name=namespace or "", query=full,
                                timeout_s=timeout_s)
                rv = str((out.get("metadata") or {}).get("resourceVersion", ""))
                return list(out.get("items") or []), rv
            meta = out.get("metadata") or {}
            if list_rv is None:
                list_rv = str(meta.get("resourceVersion", ""))
            items.extend(out.get("items") or [])
            token = meta.get("continue")
            if not token:
                return items, list_rv
            # later pages: the token carries the revision; a resourceVersion next to it is refused
            page = {k: v for k, v in query.items() if k != "resourceVersion"}
            page["continue"] = str(token)

    def create(self, kind: str, obj: Obj, namespace: str | None = None,
               timeout_s: float | None = None, *, decode: bool = True) -> Obj:
        info = kind_info(kind)
        meta = obj.get("metadata") or {}
        ns = namespace or meta.get("namespace") or ("default" if info.namespaced else None)
        return self.call("POST", api_path(kind, ns), verb="create", kind=info.singular,
                         name=_display(ns, meta.get("name") or meta.get("generateName", ""), info),
                         body=obj, timeout_s=timeout_s, idempotent=False, decode=decode)

    def replace(self, kind: str, obj: Obj, timeout_s: float | None = None) -> Obj:
        """PUT the whole object; a ``metadata.resourceVersion`` in ``obj`` makes it conditional (409)."""
        info = kind_info(kind)
        meta = obj["metadata"]
        ns = meta.get("namespace")
        return self.call("PUT", api_path(kind, ns, meta["name"]), verb="update", kind=info.singular,
                         name=_display(ns, meta["name"], info), body=obj, timeout_s=timeout_s)

    def patch(self, kind: str, name: str, patch: Obj | list[Obj], namespace: str | None = None, *,
              subresource: str | None = None, timeout_s: float | None = None,
              content_type: str = MERGE_PATCH, decode: bool = True) -> Obj:
        """JSON merge-patch (RFC 7386): ``None`` deletes a key; a ``metadata.resourceVersion`` in the
        patch makes it conditional (409 ``ConflictError`` when stale). With ``content_type=JSON_PATCH``
        ``patch`` is an RFC 6902 operation list; a failed ``test`` operation is a 422 and applies nothing."""
        info = kind_info(kind)
        return self.call("PATCH", api_path(kind, namespace, name, subresource), verb="patch",
                         kind=info.singular, name=_display(namespace, name, info), body=patch,
                         content_type=content_type, timeout_s=timeout_s, decode=decode)

    def delete(self, kind: str, name: str, namespace: str | None = None,  # noqa: PLR0917
               resource_version: str | None = None, timeout_s: float | None = None, *,
               uid: str | None = None, grace_period_s: int | None = None) -> Obj:
        """DeleteOptions: preconditions on ``resource_version`` / ``uid``; ``grace_period_s=0`` deletes a
        pod at once (what a kubelet sends to confirm a graceful deletion, or the pod GC for a gone node)."""
        info = kind_info(kind)
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        pre = {k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v}
        if pre:
            body["preconditions"] = pre
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        return self.call("DELETE", api_path(kind, namespace, name), verb="delete", kind=info.singular,
                         name=_display(namespace, name, info), body=body, timeout_s=timeout_s)

    def watch(self, kind: str, resource_version: str, namespace: str | None = None, *,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_s: float = 300.0, allow_bookmarks: bool = True) -> WatchStream:
        """Open a watch from ``resource_version`` (not retried: the informer owns recovery)."""
        info = kind_info(kind)
        query = {"watch": "1", "resourceVersion": resource_version,
                 "timeoutSeconds": str(max(1, int(timeout_s)))}
        if allow_bookmarks:
            query["allowWatchBookmarks"] = "true"
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        path = api_path(kind, namespace)
        # read timeout: the server ends the stream after timeoutSeconds; allow some slack before we
        # declare the connection dead.
        timeout = (min(self.timeout_s, 5.0), timeout_s + 15.0)
        self._throttle("GET", path, "watch", info.plural, namespace or "", self.timeout_s)
        pool = self._http1_pool()
        try:
            if pool is not None:
                body: Any = pool.stream("GET", path + _query_string(query), self._headers(None, None),
                                        timeout[0], timeout[1])
            else:
                body = _Urllib3Body(self._send("GET", path, query, None, content_type=None, timeout=timeout))
            if body.status != 200:
                try:
                    data = body.read()
                finally:
                    body.close()
                raise _status_error(body.status, data, body.getheader("Retry-After"), verb="watch",
                                    kind=info.plural, name=namespace or "")
        except KubeError:
            raise
        except Exception as exc:
            raise _transport_error(exc, "watch", info.plural, namespace or "", timeout[1]) from exc
        return WatchStream(body, info.plural, namespace or "")

    # -- typed helpers (names other components rely on)
    def get_node(self, name: str) -> Obj:
        return self.get("nodes", name)

    def list_nodes(self, label_selector: str | None = None) -> list[Obj]:
        return self.list("nodes", label_selector=label_selector)[0]

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None],
                               resource_version: str | None = None, *, decode: bool = True) -> Obj:
        return self.patch_node_metadata(name, annotations=annotations, resource_version=resource_version,
                                        decode=decode)

    def patch_node_metadata(self, name: str, annotations: dict[str, str | None] | None = None,
                            labels: dict[str, str | None] | None = None,
                            resource_version: str | None = None, *, decode: bool = True) -> Obj:
        return self.patch("nodes", name, _metadata_patch(annotations, labels, resource_version),
                          decode=decode)

    def get_pod(self, namespace: str, name: str) -> Obj:
        return self.get("pods", name, namespace)

    def list_pods(self, namespace: str | None = None, field_selector: str | None = None,
                  label_selector: str | None = None) -> list[Obj]:
        return self.list("pods", namespace, label_selector, field_selector)[0]

    def patch_pod_metadata(self, namespace: str, name: str, annotations: dict[str, str | None] | None = None,
                           labels: dict[str, str | None] | None = None,
                           resource_version: str | None = None, *, decode: bool = True) -> Obj:
        return self.patch("pods", name, _metadata_patch(annotations, labels, resource_version), namespace,
                          decode=decode)

    def patch_pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return self.patch("pods", name, {"status": status}, namespace, subresource="status")

    def bind_pod(self, namespace: str, name: str, node_name: str, uid: str | None = None,
                 annotations: dict[str, str] | None = None) -> None:
        """POST pods/binding. 409 ``ConflictError`` when the pod is already bound (or ``uid`` differs)."""
        meta: Obj = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = annotations
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}
        self.call("POST", api_path("pods", namespace, name, "binding"), verb="bind", kind="pod",
                  name=f"{namespace}/{name}", body=binding, idempotent=False, decode=False)

    def list_resource_quotas(self, namespace: str) -> list[Obj]:
        return self.list("resourcequotas", namespace)[0]

    def get_lease(self, namespace: str, name: str) -> Obj:
        return self.get("leases", name, namespace)

    def create_event(self, obj: Obj, type_: str, reason: str, message: str, component: str, *,
                     kind: str | None = None, host: str | None = None,
                     key: tuple[str, ...] | None = None) -> Obj:
        """Record a core/v1 Event about ``obj``. A repeat of the same (object, type, reason, message)
        within 10 minutes bumps ``count`` and ``lastTimestamp`` instead of creating a new Event, like
        client-go's event correlator. ``key``: the identity of an aggregate event (its message changes
        with every update; see ``scheduler.events.EventCorrelator``). Returns what was written (the
        Event, or the repeat's name and count): the API's answer is not decoded."""
        meta = obj.get("metadata") or {}
        kind = kind or obj.get("kind") or _guess_kind(obj)
        ns = meta.get("namespace") or "default"
        message = message[:1024]  # the API's limit on Event.message
        aggregate = key is not None
        if key is None:
            key = (kind, ns, meta.get("name", ""), meta.get("uid", ""), type_, reason, message, component)
        now = now_rfc3339()
        with self._event_lock:
            seen = self._event_names.get(key)
        if seen is not None and time.monotonic() - seen[1] < 600:
            name, _t, count = seen
            update: Obj = {"count": count + 1, "lastTimestamp": now}
            if aggregate:
                update["message"] = message
            try:
                self.patch("events", name, update, ns, decode=False)
                with self._event_lock:
                    self._event_names[key] = (name, time.monotonic(), count + 1)
                return {"metadata": {"name": name, "namespace": ns}, **update}
            except NotFoundError:
                pass
        involved: Obj = {"kind": kind, "name": meta.get("name", ""),
                         "apiVersion": obj.get("apiVersion", "v1")}
        for src, dst in (("namespace", "namespace"), ("uid", "uid"), ("resourceVersion", "resourceVersion")):
            if meta.get(src):
                involved[dst] = meta[src]
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'unknown')}.{time.time_ns():x}", "namespace": ns},
            "involvedObject": involved, "reason": reason, "message": message, "type": type_,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": component, "reportingInstance": host or component,
        }
        self.create("events", event, ns, decode=False)  # its name is ours: the answer is not read
        with self._event_lock:
            self._event_names[key] = (event["metadata"]["name"], time.monotonic(), 1)
            while len(self._event_names) > 4096:
                self._event_names.popitem(last=False)
        return event


class _Urllib3Body:
    """A watch answer on the kubernetes client's urllib3 pool (a proxied configuration), with the
    interface of ``http1.Stream``: status, headers, ``chunks()``, ``read()``, ``close()``."""

    def __init__(self, resp: Any) -> None:
        self._resp = resp.response
        self.status = resp.status

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self._resp.headers.get(name, default)

    def read(self) -> bytes:
        return bytes(self._resp.data)

    def chunks(self) -> Iterator[bytes]:
        return self._resp.stream(65536, decode_content=True)

    def close(self) -> None:
        try:
            self._resp.shutdown()  # unblocks a reader in another thread (urllib3 >= 2.3)
        except Exception:  # noqa: S110 - best effort: the socket may already be gone
            pass
        try:
            self._resp.release_conn()
            self._resp.close()
        except Exception:  # noqa: S110
            pass


class WatchStream:
    """Iterator over ``(type, object)`` of one watch response. ``ERROR`` events are raised:
    ``ExpiredError`` for 410 (relist), ``KubeError`` otherwise. ``close()`` may be called from another
    thread to end a blocked read at once."""

    def __init__(self, body: Any, kind: str, namespace: str) -> None:
        self._body = body  # http1.Stream or _Urllib3Body
        self._kind = kind
        self._ns = namespace
        self._closed = False

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._body.close()

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        buf = b""
        try:
            for chunk in self._body.chunks():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield self._event(line)
            if buf.strip():
                yield self._event(buf)
        except KubeError:
            raise
        except Exception as exc:
            if self._closed:
                return
            raise _transport_error(exc, "watch", self._kind, self._ns, 0) from exc

    def _event(self, line: bytes) -> tuple[str, Obj]:
        try:
            ev = wirejson.loads(line)
        except ValueError as exc:
            raise KubeError(0, "bad watch event", f"cannot decode {line[:120]!r}: {exc}", "watch",
                            self._kind, self._ns) from exc
        type_ = ev.get("type", "")
        obj = ev.get("object") or {}
        if type_ == "ERROR":
            code = int(obj.get("code") or 0)
            raise error_for(code, str(obj.get("reason", "")), str(obj.get("message", "")), "watch",
                            self._kind, self._ns)
        return type_, obj


def _status_error(status: int, data: bytes, retry_after: str | None, *, verb: str, kind: str,
                  name: str) -> KubeError:
    reason, message = "", ""
    try:
        body = wirejson.loads(data) if data else {}
        if isinstance(body, dict):
            reason = str(body.get("reason", ""))
            message = str(body.get("message", ""))
    except ValueError:
        message = data[:200].decode("utf-8", "replace")
    ra: float | None = None
    if retry_after:
        try:
            ra = float(retry_after)
        except ValueError:
            ra = None
    return error_for(status, reason, message, verb, kind, name, ra)


def _metadata_patch(annotations: dict[str, str | None] | None, labels: dict[str, str | None] | None,
                    resource_version: str | None) -> Obj:
    meta: Obj = {}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    if resource_version:
        meta["resourceVersion"] = str(resource_version)
    return {"metadata": meta}


def _display(namespace: str | None, name: str, info: KindInfo) -> str:
    return f"{namespace}/{name}" if info.namespaced and namespace else name


def _guess_kind(obj: Obj) -> str:
    if "containers" in (obj.get("spec") or {}):
        return "Pod"
    if not (obj.get("metadata") or {}).get("namespace"):
        return "Node"
    return "Pod"


__all__ = ["JSON_PATCH", "KINDS", "MERGE_PATCH", "PAGE_SIZE", "ExpiredError", "KubeClient", "RetryPolicy",
           "WatchStream", "api_path", "kind_info", "now_micro", "now_rfc3339", "too_large_rv", "user_agent"]

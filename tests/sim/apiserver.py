"""A simulated Kubernetes API server for tests: the real ``kubernetes`` client talks to it over HTTP.

Why not kmock's ``KubernetesEmulator``: kmock 0.8 answers every list with ``resourceVersion: "..."``,
keeps no revision history, never returns 409 for a stale resourceVersion, has no selectors and no
410 Expired — exactly the semantics the node lock, the informers and leader election depend on. So this
is a small stdlib server (``http.server.ThreadingHTTPServer`` in a background thread) over the store in
``apiserver_store.py``. See docs/testing.md for what it models and its gaps vs a real kube-apiserver.

Usage::

    with ApiServer() as api:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
        client = KubeClient.from_kubeconfig(api.kubeconfig_path)
        ...
        api.stop(); time.sleep(1); api.start()   # an API outage; same port, same data
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.sim import (
    apiserver_lists,
    apiserver_managed,
    apiserver_meta,
    apiserver_pods,
    apiserver_resource,
    apiserver_reviews,
    apiserver_watch,
)
from tests.sim.apiserver_auth import ADMIN, ADMIN_TOKEN, ANONYMOUS, TokenTable, UserInfo
from tests.sim.apiserver_policy import Policy, route_eviction
from tests.sim.apiserver_rbac import (
    BOOTSTRAP_CLUSTER_ROLES,
    PUBLIC_INFO_PATHS,
    RbacAuthorizer,
    RequestAttributes,
    forbidden,
    request_attributes,
    review_attributes,
    unauthorized,
)
from tests.sim.apiserver_store import (
    RESOURCES,
    ApiError,
    HistoryEntry,
    Obj,
    ResourceType,
    Store,
    bad_request,
    find_resource,
    parse_field_selector,
    parse_label_selector,
    resource_for_kind,
    watch_event_line,
)

DEFAULT_WATCH_TIMEOUT_S = 1800  # the real server's --min-request-timeout
# Go net/http: a handler's body up to this size gets a Content-Length, a larger one is chunked; each
# chunk is one flush of the response's 4 KiB bufio writer
GO_CHUNKING_BUFFER = 2048
GO_CHUNK_BYTES = 4096
GO_CONN_BUFFER = 4096  # net/http's bufio.Writer on the connection (server.go: newBufioWriterSize(..., 4<<10))


class GoConnWriter:
    """What reaches the socket, write by write, when Go's ``net/http`` answers: everything goes through a
    4 KiB ``bufio.Writer`` on the connection, which sends when it is full and at each flush, and writes a
    large piece straight through when it holds nothing (Go's ``bufio.(*Writer).Write``). A 6 KB answer
    then leaves in two sends (headers with the first 4 KiB, then the rest), as a client of kube-apiserver
    reads it; a watch event over 4 KiB in two or three. Each send can wake the reader once."""

    def __init__(self, send: Any, size: int = GO_CONN_BUFFER) -> None:
        self._send = send
        self._size = size
        self._buf = bytearray()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view) > self._size - len(self._buf):
            if not self._buf:  # a large write into an empty buffer goes straight through
                self._send(bytes(view))
                return
            room = self._size - len(self._buf)
            self._buf += view[:room]
            self.flush()
            view = view[room:]
        self._buf += view

    def chunk(self, data: bytes) -> None:
        """One chunk of a chunked body, written as Go's chunkWriter writes it: size line, data, CRLF."""
        self.write(b"%x\r\n" % len(data))
        self.write(data)
        self.write(b"\r\n")

    def flush(self) -> None:
        if self._buf:
            data, self._buf = bytes(self._buf), bytearray()
            self._send(data)


@dataclass
class Fault:
    """An injected failure: the next ``times`` matching requests get ``code`` (after ``delay_s``)."""

    method: str | None
    path_regex: str | None
    code: int | None
    times: int
    delay_s: float = 0.0
    retry_after: int | None = None

    def matches(self, method: str, path: str) -> bool:
        return (self.times > 0 and (self.method is None or self.method == method)
                and (self.path_regex is None or re.search(self.path_regex, path) is not None))


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any
    user: str | None = None  # the authenticated username (the admin when authentication is off)


@dataclass
class AuditRecord:
    """One request as the audit log would show it: who, what (RBAC attributes), the answer, and the
    admission audit annotations (ValidatingAdmissionPolicy ``auditAnnotations`` / validation failures)."""

    user: UserInfo
    attrs: RequestAttributes | None = None
    code: int = 0
    annotations: dict[str, str] | None = None
    warnings: list[str] | None = None
    recorded: bool = False  # a watch is recorded when its response starts (audit stage ResponseStarted)


@dataclass(frozen=True)
class Route:
    rt: ResourceType | None
    namespace: str
    name: str | None
    subresource: str | None
    discovery: Obj | None = None


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle + delayed ACK add ~40 ms
    # to every keep-alive request.
    disable_nagle_algorithm = True
    server: _HttpServer

    # quiet: tests read failures from assertions, not from a request log on stderr
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # request accounting (tests/sim/apiserver_lists.py): who sent it, the verb, bytes out
    acct_who: tuple[str, str] = ("", "")
    acct_verb: str | None = None
    acct_done = False
    acct_sent = 0

    # -- plumbing
    def _dispatch(self, method: str) -> None:
        api = self.server.api
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
        length = int(self.headers.get("Content-Length") or 0)
        self.acct_who, self.acct_verb, self.acct_done, self.acct_sent = (
            (self.headers.get("User-Agent") or "", ""), None, False, 0)
        code = 0
        try:
            code = self._dispatch_inner(api, method, parts, query, content_type, length)
        finally:
            if not self.acct_done:
                verb = self.acct_verb or apiserver_lists.verb_of(method, query, named=False)
                api.accounting.record(*self.acct_who, verb, code, length, self.acct_sent)

    def _dispatch_inner(self, api: ApiServer, method: str, parts: Any, query: dict[str, str],  # noqa: PLR0917
                        content_type: str | None, length: int) -> int:
        body: Any = None
        audit: AuditRecord | None = None
        try:
            if length:
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    raise bad_request(f"the request body is not valid JSON: {raw[:80]!r}") from None
            user = api._authenticate(self.headers.get("Authorization"), method, parts.path)
            self.acct_who = (self.acct_who[0], user.username)
            audit = AuditRecord(user)
            api._log(RequestRecord(method, parts.path, query, content_type, body, user.username))
            api._apply_faults(method, parts.path)
            status, payload = api._handle(method, parts.path, query, content_type, body, self, audit)
        except ApiError as e:
            headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else {}
            api._audit(audit, e.code)
            self._send_json(e.code, e.status(), {**headers, **_warning_headers(audit)})
            return e.code
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
            return 0
        api._audit(audit, status)
        if payload is not None:
            self._send_json(status, payload, _warning_headers(audit))
        return status

    def _send_json(self, code: int, payload: Obj, headers: dict[str, str] | None = None) -> None:
        """As kube-apiserver answers over HTTP/1.1: its response writer sets no Content-Length
        (``responsewriters/writers.go``), so Go's ``net/http`` sends one only for a body that fits its
        2,048-byte buffer (``bufferBeforeChunkingSize``) and chunks a larger one."""
        data = json.dumps(payload).encode()
        self.acct_sent += len(data)
        chunked = len(data) > GO_CHUNKING_BUFFER
        out = GoConnWriter(self.wfile.write)
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self._headers_buffer.append(b"\r\n")  # end_headers() would send them alone
            out.write(b"".join(self._headers_buffer))
            self._headers_buffer = []
            if not chunked:
                out.write(data)
            else:
                for i in range(0, len(data), GO_CHUNK_BYTES):
                    out.chunk(data[i:i + GO_CHUNK_BYTES])
                out.chunk(b"")  # the last chunk ends the body
            out.flush()
        except OSError:
            self.close_connection = True

    def write_chunk(self, data: bytes) -> None:
        """One watch event, flushed (kube-apiserver flushes after each), sent as Go's connection writer
        sends it (``GoConnWriter``)."""
        if data:  # counted before the client can read it: a reader that got the event sees it counted
            self.server.api.accounting.add_bytes_out(*self.acct_who, "watch", len(data))
        out = GoConnWriter(self.wfile.write)
        out.chunk(data)
        out.flush()


def _warning_headers(audit: AuditRecord | None) -> dict[str, str]:
    """ValidatingAdmissionPolicy ``Warn`` results as one ``Warning: 299 - "..."`` header (RFC 7234)."""
    if audit is None or not audit.warnings:
        return {}
    return {"Warning": ", ".join('299 - "{}"'.format(w.replace('"', "'")) for w in audit.warnings)}


class ApiServer:
    """The simulated API server. Context manager; ``start()`` / ``stop()`` / ``restart()`` keep the
    port and the data, so a test can simulate an API outage."""

    def __init__(self, port: int = 0, history_limit: int = 1000, bookmark_interval_s: float = 1.0, *,
                 auth: TokenTable | None = None, rbac: bool = False) -> None:
        """``auth``: bearer tokens -> users; requests without a known token get 401 (default: no
        authentication, every request is the admin). ``rbac``: authorize every request against the
        stored ClusterRoles/Roles and their bindings (403 otherwise). ValidatingAdmissionPolicies are
        enforced whenever a binding is stored (tests/sim/apiserver_admission.py)."""
        self.store = Store(history_limit=history_limit)
        self.watch_hub = apiserver_watch.WatchHub()  # each write goes to the watches it may concern
        self.store.on_record = self.watch_hub.publish
        apiserver_resource.install(self.store)  # resource.k8s.io write rules (validation, status, generation)
        self.store.on_write.append(apiserver_meta.validate_object_meta)  # labels, annotations: 422
        # what the server adds to every object: pod defaults (apiserver_pods.py), managedFields
        apiserver_pods.install(self.store)
        self.store.on_write.append(apiserver_managed.track)
        self.auth = auth
        self.rbac = RbacAuthorizer(self.store) if rbac else None
        if rbac:
            for role in BOOTSTRAP_CLUSTER_ROLES:
                self.create(role)
        self._admission: Any = None  # created on first use: importing the CEL engine costs ~0.1 s
        self.audit: deque[AuditRecord] = deque(maxlen=20000)
        # eviction, PodDisruptionBudgets, graceful pod deletion (apiserver_policy.py); e.g.
        # ``api.policy.graceful_deletion = True``
        self.policy = Policy(self.store)
        self.bookmark_interval_s = bookmark_interval_s
        # an older cluster: these resources (plurals) are neither in discovery nor served (404), e.g.
        # {"validatingadmissionpolicies", "validatingadmissionpolicybindings"} before Kubernetes 1.30;
        # ``version`` is what /version answers (major, minor)
        self.unserved: set[str] = set()
        self.version: tuple[int, int] = (1, 31)
        self.requests: deque[RequestRecord] = deque(maxlen=2000)
        # requests per (User-Agent, user, verb) with bytes: tests/sim/apiserver_lists.py
        self.accounting = apiserver_lists.RequestAccounting()
        self._port = port
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._tmpdir = tempfile.mkdtemp(prefix="hami-apiserver-")
        self.kubeconfig_path = os.path.join(self._tmpdir, "kubeconfig")
        self._extra_kubeconfigs: set[str] = set()

    # -- lifecycle
    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> ApiServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        deadline = time.monotonic() + 5.0
        while True:
            try:
                httpd = _HttpServer(("127.0.0.1", self._port), _Handler)
                break
            except OSError:
                # After a restart the old socket may linger briefly; the port must stay the same.
                if self._port == 0 or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        httpd.api = self
        self._port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"apiserver-{self._port}", daemon=True)
        self._thread.start()
        self._write_kubeconfig()
        self.policy.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop every open connection (watches included), like a process exit."""
        httpd = self._httpd
        if httpd is None:
            return
        self.policy.stop()
        self._stopping.set()
        self.watch_hub.close_all()
        with self.store.condition:
            self.store.condition.notify_all()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.stop()
        for path in (*self._extra_kubeconfigs, self.kubeconfig_path):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(self._tmpdir)
        except OSError:
            pass

    def _write_kubeconfig(self, path: str | None = None, token: str = ADMIN_TOKEN) -> str:
        path = path or self.kubeconfig_path
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "sim",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {"token": token}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim",
                                                      "namespace": "default"}}],
        }
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cfg, f)  # JSON is valid YAML; the client's loader accepts it
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path

    def kubeconfig_for(self, token: str, name: str | None = None) -> str:
        """A kubeconfig (in the server's temp dir, removed by ``close()``) that authenticates with
        ``token``; the default ``kubeconfig_path`` is the admin's."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name or token)[:60]
        path = os.path.join(self._tmpdir, f"kubeconfig-{safe}")
        self._extra_kubeconfigs.add(path)
        return self._write_kubeconfig(path, token)

    def apply(self, *docs: Obj) -> list[Obj]:
        """Create or replace each object (e.g. a role's rendered manifests), like ``kubectl apply``."""
        out = []
        for doc in docs:
            rt = resource_for_kind(doc["kind"], doc.get("apiVersion"))
            meta = doc.get("metadata") or {}
            ns = meta.get("namespace", "default") if rt.namespaced else ""
            try:
                self.store.get(rt, ns, meta["name"])
            except ApiError:
                out.append(self.create(doc))
                continue
            out.append(copy.deepcopy(self.store.update(rt, ns, meta["name"], copy.deepcopy(doc))))
        return out

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    # -- test helpers (direct access, no HTTP)
    def create(self, obj: Obj) -> Obj:
        rt = resource_for_kind(obj["kind"], obj.get("apiVersion"))
        ns = (obj.get("metadata") or {}).get("namespace", "default") if rt.namespaced else ""
        return copy.deepcopy(self.store.create(rt, ns, obj, seed=True))

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        rt = resource_for_kind(kind)
        try:
            return copy.deepcopy(self.store.get(rt, namespace or "", name))
        except ApiError:
            return None

    def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        items, _rv = self.store.list(resource_for_kind(kind), namespace)
        return copy.deepcopy(items)

    def patch(self, kind: str, namespace: str | None, name: str, patch: Obj,
              subresource: str | None = None) -> Obj:
        rt = resource_for_kind(kind)
        return copy.deepcopy(self.store.patch(rt, namespace or "", name, "application/merge-patch+json",
                                              patch, subresource))

    def delete(self, kind: str, namespace: str | None, name: str) -> Obj:
        return copy.deepcopy(self.store.delete(resource_for_kind(kind), namespace or "", name))

    def compact(self) -> int:
        """Forget the event history (etcd compaction): older watch resourceVersions now get 410."""
        return self.store.compact()

    def inject_fault(self, code: int | None = 500, *, method: str | None = None,
                     path_regex: str | None = None, times: int = 1, delay_s: float = 0.0,
                     retry_after: int | None = None) -> Fault:
        """Fail (or delay, with ``code=None``) the next ``times`` matching requests."""
        fault = Fault(method, path_regex, code, times, delay_s, retry_after)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _apply_faults(self, method: str, path: str) -> None:
        with self._lock:
            fault = next((f for f in self._faults if f.matches(method, path)), None)
            if fault is not None:
                fault.times -= 1
        if fault is None:
            return
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.code is not None:
            reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                       504: "Timeout"}
            raise ApiError(fault.code, reasons.get(fault.code, "InternalError"),
                           f"simulated fault {fault.code} for {method} {path}", retry_after=fault.retry_after)

    def _log(self, rec: RequestRecord) -> None:
        self.requests.append(rec)

    # -- authentication, authorization, admission (tests/sim/apiserver_auth.py, _rbac.py, _admission.py)
    def _authenticate(self, authorization: str | None, method: str = "GET", path: str = "") -> UserInfo:
        if self.auth is None:
            return ADMIN
        user = self.auth.authenticate(authorization)
        if user is None:
            # kube-apiserver's default --anonymous-auth=true: a request without credentials is
            # system:anonymous, which RBAC lets read only the public info endpoints; any other request
            # without (valid) credentials is refused here, as with anonymous auth limited to those
            # endpoints (AuthenticationConfiguration anonymous.conditions, kubernetes KEP-4633)
            if not authorization and method == "GET" and path in PUBLIC_INFO_PATHS:
                return ANONYMOUS
            raise unauthorized()
        return user

    def _audit(self, audit: AuditRecord | None, code: int) -> None:
        if audit is not None and not audit.recorded:
            audit.code = code
            audit.recorded = True
            self.audit.append(audit)

    def audit_for(self, username: str) -> list[AuditRecord]:
        return [a for a in list(self.audit) if a.user.username == username]

    def _authorize(self, user: UserInfo, attrs: RequestAttributes) -> None:
        if self.rbac is None:
            return
        allowed, reason = self.rbac.authorize(user, attrs)
        if not allowed:
            raise forbidden(user, attrs, reason)

    def _admitter(self, audit: AuditRecord | None, operation: str, rt: ResourceType, ns: str,  # noqa: PLR0917
                  name: str | None, subresource: str | None,
                  kind: tuple[str, str, str] | None = None) -> Any:
        """``admit(old, new)`` for the store, or None while no ValidatingAdmissionPolicyBinding exists."""
        if not self.store.count(resource_for_kind("validatingadmissionpolicybindings")):
            return None
        if self._admission is None:
            from tests.sim.apiserver_admission import Admission

            with self._lock:
                if self._admission is None:
                    self._admission = Admission(self.store)
        from tests.sim.apiserver_admission import AdmissionOutcome, AdmissionRequest

        user = audit.user if audit is not None else ADMIN
        outcome = AdmissionOutcome()

        def admit(old: Obj | None, new: Obj) -> None:
            obj_name = (new.get("metadata") or {}).get("name") or name or ""
            req = AdmissionRequest(operation, rt, subresource or "", ns, obj_name, user,
                                   kind or (rt.group, rt.version, rt.kind))
            outcome.warnings.clear()
            outcome.audit_annotations.clear()
            try:
                self._admission.validate(req, new, old, outcome)
            finally:
                if audit is not None:
                    audit.annotations = dict(outcome.audit_annotations) or None
                    audit.warnings = list(outcome.warnings) or None

        return admit

    def requests_matching(self, method: str, path_regex: str) -> list[RequestRecord]:
        return [r for r in list(self.requests) if r.method == method and re.search(path_regex, r.path)]

    # -- routing
    def _route(self, path: str) -> Route:
        parts = [p for p in path.split("/") if p]
        if parts == ["version"]:
            major, minor = self.version
            return Route(None, "", None, None, {
                "major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0-hami-sim",
                "gitCommit": "simulated",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22",
                "compiler": "gc", "platform": "linux/amd64"})
        if parts == ["api"]:
            return Route(None, "", None, None, {"kind": "APIVersions", "versions": ["v1"],
                                                "serverAddressByClientCIDRs": []})
        if parts == ["apis"]:
            groups = sorted({rt.group for rt in RESOURCES if rt.group})
            return Route(None, "", None, None, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}} for g in groups]})
        if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            gv = f"{group}/{version}" if group else version
            return Route(None, "", None, None, {
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
                {"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                 "kind": rt.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                for rt in RESOURCES if rt.group == group and rt.version == version
                and rt.plural not in self.unserved]})
        if any(p in self.unserved for p in rest[:3:2]):  # /<plural>/... or /namespaces/<ns>/<plural>/...
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = find_resource(group, version, rest[2])
            if rt is not None and rt.namespaced:
                if len(rest) > 5:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return Route(rt, rest[1], rest[3] if len(rest) > 3 else None,
                             rest[4] if len(rest) > 4 else None)
        rt = find_resource(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and len(rest) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return Route(rt, "", rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)

    def _handle(self, method: str, path: str, query: dict[str, str], content_type: str | None, body: Any,  # noqa: PLR0917
                handler: _Handler, audit: AuditRecord | None = None) -> tuple[int, Obj | None]:
        user = audit.user if audit is not None else ADMIN
        review = review_attributes(method, path)
        if review is not None:  # TokenReview / SubjectAccessReview: authorized here, answered by
            if audit is not None:  # tests/sim/apiserver_reviews.py (the line below, once merged)
                audit.attrs = review
            self._authorize(user, review)
            if (answer := apiserver_reviews.answer(self, method, path, body)) is not None:
                return answer
        try:
            route = self._route(path)
        except ApiError:
            if review is None:
                self._authorize(user, RequestAttributes(verb=method.lower(), path=path))  # 403 before 404
            raise
        if route.discovery is not None:
            attrs = RequestAttributes(verb=method.lower(), path=path)
            if audit is not None:
                audit.attrs = attrs
            self._authorize(user, attrs)
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
            return 200, route.discovery
        rt = route.rt
        assert rt is not None
        store = self.store
        attrs = request_attributes(method, path, query, group=rt.group, version=rt.version,
                                   resource=rt.plural, namespace=route.namespace, name=route.name,
                                   subresource=route.subresource)
        if audit is not None:
            audit.attrs = attrs
        self._authorize(user, attrs)
        if route.subresource is not None and route.subresource not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        handler.acct_verb = apiserver_lists.verb_of(method, query, named=route.name is not None)
        # whose writes these are in managedFields (apiserver_managed.py); a binding records none
        apiserver_managed.set_manager(None if route.subresource == "binding" else
                                      apiserver_managed.manager_from(query, handler.acct_who[0]))
        if route.name is None:
            if method == "GET" and query.get("watch") in ("1", "true"):
                self._audit(audit, 200)
                self.accounting.record(*handler.acct_who, "watch", 200, 0, 0)
                handler.acct_done = True
                self._serve_watch(rt, route.namespace, query, handler)
                return 200, None
            if method == "GET":
                out = apiserver_lists.serve_list(store, rt, route.namespace or None, query)
                if out.source == "etcd":
                    handler.acct_verb = "list-etcd"
                return 200, out.payload
            if method == "POST":
                if not isinstance(body, dict):
                    raise bad_request("the request body must be a JSON object")
                admit = self._admitter(audit, "CREATE", rt, route.namespace, None, None)
                return 201, store.create(rt, route.namespace, body, admit=admit)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection here")
        if route.subresource == "eviction":
            return route_eviction(self.policy, method, route.namespace, route.name, body)
        if route.subresource == "binding":
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "only POST is supported on pods/binding")
            if not isinstance(body, dict):
                raise bad_request("the request body must be a Binding object")
            # admission sees the Binding (its annotations are copied onto the pod), not the pod
            admit = self._admitter(audit, "CREATE", rt, route.namespace, route.name, "binding",
                                   kind=("", "v1", "Binding"))
            if admit is not None:
                binding = copy.deepcopy(body)
                meta = binding.setdefault("metadata", {}) if isinstance(binding.get("metadata"), dict) else {}
                meta.setdefault("name", route.name)
                meta.setdefault("namespace", route.namespace)
                admit(None, binding)
            store.bind(route.namespace, route.name, body)
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "code": 201}
        if method == "GET":
            return 200, store.get(rt, route.namespace, route.name)
        if method == "PUT":
            if not isinstance(body, dict):
                raise bad_request("the request body must be a JSON object")
            admit = self._admitter(audit, "UPDATE", rt, route.namespace, route.name, route.subresource)
            return 200, store.update(rt, route.namespace, route.name, body, route.subresource, admit=admit)
        if method == "PATCH":
            admit = self._admitter(audit, "UPDATE", rt, route.namespace, route.name, route.subresource)
            return 200, store.patch(rt, route.namespace, route.name, content_type or "", body,
                                    route.subresource, admit=admit)
        if method == "DELETE":
            if rt.plural == "pods":
                options = dict(body) if isinstance(body, dict) else {}
                if query.get("gracePeriodSeconds", "").isdigit():
                    options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
                return 200, self.policy.delete_pod(route.namespace, route.name, options)
            pre = None
            if isinstance(body, dict):
                pre = (body.get("preconditions") or {}).get("resourceVersion")
            return 200, store.delete(rt, route.namespace, route.name, pre)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    # -- watch
    def _serve_watch(self, rt: ResourceType, ns: str, query: dict[str, str], h: _Handler) -> None:
        store = self.store
        label_pred = parse_label_selector(query.get("labelSelector"))
        field_pred = parse_field_selector(query.get("fieldSelector"), rt)

        def matches(o: Obj | None) -> bool:
            if o is None:
                return False
            if ns and (o.get("metadata") or {}).get("namespace") != ns:
                return False
            return label_pred(o) and field_pred(o)

        timeout_s = float(query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        rv_param = query.get("resourceVersion") or ""
        if rv_param not in ("", "0") and not rv_param.isdigit():
            raise bad_request(f"invalid resource version {rv_param!r}")
        deadline = time.monotonic() + timeout_s

        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def send(type_: str, obj: Obj) -> None:
            h.write_chunk(watch_event_line(type_, obj))

        hub = self.watch_hub
        expired_at = None
        initial: list[Obj] = []
        backlog: list[HistoryEntry] = []
        with store.condition:  # no write can happen between the subscription and the starting point
            sub = hub.subscribe(rt.plural, apiserver_watch.index_of(query.get("fieldSelector")))
            if rv_param in ("", "0"):
                # "Get State and Start at Most Recent": synthetic ADDED for what exists now.
                items, cursor = store.list(rt, ns or None)
                initial = [o for o in items if matches(o)]
            else:
                cursor = int(rv_param)
                if store.expired(cursor):
                    expired_at = cursor
                else:
                    backlog = [e for e in store.entries_after(cursor) if e.plural == rt.plural]
        try:
            if expired_at is not None:
                err = ApiError(410, "Expired",
                               f"too old resource version: {expired_at} ({store.oldest_rv()})")
                send("ERROR", err.status())
                h.write_chunk(b"")
                return
            for o in initial:
                send("ADDED", o)
            last_sent = time.monotonic()
            pending = backlog
            while not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if not pending:
                    pending = sub.get(min(remaining, 0.5, self.bookmark_interval_s))
                for e in pending:
                    if e.rv <= cursor:
                        continue
                    cursor = e.rv
                    out = _translate(e, matches)
                    if out is not None:
                        h.write_chunk(e.event_line(out[0]))
                        last_sent = time.monotonic()
                pending = []
                if bookmarks and time.monotonic() - last_sent >= self.bookmark_interval_s:
                    with store.condition:  # nothing queued: every relevant write up to now was sent
                        if sub.empty():
                            cursor = max(cursor, store.current_rv())
                    send("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                      "metadata": {"resourceVersion": str(cursor)}})
                    last_sent = time.monotonic()
            if self._stopping.is_set():
                h.close_connection = True  # outage: drop the stream without a clean end
                return
            h.write_chunk(b"")
        except OSError:
            h.close_connection = True
        finally:
            hub.unsubscribe(sub)


def _translate(e: HistoryEntry, matches: Any) -> tuple[str, Obj] | None:
    """The watch cache's rule: moving into a selector is ADDED, moving out of it is DELETED."""
    if e.type == "ADDED":
        return ("ADDED", e.new) if matches(e.new) else None
    if e.type == "DELETED":
        return ("DELETED", e.new) if matches(e.old) else None
    was, now = matches(e.old), matches(e.new)
    if was and now:
        return ("MODIFIED", e.new)
    if now:
        return ("ADDED", e.new)
    if was:
        return ("DELETED", e.new)
    return None

"""The extender's HTTP server: /filter /bind /prioritize /webhook /healthz /readyz /metrics and, with
``--profiling``, /debug/pprof/{profile,goroutine}.

Why the stdlib ``ThreadingHTTPServer``: kube-scheduler sends one request at a time per pod over a
keep-alive connection, the handlers are CPU-bound Python (an event loop would not add concurrency
under the GIL), and it has no dependency beyond the standard library; TLS is an ``ssl`` wrap."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hami_agent import log
from hami_agent.scheduler import profiling
from hami_agent.scheduler.extender import BadRequest

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB, like HAMi's io.LimitReader


def parse_bind(addr: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``host:port`` or ``:port`` → (host, port); raises ValueError naming the flag value."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bind address {addr!r}: want host:port or :port")
    return (host.strip("[]") or default_host), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class ExtenderHTTPServer:
    """Owns the listening socket and a serving thread; ``routes`` map (method, path) to handlers that
    take the parsed JSON body and return a JSON-able object."""

    def __init__(self, extender: Any = None, webhook: Any = None, *, host: str = "127.0.0.1", port: int = 0,
                 cert_file: str | None = None, key_file: str | None = None, registry: Any = None,
                 ready: Callable[[], bool] | None = None, profiling_enabled: bool = False,
                 max_body: int = DEFAULT_MAX_BODY, metrics: Any = None,
                 routes: dict[str, Callable[[Any], Any]] | None = None) -> None:
        self.routes: dict[str, Callable[[Any], Any]] = dict(routes or {})
        if extender is not None:
            self.routes.setdefault("/filter", extender.filter)
            self.routes.setdefault("/bind", extender.bind)
            self.routes.setdefault("/prioritize", prioritize)
        if webhook is not None:
            self.routes.setdefault("/webhook", webhook.review)
        self.registry = registry
        self.ready = ready or (lambda: True)
        self.profiling = profiling_enabled
        self.max_body = max_body
        self.metrics = metrics
        self.tls = bool(cert_file)
        handler = type("Handler", (_Handler,), {"app": self})
        self.httpd = _Server((host, port), handler)
        if cert_file:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert_file, key_file or None)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self) -> ExtenderHTTPServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="extender-http", daemon=True)
        self._thread.start()
        logger.info("scheduler extender listening on %s", self.url)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)


def prioritize(args: Any) -> list[dict]:
    """HAMi has no prioritize verb (the node is chosen in /filter); answer a neutral HostPriorityList."""
    if not isinstance(args, dict):
        raise BadRequest("ExtenderArgs: body must be a JSON object")
    names = args.get("NodeNames") or args.get("nodenames") or [
        (n.get("metadata") or {}).get("name") for n in ((args.get("Nodes") or args.get("nodes") or {})
                                                        .get("items") or [])]
    return [{"Host": n, "Score": 0} for n in names]


class _Handler(BaseHTTPRequestHandler):
    app: ExtenderHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's client expects
    # Headers and body go out in two writes; with Nagle on, the second waits for the client's
    # delayed ACK (~40 ms per request on Linux).
    disable_nagle_algorithm = True
    server_version = "hami-scheduler"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.v(logger, 5, "%s " + format, self.client_address[0], *args)

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        self._send(code, json.dumps({"error": message}).encode())

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if path in ("/healthz", "/livez"):
            self._send(200, b"ok", "text/plain")
        elif path == "/readyz":
            ok = self.app.ready()
            self._send(200 if ok else 503, b"ok" if ok else b"not ready: caches not synced or not leader",
                       "text/plain")
        elif path == "/metrics" and self.app.registry is not None:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            self._send(200, generate_latest(self.app.registry), CONTENT_TYPE_LATEST)
        elif path.startswith("/debug/pprof") and self.app.profiling:
            self._pprof(path, parse_qs(url.query))
        else:
            self._error(404, f"no route GET {path}")

    def _pprof(self, path: str, query: dict[str, list[str]]) -> None:
        if path.rstrip("/") == "/debug/pprof":
            self._send(200, b"profile?seconds=N  CPU profile (folded stacks)\ngoroutine  thread dump\n",
                       "text/plain")
        elif path == "/debug/pprof/profile":
            try:
                seconds = float(query.get("seconds", ["30"])[0])
            except ValueError:
                self._error(400, "seconds: not a number")
                return
            self._send(200, profiling.cpu_profile(seconds).encode(), "text/plain")
        elif path in ("/debug/pprof/goroutine", "/debug/pprof/threads"):
            self._send(200, profiling.thread_dump().encode(), "text/plain")
        else:
            self._error(404, f"no profile {path}")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        route = self.app.routes.get(path)
        if route is None:
            self._error(404, f"no route POST {path}")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._error(411, "Content-Length required")
            return
        n = int(length)
        if n > self.app.max_body:
            self.close_connection = True  # do not read the oversized body
            self._error(413, f"request body of {n} bytes exceeds the limit of {self.app.max_body} bytes")
            return
        raw = self.rfile.read(n)
        if not raw:
            self._error(400, "empty request body")
            return
        try:
            args = json.loads(raw)
        except ValueError as exc:
            self._error(400, f"malformed JSON body for {path}: {exc}")
            return
        verb = path.strip("/")
        t0 = time.perf_counter()
        try:
            result = route(args)
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        except Exception as exc:
            logger.exception("%s failed", path)
            self._error(500, f"{verb} failed: {exc}")
            return
        finally:
            if self.app.metrics is not None:
                self.app.metrics.latency.labels(verb).observe(time.perf_counter() - t0)
        self._send(200, json.dumps(result, separators=(",", ":")).encode())

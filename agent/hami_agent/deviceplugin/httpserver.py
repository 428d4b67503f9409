"""``/healthz`` and ``/metrics`` for the device plugin (stdlib HTTP server: two read-only endpoints do
not justify a web framework dependency)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

logger = logging.getLogger(__name__)


def parse_bind(bind: str) -> tuple[str, int]:
    """``:9394`` -> ("", 9394); ``127.0.0.1:0`` -> ("127.0.0.1", 0)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--metrics-bind {bind!r}: expected [HOST]:PORT, e.g. :9394")
    return host.strip("[]"), int(port)


class OpsServer:
    def __init__(self, bind: str, registry: CollectorRegistry,
                 healthz: Callable[[], tuple[bool, str]]) -> None:
        host, port = parse_bind(bind)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    try:
                        ok, msg = outer.healthz()
                    except Exception as exc:  # a failing check is a failed check, not a crash
                        ok, msg = False, f"health check error: {exc}"
                    self._send(200 if ok else 503, "text/plain; charset=utf-8", (msg + "\n").encode())
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(outer.registry))
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - keep the access log quiet
                return

        self.registry = registry
        self.healthz = healthz
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="ops-http", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> OpsServer:
        self._thread.start()
        logger.info("serving /healthz and /metrics on port %d", self.port)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

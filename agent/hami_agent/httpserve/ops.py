"""Read-only operational routes shared by every component: /metrics and /healthz. They are
unauthenticated by design (Prometheus and probes scrape them) and change nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hami_agent.httpserve.model import Limits, Listener, Request, Response, Route
from hami_agent.httpserve.server import HttpServer

# Read-only listeners: a scrape or a probe at a time, a few dashboards; no request bodies.
OPS_LIMITS = Limits(max_connections=256, workers=2, max_queued=8, max_body=64 * 1024)


def parse_bind(bind: str, flag: str = "--metrics-bind", example: str = ":9394") -> tuple[str, int]:
    """``:9394`` -> ("", 9394); ``127.0.0.1:0`` -> ("127.0.0.1", 0); ValueError names the flag."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag} {bind!r}: expected [HOST]:PORT, e.g. {example}")
    return host.strip("[]"), int(port)


def metrics_route(registry: Any) -> Route:
    """Prometheus text of ``registry`` (generated on a handler thread: large registries take time)."""

    def handler(_req: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return Route(handler)


def healthz_route(check: Callable[[], tuple[bool, str]] | None = None) -> Route:
    """200 with the check's message, 503 when it fails or raises (a failing check is a failed check).
    Without a check it answers on the event loop (always up while the process serves); a check may
    block (the device plugin probes its gRPC sockets), so it runs on a handler thread."""

    def handler(_req: Request) -> Response:
        if check is None:
            return Response.text("ok")
        try:
            ok, msg = check()
        except Exception as exc:
            ok, msg = False, f"health check error: {type(exc).__name__}"
        return Response.text(msg + "\n", 200 if ok else 503)

    return Route(handler, inline=check is None)


def ops_server(bind: str, registry: Any, healthz: Callable[[], tuple[bool, str]] | None = None, *,
               name: str = "ops", flag: str = "--metrics-bind", limits: Limits | None = None) -> HttpServer:
    """An HttpServer with GET /metrics and GET /healthz on ``bind``."""
    host, port = parse_bind(bind, flag)
    routes = {("GET", "/metrics"): metrics_route(registry), ("GET", "/healthz"): healthz_route(healthz)}
    return HttpServer([Listener(name, host, port, routes)], limits or OPS_LIMITS, name=name)

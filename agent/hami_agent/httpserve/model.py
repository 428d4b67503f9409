"""Request, response, routes and limits of the agent's HTTP listeners (no I/O here)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any


@dataclass(frozen=True)
class Limits:
    """Every bound of a server. The defaults fit the scheduler extender; read-only listeners (device
    plugin, monitor) pass smaller ones."""

    max_connections: int = 1024  # open connections of all listeners together (TLS handshakes included)
    workers: int = 8  # handler threads
    max_queued: int = 32  # requests waiting for a handler thread; beyond workers + max_queued: 503
    max_body: int = 1 << 20  # bytes (HAMi's io.LimitReader: 1 MiB); larger: 413
    max_header_bytes: int = 16 * 1024  # request line + headers; larger: 431
    handshake_timeout_s: float = 10.0  # TLS handshake (Go's http.Transport default is 10 s too)
    header_timeout_s: float = 10.0  # from the connection's start (or its first byte after keep-alive)
    body_timeout_s: float = 30.0  # the whole body, not per read: a trickle cannot hold a connection
    # Idle keep-alive: longer than Go's http.Transport IdleConnTimeout (90 s, which kube-scheduler's
    # extender client inherits) so the client, not the server, closes idle connections and a POST never
    # races a server-side close.
    idle_timeout_s: float = 120.0
    write_timeout_s: float = 30.0  # a response the peer does not read within this is dropped
    # listeners with PeerLimits: how long a request may wait for a handler (or for its address's in-flight
    # cap) before it is answered 503; its connection is not read while it waits
    queue_wait_s: float = 5.0


class HTTPError(Exception):
    """Raised by handlers: answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    peer: tuple[str, int]
    listener: str
    # the verified client certificate (ssl.SSLSocket.getpeercert() form) when the listener asks for one
    peer_cert: dict | None = None
    tls: bool = False


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(obj, separators=(",", ":")).encode())

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Response:
        return cls(status, text.encode(), content_type)

    @classmethod
    def error(cls, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Response:
        return cls(status, json.dumps({"error": message}).encode(), headers=list(headers or []))


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    handler: Handler
    # Cheap and non-blocking (health checks): runs on the event loop, so it answers even while every
    # handler thread is busy. Everything else runs on the bounded thread pool.
    inline: bool = False
    # The handler pool (``HttpServer(pools=...)``) that runs it; None: the server's own. A route with its own
    # pool keeps its capacity whatever the other routes of the same listener receive.
    pool: str | None = None


@dataclass(frozen=True)
class PeerLimits:
    """What one client address may hold on a listener the network can reach (issue 27 item 2): without
    them, one pod that opens enough keep-alive connections and sends requests as fast as they are
    answered takes every connection and every queue slot of the listener. A peer beyond
    ``max_connections`` gets its own idle connection closed first, else the new one is refused; a
    request beyond ``max_inflight`` (or one that finds no free handler) waits, its connection unread,
    until its address is below the cap and a handler is free (addresses take turns), at most
    ``Limits.queue_wait_s`` (then 503). ``allowed_sources``: when set, a connection from any other address
    is closed at once (before TLS)."""

    max_connections: int = 128
    max_inflight: int = 16
    allowed_sources: tuple[Any, ...] = ()  # ipaddress.IPv4Network / IPv6Network

    def admits(self, host: str) -> bool:
        if not self.allowed_sources:
            return True
        try:
            addr = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr.version == net.version and addr in net for net in self.allowed_sources)


def parse_cidrs(text: str, flag: str = "--allowed-sources") -> tuple[Any, ...]:
    """``10.0.0.0/8, 192.168.1.10`` -> networks; ValueError names the flag and the bad entry."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError as exc:
            raise ValueError(f"{flag}: {part!r} is not an address or CIDR ({exc})") from None
    return tuple(out)


@dataclass
class Listener:
    """One listening address. ``routes`` maps (METHOD, path) to a route; a path ending in ``*`` matches
    every path with that prefix."""

    name: str
    host: str
    port: int
    routes: dict[tuple[str, str], Route]
    ssl_context: Any = None  # ssl.SSLContext (server side) or None for plain HTTP
    peers: PeerLimits | None = None  # per-address caps (listeners the network can reach)

    def match(self, method: str, path: str) -> tuple[Route | None, list[str]]:
        """(route, methods allowed on this path): (None, []) is 404, (None, [..]) is 405."""
        route = self.routes.get((method, path))
        if route is not None:
            return route, []
        allowed = sorted({m for (m, p) in self.routes if p == path})
        if allowed:
            return None, allowed
        best: tuple[int, Route] | None = None
        for (m, p), r in self.routes.items():
            if p.endswith("*") and path.startswith(p[:-1]):
                if m == method and (best is None or len(p) > best[0]):
                    best = (len(p), r)
                elif m != method:
                    allowed.append(m)
        if best is not None:
            return best[1], []
        return None, sorted(set(allowed))


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"

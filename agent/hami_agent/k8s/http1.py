"""A lean HTTP/1.1 client for the API server's unary requests (GET, POST, PUT, PATCH, DELETE).

Why not urllib3 alone: every request the agent makes through urllib3 runs its pool manager, URL parsing,
header containers and ``http.client``, whose response headers go through the ``email`` package's feed
parser; that is ~0.3 ms of CPU per request on an idle core, most of what a pod write costs the extender
and the device plugin (HAMi's protocol writes ~5 times per pod; issue 31). This module keeps what those
layers are there for (keep-alive connections, TLS, timeouts, chunked bodies) and leaves out the rest:
responses are parsed by llhttp (``httptools``, the parser the agent's own HTTP servers already use), the
request is written in one ``sendall``. Measured against the same server: ~4× less client CPU per request.

Watches use ``Pool.stream``: a connection of their own, the body handed over as it arrives, closable from
another thread. What it deliberately does not do, so ``KubeClient`` keeps urllib3 for it: proxies
(``Configuration.proxy``), content encodings (we never ask for gzip, so the API server sends none).

Semantics follow urllib3's with ``retries=False``, which ``KubeClient`` relied on before: the connect
timeout bounds the TCP connect and the TLS handshake, the read timeout bounds each wait for bytes; an idle
connection the server closed is noticed before it is reused (urllib3's ``is_connection_dropped``); any
failure closes the connection and raises, and ``KubeClient``'s own retry policy decides what happens next.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools

_RECV = 262144
MAX_HEADER_BYTES = 1 << 20  # a response whose headers alone exceed this is not an API server's


class ConnectFailed(ConnectionError):
    """No connection: refused, unreachable or name not resolved. The server cannot have seen the request."""


class ConnectTimeout(TimeoutError):
    """No connection (TCP or TLS handshake) within the connect timeout; the request was not sent."""


class ResponseTimeout(TimeoutError):
    """The connection stayed silent longer than the read timeout."""


class ProtocolError(ConnectionError):
    """The connection closed early or the answer is not HTTP/1.1 as the client understands it."""


@dataclass
class Response:
    """What ``KubeClient`` reads from an answer: the status, the body, a header by name."""

    status: int
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names; a repeated one keeps the last

    def read(self) -> bytes:
        return self.data

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


class _Exchange:
    """Callbacks of one response's parse (llhttp calls them from ``feed_data``)."""

    __slots__ = ("body", "complete", "framed", "header_bytes", "headers", "headers_done", "keep_alive",
                 "parser")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = False
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.headers_done = False
        self.complete = False
        self.framed = False  # Content-Length or chunked: the body's end is known without the socket closing
        self.header_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        key = name.decode("latin-1").lower()
        self.headers[key] = value.decode("latin-1")
        if key in ("content-length", "transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # llhttp answers this only until the message completes (it then resets for the next one)
        self.keep_alive = bool(self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Conn:
    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def dropped(self) -> bool:
        """An idle keep-alive connection is readable only when the server closed it (or sent junk).
        ``poll``, not ``select``: a busy extender has descriptors above select's 1,024."""
        try:
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def exchange(self, request: bytes, read_timeout: float) -> tuple[Response, bool]:
        """Send one request, read its whole answer. Returns the response and whether the connection may
        carry another request."""
        ex = self.send(request, read_timeout)
        while not ex.complete:
            if not self.feed(ex, read_timeout):
                break
        reusable = ex.complete and ex.framed and ex.keep_alive
        response = Response(ex.parser.get_status_code(), b"".join(ex.body), ex.headers)
        ex.parser = None  # it holds ex's bound callbacks: a cycle (with the body's pieces) for the collector
        return response, reusable

    def send(self, request: bytes, read_timeout: float) -> _Exchange:
        self.sock.settimeout(read_timeout)
        self.sock.sendall(request)
        return _Exchange()

    def feed(self, ex: _Exchange, read_timeout: float) -> bool:
        """Read once and parse it. False at the end of a body delimited by the connection's close."""
        try:
            data = self.sock.recv(_RECV)
        except TimeoutError as e:
            raise ResponseTimeout(f"read timed out after {read_timeout:g}s") from e
        if not data:
            if ex.headers_done and not ex.framed:
                return False  # a body delimited by the connection's close (HTTP/1.0 style)
            raise ProtocolError("the server closed the connection before the answer was complete"
                                if ex.headers_done or ex.header_bytes else
                                "the server closed the connection without answering")
        try:
            ex.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            raise ProtocolError("the server switched protocols") from e
        except httptools.HttpParserError as e:
            raise ProtocolError(f"malformed HTTP answer: {e}") from e
        if not ex.headers_done and ex.header_bytes > MAX_HEADER_BYTES:
            raise ProtocolError(f"the answer's headers exceed {MAX_HEADER_BYTES} bytes")
        return True


class Stream:
    """An answer read as it arrives (a watch): ``status`` and headers first, then ``chunks()``. It owns its
    connection, which ``close()`` ends, from any thread: a reader blocked in ``chunks()`` then stops."""

    def __init__(self, conn: _Conn, ex: _Exchange, read_timeout: float) -> None:
        self._conn = conn
        self._ex = ex
        self._read_timeout = read_timeout
        self._closed = False
        self.status = ex.parser.get_status_code()
        self.headers = ex.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def chunks(self) -> Iterator[bytes]:
        """The body's pieces as they arrive (chunked framing removed), until the answer ends."""
        ex = self._ex
        while True:
            if ex.body:
                pieces, ex.body = ex.body, []
                yield from pieces
            if ex.complete or self._closed:
                return
            try:
                if not self._conn.feed(ex, self._read_timeout):
                    return
            except (OSError, ProtocolError):
                if self._closed:
                    return
                raise

    def read(self) -> bytes:
        """The rest of the body (an error's Status)."""
        return b"".join(self.chunks())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # The plain socket's shutdown, also under TLS: it wakes a reader blocked in recv at once,
            # without touching the TLS object that reader is using (SSLSocket.shutdown would drop it).
            socket.socket.shutdown(self._conn.sock, socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()


class Pool:
    """Keep-alive connections to one ``http://`` or ``https://`` origin. Thread-safe; a request takes an
    idle connection or opens a new one, and at most ``maxsize`` idle ones are kept (urllib3's
    ``block=False`` pool)."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None, maxsize: int = 16,
                 socket_options: list[tuple[int, int, int]] | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {base_url!r}: use http or https")
        if not parts.hostname:
            raise ValueError(f"no host in {base_url!r}")
        self.https = parts.scheme == "https"
        if self.https and ssl_context is None:
            raise ValueError("an https origin needs an ssl_context")
        default_port = 443 if self.https else 80
        self.host = parts.hostname
        self.port = parts.port or default_port
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname or self.host
        self.maxsize = maxsize
        # urllib3 sets TCP_NODELAY by default; a caller's options replace that default, as in urllib3
        self.socket_options = ([(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)] if socket_options is None
                               else list(socket_options))
        self._idle: deque[_Conn] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None,
                connect_timeout: float, read_timeout: float) -> Response:
        """``target``: the path and query below the origin's own path. Raises ``ConnectFailed``,
        ``ConnectTimeout``, ``ResponseTimeout``, ``ProtocolError``, ``ssl.SSLError`` or ``OSError``."""
        request = self._request_bytes(method, target, headers, body)
        conn = self._take() or self._connect(connect_timeout)
        try:
            response, reusable = conn.exchange(request, read_timeout)
        except BaseException:
            conn.close()
            raise
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return response

    def stream(self, method: str, target: str, headers: dict[str, str], connect_timeout: float,
               read_timeout: float) -> Stream:
        """A request whose answer is read as it arrives, on a new connection of its own (a watch holds it
        for minutes; it never returns to the pool). Returns once the answer's headers are in."""
        request = self._request_bytes(method, target, headers, None)
        conn = self._connect(connect_timeout)
        try:
            ex = conn.send(request, read_timeout)
            while not ex.headers_done:
                if not conn.feed(ex, read_timeout):
                    raise ProtocolError("the server closed the connection before the answer's headers")
        except BaseException:
            conn.close()
            raise
        return Stream(conn, ex, read_timeout)

    def _request_bytes(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> bytes:
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        for conn in idle:
            conn.close()

    def _take(self) -> _Conn | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()  # the most recently used: the least likely to have timed out
            if not conn.dropped():
                return conn
            conn.close()

    def _give_back(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, timeout: float) -> _Conn:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except TimeoutError as e:
            raise ConnectTimeout(f"no connection to {self.host}:{self.port} within {timeout:g}s") from e
        except OSError as e:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {e}") from e
        try:
            for level, name, value in self.socket_options:
                sock.setsockopt(level, name, value)
            if self.https:
                assert self.ssl_context is not None
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.server_hostname)
        except TimeoutError as e:
            sock.close()
            raise ConnectTimeout(f"no TLS handshake with {self.host}:{self.port} within {timeout:g}s") from e
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)


def ssl_context_for(configuration: Any) -> ssl.SSLContext:
    """The TLS settings of a ``kubernetes.client.Configuration`` as the client's own urllib3 pool applies
    them (``kubernetes/client/rest.py``): the CA bundle (``ssl_ca_cert`` or ``ca_cert_data``) or the
    system's, a client certificate (``cert_file``/``key_file``), ``verify_ssl``, ``assert_hostname=False``."""
    ctx = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None,
                                     cadata=getattr(configuration, "ca_cert_data", None) or None)
    if not configuration.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        ctx.check_hostname = False
    if configuration.cert_file:
        ctx.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    ctx.set_alpn_protocols(["http/1.1"])  # as urllib3 offers it (util/ssl_.py ALPN_PROTOCOLS)
    return ctx


__all__ = ["ConnectFailed", "ConnectTimeout", "Pool", "ProtocolError", "Response", "ResponseTimeout",
           "Stream", "ssl_context_for"]

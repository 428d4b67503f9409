# Over 500 lines on purpose: one event loop's connections, limits and worker hand-off.
"""The HTTP/1.1 server every listener of the agent uses (extender, webhook, metrics, health).

Why this and not a framework: uvicorn, hypercorn, cheroot, aiohttp and the stdlib server were each run
against the attacks this server must survive (docs/scheduler.md, "Serving"); none bounded all of them
(no header-read deadline, no whole-body deadline, no cap on connections that evicts idle ones, or a
TLS handshake on the accept thread). What is hand-written is only the connection bookkeeping and the
response's status line and headers: HTTP/1.1 parsing is httptools' (MagicStack's binding of llhttp, the
Node.js parser; uvicorn's default), TLS is asyncio's (``loop.connect_accepted_socket`` with
``ssl_handshake_timeout``), handlers run on a bounded ``ThreadPoolExecutor``.

Guarantees, per connection: the TLS handshake runs on the event loop, never on the accept path, and
ends within ``handshake_timeout_s``; the request line and headers arrive within ``header_timeout_s``
(408 otherwise), the whole body within ``body_timeout_s`` (408), a keep-alive connection idles at most
``idle_timeout_s``; a response the peer does not read is dropped after ``write_timeout_s``. Per server:
at most ``max_connections`` open connections — a new one first evicts the oldest connection that has not
sent a complete request (or sits idle between requests), and is refused (503, or a plain close for TLS)
only when all are busy; at most ``workers + max_queued`` requests in flight (503 with Retry-After
beyond); bodies over ``max_body`` get 413 without being read; an unexpected handler error is a 500 with
an error id (the traceback goes to the log, never to the caller)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import secrets
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httptools

from hami_agent import log
from hami_agent.httpserve.model import HTTPError, Limits, Listener, Request, Response, Route, reason

logger = logging.getLogger(__name__)

_ACCEPT_BATCH = 64
_SLOW_READER_S = 1.0  # a request still incomplete after this long may be evicted for a new connection
_MAX_PIPELINED = 16  # complete requests waiting on one connection (reading pauses while one is answered)


@dataclass
class Stats:
    accepted: int = 0
    refused: int = 0  # connections refused at the cap (every open one was busy)
    evicted: int = 0  # idle/slow connections closed to make room for a new one
    timeouts: int = 0
    busy: int = 0  # requests answered 503 because every handler thread and queue slot was taken
    requests: int = 0
    errors: int = 0  # 500s
    peer_refused: int = 0  # connections refused: their address held its connection cap (PeerLimits)
    parked: int = 0  # requests that waited for a handler or for their address's in-flight cap (PeerLimits)
    source_refused: int = 0  # connections closed: their address is not in PeerLimits.allowed_sources

    def __add__(self, other: Stats) -> Stats:
        return Stats(**{k: v + getattr(other, k) for k, v in vars(self).items()})


class Pool:
    """Handler threads and the queue in front of them: at most ``workers`` requests run and ``queued`` wait;
    beyond that a request is answered 503 at once. A pool may serve routes of several servers (each with
    its own event loop), so its count is locked."""

    def __init__(self, name: str, workers: int, queued: int) -> None:
        self.name = name
        self.capacity = workers + queued
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-handler")
        self._lock = threading.Lock()
        self.inflight = 0
        self.busy = 0  # requests refused because the pool was full

    def acquire(self) -> bool:
        with self._lock:
            if self.inflight >= self.capacity:
                self.busy += 1
                return False
            self.inflight += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.inflight -= 1

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def bind_socket(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket; ``host`` '' or '0.0.0.0' is every IPv4 address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or "0.0.0.0", port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Priority:
    """One server's requests go first (issue 27 item 2: kube-scheduler's verbs before anything the network
    sends to the webhook). The servers share one interpreter: threads of a flooded server hold the GIL and
    the CPU while a verb waits its turn. So while a prioritised request is being read or handled
    (``hold``/``release``; not while its answer is deferred, e.g. a /bind waiting for a node lock), the
    other servers' event loop and handler threads pause at their next checkpoint (a new connection, each
    chunk received, the start of each handler), at most ``max_pause_s`` each time: they slow down, they
    are never stopped."""

    def __init__(self, max_pause_s: float = 0.01) -> None:
        self.max_pause_s = max_pause_s
        self._lock = threading.Lock()
        self._held = 0
        self._idle = threading.Event()
        self._idle.set()

    def hold(self) -> None:
        with self._lock:
            self._held += 1
            self._idle.clear()

    def release(self) -> None:
        with self._lock:
            self._held -= 1
            if self._held <= 0:
                self._held = 0
                self._idle.set()

    def pause(self) -> None:
        """(a lower-priority thread) wait while a prioritised request is in progress, briefly."""
        if not self._idle.is_set():
            self._idle.wait(self.max_pause_s)


class HttpServer:
    """Serves ``listeners`` from one event-loop thread; handlers run on a bounded thread pool (``pools``
    adds named pools that routes may choose with ``Route.pool``; the server owns only its default one).
    ``limits.max_connections`` is this server's connection budget: servers that must not starve each
    other are separate ``HttpServer`` instances (each its own loop, connections and pool)."""

    def __init__(self, listeners: list[Listener], limits: Limits | None = None, name: str = "http",
                 pools: dict[str, Pool] | None = None, priority: Priority | None = None,
                 prioritised: bool = False, sockets: dict[str, socket.socket] | None = None) -> None:
        """``priority`` shared by servers: this one's requests hold it (``prioritised``) or this one yields
        to them. ``sockets``: listening sockets already bound (by name of listener; e.g. inherited from the
        process that bound them), used instead of binding ``host:port``; the server closes them at stop."""
        self.limits = limits or Limits()
        self.priority = priority
        self._holds = priority if prioritised else None
        self._yields = priority if priority is not None and not prioritised else None
        self.name = name
        self.listeners = {lst.name: lst for lst in listeners}
        self.stats = Stats()
        for lst in listeners:
            for route in lst.routes.values():
                if route.pool is not None and route.pool not in (pools or {}):
                    raise ValueError(f"{name}: route of listener {lst.name} names pool {route.pool!r}, "
                                     "which was not given")
        self._socks: dict[str, socket.socket] = {}
        try:
            for lst in listeners:
                given = (sockets or {}).get(lst.name)
                if given is not None:
                    given.setblocking(False)
                self._socks[lst.name] = given if given is not None else bind_socket(lst.host, lst.port)
        except OSError as exc:
            for s in self._socks.values():
                s.close()
            raise OSError(exc.errno, f"{name}: cannot listen on {lst.host or '0.0.0.0'}:{lst.port} "
                                     f"({lst.name}): {exc.strerror}") from exc
        self._loop = asyncio.new_event_loop()
        self.pool = Pool(name, self.limits.workers, self.limits.max_queued)
        self._pools = {**(pools or {}), None: self.pool}
        self._conns: set[_Connection] = set()
        self._peer_conns: collections.Counter[str] = collections.Counter()  # per address (PeerLimits)
        self._peer_inflight: collections.Counter[str] = collections.Counter()
        # requests waiting for a handler or for their address's cap, per address (round robin)
        self._parked: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._thread: threading.Thread | None = None
        self._last_accept_error = 0.0
        self._last_peer_warning = 0.0

    # -- public
    def port(self, listener: str) -> int:
        return self._socks[listener].getsockname()[1]

    def address(self, listener: str) -> tuple[str, int]:
        host, port = self._socks[listener].getsockname()[:2]
        return host, port

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def start(self) -> HttpServer:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._thread is None:  # never started
            for s in self._socks.values():
                s.close()
            self.pool.shutdown()
            self._loop.close()
            return
        done = threading.Event()

        def shutdown() -> None:
            for lname, s in self._socks.items():
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(s)
                s.close()
                log.v(logger, 4, "%s: closed listener %s", self.name, lname)
            for conn in list(self._conns):
                conn.abort()
            # a few more iterations let cancelled handshakes release their sockets before the loop ends
            self._loop.call_later(0.05, self._loop.stop)
            done.set()

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(shutdown)  # queued even if run_forever has not begun yet
            done.wait(timeout_s)
        self._thread.join(timeout_s)
        self.pool.shutdown()
        if not self._thread.is_alive():
            self._loop.close()

    # -- event loop
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        for lname, s in self._socks.items():
            self._loop.add_reader(s, self._on_accept, lname)
        self._loop.run_forever()

    def _on_accept(self, lname: str) -> None:
        sock = self._socks[lname]
        if self._yields is not None:
            self._yields.pause()
        for _ in range(_ACCEPT_BATCH):
            try:
                conn_sock, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._accept_failed(lname, exc)
                return
            conn_sock.setblocking(False)
            self.stats.accepted += 1
            lst = self.listeners[lname]
            host = str(addr[0]) if isinstance(addr, tuple) and addr else "?"
            if lst.peers is not None:
                if not lst.peers.admits(host):
                    self.stats.source_refused += 1
                    self._peer_warning(f"closing connections from {host} on {lname}: not in its allowed "
                                       "source ranges")
                    conn_sock.close()
                    continue
                if self._peer_conns[host] >= lst.peers.max_connections and not self._evict_one(host):
                    self.stats.peer_refused += 1
                    self._peer_warning(f"{host} holds {self._peer_conns[host]} connections on {lname} (its "
                                       f"cap): refusing more from it")
                    self._refuse(conn_sock, lst, counted=False,
                                 message=f"too many connections from {host}; retry later")
                    continue
            if len(self._conns) >= self.limits.max_connections and not self._evict_one():
                self._refuse(conn_sock, lst)
                continue
            conn = _Connection(self, lst, conn_sock, addr)
            self._conns.add(conn)
            self._peer_conns[conn.peer[0]] += 1
            conn.start()

    def _accept_failed(self, lname: str, exc: OSError) -> None:
        """Out of descriptors (EMFILE/ENFILE) or buffers: make room and pause accepting briefly instead
        of spinning on a readable listener."""
        now = time.monotonic()
        if now - self._last_accept_error > 10:
            self._last_accept_error = now
            logger.warning("%s: accept on %s failed: %s (%d open connections; raise LimitNOFILE or lower "
                           "--max-connections)", self.name, lname, exc, len(self._conns))
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            self._evict_one()
        sock = self._socks[lname]
        self._loop.remove_reader(sock)
        self._loop.call_later(0.1, self._resume_accept, lname)

    def _resume_accept(self, lname: str) -> None:
        if self._socks[lname].fileno() >= 0:
            self._loop.add_reader(self._socks[lname], self._on_accept, lname)

    def _evict_one(self, peer: str | None = None) -> bool:
        """Close the connection that costs the least to lose: first the oldest one that has not sent a
        complete request (handshake, nothing yet, or a slow request), then the longest-idle keep-alive.
        ``peer``: only among that address's connections (its own cap)."""
        now = self._loop.time()
        best: tuple[int, float, _Connection] | None = None
        for c in self._conns:
            if peer is not None and c.peer[0] != peer:
                continue
            if c.state in ("handshake", "new") or (c.state in ("reading", "body")
                                                    and now - c.since > _SLOW_READER_S):
                key = (0, c.since)
            elif c.state == "keepalive":
                key = (1, c.since)
            else:
                continue
            if best is None or key < best[:2]:
                best = (key[0], key[1], c)
        if best is None:
            return False
        self.stats.evicted += 1
        log.v(logger, 4, "%s: evicting %s connection from %s to make room", self.name, best[2].state,
              best[2].peer_text)
        best[2].abort()
        return True

    def _refuse(self, sock: socket.socket, lst: Listener, counted: bool = True,
                message: str = "too many connections; retry later") -> None:
        if counted:
            self.stats.refused += 1
            now = time.monotonic()
            if now - self._last_accept_error > 10:
                self._last_accept_error = now
                logger.warning("%s: %d connections open and all busy: refusing new connections on %s",
                               self.name, len(self._conns), lst.name)
        if lst.ssl_context is None:
            with contextlib.suppress(OSError):
                sock.send(_raw_response(503, message, [("Retry-After", "1")]))
        sock.close()

    def _peer_warning(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_peer_warning > 10:
            self._last_peer_warning = now
            logger.warning("%s: %s", self.name, text)

    def _forget(self, conn: _Connection) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            host = conn.peer[0]
            self._peer_conns[host] -= 1
            if self._peer_conns[host] <= 0:
                del self._peer_conns[host]

    # -- handler dispatch (event loop side)
    def _submit(self, conn: _Connection, route: Route, req: Request) -> None:
        self.stats.requests += 1
        if route.inline:
            conn.respond(self._call(route, req))
            return
        pool = self._pools[route.pool]
        # a route with its own pool (the extender verbs beside the webhook) is not the peer cap's business
        peer = conn.peer[0] if conn.lst.peers is not None and route.pool is None else None
        if peer is not None and (self._peer_inflight[peer] >= conn.lst.peers.max_inflight
                                 or pool.inflight >= pool.capacity):
            self._park(peer, conn, route, req)
            return
        if not pool.acquire():
            self.stats.busy += 1
            conn.respond(Response.error(503, f"server busy: {pool.inflight} requests in flight; retry",
                                        [("Retry-After", "1")]))
            return
        self._start(pool, peer, conn, route, req)

    def _start(self, pool: Pool, peer: str | None, conn: _Connection, route: Route, req: Request) -> None:
        if peer is not None:
            self._peer_inflight[peer] += 1
        try:
            fut = pool.executor.submit(self._call, route, req)
        except RuntimeError:  # shut down
            pool.release()
            return
        fut.add_done_callback(lambda f: self._hand_back(conn, f, pool, peer))

    # -- waiting requests of the listeners the network reaches (PeerLimits)
    def _park(self, peer: str, conn: _Connection, route: Route, req: Request) -> None:
        """Hold a request that finds its address at its in-flight cap, or no free handler, until one frees
        (``_drain``), at most ``limits.queue_wait_s`` (then 503). Its connection is not read meanwhile (one
        request at a time per connection), so a client that sends faster than it is answered costs nothing
        more: refusing at once let a flood spin the event loop on refusals at the rate it could send."""
        self.stats.parked += 1
        entry: list = [conn, route, req, None]
        entry[3] = self._loop.call_later(self.limits.queue_wait_s, self._expire, peer, entry)
        self._parked.setdefault(peer, collections.deque()).append(entry)
        if self._peer_inflight[peer] >= conn.lst.peers.max_inflight:
            self._peer_warning(f"{peer} has {self._peer_inflight[peer]} requests in flight on "
                               f"{conn.lst.name} (its cap): its next requests wait")

    def _expire(self, peer: str, entry: list) -> None:
        queue = self._parked.get(peer)
        if queue is None or entry not in queue:
            return
        queue.remove(entry)
        if not queue:
            del self._parked[peer]
        self.stats.busy += 1
        wait = self.limits.queue_wait_s
        entry[0].respond(Response.error(503, f"server busy: no request handler for {wait:g}s; retry",
                                        [("Retry-After", "1")]))

    def _drain(self) -> None:
        """Start waiting requests while handlers are free, one address after another (round robin)."""
        while self._parked and self.pool.inflight < self.pool.capacity:
            started = False
            for peer in list(self._parked):
                queue = self._parked[peer]
                while queue and queue[0][0].state == "closed":  # the client gave up
                    queue.popleft()[3].cancel()
                if not queue:
                    del self._parked[peer]
                    continue
                conn = queue[0][0]
                if self._peer_inflight[peer] >= conn.lst.peers.max_inflight:
                    continue
                if not self.pool.acquire():
                    return
                conn, route, req, timer = queue.popleft()
                timer.cancel()
                if not queue:
                    del self._parked[peer]
                else:
                    self._parked.move_to_end(peer)  # the next address goes first next time
                self._start(self.pool, peer, conn, route, req)
                started = True
                break
            if not started:
                return

    def _hand_back(self, conn: _Connection, fut: Future, pool: Pool, peer: str | None) -> None:
        """(handler thread) the result goes back to the event loop, unless the server stopped."""
        pool.release()
        with contextlib.suppress(RuntimeError):  # loop closed at shutdown
            self._loop.call_soon_threadsafe(self._finished, conn, fut, peer)

    def _finished(self, conn: _Connection, fut: Future, peer: str | None = None) -> None:
        if peer is not None:
            self._peer_inflight[peer] -= 1
            if self._peer_inflight[peer] <= 0:
                del self._peer_inflight[peer]
        if self._parked:
            self._drain()
        try:
            resp = fut.result()
        except BaseException:  # cancelled at shutdown
            conn.unprioritise()
            return
        if isinstance(resp, Future):
            conn.unprioritise()  # waiting (a node lock, a write) is not work: the others go on meanwhile
            # a deferred response (the extender's /bind waiting for a node lock): the handler thread is
            # free again; the handler bounds how many such answers are pending and for how long
            resp.add_done_callback(lambda f: self._hand_back_deferred(conn, f))
            return
        conn.respond(resp)

    def _hand_back_deferred(self, conn: _Connection, fut: Future) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed at shutdown
            self._loop.call_soon_threadsafe(self._deferred_done, conn, fut)

    def _deferred_done(self, conn: _Connection, fut: Future) -> None:
        exc = fut.exception()
        if exc is None:
            conn.respond(fut.result())
        elif isinstance(exc, HTTPError):
            conn.respond(Response.error(exc.status, exc.message, exc.headers))
        else:
            self.stats.errors += 1
            err_id = secrets.token_hex(6)
            logger.error("%s deferred response failed (error id %s): %r", self.name, err_id, exc)
            conn.respond(Response.error(500, f"internal error (error id {err_id}; details in the server "
                                             "log)"))

    def _call(self, route: Route, req: Request) -> Response:
        """Run a handler; every outcome is a Response (the connection always gets an answer)."""
        if self._yields is not None and route.pool is None:
            self._yields.pause()
        try:
            return route.handler(req)
        except HTTPError as exc:
            return Response.error(exc.status, exc.message, exc.headers)
        except Exception:
            self.stats.errors += 1
            err_id = secrets.token_hex(6)
            logger.exception("%s %s %s failed (error id %s)", self.name, req.method, req.path, err_id)
            return Response.error(500, f"internal error (error id {err_id}; details in the server log)")


def _raw_response(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> bytes:
    """A complete error response that closes the connection (before or instead of a parsed request)."""
    body = Response.error(status, message).body
    lines = [f"HTTP/1.1 {status} {reason(status)}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One client connection. States: handshake → new → reading → body → busy → (writing) → keepalive →
    reading ... → closed. ``since`` is when the current state began; one timer enforces its deadline.
    The httptools parser calls the ``on_*`` methods while ``data_received`` feeds it."""

    def __init__(self, server: HttpServer, lst: Listener, sock: socket.socket, addr: tuple) -> None:
        self.server = server
        self.lst = lst
        self.sock = sock
        self.peer = (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) and len(addr) >= 2 else ("?", 0)
        self.peer_text = f"{self.peer[0]}:{self.peer[1]}"
        self.loop = server._loop
        self.limits = server.limits
        self.state = "handshake" if lst.ssl_context is not None else "connecting"
        self.since = self.loop.time()
        self.transport: asyncio.Transport | None = None
        self.parser: Any = httptools.HttpRequestParser(self)  # None once closed (see _closed)
        self.peer_cert: dict | None = None
        self.queue: collections.deque[tuple[Request, bool]] = collections.deque()  # complete, unanswered
        self.keep_alive = True  # of the request being answered
        self._url = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._body = bytearray()
        self._refusal: tuple[int, str] | None = None
        self._in_message = False  # a request has begun and is not complete
        self._peer_eof = False
        self._method = ""
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None  # of the current state (None: none)
        self._task: asyncio.Task | None = None
        self._write_paused = False
        self._header_deadline = self.since + self.limits.header_timeout_s
        self._prio = False  # this connection holds the server's Priority (a prioritised request under way)

    def prioritise(self) -> None:
        """Hold the server's Priority while this request is read and handled, for a caller that is already
        known to be kube-scheduler's side: a loopback peer of a plain listener, or a peer that presented a
        verified client certificate (mtls). Anyone else who can reach the listener could otherwise slow
        the webhook down just by starting requests there."""
        holds = self.server._holds
        if holds is not None and not self._prio and (
                self.peer_cert or (self.lst.ssl_context is None and _loopback(self.peer[0]))):
            self._prio = True
            holds.hold()

    def unprioritise(self) -> None:
        if self._prio:
            self._prio = False
            self.server._holds.release()

    # -- lifecycle
    def start(self) -> None:
        self._task = self.loop.create_task(self._connect())
        self._task.add_done_callback(self._connect_done)

    async def _connect(self) -> None:
        kw = {}
        if self.lst.ssl_context is not None:
            kw = {"ssl": self.lst.ssl_context, "ssl_handshake_timeout": self.limits.handshake_timeout_s}
        await self.loop.connect_accepted_socket(lambda: self, self.sock, **kw)

    def _connect_done(self, task: asyncio.Task) -> None:
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or exc is not None:
            # handshake failed, timed out or was evicted: nothing was served, release the descriptor
            if exc is not None:
                if isinstance(exc, (TimeoutError, ConnectionAbortedError)):
                    self.server.stats.timeouts += 1
                log.v(logger, 4, "%s: TLS handshake with %s failed: %s", self.server.name, self.peer_text,
                      exc)
            self.sock.close()
            self._closed()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.lst.ssl_context is not None:
            self.peer_cert = transport.get_extra_info("peercert") or None
        self._header_deadline = self.loop.time() + self.limits.header_timeout_s
        self._set_state("new", self._header_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.state == "writing":
            self._next_request()

    def abort(self) -> None:
        """Close now, dropping unsent data (eviction, timeouts, shutdown)."""
        if self.transport is not None:
            self.transport.abort()
        elif self._task is not None:
            self._task.cancel()
        self._closed()

    def _closed(self) -> None:
        self.unprioritise()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadline = None
        self.state = "closed"
        self.queue.clear()
        self.server._forget(self)
        # the parser holds this connection's bound callbacks and this connection holds the parser: without
        # this cut, every closed connection (with its TLS protocol's 256 KB buffer) waited for a gen-2
        # collection, which counts objects, not bytes
        self.parser = None

    def _close_after(self, data: bytes) -> None:
        if self.transport is None or self.state in ("closed", "closing"):
            return
        self.transport.write(data)
        self.transport.close()  # flushes what is buffered, then closes
        self._set_state("closing", self.loop.time() + self.limits.write_timeout_s)

    # -- deadlines
    def _set_state(self, state: str, deadline: float | None) -> None:
        """Enter ``state`` with its ``deadline``. The timer is moved only when the new deadline is earlier
        than the one it waits for; a later one is picked up when it fires. A keep-alive request passes
        four states (reading, body, busy, keepalive): cancelling and scheduling a timer on each was a
        seventh of the event loop's CPU per request (issue 31)."""
        self.state = state
        self.since = self.loop.time()
        self._deadline = deadline
        if deadline is None or (self._timer is not None and self._timer.when() <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        deadline = self._deadline  # None once closed (``_closed``) or in a state without one
        if deadline is None:
            return
        if deadline > self.loop.time():  # a later deadline than the one this timer was set for
            self._timer = self.loop.call_at(deadline, self._on_timer)
            return
        self._on_timeout(self.state)

    def _on_timeout(self, state: str) -> None:
        self.server.stats.timeouts += 1
        log.v(logger, 4, "%s: %s timeout for %s in state %s", self.server.name, self.lst.name, self.peer_text,
              state)
        if state in ("reading", "body"):
            what = "request headers" if state == "reading" else "request body"
            limit = self.limits.header_timeout_s if state == "reading" else self.limits.body_timeout_s
            self._close_after(_raw_response(408, f"{what} not received within {limit:g}s"))
        else:  # new / keepalive (idle), writing, closing: nothing to say to a peer that is not there
            self.abort()

    # -- input
    def data_received(self, data: bytes) -> None:
        if self.state not in ("new", "keepalive", "reading", "body", "busy"):
            return  # closing: ignore
        if self.server._yields is not None:
            self.server._yields.pause()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._refusal is None:
                self._refusal = (400, f"malformed HTTP request: {exc}")
        if self._refusal is not None:
            status, message = self._refusal
            self._close_after(_raw_response(status, message))
            return
        if len(self.queue) > _MAX_PIPELINED:
            self._close_after(_raw_response(400, f"more than {_MAX_PIPELINED} pipelined requests"))
            return
        if self.state != "busy" and self.queue:
            self._dispatch()

    def eof_received(self) -> bool | None:
        if self.state in ("busy", "writing"):
            self._peer_eof = True  # half-closed after its request: answer, then close
            return True
        self.abort()  # the peer is gone mid-request or idle: nothing to answer
        return None

    # httptools callbacks (bounded: a refusal stops collecting, data_received answers it)
    def on_message_begin(self) -> None:
        self.prioritise()
        self._in_message = True
        self._url.clear()
        self._headers = []
        self._head_size = 0
        self._body = bytearray()
        if self.state in ("new", "keepalive"):
            if self.state == "keepalive":
                self._header_deadline = self.loop.time() + self.limits.header_timeout_s
            self._set_state("reading", self._header_deadline)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._grow_head(len(name) + len(value) + 4)

    def _grow_head(self, n: int) -> None:
        self._head_size += n
        if self._head_size > self.limits.max_header_bytes and self._refusal is None:
            self._refusal = (431, "request line and headers exceed the limit of "
                                  f"{self.limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        if self._refusal is not None:
            return
        length = next((v for k, v in self._headers if k == b"content-length"), None)
        if length is not None and length.strip().isdigit() and int(length) > self.limits.max_body:
            # not read: the connection closes after the answer (reading a refused body costs as much)
            self._refusal = (413, f"request body of {int(length)} bytes exceeds the limit of "
                                  f"{self.limits.max_body} bytes")
            return
        if any(k == b"expect" and v.lower() == b"100-continue" for k, v in self._headers):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.state == "reading":
            self._set_state("body", self.loop.time() + self.limits.body_timeout_s)

    def on_body(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        self._body += data
        if len(self._body) > self.limits.max_body:
            self._refusal = (413, f"request body exceeds the limit of {self.limits.max_body} bytes")

    def on_message_complete(self) -> None:
        self._in_message = False
        if self._refusal is not None:
            return
        target = self._url.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for k, v in self._headers:
            name = k.decode("latin-1")
            val = v.decode("latin-1")
            headers[name] = f"{headers[name]}, {val}" if name in headers else val
        req = Request(method=self.parser.get_method().decode("latin-1"), path=path, query=query,
                      headers=headers, body=bytes(self._body), peer=self.peer, listener=self.lst.name,
                      peer_cert=self.peer_cert, tls=self.lst.ssl_context is not None)
        self._body = bytearray()
        self.queue.append((req, self.parser.should_keep_alive()))

    def _dispatch(self) -> None:
        assert self.transport is not None
        req, self.keep_alive = self.queue.popleft()
        self.transport.pause_reading()  # one request at a time per connection: more bytes wait
        self._set_state("busy", None)  # handlers bound their own waits; the server cannot stop a thread
        self._method = req.method
        route, allowed = self.lst.match(req.method, req.path)
        if route is None:
            if allowed:
                self.respond(Response.error(405, f"{req.method} not allowed on {req.path[:200]}; use "
                                                 f"{', '.join(allowed)}", [("Allow", ", ".join(allowed))]))
            else:
                self.respond(Response.error(404, f"no route {req.method} {req.path[:200]}"))
            return
        self.server._submit(self, route, req)

    # -- output
    def respond(self, resp: Response) -> None:
        if self.state != "busy" or self.transport is None:
            return  # the peer went away while the handler ran
        if self._peer_eof:
            self.keep_alive = False
        self.transport.write(_encode(resp, self.server.name, not self.keep_alive,
                                     head_only=self._method == "HEAD"))
        if not self.queue and not self._in_message:
            self.unprioritise()  # answered, and nothing more of this connection is under way
        if not self.keep_alive:
            self.transport.close()  # Connection: close (client asked, or HTTP/1.0)
            self._set_state("closing", self.loop.time() + self.limits.write_timeout_s)
            return
        if self._write_paused:
            self._set_state("writing", self.loop.time() + self.limits.write_timeout_s)
            return
        self._next_request()

    def _next_request(self) -> None:
        assert self.transport is not None
        if self.queue:  # pipelined: answer in order
            self._dispatch()
            return
        if self._in_message:  # the next request began while this one was answered: its head deadline runs
            self._header_deadline = self.loop.time() + self.limits.header_timeout_s
            self._set_state("reading", self._header_deadline)
        else:
            self._set_state("keepalive", self.loop.time() + self.limits.idle_timeout_s)
        self.transport.resume_reading()


def _encode(resp: Response, server: str, close: bool, head_only: bool = False) -> bytes:
    """A complete HTTP/1.1 response. Written by hand because it is a format string: the status line,
    fixed headers and the handler's few extra ones (checked for CR/LF, the response-splitting bytes)."""
    lines = [f"HTTP/1.1 {resp.status} {reason(resp.status)}", f"Content-Type: {resp.content_type}",
             f"Content-Length: {len(resp.body)}", f"Server: {server}"]
    if close:
        lines.append("Connection: close")
    for k, v in resp.headers:
        if any(c in k or c in v for c in "\r\n"):
            raise ValueError(f"response header {k!r}: CR/LF not allowed")
        lines.append(f"{k}: {v}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


def listener_is_loopback(host: str) -> bool:
    """True for addresses only this host can reach (127.0.0.0/8, ::1, localhost)."""
    return _loopback(host)

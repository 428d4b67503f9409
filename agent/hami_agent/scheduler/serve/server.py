"""The scheduler's listeners: extender verbs (/filter /prioritize /bind), the admission webhook
(/webhook), /healthz /livez /readyz /metrics and, with ``--profiling`` on a loopback listener,
/debug/pprof/{profile,goroutine}.

Serving (deadlines, connection and thread bounds, 413/503/408) is ``hami_agent.httpserve``; who may
call the verbs is ``scheduler.auth``; the request shapes are checked by ``scheduler.shapes`` before a
handler sees them. Listeners:

- ``main`` (``--bind-address``): webhook, health, metrics; also the verbs unless they have their own
  listener.
- ``extender`` (``--extender-bind-address``, optional): the verbs (and health). With
  ``--extender-auth=loopback`` on a non-loopback ``--bind-address`` this is where kube-scheduler calls.
- ``metrics`` (``--metrics-bind``, optional): /metrics and /healthz only.

Listeners that cannot starve each other (issue 27 item 2): the public listeners (``main``, ``metrics``)
and the verbs' ``extender`` listener are two ``HttpServer``s, each with its own event-loop thread,
connection budget, handler threads and queue, so nothing sent to the webhook's address takes anything
kube-scheduler's calls need; with ``public_process`` (``--public-listener-process``, the scheduler's
default when the verbs have their own listener) the public ones are served by a child process
(``scheduler.serve.public``), so that their threads cannot hold the interpreter lock the verbs' threads
need either. When the verbs share ``main`` (no ``--extender-bind-address``) they still run on a pool of
their own. The public listeners cap what one client address may hold (``PeerLimits``: connections,
requests in flight) and ``main`` optionally admits only ``--allowed-sources``."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs

from hami_agent.httpserve import HTTPError, HttpServer, Limits, Listener, Request, Response, Route
from hami_agent.httpserve import listener_is_loopback as is_loopback
from hami_agent.httpserve.jsonbody import RepeatedArray, parse_json
from hami_agent.httpserve.model import PeerLimits
from hami_agent.httpserve.ops import healthz_route, metrics_route
from hami_agent.httpserve.server import Pool, Priority, Stats, bind_socket
from hami_agent.httpserve.tls import server_context
from hami_agent.scheduler.serve import auth as authn
from hami_agent.scheduler.serve import profiling, shapes
from hami_agent.scheduler.serve.public import ChannelClosed, PublicProcess, portable_webhook
from hami_agent.scheduler.verbs.args import parse_prioritize_args
from hami_agent.scheduler.verbs.extender import BadRequest

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB, like HAMi's io.LimitReader
VERBS = ("filter", "prioritize", "bind", "preempt")


def parse_bind(addr: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``host:port`` or ``:port`` → (host, port); raises ValueError naming the flag value."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bind address {addr!r}: want host:port or :port")
    return (host.strip("[]") or default_host), int(port)


def _deferred_json(src: Future, dst: Future) -> None:
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(Response.json(src.result()))


def prioritize(args: Any) -> list[dict]:
    """HAMi has no prioritize verb (the node is chosen in /filter); answer a neutral HostPriorityList."""
    return [{"Host": n, "Score": 0} for n in parse_prioritize_args(args)]


_SHAPES: dict[str, Callable[[Any], Any]] = {
    "/filter": shapes.extender_args, "/prioritize": shapes.extender_args, "/bind": shapes.binding_args,
    "/preempt": shapes.preemption_args, "/webhook": shapes.admission_review}


class ExtenderHTTPServer:
    """The scheduler process's HTTP listeners (see the module docstring). ``routes`` adds JSON POST
    routes (path → handler taking the parsed body), served like the built-in ones."""

    def __init__(self, extender: Any = None, webhook: Any = None, *, host: str = "127.0.0.1", port: int = 0,
                 cert_file: str | None = None, key_file: str | None = None, registry: Any = None,
                 ready: Callable[[], bool] | None = None, profiling_enabled: bool = False,
                 max_body: int = DEFAULT_MAX_BODY, metrics: Any = None,
                 routes: dict[str, Callable[[Any], Any]] | None = None,
                 auth: authn.AuthConfig | authn.Authenticator | None = None,
                 extender_bind: tuple[str, int] | None = None, metrics_bind: tuple[str, int] | None = None,
                 limits: Limits | None = None, name: str = "hami-scheduler",
                 peers: PeerLimits | None = None, public_process: bool = False, public_nice: int = 0,
                 sockets: dict | None = None, public_only: bool = False) -> None:
        """``public_process`` (with ``extender_bind``): the public listeners run in a child process
        (``scheduler.serve.public``); ``sockets`` and ``public_only`` are that child's: listening sockets
        it inherited, and no verbs here."""
        json_routes: dict[str, Callable[[Any], Any]] = dict(routes or {})
        validated: set[str] = set()
        if extender is not None:
            # /bind may answer later (a Future) while it waits for a node lock: no handler thread waits
            # /filter's assignment write may run behind its answer (config.write_behind, writebehind.py)
            verbs = (("/filter", getattr(extender, "filter_route", extender.filter)),
                     ("/bind", getattr(extender, "bind_async", extender.bind)),
                     ("/prioritize", prioritize))
            if hasattr(extender, "preempt"):  # preemptVerb (verbs/preemption.py)
                verbs += (("/preempt", extender.preempt),)
            for path, fn in verbs:
                if path not in json_routes:
                    json_routes[path] = fn
                    validated.add(path)
        if webhook is not None and "/webhook" not in json_routes:
            json_routes["/webhook"] = webhook.review
            validated.add("/webhook")
        config = auth if isinstance(auth, authn.AuthConfig) else authn.AuthConfig()
        mode = auth.mode if auth is not None else config.mode
        verb_paths = {p for p in json_routes if p.strip("/") in VERBS}
        verbs_host = extender_bind[0] if extender_bind else host
        self._public_only = public_only
        self._public_nice = public_nice
        if not public_only:
            self._check_auth_placement(mode, verbs_host, bool(extender_bind), cert_file)
        self.auth = auth if isinstance(auth, authn.Authenticator) else authn.build(
            config, client=getattr(extender, "client", None))
        self.registry = registry
        self.ready = ready or (lambda: True)
        self.metrics = metrics
        self.tls = bool(cert_file)
        limits = limits or Limits()
        self.limits = replace(limits, max_body=max_body)

        client_ca = config.client_ca_file if self.auth.mode == "mtls" else None
        main_ctx = server_context(cert_file, key_file, client_ca if not extender_bind else None) \
            if cert_file else None

        # the verbs' own handler pool when they share the main listener with the webhook
        shared_verbs = bool(verb_paths) and not extender_bind
        self._verbs_pool = (Pool(f"{name}-verbs", self.limits.workers, self.limits.max_queued)
                            if shared_verbs else None)

        def post(path: str) -> Route:
            pool = "verbs" if shared_verbs and path in verb_paths else None
            return Route(self._json_handler(path, json_routes[path], path in validated), pool=pool)

        common: dict[tuple[str, str], Route] = {
            ("GET", "/healthz"): healthz_route(), ("GET", "/livez"): healthz_route(),
            ("GET", "/readyz"): Route(self._readyz, inline=True)}
        if registry is not None:
            common[("GET", "/metrics")] = metrics_route(registry)
        pprof = {("GET", "/debug/pprof*"): Route(self._pprof)} if profiling_enabled else {}

        peers = peers or PeerLimits()
        main_routes = dict(common)
        main_routes.update({("POST", p): post(p) for p in json_routes
                            if p not in verb_paths or not extender_bind})
        listeners = [Listener("main", host, port, main_routes, main_ctx, peers=peers)]
        if pprof and is_loopback(host):
            main_routes.update(pprof)
        if extender_bind:
            # loopback: plain HTTP on 127.0.0.1 (kube-scheduler's urlPrefix http://...); mtls and token: TLS
            ext_ctx = (server_context(cert_file, key_file, client_ca)
                       if cert_file and self.auth.mode != "loopback" else None)
            ext_routes = dict(common)
            ext_routes.update({("POST", p): post(p) for p in verb_paths})
            ext_routes.update(pprof)  # the extender listener is loopback unless mtls/token chose otherwise
            if pprof and not is_loopback(extender_bind[0]):
                for k in pprof:
                    ext_routes.pop(k)
            verbs_listener = Listener("extender", extender_bind[0], extender_bind[1], ext_routes, ext_ctx)
        if metrics_bind is not None and registry is not None:
            listeners.append(Listener("metrics", metrics_bind[0], metrics_bind[1], {
                ("GET", "/metrics"): metrics_route(registry), ("GET", "/healthz"): healthz_route()},
                peers=PeerLimits(peers.max_connections, peers.max_inflight)))
        every = listeners + ([verbs_listener] if extender_bind else [])
        if profiling_enabled and not any(("GET", "/debug/pprof*") in lst.routes for lst in every):
            logger.warning("--profiling: /debug/pprof is served only on a loopback listener and none is "
                           "configured; set --bind-address or --extender-bind-address to 127.0.0.1:PORT")
        # two servers, two event loops: kube-scheduler's listener shares no thread, queue or connection
        # budget with the listeners the network reaches; and while one of kube-scheduler's requests is
        # read or handled, the public listeners' threads yield the interpreter to it (Priority)
        # with public_process the public listeners are another process's (scheduler/serve/public.py): their
        # threads cannot hold the interpreter lock that the verbs' threads need
        split = public_process and bool(extender_bind)
        servers: list[HttpServer] = []
        priority = Priority() if extender_bind and not split else None
        self._public: PublicProcess | None = None
        self._public_socks: dict = {}
        try:
            if extender_bind:
                servers.append(HttpServer([verbs_listener], self.limits, name=f"{name}-verbs",
                                          priority=priority, prioritised=True))
            if split:
                self._public_socks = self._bind_public(listeners)
                self._public = self._public_process(
                    webhook, routes or {}, verb_paths, registry, host, port, cert_file, key_file,
                    profiling_enabled, metrics_bind, name, peers)
            else:
                pools = {"verbs": self._verbs_pool} if self._verbs_pool is not None else None
                servers.append(HttpServer(listeners, self.limits, name=name, pools=pools, priority=priority,
                                          sockets=sockets))
        except BaseException:
            for srv in servers:
                srv.stop()
            for sock in self._public_socks.values():
                sock.close()
            if self._verbs_pool is not None:
                self._verbs_pool.shutdown()
            raise
        self._servers = servers
        self._server = servers[-1]  # main (+ metrics); the verbs' server when the public ones are a process
        self._verbs_server = servers[0] if extender_bind else self._server
        self._extender_listener = "extender" if extender_bind else "main"
        if shared_verbs and not is_loopback(host):
            logger.warning("the extender verbs share --bind-address %s with the webhook: they keep their own "
                           "handler threads, but not their own connections; set --extender-bind-address so "
                           "that nothing sent to the webhook's address can delay kube-scheduler's calls",
                           host or "0.0.0.0")

    @staticmethod
    def _bind_public(listeners: list[Listener]) -> dict:
        socks: dict = {}
        try:
            for lst in listeners:
                socks[lst.name] = bind_socket(lst.host, lst.port)
        except OSError as exc:
            for s in socks.values():
                s.close()
            raise OSError(exc.errno, f"cannot listen on {lst.host or '0.0.0.0'}:{lst.port} ({lst.name}): "
                                     f"{exc.strerror}") from exc
        return socks

    def _public_process(self, webhook: Any, routes: dict, verb_paths: set[str], registry: Any, host: str,
                        port: int, cert_file: str | None, key_file: str | None, profiling_enabled: bool,
                        metrics_bind: tuple[str, int] | None, name: str, peers: PeerLimits) -> PublicProcess:
        """The child's recipe (pickled to it) and the questions it may ask this process."""
        handlers: dict[str, Callable[..., Any]] = {"ready": self._ready_now}
        if registry is not None:
            from prometheus_client import generate_latest

            handlers["metrics"] = lambda: generate_latest(registry)
        own_webhook = webhook is not None and "/webhook" not in routes
        if own_webhook:
            if webhook.quota is not None:
                handlers["quota"] = webhook.quota
            if webhook.namespace_labels is not None:
                handlers["labels"] = webhook.namespace_labels
        spec = {"webhook": portable_webhook(webhook) if own_webhook else None,
                "routes": {p: fn for p, fn in routes.items() if p not in verb_paths},
                "registry": registry is not None, "host": host, "port": port, "cert_file": cert_file,
                "key_file": key_file, "profiling": profiling_enabled, "max_body": self.limits.max_body,
                "metrics_bind": metrics_bind, "limits": self.limits, "name": name, "peers": peers}
        return PublicProcess(spec, self._public_socks, handlers, nice=self._public_nice)

    def _ready_now(self) -> bool:
        try:
            return bool(self.ready())
        except Exception as exc:
            logger.warning("readiness check failed: %s", exc)
            return False

    @staticmethod
    def _check_auth_placement(mode: str, verbs_host: str, separate: bool, cert_file: str | None) -> None:
        """Refuse configurations where the chosen mode would not protect the verbs."""
        flag = "--extender-bind-address" if separate else "--bind-address"
        if mode == "loopback" and not is_loopback(verbs_host):
            raise ValueError(
                f"--extender-auth=loopback serves /filter, /prioritize and /bind on loopback only, but "
                f"{flag} is {verbs_host or '0.0.0.0'}: set --extender-bind-address 127.0.0.1:PORT "
                "(kube-scheduler's urlPrefix) and keep --bind-address for the webhook, or choose "
                "--extender-auth=mtls or token")
        if mode == "mtls" and not cert_file:
            raise ValueError("--extender-auth=mtls needs TLS: set --cert-file, --key-file and "
                             "--client-ca-file")
        if mode == "token" and not cert_file and not is_loopback(verbs_host):
            raise ValueError(f"--extender-auth=token on {flag} {verbs_host or '0.0.0.0'} without TLS would "
                             "send bearer tokens in clear text: set --cert-file and --key-file")

    # -- properties and lifecycle
    @property
    def port(self) -> int:
        if self._public is not None:
            return self._public_socks["main"].getsockname()[1]
        return self._server.port("main")

    @property
    def public_pid(self) -> int | None:
        """The process serving the public listeners when it is not this one."""
        return self._public.pid if self._public is not None else None

    @property
    def extender_port(self) -> int:
        return self._verbs_server.port(self._extender_listener)

    def _url(self, listener: str, tls: bool) -> str:
        if listener != "extender" and self._public is not None:
            host, port = self._public_socks[listener].getsockname()[:2]
        else:
            srv = self._verbs_server if listener == "extender" else self._server
            host, port = srv.address(listener)
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if tls else 'http'}://{host}:{port}"

    @property
    def url(self) -> str:
        return self._url("main", self.tls)

    @property
    def extender_url(self) -> str:
        lst = self._verbs_server.listeners[self._extender_listener]
        return self._url(self._extender_listener, lst.ssl_context is not None)

    @property
    def stats(self) -> Stats:
        """Every listener's counters together (``public_stats``/``verbs_stats`` apart)."""
        total = Stats()
        for srv in self._servers:
            total = total + srv.stats
        if self._public is not None:
            total = total + self.public_stats
        return total

    @property
    def public_stats(self) -> Stats:
        if self._public is not None:  # asked of the child process (nothing while it is not running)
            try:
                return Stats(**self._public.call("stats"))
            except ChannelClosed:
                return Stats()
        return self._server.stats

    @property
    def verbs_stats(self) -> Stats:
        return self._verbs_server.stats

    @property
    def open_connections(self) -> int:
        n = sum(srv.open_connections for srv in self._servers)
        if self._public is not None:
            with contextlib.suppress(ChannelClosed):
                n += int(self._public.call("open_connections"))
        return n

    def start(self) -> ExtenderHTTPServer:
        if self._public is not None:
            self._public.start()
        for srv in self._servers:
            srv.start()
        if self._public_only:
            logger.info("public listeners (webhook, health, metrics) on %s", self.url)
        else:
            logger.info("scheduler listening on %s (extender verbs on %s, --extender-auth=%s)", self.url,
                        self.extender_url, self.auth.mode)
        return self

    def stop(self) -> None:
        for srv in self._servers:
            srv.stop()
        if self._public is not None:
            self._public.stop()
        if self._verbs_pool is not None:
            self._verbs_pool.shutdown()

    # -- handlers
    def _json_handler(self, path: str, fn: Callable[[Any], Any],
                      validate: bool) -> Callable[[Request], Response]:
        verb = path.strip("/")
        needs_auth = verb in VERBS
        shape = _SHAPES.get(path) if validate else None
        what = {"/filter": "ExtenderArgs", "/prioritize": "ExtenderArgs", "/bind": "ExtenderBindingArgs",
                "/preempt": "ExtenderPreemptionArgs", "/webhook": "AdmissionReview"}.get(path, "body")
        # kube-scheduler sends every node name in every ExtenderArgs, the same list call after call
        repeated = RepeatedArray("NodeNames") if what == "ExtenderArgs" else None

        def handler(req: Request) -> Response:
            if needs_auth:
                self.auth.check(req, verb)  # raises 401/403 before anything is parsed or decided
            args = parse_json(req.body, f"{path} {what}", repeated=repeated)
            if shape is not None:
                shape(args)
            t0 = time.perf_counter()
            try:
                result = fn(args)
            except BadRequest as exc:
                raise HTTPError(400, str(exc)) from None
            finally:
                if self.metrics is not None:
                    self.metrics.latency.labels(verb).observe(time.perf_counter() - t0)
            if isinstance(result, Future):  # answered when it resolves (httpserve: deferred response)
                out: Future = Future()
                result.add_done_callback(lambda f: _deferred_json(f, out))
                return out  # type: ignore[return-value]
            return Response.json(result)

        return handler

    def _readyz(self, _req: Request) -> Response:
        try:
            ok = bool(self.ready())
        except Exception as exc:
            logger.warning("readiness check failed: %s", exc)
            ok = False
        return Response.text("ok" if ok else "not ready: caches not synced or not leader", 200 if ok else 503)

    def _pprof(self, req: Request) -> Response:
        path = req.path
        if path.rstrip("/") == "/debug/pprof":
            return Response.text("profile?seconds=N  CPU profile (folded stacks)\ngoroutine  thread dump\n")
        if path == "/debug/pprof/profile":
            raw = parse_qs(req.query).get("seconds", ["30"])[0]
            try:
                seconds = float(raw)
            except ValueError:
                raise HTTPError(400, f"seconds: {raw!r} is not a number") from None
            return Response.text(profiling.cpu_profile(seconds))
        if path in ("/debug/pprof/goroutine", "/debug/pprof/threads"):
            return Response.text(profiling.thread_dump())
        raise HTTPError(404, f"no profile {path}")

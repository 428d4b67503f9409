"""The public listeners in a process of their own (issue 27 item 2: listeners that cannot starve each other).

Why a process: kube-scheduler's /filter and everything the network sends to the webhook's address used to
share one interpreter. Measured under a flood of 200 keep-alive TLS clients (2026-11-27, 2 shared cores):
the /filter handler itself did not slow down (0.37 ms at p50 with or without the flood), but the verbs'
event-loop thread waited for the interpreter lock after each wake-up — from the request's arrival to its
first byte being read took 0.1 ms at p50 and 0.3 ms at p99 unflooded, 0.2 ms / 4.6 ms flooded — and each
hand-off between that loop and a handler thread waited again (p99 0.25 → 1.8 ms). Nine threads of the
public listener (its event loop: TLS, HTTP, connection bookkeeping; eight handlers: JSON, webhook) take the
lock in turn; a shorter switch interval, a frozen heap and the ``Priority`` checkpoints did not change it.
With those threads in another process the same flood left the arrival-to-read time at its unflooded
figures. (Numbers: ``python -m benchmarks webhook_flood``; docs/security.md.)

So with ``--extender-bind-address`` the scheduler runs the public listeners (``--bind-address``: webhook,
/validate, health, readiness, metrics; ``--metrics-bind``) in a child process at nice 10
(``--public-listener-nice``: on busy CPUs the kernel runs the verbs first), started and watched by the
scheduler process, which keeps kube-scheduler's listener and everything the verbs decide with (the
child's entry point is ``scheduler.serve.publicchild``). What the child serves:

- the listening sockets are bound by the scheduler process and inherited (a port in use fails at start,
  as before; port 0 is known before the child runs; a restarted child serves the same sockets);
- every bound of ``httpserve`` (deadlines, caps, 413/429/503) is the child's, as it was the listener's;
- /webhook and /validate run in the child (the webhook and the guard are pickled to it); the few things
  they read from the scheduler's state — a namespace's quota left and its labels — the child asks the
  scheduler process for over a socket pair, one question at a time, each answer kept ``CACHE_S`` (so a
  flood costs the scheduler process at most one question per namespace and second, whatever its rate);
- /readyz asks the scheduler process (kept ``READY_CACHE_S``); /metrics is the scheduler process's
  registry (kept ``CACHE_S``) merged with the child's own request-latency histogram (webhook, validate);
- the scheduler process asks the child for its counters (``Stats``) over a second socket pair.

Lifecycle: the child runs the interpreter and module path of the scheduler process and exits when that
process closes its end of the channels (its stop, or its death); it ignores SIGINT and SIGTERM, which a
terminal or systemd send to both (the scheduler stops it in its own stop; systemd's control-group kill
ends a child left behind). A child that exits on its own is logged and started again after ``RESTART_S``,
doubling up to ``RESTART_MAX_S`` while it fails (its sockets stay open meanwhile: connections wait in the
backlog). Python 3.10+: subprocess, socketpair and pickle only."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

CACHE_S = 1.0  # quota, namespace labels, the scheduler's metrics text: how long the child keeps an answer
READY_CACHE_S = 0.5
RESTART_S = 1.0
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0  # a question the other side does not answer within this: the channel is broken
RESTART_MAX_S = 30.0
_HEADER = struct.Struct("!I")
_BOOT = ("import json, os, runpy, sys; sys.path[:] = json.loads(os.environ.pop('HAMI_PUBLIC_SYS_PATH')); "
         "runpy.run_module('hami_agent.scheduler.serve.publicchild', run_name='__main__', alter_sys=True)")


class ChannelClosed(Exception):
    pass


class Channel:
    """Request/answer over one stream socket, one at a time: length-prefixed pickles. Both ends are this
    program (the scheduler process and the child it started), so pickle carries no foreign input."""

    def __init__(self, sock: socket.socket, timeout_s: float | None = CALL_TIMEOUT_S) -> None:
        self.sock = sock
        self.sock.setblocking(True)
        self.sock.settimeout(timeout_s)
        self.lock = threading.Lock()

    def send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def recv(self) -> Any:
        head = self._exactly(_HEADER.size)
        return pickle.loads(self._exactly(_HEADER.unpack(head)[0]))

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ChannelClosed("the other process closed the channel")
            buf += chunk
        return bytes(buf)

    def call(self, name: str, *args: Any) -> Any:
        with self.lock:
            try:
                self.send((name, args))
                ok, value = self.recv()
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                raise ChannelClosed(f"{name}: {exc}") from exc
        if not ok:
            raise RuntimeError(f"{name} failed in the other process: {value}")
        return value

    def serve(self, handlers: dict[str, Callable[..., Any]]) -> None:
        """Answer questions until the other end closes (on the calling thread)."""
        self.sock.settimeout(None)
        while True:
            try:
                name, args = self.recv()
            except (ChannelClosed, OSError, EOFError, pickle.UnpicklingError):
                return
            try:
                answer = (True, handlers[name](*args))
            except Exception as exc:  # the caller decides what a failed lookup means
                answer = (False, f"{type(exc).__name__}: {exc}")
            try:
                self.send(answer)
            except OSError:
                return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Remote:
    """(child) one of the scheduler process's functions, each answer kept ``ttl_s`` per arguments (a
    failure too: a flood asks again at most once per ``ttl_s``). Callers share one question in flight."""

    def __init__(self, channel: Channel, name: str, ttl_s: float) -> None:
        self.channel = channel
        self.name = name
        self.ttl_s = ttl_s
        self._cache: dict[tuple, tuple[float, bool, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        hit = self._cache.get(args)  # a fresh answer needs no lock: a slow question holds up only misses
        if hit is not None and hit[0] > time.monotonic():
            if not hit[1]:
                raise hit[2]
            return hit[2]
        with self._lock:  # one question at a time: the others find its answer here
            hit = self._cache.get(args)
            now = time.monotonic()
            if hit is None or hit[0] <= now:
                try:
                    hit = (now + self.ttl_s, True, self.channel.call(self.name, *args))
                except RuntimeError as exc:
                    hit = (now + self.ttl_s, False, exc)
                if len(self._cache) > 4096:
                    self._cache.clear()
                self._cache[args] = hit
        if not hit[1]:
            raise hit[2]
        return hit[2]


def portable_webhook(webhook: Any) -> Any:
    """A copy of the webhook for the child: its quota and namespace-label lookups become questions to the
    scheduler process (``Remote`` placeholders, bound in the child)."""
    if webhook is None:
        return None
    twin = copy.copy(webhook)
    twin.quota = "remote:quota" if webhook.quota is not None else None
    twin.namespace_labels = "remote:labels" if webhook.namespace_labels is not None else None
    return twin


class PublicProcess:
    """(scheduler process) starts, watches and stops the child that serves the public listeners."""

    def __init__(self, spec: dict, sockets: dict[str, socket.socket],
                 handlers: dict[str, Callable[..., Any]], nice: int = 0) -> None:
        self.spec = spec
        self.nice = nice
        self.sockets = sockets
        self.handlers = handlers
        try:
            self._payload = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise ValueError(f"the public listeners' routes cannot be served in their own process: {exc} "
                             "(their handlers must be picklable)") from exc
        self._proc: subprocess.Popen | None = None
        self._ask: Channel | None = None  # we ask the child (stats)
        self._answer: Channel | None = None  # the child asks us (quota, labels, ready, metrics)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> PublicProcess:
        self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="public-listener-watch", daemon=True)
        self._watcher.start()
        return self

    def _spawn(self) -> None:
        ask_here, ask_there = socket.socketpair()
        answer_here, answer_there = socket.socketpair()
        fds = {name: s.fileno() for name, s in self.sockets.items()}
        boot = {"fds": fds, "ask_fd": answer_there.fileno(), "serve_fd": ask_there.fileno(),
                "log": _log_settings(), "nice": self.nice}
        # the child imports what this process imported: its module path is ours
        env = dict(os.environ, HAMI_PUBLIC_SYS_PATH=json.dumps([p for p in sys.path if isinstance(p, str)]))
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, env=env,
                pass_fds=[*fds.values(), answer_there.fileno(), ask_there.fileno()], close_fds=True)
            assert proc.stdin is not None
            proc.stdin.write(pickle.dumps(boot, protocol=pickle.HIGHEST_PROTOCOL))
            proc.stdin.write(self._payload)
            proc.stdin.close()
        finally:
            ask_there.close()
            answer_there.close()
        ask = Channel(ask_here, START_TIMEOUT_S)
        try:
            started = ask.recv()  # the child's first word: listening, or why not
        except (ChannelClosed, OSError, EOFError) as exc:
            proc.kill()
            proc.wait()
            ask.close()
            answer_here.close()
            raise RuntimeError(f"the public listener process did not start: {exc} (exit {proc.returncode})"
                               ) from None
        if started != "started":
            proc.wait()
            ask.close()
            answer_here.close()
            raise RuntimeError(f"the public listener process did not start: {started}")
        ask.sock.settimeout(CALL_TIMEOUT_S)
        answer = Channel(answer_here, None)
        threading.Thread(target=answer.serve, args=(self.handlers,), name="public-listener-questions",
                         daemon=True).start()
        with self._lock:
            self._proc, self._ask, self._answer = proc, ask, answer
        logger.info("public listeners served by process %d", proc.pid)

    def _watch(self) -> None:
        delay = RESTART_S
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            started = time.monotonic()
            rc = proc.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - started > 60:
                delay = RESTART_S
            logger.error("the public listener process %d exited (status %s): starting it again in %gs",
                         proc.pid, rc, delay)
            self._close_channels()
            while not self._stopping.wait(delay):
                delay = min(RESTART_MAX_S, delay * 2)
                try:
                    self._spawn()
                    self.restarts += 1
                    break
                except Exception as exc:  # keep trying: the sockets still queue connections meanwhile
                    logger.error("public listener process: %s (next try in %gs)", exc, delay)

    def _close_channels(self) -> None:
        with self._lock:
            for ch in (self._ask, self._answer):
                if ch is not None:
                    ch.close()
            self._ask = self._answer = None

    def call(self, name: str) -> Any:
        ask = self._ask
        if ask is None:
            raise ChannelClosed("the public listener process is not running")
        return ask.call(name)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        proc = self._proc
        self._close_channels()  # the child sees its channel close and stops
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("the public listener process %d did not stop within %gs: killing it", proc.pid,
                               timeout_s)
                proc.kill()
                proc.wait()
        if self._watcher is not None:
            self._watcher.join(timeout_s)
        for s in self.sockets.values():
            s.close()


def _log_settings() -> dict:
    root = logging.getLogger("hami_agent")
    return {"level": root.getEffectiveLevel(), "configured": bool(root.handlers)}


# ---------------------------------------------------------------- the child
class ChildMetrics:
    """The child's request-latency histogram (the same family as the scheduler's, other ``verb`` labels)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        from hami_agent.scheduler.serve.metrics import LATENCY_BUCKETS

        self.registry = CollectorRegistry()
        self.latency = Histogram("hami_scheduler_request_duration_seconds", "Extender request latency",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)


class MergedRegistry:
    """/metrics in the child: the scheduler process's text (asked, kept ``CACHE_S``) with the child's
    samples added to the families of the same name."""

    def __init__(self, remote: Callable[[], bytes], local: Any) -> None:
        self.remote = remote
        self.local = local

    def collect(self):
        from prometheus_client.parser import text_string_to_metric_families

        families: dict[str, Any] = {}
        for fam in text_string_to_metric_families(self.remote().decode("utf-8")):
            families[fam.name] = fam
        for fam in self.local.collect():
            mine = families.get(fam.name)
            if mine is not None and mine.type == fam.type:
                mine.samples.extend(fam.samples)
            else:
                families[fam.name] = fam
        yield from families.values()

"""The public listeners' process (scheduler/serve/public.py): its entry point. Started by
``PublicProcess`` with the scheduler process's interpreter and module path; reads its recipe (pickled) on
stdin, serves the inherited listening sockets with ``ExtenderHTTPServer`` (no verbs), answers the scheduler
process's questions (its counters) and asks it for what only it knows (quota, namespace labels, readiness,
its metrics)."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from typing import Any

from hami_agent.scheduler.serve.public import (
    CACHE_S,
    READY_CACHE_S,
    Channel,
    ChildMetrics,
    MergedRegistry,
    Remote,
)
from hami_agent.scheduler.serve.server import ExtenderHTTPServer


def main() -> int:
    from hami_agent import log as klog

    stdin = sys.stdin.buffer
    boot = pickle.load(stdin)
    spec = pickle.load(stdin)
    settings = boot["log"]
    root = logging.getLogger(klog.ROOT_LOGGER)
    if settings["configured"]:
        klog.setup(0)
    root.setLevel(settings["level"])
    # stopped by the scheduler process closing its end (its stop, or its death), never by a signal meant
    # for both (a terminal's Ctrl-C, systemd's SIGTERM to the unit's processes): the webhook is served
    # until the scheduler stops it, and the scheduler never sees its child exit on its own at shutdown
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if boot.get("nice"):  # before any thread starts: they inherit it
        os.nice(boot["nice"])
    stop = threading.Event()

    serve = Channel(socket.socket(fileno=boot["serve_fd"]), None)  # the scheduler asks us
    ask = Channel(socket.socket(fileno=boot["ask_fd"]))  # we ask the scheduler
    try:
        srv = _server(spec, boot["fds"], ask)
    except Exception as exc:
        with contextlib.suppress(OSError):
            serve.send(f"{type(exc).__name__}: {exc}")
        raise
    srv.start()
    serve.send("started")

    def stats() -> dict:
        return vars(srv.public_stats)

    def questions() -> None:
        serve.serve({"stats": stats, "open_connections": lambda: srv.open_connections})
        stop.set()  # the scheduler process closed its end: stopped, or gone

    threading.Thread(target=questions, name="questions", daemon=True).start()
    stop.wait()
    srv.stop()
    return 0


def _server(spec: dict, fds: dict[str, int], ask: Channel) -> ExtenderHTTPServer:
    def bind(fn: Any) -> Any:
        return Remote(ask, fn.split(":", 1)[1], CACHE_S) if isinstance(fn, str) and fn.startswith(
            "remote:") else fn

    webhook = spec["webhook"]
    if webhook is not None:
        webhook.quota = bind(webhook.quota)
        webhook.namespace_labels = bind(webhook.namespace_labels)
    metrics = ChildMetrics()
    registry = None
    if spec["registry"]:
        registry = MergedRegistry(Remote(ask, "metrics", CACHE_S), metrics.registry)
    ready_remote = Remote(ask, "ready", READY_CACHE_S)

    def ready() -> bool:
        return bool(ready_remote())

    sockets = {name: socket.socket(fileno=fd) for name, fd in fds.items()}
    return ExtenderHTTPServer(
        None, webhook, host=spec["host"], port=spec["port"], cert_file=spec["cert_file"],
        key_file=spec["key_file"], registry=registry, ready=ready, profiling_enabled=spec["profiling"],
        max_body=spec["max_body"], metrics=metrics, routes=spec["routes"], metrics_bind=spec["metrics_bind"],
        limits=spec["limits"], name=spec["name"], peers=spec["peers"], sockets=sockets, public_only=True)


if __name__ == "__main__":
    sys.exit(main())

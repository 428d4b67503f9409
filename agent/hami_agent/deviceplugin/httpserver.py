"""``/healthz`` and ``/metrics`` for the device plugin, on the agent's shared serving layer
(``hami_agent.httpserve``: bounded connections and threads, read/idle deadlines). Both endpoints are
read-only and unauthenticated (probes and Prometheus scrape them)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from hami_agent.httpserve.ops import ops_server
from hami_agent.httpserve.ops import parse_bind as _parse_bind

logger = logging.getLogger(__name__)


def parse_bind(bind: str) -> tuple[str, int]:
    """``:9394`` -> ("", 9394); ``127.0.0.1:0`` -> ("127.0.0.1", 0)."""
    return _parse_bind(bind, "--metrics-bind", ":9394")


class OpsServer:
    def __init__(self, bind: str, registry: CollectorRegistry,
                 healthz: Callable[[], tuple[bool, str]]) -> None:
        self.registry = registry
        self.healthz = healthz
        self._server = ops_server(bind, registry, healthz, name="device-plugin-ops")

    @property
    def port(self) -> int:
        return self._server.port("device-plugin-ops")

    def start(self) -> OpsServer:
        self._server.start()
        logger.info("serving /healthz and /metrics on port %d", self.port)
        return self

    def stop(self) -> None:
        self._server.stop()

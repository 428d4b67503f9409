"""The agent's one HTTP serving layer: every listener (scheduler extender and webhook, scheduler
metrics, device plugin /healthz and /metrics, monitor /metrics) is an ``HttpServer`` with ``Limits``."""

from hami_agent.httpserve.model import HTTPError, Limits, Listener, Request, Response, Route
from hami_agent.httpserve.server import HttpServer, listener_is_loopback

__all__ = ["HTTPError", "HttpServer", "Limits", "Listener", "Request", "Response", "Route",
           "listener_is_loopback"]

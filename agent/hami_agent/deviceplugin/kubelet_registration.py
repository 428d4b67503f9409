"""Register a served resource with the kubelet (``kubelet.sock``), with timeouts and backoff.

The plugin must already be serving: the kubelet's Register handler dials back and calls
GetDevicePluginOptions before it answers (kubernetes
``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import grpc

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.server import OPTIONS
from hami_agent.deviceplugin.settings import API_VERSION

logger = logging.getLogger(__name__)

# The kubelet dials us back with a 10 s timeout inside Register, so allow that plus margin.
REGISTER_RPC_TIMEOUT_S = 12.0


class RegistrationError(RuntimeError):
    """Registration failed. ``permanent``: retrying cannot help (the plugin should exit)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def register_once(kubelet_socket: str, resource: str, endpoint: str, dial_timeout_s: float,
                  cancelled: Callable[[], bool] | None = None) -> None:
    """One Register call. ``cancelled`` is polled until the kubelet answers: a registration superseded by a
    newer one (our server was restarted meanwhile) must not reach the kubelet late and replace the new one."""
    if not os.path.exists(kubelet_socket):
        raise RegistrationError(f"cannot dial kubelet at {kubelet_socket}: socket does not exist "
                                "(is the kubelet running?)")
    req = api_pb2.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource,
                                  options=OPTIONS)
    channel = grpc.insecure_channel(f"unix://{kubelet_socket}")
    try:
        # The call waits for the connection itself (wait_for_ready), as the kubelet's dial would block. Not
        # grpc.channel_ready_future: its helper thread polls the channel's state and raises "Cannot monitor
        # channel state: Channel closed!" when the channel is closed under it (a traceback in our log on
        # every superseded registration that lost that race).
        call = api_pb2_grpc.RegistrationStub(channel).Register.future(
            req, timeout=dial_timeout_s + REGISTER_RPC_TIMEOUT_S, wait_for_ready=True)
        superseded = f"registration of '{resource}' cancelled (superseded)"
        while True:
            if cancelled is not None and cancelled() and not call.done():
                call.cancel()  # not yet answered: a superseded registration must not land late
                raise RegistrationError(superseded)
            try:
                call.result(timeout=0.05)
                return
            except grpc.FutureTimeoutError:
                continue
            except grpc.FutureCancelledError:
                raise RegistrationError(superseded) from None
            except grpc.RpcError as exc:
                raise _refusal(exc, resource, kubelet_socket, dial_timeout_s) from None
    finally:
        channel.close()


def _refusal(exc: grpc.RpcError, resource: str, kubelet_socket: str,
             dial_timeout_s: float) -> RegistrationError:
    details = exc.details() or ""
    low = details.lower()
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        waited = dial_timeout_s + REGISTER_RPC_TIMEOUT_S
        return RegistrationError(f"Register '{resource}' with the kubelet at {kubelet_socket}: no answer "
                                 f"within {waited:g}s (is the kubelet running?)")
    if "unsupported version" in low or "version" in low and "support" in low:
        return RegistrationError(
            f"kubelet rejected '{resource}': {details} (this plugin speaks device plugin API "
            f"{API_VERSION}; the kubelet is too old or too new)", permanent=True)
    if "already" in low or "taken" in low or "in use" in low:
        return RegistrationError(
            f"kubelet rejected '{resource}': {details} (another device plugin already serves "
            "this resource name; stop it or change resourceCountName)", permanent=True)
    if "invalid" in low and "resource" in low:
        return RegistrationError(f"kubelet rejected '{resource}': {details}", permanent=True)
    return RegistrationError(f"Register '{resource}' with kubelet failed: {exc.code().name} {details}")


def register_with_retry(kubelet_socket: str, resource: str, endpoint: str, dial_timeout_s: float,
                        *, stop: threading.Event, sleep: Callable[[float], bool] | None = None,
                        initial_backoff_s: float = 0.1, max_backoff_s: float = 5.0) -> bool:
    """Register until it works (True), ``stop`` is set (False) or a permanent error (raised)."""
    wait = sleep or stop.wait
    backoff = initial_backoff_s
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            register_once(kubelet_socket, resource, endpoint, dial_timeout_s, cancelled=stop.is_set)
            logger.info("Registered device plugin for '%s' with Kubelet", resource)
            return True
        except RegistrationError as exc:
            if stop.is_set():
                return False
            if exc.permanent:
                logger.error("%s", exc)
                raise
            if attempt == 1 or attempt % 10 == 0:
                logger.warning("%s; retrying in %.1fs (attempt %d)", exc, backoff, attempt)
            if wait(backoff):
                return False
            backoff = min(max_backoff_s, backoff * 2)
    return False

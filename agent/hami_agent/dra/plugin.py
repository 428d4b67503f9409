"""The DRA kubelet plugin's gRPC side: the DRAPlugin service (v1 and v1beta1), the optional
DRAResourceHealth stream (v1 and v1alpha1, KEP-4680) and the plugin-watcher registration socket.

Registration (kubernetes ``pkg/kubelet/pluginmanager``, ``pkg/kubelet/cm/dra/plugin``): the kubelet's plugin
watcher finds ``<plugins_registry>/<driver>-reg.sock``, calls ``GetInfo`` -- type ``DRAPlugin``, name = the
driver name, endpoint = the plugin socket, ``supported_versions`` = the gRPC services we serve
(``v1.DRAPlugin``, ``v1beta1.DRAPlugin``, ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``; the
kubelet picks the first one it supports) -- and reports the outcome with ``NotifyRegistrationStatus``.

Every unary call runs on the device plugin's ``DeadlineRunner``: the gRPC thread waits at most
``--rpc-deadline`` (5 s, far below the kubelet's 45 s), then answers DEADLINE_EXCEEDED naming the call;
the budget passed down makes sure nothing commits after that answer (``prepare.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from hami_agent import log
from hami_agent.deviceplugin.api import pluginregistration_pb2_grpc as reg_pb2_grpc
from hami_agent.dra.api import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from hami_agent.dra.claims import ClaimRef
from hami_agent.dra.devices import DraDevice
from hami_agent.dra.prepare import ClaimResult, PrepareBusy, Preparer
from hami_agent.kubeletplugin import DeadlineRunner, RegistrationServicer, SocketServer, run_rpc

logger = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# "<gRPC package>.<service>" as registration lists them (kubelet k8s.io/kubelet/pkg/apis/dra*/types.go)
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                      "v1alpha1.DRAResourceHealth")
HEALTH_TIMEOUT_S = 60  # health_check_timeout_seconds: the kubelet marks a device Unknown without news
MESSAGE_MAX = 1024


class HealthBoard:
    """The devices' health as the health stream sends it; streams wait on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: tuple[DraDevice, ...] = ()
        self._version = 0

    def update(self, devices: Sequence[DraDevice]) -> None:
        key = tuple((d.name, d.healthy, d.reason) for d in devices)
        with self._cond:
            if key != tuple((d.name, d.healthy, d.reason) for d in self._devices):
                self._devices = tuple(devices)
                self._version += 1
                self._cond.notify_all()

    def current(self) -> tuple[tuple[DraDevice, ...], int]:
        with self._cond:
            return self._devices, self._version

    def wait_newer(self, version: int, timeout: float) -> None:
        with self._cond:
            if self._version == version:
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class _DraServicer:
    """NodePrepareResources / NodeUnprepareResources for one generated API version (``pb``)."""

    def __init__(self, pb: Any, preparer: Preparer, runner: DeadlineRunner, metrics: Any,
                 driver: str) -> None:
        self.pb = pb
        self.preparer = preparer
        self.runner = runner
        self.metrics = metrics
        self.driver = driver

    async def _run(self, method: str, context: grpc.aio.ServicerContext, body: Callable) -> Any:
        def record(seconds: float, code: str) -> None:
            if self.metrics is not None:
                self.metrics.rpc_duration.labels(method).observe(seconds)
                if code != "OK":
                    self.metrics.rpc_errors.labels(method, code).inc()

        return await run_rpc(self.runner, f"{method} of driver {self.driver}", context, body,
                             {PrepareBusy: grpc.StatusCode.UNAVAILABLE}, record, log=logger)

    # ``async``: served on the gRPC loop, which hands each body straight to the runner (``kubeletplugin``)
    async def NodePrepareResources(self, request, context):  # noqa: N802 - gRPC method name
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        log.v(logger, 4, "NodePrepareResources %s", [f"{r} ({r.uid})" for r in refs])
        results: dict[str, ClaimResult] = await self._run("NodePrepareResources", context,
                                                          lambda budget: self.preparer.prepare(refs, budget))
        out = self.pb.NodePrepareResourcesResponse()
        for ref in refs:
            res = results.get(ref.uid) or ClaimResult(error=f"claim {ref}: not prepared")
            entry = out.claims[ref.uid]
            if res.error:
                entry.error = res.error
                if self.metrics is not None:
                    self.metrics.claims.labels("prepare", "failed").inc()
                continue
            for d in res.devices:
                dev = entry.devices.add(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                                        cdi_device_ids=list(d.cdi_ids))
                if d.share_id and "share_id" in self.pb.Device.DESCRIPTOR.fields_by_name:
                    dev.share_id = d.share_id
            if self.metrics is not None:
                self.metrics.claims.labels("prepare", "success").inc()
        return out

    async def NodeUnprepareResources(self, request, context):  # noqa: N802
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        log.v(logger, 4, "NodeUnprepareResources %s", [f"{r} ({r.uid})" for r in refs])
        errors: dict[str, str] = await self._run("NodeUnprepareResources", context,
                                                 lambda budget: self.preparer.unprepare(refs, budget))
        out = self.pb.NodeUnprepareResourcesResponse()
        for ref in refs:
            out.claims[ref.uid].error = errors.get(ref.uid, "")
            if self.metrics is not None:
                self.metrics.claims.labels("unprepare", "failed" if errors.get(ref.uid) else "success").inc()
        return out


class DraV1Servicer(_DraServicer, dra_v1_pb2_grpc.DRAPluginServicer):
    pass


class DraV1beta1Servicer(_DraServicer, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    pass


class _HealthServicer:
    """NodeWatchResources: the whole device list, at once and after every change (and every 30 s, well
    inside ``health_check_timeout_seconds``)."""

    RESEND_S = 30.0

    def __init__(self, pb: Any, board: HealthBoard, pool: str, stopping: threading.Event) -> None:
        self.pb = pb
        self.board = board
        self.pool = pool
        self.stopping = stopping

    def _response(self, devices: Sequence[DraDevice]) -> Any:
        out = self.pb.NodeWatchResourcesResponse()
        now = int(time.time())
        fields = self.pb.DeviceHealth.DESCRIPTOR.fields_by_name
        for d in devices:
            entry = out.devices.add(device=self.pb.DeviceIdentifier(pool_name=self.pool, device_name=d.name),
                                    health=self.pb.HEALTHY if d.healthy else self.pb.UNHEALTHY,
                                    last_updated_time=now)
            if "health_check_timeout_seconds" in fields:
                entry.health_check_timeout_seconds = HEALTH_TIMEOUT_S
            if "message" in fields and d.reason:
                entry.message = d.reason[:MESSAGE_MAX]
        return out

    def NodeWatchResources(self, request, context):  # noqa: N802
        context.add_callback(self.board.wake)
        version, sent_at = -1, 0.0
        while not self.stopping.is_set() and context.is_active():
            devices, current = self.board.current()
            if current != version or time.monotonic() - sent_at >= self.RESEND_S:
                version, sent_at = current, time.monotonic()
                yield self._response(devices)
            self.board.wait_newer(version, timeout=1.0)


class HealthV1Servicer(_HealthServicer, health_v1_pb2_grpc.DRAResourceHealthServicer):
    pass


class HealthV1alpha1Servicer(_HealthServicer, health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    pass


class KubeletPlugin:
    """The plugin socket (DRA + health services) and the registration socket of one driver."""

    def __init__(self, settings: Any, preparer: Preparer, board: HealthBoard, runner: DeadlineRunner,
                 metrics: Any = None) -> None:
        self.settings = settings
        self.board = board
        self.registered = threading.Event()
        self.registration_error: str | None = None
        self._stopping = threading.Event()
        s = settings

        def add_plugin(server: grpc.Server) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
                DraV1Servicer(dra_v1_pb2, preparer, runner, metrics, s.driver_name), server)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                DraV1beta1Servicer(dra_v1beta1_pb2, preparer, runner, metrics, s.driver_name), server)
            health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthV1Servicer(health_v1_pb2, board, s.node_name, self._stopping), server)
            health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthV1alpha1Servicer(health_v1alpha1_pb2, board, s.node_name, self._stopping), server)

        def add_registration(server: grpc.Server) -> None:
            reg_pb2_grpc.add_RegistrationServicer_to_server(
                RegistrationServicer(PLUGIN_TYPE, s.driver_name, s.kubelet_plugin_socket, SUPPORTED_SERVICES,
                                     self._on_status), server)

        # health streams hold one thread each for their lifetime: room for a few kubelets' streams
        self.plugin = SocketServer(s.plugin_socket, add_plugin, s.rpc_workers + 4, "dra-plugin")
        self.registration = SocketServer(s.registration_socket, add_registration, 2, "dra-registration")

    def _on_status(self, ok: bool, error: str) -> None:
        if ok:
            if not self.registered.is_set():
                logger.info("DRA driver %s registered with the kubelet (plugin socket %s)",
                            self.settings.driver_name, self.settings.kubelet_plugin_socket)
            self.registration_error = None
            self.registered.set()
        else:
            self.registration_error = error
            self.registered.clear()
            logger.error("the kubelet refused DRA driver %s: %s", self.settings.driver_name, error)

    def start(self) -> None:
        self._stopping.clear()
        self.plugin.start()  # serve first: the kubelet dials the plugin socket right after GetInfo
        self.registration.start()
        logger.info("serving DRA driver %s on %s; registration socket %s", self.settings.driver_name,
                    self.settings.plugin_socket, self.settings.registration_socket)

    def check_sockets(self) -> list[str]:
        """Re-create a socket someone deleted (a new registration follows: the watcher sees it again)."""
        restarted = []
        for srv in (self.plugin, self.registration):
            if not srv.socket_ok():
                logger.warning("socket %s is gone: serving it again", srv.path)
                if srv is self.registration:
                    self.registered.clear()
                srv.stop()
                srv.start()
                restarted.append(srv.path)
        return restarted

    def stop(self) -> None:
        self._stopping.set()
        self.board.wake()
        self.registration.stop()
        self.plugin.stop()

    def self_check(self, timeout: float = 1.0) -> str | None:
        """None when the plugin socket answers an empty NodePrepareResources within ``timeout``."""
        if not self.plugin.socket_ok():
            return f"socket {self.plugin.path} missing"
        try:
            with grpc.insecure_channel(f"unix://{self.plugin.path}") as ch:
                dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            return f"NodePrepareResources on {self.plugin.path}: {exc.code().name} {exc.details()}"
        return None

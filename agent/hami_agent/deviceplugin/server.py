"""One gRPC server per kubelet resource, with deadline-bounded unary handlers.

Why handlers run on a separate bounded pool: the kubelet calls GetPreferredAllocation/Allocate inside
pod admission with no deadline and admits pods one at a time (kubelet device manager,
``pkg/kubelet/cm/devicemanager/manager.go``), so a plugin RPC that never returns stalls every pod on the
node (seed 003). Each unary body is submitted to ``DeadlineRunner`` with an ``RpcBudget`` (the RPC's
deadline, passed down to every API call) and the gRPC loop awaits it at most ``rpc_deadline_s``; past it
the kubelet gets DEADLINE_EXCEEDED with a message naming what was pending. Before any error answer the
runner marks the budget answered, so a body still running can no longer commit a success
(``budget.py`` has the rule). ListAndWatch streams run on the socket's own pool threads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from hami_agent import log
from hami_agent.deviceplugin.allocator import AllocationError, Allocator, ContainerResponse, PreferredRequest
from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.api import pluginregistration_pb2_grpc as reg_pb2_grpc
from hami_agent.deviceplugin.budget import RpcBudget
from hami_agent.deviceplugin.devices import ResourcePlan
from hami_agent.deviceplugin.metrics import PluginMetrics
from hami_agent.deviceplugin.settings import API_VERSION, HEALTHY, UNHEALTHY, PluginSettings
from hami_agent.kubeletplugin import DeadlineRunner, RegistrationServicer, SocketServer, run_rpc

logger = logging.getLogger(__name__)
T = TypeVar("T")

# A ListAndWatch stream sleeps this long at most between looks at its plan, its cancel and the server's stop;
# each of those wakes it at once, so this is a safety net, not a reaction time.
STREAM_WAIT_S = 5.0

# Constant on purpose: the kubelet calls this synchronously inside our own Register call.
OPTIONS = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class DeviceState:
    """The devices one resource advertises; ListAndWatch streams wait on it."""

    def __init__(self, plan: ResourcePlan) -> None:
        self._cond = threading.Condition()
        self._plan = plan
        self._version = 0

    @staticmethod
    def _key(plan: ResourcePlan) -> tuple:
        return tuple((d.id, d.healthy, d.numa) for d in plan.devices)

    def update(self, plan: ResourcePlan) -> bool:
        with self._cond:
            changed = self._key(plan) != self._key(self._plan)
            self._plan = plan
            if changed:
                self._version += 1
                self._cond.notify_all()
            return changed

    def current(self) -> tuple[ResourcePlan, int]:
        with self._cond:
            return self._plan, self._version

    def wait_newer(self, version: int, timeout: float, done: Callable[[], bool] = lambda: False) -> None:
        """Sleep until a newer plan, a ``wake()`` or ``timeout``. ``done`` is checked under the lock, so a
        ``wake()`` that follows its change (a stream's cancel, the server's stop) is never missed."""
        with self._cond:
            if self._version == version and not done():
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def to_pb_devices(plan: ResourcePlan, numa: bool) -> list:
    out = []
    for d in plan.devices:
        dev = api_pb2.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
        if numa and d.numa is not None:
            dev.topology.nodes.append(api_pb2.NUMANode(ID=d.numa))
        out.append(dev)
    return out


def to_pb_container_response(r: ContainerResponse) -> Any:
    return api_pb2.ContainerAllocateResponse(
        envs=r.envs,
        mounts=[api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in r.mounts])


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, state: DeviceState, allocator: Allocator, settings: PluginSettings,
                 metrics: PluginMetrics, runner: DeadlineRunner, *, stopping: threading.Event,
                 stream_lost: threading.Event | None = None,
                 on_stream_lost: Callable[[], None] | None = None,
                 on_answer: Callable[[], None] = lambda: None) -> None:
        """``on_answer``: called whenever a unary RPC was answered (whatever its code): proof of life."""
        self.state = state
        self.allocator = allocator
        self.settings = settings
        self.metrics = metrics
        self.runner = runner
        self.stopping = stopping
        self.stream_lost = stream_lost
        self.on_stream_lost = on_stream_lost
        self.on_answer = on_answer

    @property
    def resource(self) -> str:
        return self.state.current()[0].resource_name

    async def _timed(self, method: str, context: grpc.aio.ServicerContext,
                     body: Callable[[RpcBudget], T]) -> T:
        # UNKNOWN is what a Go plugin's plain error becomes, so the kubelet's event text matches HAMi's:
        # "Allocate failed due to rpc error: code = Unknown desc = device number not matched ..."
        def record(seconds: float, code: str) -> None:
            self.on_answer()
            self.metrics.rpc_duration.labels(method, self.resource).observe(seconds)
            if code != "OK":
                self.metrics.rpc_errors.labels(method, self.resource, code).inc()

        return await run_rpc(self.runner, f"{method} for '{self.resource}'", context, body,
                             {AllocationError: grpc.StatusCode.UNKNOWN}, record, log=logger)

    # The unary methods are ``async``: grpc.aio runs them on its loop, which hands a body straight to the
    # runner (never blocking itself); ListAndWatch blocks between updates, so it stays synchronous and
    # runs on the socket's pool (``grpcaio``).
    async def GetDevicePluginOptions(self, request, context):  # noqa: N802 - gRPC method name
        self.on_answer()
        return OPTIONS

    def ListAndWatch(self, request, context):  # noqa: N802
        # The kubelet never reopens a stream that ended: it marks every device Unhealthy and waits for a
        # new Register (kubernetes devicemanager plugin/v1beta1 client.go Run, handler.go runClient). So a
        # stream that ends while this server still serves -- the kubelet dropped it, or disconnected this
        # registration because an older stream of ours ended late (kubernetes #121994) -- is reported to
        # the manager through ``stream_lost``, which registers again.
        cancelled = threading.Event()

        def on_done() -> None:  # notice the kubelet's cancel at once, not at the next timeout
            cancelled.set()
            self.state.wake()

        def done() -> bool:
            return cancelled.is_set() or self.stopping.is_set()

        context.add_callback(on_done)
        version = -1
        try:
            while not self.stopping.is_set() and context.is_active():
                plan, current = self.state.current()
                if current != version:
                    version = current
                    healthy = sum(1 for d in plan.devices if d.healthy)
                    log.v(logger, 4, "ListAndWatch '%s': %d devices (%d healthy)", plan.resource_name,
                          len(plan.devices), healthy)
                    devices = to_pb_devices(plan, self.settings.enable_numa_topology)
                    yield api_pb2.ListAndWatchResponse(devices=devices)
                # a safety net only: every reason to look again wakes the wait (issue 31: was 0.5 s)
                self.state.wait_newer(version, timeout=STREAM_WAIT_S, done=done)
        finally:
            if not self.stopping.is_set() and self.stream_lost is not None:
                self.stream_lost.set()
                if self.on_stream_lost is not None:
                    self.on_stream_lost()

    async def GetPreferredAllocation(self, request, context):  # noqa: N802
        reqs = [PreferredRequest(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs),
                                 r.allocation_size) for r in request.container_requests]

        def body(budget: RpcBudget):
            plan = self.state.current()[0]
            chosen = self.allocator.preferred(plan, reqs, budget)
            log.v(logger, 4, "GetPreferredAllocation '%s': %s", plan.resource_name, chosen)
            return api_pb2.PreferredAllocationResponse(container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen])

        return await self._timed("GetPreferredAllocation", context, body)

    async def Allocate(self, request, context):  # noqa: N802
        reqs = [list(r.devices_ids) for r in request.container_requests]

        def body(budget: RpcBudget):
            plan = self.state.current()[0]
            try:
                # the allocator commits its success write through the budget and returns what the
                # commit stored: building the gRPC answer below cannot fail after the write
                responses = self.allocator.allocate(plan, reqs, budget)
            except AllocationError:
                self.metrics.allocations.labels(plan.resource_name, "failed").inc()
                raise
            self.metrics.allocations.labels(plan.resource_name, "success").inc()
            log.v(logger, 4, "Allocate '%s' %s -> %s", plan.resource_name, reqs,
                  [r.envs.get("NVIDIA_VISIBLE_DEVICES") for r in responses])
            return responses

        responses = await self._timed("Allocate", context, body)
        return api_pb2.AllocateResponse(container_responses=[to_pb_container_response(r) for r in responses])

    async def PreStartContainer(self, request, context):  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """Serves one resource on ``<device-plugin-dir>/<endpoint>`` (and, with the plugin watcher, its
    registration socket in ``plugins_registry/``): ``kubeletplugin.SocketServer`` each."""

    def __init__(self, state: DeviceState, allocator: Allocator, settings: PluginSettings,
                 metrics: PluginMetrics, runner: DeadlineRunner,
                 on_stream_lost: Callable[[], None] | None = None) -> None:
        """``on_stream_lost``: called (from the stream's thread) after ``stream_lost`` is set."""
        self.state = state
        self.on_stream_lost = on_stream_lost
        self.allocator = allocator
        self.settings = settings
        self.metrics = metrics
        self.runner = runner
        plan = state.current()[0]
        self.resource = plan.resource_name
        self.endpoint = plan.endpoint
        self.path = os.path.join(settings.device_plugin_dir, plan.endpoint)
        self.registry_path = os.path.join(settings.plugins_registry_dir,
                                          plan.endpoint.removesuffix(".sock") + "-reg.sock")
        self._stopping = threading.Event()
        self._probe: grpc.Channel | None = None  # self_check's channel to our own socket
        self._probe_lock = threading.Lock()
        # time.monotonic() of the last unary RPC this server answered (the kubelet's or our probe's)
        self.answered_at = 0.0
        self.watcher_registered = threading.Event()
        # set when a ListAndWatch stream ends while this server still serves (the manager registers again)
        self.stream_lost = threading.Event()
        # ListAndWatch holds one thread per stream; unary calls only wait on the runner
        self._plugin = SocketServer(self.path, self._add_plugin, settings.rpc_workers,
                                    f"grpc-{self.endpoint}")
        self._registration = (
            SocketServer(self.registry_path, self._add_registration, 2, f"reg-{self.endpoint}")
            if settings.registration_mode == "plugin-watcher" else None)

    def _add_plugin(self, server: grpc.Server) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            DevicePluginServicer(self.state, self.allocator, self.settings, self.metrics, self.runner,
                                 stopping=self._stopping, stream_lost=self.stream_lost,
                                 on_stream_lost=self.on_stream_lost, on_answer=self._answered), server)

    def _answered(self) -> None:
        self.answered_at = time.monotonic()

    def quiet_for(self, now: float) -> float:
        """Seconds since this server last answered a unary RPC (anyone's)."""
        return now - self.answered_at

    def _add_registration(self, server: grpc.Server) -> None:
        def on_status(ok: bool, error: str) -> None:
            if ok:
                logger.info("Registered device plugin for '%s' with Kubelet", self.resource)
                self.metrics.registrations.labels(self.resource).inc()
                self.watcher_registered.set()
            else:
                logger.error("kubelet rejected plugin-watcher registration of '%s': %s", self.resource, error)

        reg_pb2_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer("DevicePlugin", self.resource, self.path, [API_VERSION], on_status), server)

    def start(self) -> None:
        logger.info("Starting GRPC server for '%s'", self.resource)
        self._stopping = threading.Event()
        self._plugin.start()  # serve first: the kubelet dials the endpoint right after registration
        if self._registration is not None:
            self._registration.start()
        logger.info("Starting to serve '%s' on %s", self.resource, self.path)

    def socket_ok(self) -> bool:
        """False when our socket file is gone or replaced (the kubelet wipes the dir on restart)."""
        return self._plugin.socket_ok()

    def stop(self, grace: float = 0.5) -> None:
        self._stopping.set()
        self.state.wake()
        if self._registration is not None:
            self._registration.stop(grace)
        self._plugin.stop(grace)  # removes the socket only if it is still ours (never a newer instance's)
        self._close_probe()

    def self_check(self, timeout: float = 1.0) -> str | None:
        """None when the server answers GetDevicePluginOptions over its socket within ``timeout``."""
        if not self.socket_ok():
            return f"socket {self.path} missing"
        with self._probe_lock:
            if self._probe is None:
                # one channel for the server's life: a new one per check cost ~1 ms of CPU every 5 s per
                # resource, most of an idle node's cost (issue 31)
                self._probe = grpc.insecure_channel(f"unix://{self.path}")
            stub = api_pb2_grpc.DevicePluginStub(self._probe)
        try:
            stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout)
        except grpc.RpcError as exc:
            return f"GetDevicePluginOptions on {self.path}: {exc.code().name} {exc.details()}"
        return None

    def _close_probe(self) -> None:
        with self._probe_lock:
            probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()

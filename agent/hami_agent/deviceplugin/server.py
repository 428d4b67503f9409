"""One gRPC server per kubelet resource, with deadline-bounded unary handlers.

Why handlers run on a separate bounded pool: the kubelet calls GetPreferredAllocation/Allocate inside
pod admission with no deadline and admits pods one at a time (kubelet device manager,
``pkg/kubelet/cm/devicemanager/manager.go``), so a plugin RPC that never returns stalls every pod on the
node (seed 003). Each unary body is submitted to ``DeadlineRunner`` with an ``RpcBudget`` (the RPC's
deadline, passed down to every API call) and the gRPC thread waits at most ``rpc_deadline_s``; past it
the kubelet gets DEADLINE_EXCEEDED with a message naming what was pending. Before any error answer the
runner marks the budget answered, so a body still running can no longer commit a success
(``budget.py`` has the rule). ListAndWatch streams run on the gRPC server's own threads.
"""

from __future__ import annotations

import concurrent.futures as cf
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
from hami_agent.deviceplugin.api import pluginregistration_pb2 as reg_pb2
from hami_agent.deviceplugin.api import pluginregistration_pb2_grpc as reg_pb2_grpc
from hami_agent.deviceplugin.budget import RpcBudget
from hami_agent.deviceplugin.devices import ResourcePlan
from hami_agent.deviceplugin.metrics import PluginMetrics
from hami_agent.deviceplugin.settings import API_VERSION, HEALTHY, UNHEALTHY, PluginSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Constant on purpose: the kubelet calls this synchronously inside our own Register call.
OPTIONS = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class DeadlineExceeded(RuntimeError):
    pass


class DeadlineRunner:
    """Runs RPC bodies on a bounded pool, each with its own ``RpcBudget``; callers wait at most
    ``deadline_s``. The body is ``fn(budget)``; its success must go through ``budget.commit`` when it
    writes anything (Allocate), or simply be returned (read-only bodies)."""

    def __init__(self, workers: int, deadline_s: float, *, reply_margin_s: float = 0.1,
                 commit_margin_s: float = 0.25, api_timeout_s: float | None = None) -> None:
        self.deadline_s = deadline_s
        self.reply_margin_s = reply_margin_s
        self.commit_margin_s = commit_margin_s
        self.api_timeout_s = api_timeout_s
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc-body")

    def budget(self, what: str) -> RpcBudget:
        return RpcBudget(what, self.deadline_s, reply_margin_s=self.reply_margin_s,
                         commit_margin_s=self.commit_margin_s, api_timeout_s=self.api_timeout_s)

    def run(self, fn: Callable[[RpcBudget], T], what: str) -> T:
        budget: RpcBudget[T] = self.budget(what)
        fut = self._pool.submit(fn, budget)
        try:
            return fut.result(timeout=max(0.0, budget.remaining()))
        except cf.TimeoutError:
            committed, result = budget.answer_error()
            if committed:  # the success write won the race: it is the truth, answer it
                log.v(logger, 3, "%s committed at its deadline; answering the committed success", what)
                return result  # type: ignore[return-value]
            fut.cancel()  # no effect once running; a queued body is dropped
            raise DeadlineExceeded(f"{what} did not finish within the {self.deadline_s:g}s deadline; failing "
                                   "fast instead of blocking the kubelet (see hami-agent device-plugin logs)"
                                   ) from None
        except BaseException:
            committed, result = budget.answer_error()
            if committed:  # only a bug after the commit can get here; the success was written
                logger.exception("%s raised after its success was committed; answering the success", what)
                return result  # type: ignore[return-value]
            raise

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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

    def wait_newer(self, version: int, timeout: float) -> None:
        with self._cond:
            if self._version == version:
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
                 stream_lost: threading.Event | None = None) -> None:
        self.state = state
        self.allocator = allocator
        self.settings = settings
        self.metrics = metrics
        self.runner = runner
        self.stopping = stopping
        self.stream_lost = stream_lost

    @property
    def resource(self) -> str:
        return self.state.current()[0].resource_name

    def _timed(self, method: str, context: grpc.ServicerContext, body: Callable[[RpcBudget], T]) -> T:
        start = time.perf_counter()
        code = "OK"
        try:
            return self.runner.run(body, f"{method} for '{self.resource}'")
        except DeadlineExceeded as exc:
            code = "DEADLINE_EXCEEDED"
            logger.error("%s", exc)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except AllocationError as exc:
            # UNKNOWN is what a Go plugin's plain error becomes, so the kubelet's event text matches HAMi's:
            # "Allocate failed due to rpc error: code = Unknown desc = device number not matched ..."
            code = "UNKNOWN"
            logger.error("%s", exc)
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        except Exception as exc:  # a bug must not hang or kill the server: report it to the kubelet
            code = "INTERNAL"
            logger.exception("%s for '%s' failed unexpectedly", method, self.resource)
            context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {type(exc).__name__}: {exc}")
        finally:
            self.metrics.rpc_duration.labels(method, self.resource).observe(time.perf_counter() - start)
            if code != "OK":
                self.metrics.rpc_errors.labels(method, self.resource, code).inc()
        raise AssertionError("unreachable")  # context.abort raises

    def GetDevicePluginOptions(self, request, context):  # noqa: N802 - gRPC method name
        return OPTIONS

    def ListAndWatch(self, request, context):  # noqa: N802
        # The kubelet never reopens a stream that ended: it marks every device Unhealthy and waits for a
        # new Register (kubernetes devicemanager plugin/v1beta1 client.go Run, handler.go runClient). So a
        # stream that ends while this server still serves -- the kubelet dropped it, or disconnected this
        # registration because an older stream of ours ended late (kubernetes #121994) -- is reported to
        # the manager through ``stream_lost``, which registers again.
        context.add_callback(self.state.wake)  # notice the kubelet's cancel at once, not at the next tick
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
                self.state.wait_newer(version, timeout=0.5)
        finally:
            if not self.stopping.is_set() and self.stream_lost is not None:
                self.stream_lost.set()

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        reqs = [PreferredRequest(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs),
                                 r.allocation_size) for r in request.container_requests]

        def body(budget: RpcBudget):
            plan = self.state.current()[0]
            chosen = self.allocator.preferred(plan, reqs, budget)
            log.v(logger, 4, "GetPreferredAllocation '%s': %s", plan.resource_name, chosen)
            return api_pb2.PreferredAllocationResponse(container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen])

        return self._timed("GetPreferredAllocation", context, body)

    def Allocate(self, request, context):  # noqa: N802
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

        responses = self._timed("Allocate", context, body)
        return api_pb2.AllocateResponse(container_responses=[to_pb_container_response(r) for r in responses])

    def PreStartContainer(self, request, context):  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class PluginWatcherServicer(reg_pb2_grpc.RegistrationServicer):
    """Optional plugin-watcher registration (kubelet discovers our socket in plugins_registry/)."""

    def __init__(self, resource: str, endpoint_path: str, on_status: Callable[[bool, str], None]) -> None:
        self.resource = resource
        self.endpoint_path = endpoint_path
        self.on_status = on_status

    def GetInfo(self, request, context):  # noqa: N802
        return reg_pb2.PluginInfo(type="DevicePlugin", name=self.resource, endpoint=self.endpoint_path,
                                  supported_versions=[API_VERSION])

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        self.on_status(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()


class PluginServer:
    """Serves one resource on ``<device-plugin-dir>/<endpoint>``."""

    def __init__(self, state: DeviceState, allocator: Allocator, settings: PluginSettings,
                 metrics: PluginMetrics, runner: DeadlineRunner) -> None:
        self.state = state
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
        self._server: grpc.Server | None = None
        self._executor: cf.ThreadPoolExecutor | None = None
        self._stopping = threading.Event()
        self._inode: tuple[int, int] | None = None
        self.watcher_registered = threading.Event()
        # set when a ListAndWatch stream ends while this server still serves (the manager registers again)
        self.stream_lost = threading.Event()

    @staticmethod
    def _ident(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def start(self) -> None:
        logger.info("Starting GRPC server for '%s'", self.resource)
        os.makedirs(self.settings.device_plugin_dir, exist_ok=True)
        if os.path.lexists(self.path):
            os.unlink(self.path)  # stale socket from a previous run
        self._stopping = threading.Event()
        # ListAndWatch holds one thread per stream; unary calls only wait on the runner.
        # grpc does not shut down an executor it was given: keep it to release its threads in stop()
        self._executor = cf.ThreadPoolExecutor(max_workers=self.settings.rpc_workers,
                                               thread_name_prefix=f"grpc-{self.endpoint}")
        server = grpc.server(self._executor)
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            DevicePluginServicer(self.state, self.allocator, self.settings, self.metrics, self.runner,
                                 stopping=self._stopping, stream_lost=self.stream_lost), server)
        server.add_insecure_port(f"unix://{self.path}")
        if self.settings.registration_mode == "plugin-watcher":
            def on_status(ok: bool, error: str) -> None:
                if ok:
                    logger.info("Registered device plugin for '%s' with Kubelet", self.resource)
                    self.metrics.registrations.labels(self.resource).inc()
                    self.watcher_registered.set()
                else:
                    logger.error("kubelet rejected plugin-watcher registration of '%s': %s",
                                 self.resource, error)

            reg_pb2_grpc.add_RegistrationServicer_to_server(
                PluginWatcherServicer(self.resource, self.path, on_status), server)
            os.makedirs(self.settings.plugins_registry_dir, exist_ok=True)
            if os.path.lexists(self.registry_path):
                os.unlink(self.registry_path)
            server.add_insecure_port(f"unix://{self.registry_path}")
        server.start()
        self._server = server
        self._inode = self._ident(self.path)
        if self._inode is None:
            server.stop(0)
            self._server = None
            raise OSError(f"GRPC server for '{self.resource}' did not create its socket {self.path}")
        logger.info("Starting to serve '%s' on %s", self.resource, self.path)

    def socket_ok(self) -> bool:
        """False when our socket file is gone or replaced (the kubelet wipes the dir on restart)."""
        return self._server is not None and self._inode is not None and self._ident(self.path) == self._inode

    def stop(self, grace: float = 0.5) -> None:
        self._stopping.set()
        self.state.wake()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 1.0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        # remove the socket only if it is still ours (never a newer instance's)
        if self._inode is not None and self._ident(self.path) == self._inode:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        if self.settings.registration_mode == "plugin-watcher" and os.path.lexists(self.registry_path):
            try:
                os.unlink(self.registry_path)
            except OSError:
                pass
        self._inode = None

    def self_check(self, timeout: float = 1.0) -> str | None:
        """None when the server answers GetDevicePluginOptions over its socket within ``timeout``."""
        if not self.socket_ok():
            return f"socket {self.path} missing"
        try:
            with grpc.insecure_channel(f"unix://{self.path}") as ch:
                api_pb2_grpc.DevicePluginStub(ch).GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout)
        except grpc.RpcError as exc:
            return f"GetDevicePluginOptions on {self.path}: {exc.code().name} {exc.details()}"
        return None

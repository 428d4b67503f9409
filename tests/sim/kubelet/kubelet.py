"""``SimulatedKubelet``: one node's kubelet as a device plugin sees it, across restarts.

It owns what survives a kubelet restart (the plugin directory with the checkpoint, the pods the API server
still binds here, the containers the runtime keeps running, the log) and, per kubelet *process*, a
``DeviceManager`` and a ``RegistrationServer``. ``restart()`` is ``systemctl restart kubelet``: the old
process's connections all drop, the new one reads the checkpoint, wipes the sockets (plugins must register
again) and serves ``kubelet.sock``.

Pod admission runs in ONE thread, pod after pod, container after container (init containers first), as
the kubelet's ``syncLoop`` admits pods -- so a plugin RPC that never returns stalls every later pod.
A rejected pod gets ``UnexpectedAdmissionError`` / "Allocate failed due to <err>, which is unexpected"
(kubernetes ``pkg/kubelet/cm/admission/errors.go``) and stops being active, which frees its devices at
the next ``UpdateAllocatedDevices``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from tests.sim.kubelet.checkpoint import CHECKPOINT_FILE
from tests.sim.kubelet.devicemanager import AllocationError, DeviceManager
from tests.sim.kubelet.endpoint import ENDPOINT_STOP_GRACE_PERIOD_S
from tests.sim.kubelet.klog import KlogWriter
from tests.sim.kubelet.registration import DIAL_TIMEOUT_S, SUPPORTED_VERSIONS, RegistrationServer

REASON_UNEXPECTED = "UnexpectedAdmissionError"


@dataclass
class AdmissionResult:
    pod: str
    uid: str
    admitted: bool
    reason: str = ""
    message: str = ""
    # container name -> resource -> {"devices": [...], "envs": {...}, "mounts": [...]}
    allocations: dict[str, dict[str, dict]] = field(default_factory=dict)
    duration_s: float = 0.0
    dra: dict[str, list[str]] = field(default_factory=dict)  # container -> CDI device IDs (DRA claims)


@dataclass(frozen=True)
class EndpointView:
    """A read-only look at one resource's endpoint (for tests and the node simulator)."""

    resource: str
    socket: str
    options: Any
    devices: dict[str, str]  # ID -> Healthy/Unhealthy, as the device manager counts them
    topology: dict[str, list[int]]
    connected: bool
    updates: int


class SimulatedKubelet:
    def __init__(
        self,
        root: str,
        verbosity: int = 4,
        stream: TextIO | None = None,
        *,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        node_name: str = "sim-node",
        supported_versions: tuple[str, ...] = SUPPORTED_VERSIONS,
        endpoint_stop_grace_period_s: float = ENDPOINT_STOP_GRACE_PERIOD_S,
        sources_ready_delay_s: float = 0.0,
        stream_end_delay_s: float = 0.0,
        seed: int = 0,
        dra_client: Any = None,
        dra_root: str | None = None,
        dra_options: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.node_name = node_name
        self.log = KlogWriter(verbosity, stream)
        self.dial_timeout_s = dial_timeout_s
        self.supported_versions = supported_versions
        self.endpoint_stop_grace_period_s = endpoint_stop_grace_period_s
        self.sources_ready_delay_s = sources_ready_delay_s
        self.stream_end_delay_s = stream_end_delay_s
        self.rng = random.Random(seed)
        self.registrations: list[str] = []  # every successful Register, across restarts
        self.results: list[AdmissionResult] = []
        self.current_pod: str | None = None  # pod being admitted (to see a stall)
        self.on_result: Callable[[AdmissionResult], None] | None = None
        self.checkpoint_error: str | None = None  # what the last start logged about the checkpoint
        self._pods_lock = threading.Lock()
        self._active: set[str] = set()  # pods the API server binds here (admitted or being admitted)
        self._running: set[str] = set()  # pods whose containers the runtime runs (survive restarts)
        self._queue: queue.Queue = queue.Queue()
        self._admitter: threading.Thread | None = None
        self._started_at = 0.0
        self._dm: DeviceManager | None = None
        self._reg: RegistrationServer | None = None
        # DRA (tests/sim/kubelet/dra.py): enabled by an API client; <dra_root>/plugins_registry is watched
        self.dra_client = dra_client
        self.dra_root = dra_root or root
        self.dra_options = dict(dra_options or {})
        self.dra: Any = None
        self._dra_pods: dict[str, dict] = {}  # uid -> running pod with claims (re-prepared after a restart)

    # ---------------------------------------------------------------------------------- lifecycle
    @property
    def socket_path(self) -> str:
        return os.path.join(self.root, "kubelet.sock")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.root, CHECKPOINT_FILE)

    @property
    def device_manager(self) -> DeviceManager:
        assert self._dm is not None, "the simulated kubelet was never started"
        return self._dm

    def start(self) -> SimulatedKubelet:
        os.makedirs(self.root, exist_ok=True)
        self._started_at = time.monotonic()
        dm = DeviceManager(
            self.root,
            self.log,
            rng=self.rng,
            active_pods=self._active_pods,
            sources_ready=self._sources_ready,
            container_running=self._container_running,
            grace_period_s=self.endpoint_stop_grace_period_s,
        )
        self.log.log(2, "manager.go:260", "Starting Device Plugin manager")
        self.checkpoint_error = dm.read_checkpoint()
        if self.checkpoint_error:
            self.log.error_s(
                "manager.go:266",
                "Continue after failing to read checkpoint file. Device allocation "
                "info may NOT be up-to-date",
                self.checkpoint_error,
            )
        reg = RegistrationServer(
            self.root,
            dm,
            self.log,
            supported_versions=self.supported_versions,
            dial_timeout_s=self.dial_timeout_s,
            stream_end_delay_s=self.stream_end_delay_s,
        )
        reg.registrations = self.registrations  # counted across restarts
        reg.start()
        self._dm, self._reg = dm, reg
        if self.dra_client is not None:
            from tests.sim.kubelet.dra import DraManager

            self.dra = DraManager(self.dra_root, self.dra_client, self.node_name, self.log,
                                  **self.dra_options)
            self.dra.start()
            self.dra.resync(list(self._dra_pods.values()))
        if self._admitter is None or not self._admitter.is_alive():
            self._admitter = threading.Thread(target=self._admit_loop, name="sim-kubelet-admit", daemon=True)
            self._admitter.start()
        return self

    def stop(self) -> list[threading.Thread]:
        """The kubelet process exits (connections drop; the checkpoint stays on disk)."""
        reg = self._reg
        if reg is None:
            return []
        closers = reg.kill()
        if self.dra is not None:
            self.dra.stop()
        if self._dm is not None:
            with self._dm.cond:
                self._dm.cond.notify_all()
        return closers

    def close(self) -> None:
        for closer in self.stop():
            closer.join(2.0)
        self._queue.put(None)

    def restart(self) -> None:
        """``systemctl restart kubelet``: new process, sockets wiped, plugins must register again."""
        self.log.log(0, "kubelet.go:1500", "Restarting (simulated)")
        self.stop()
        self.start()

    def __enter__(self) -> SimulatedKubelet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def drop_stream(self, resource: str) -> bool:
        """Fault: the kubelet's connection to ``resource``'s plugin breaks (its ListAndWatch ends)."""
        return self._reg is not None and self._reg.drop_stream(resource)

    # ---------------------------------------------------------------------------------- queries
    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not predicate():
            left = end - time.monotonic()
            if left <= 0:
                return False
            dm = self._dm
            if dm is None:
                time.sleep(min(left, 0.05))
                continue
            with dm.cond:
                dm.cond.wait(min(left, 0.05))
        return True

    def devices(self, resource: str) -> dict[str, str]:
        dm = self.device_manager
        with dm.cond:
            out = dict.fromkeys(dm.unhealthy.get(resource, ()), "Unhealthy")
            out.update(dict.fromkeys(dm.healthy.get(resource, ()), "Healthy"))
            return out

    def capacity(self, resource: str) -> int:
        return self.device_manager.get_capacity()[0].get(resource, 0)

    def allocatable(self, resource: str) -> int:
        return self.device_manager.get_capacity()[1].get(resource, 0)

    @property
    def known_resources(self) -> set[str]:
        dm = self.device_manager
        with dm.cond:
            return set(dm.healthy) | set(dm.unhealthy)

    @property
    def endpoints(self) -> dict[str, EndpointView]:
        dm = self.device_manager
        with dm.cond:
            out = {}
            for res, info in dm.endpoints.items():
                devices = dict.fromkeys(dm.unhealthy.get(res, ()), "Unhealthy")
                devices.update(dict.fromkeys(dm.healthy.get(res, ()), "Healthy"))
                topo = {i: [n.ID for n in d.topology.nodes] for i, d in dm.all_devices.get(res, {}).items()}
                out[res] = EndpointView(
                    res, info.e.socket, info.opts, devices, topo, not info.e.is_stopped(), info.updates
                )
            return out

    def holds(self, uid: str) -> bool:
        """True while the device manager keeps devices for pod ``uid``."""
        dm = self.device_manager
        with dm.cond:
            return dm.pod_devices.has_pod(uid)

    def wait_registered(self, resource: str, timeout: float, min_devices: int = 0, after: int = 0) -> bool:
        """True once ``resource`` registered (more than ``after`` times in all), its endpoint is live and
        its stream has delivered a list of at least ``min_devices`` devices."""

        def ok() -> bool:
            if self.registrations.count(resource) <= after:
                return False
            view = self.endpoints.get(resource)
            return (
                view is not None and view.connected and view.updates > 0 and len(view.devices) >= min_devices
            )

        return self.wait_for(ok, timeout)

    # ---------------------------------------------------------------------------------- pods
    def _active_pods(self) -> set[str]:
        with self._pods_lock:
            return set(self._active)

    def _container_running(self, uid: str, container: str) -> bool:
        with self._pods_lock:
            return uid in self._running

    def _sources_ready(self) -> bool:
        return time.monotonic() - self._started_at >= self.sources_ready_delay_s

    def submit(self, pod: dict) -> cf.Future:
        fut: cf.Future = cf.Future()
        self._queue.put((pod, fut))
        return fut

    def admit(self, pod: dict, timeout: float | None = None) -> AdmissionResult | None:
        """Admit ``pod`` through the single admission thread; None if still pending after ``timeout``
        (the kubelet itself never gives up: the pod stays in admission)."""
        fut = self.submit(pod)
        try:
            return fut.result(timeout=timeout)
        except cf.TimeoutError:
            return None

    def release(self, uid: str) -> None:
        """The pod is gone (deleted, or finished): its devices are freed."""
        with self._pods_lock:
            self._active.discard(uid)
            self._running.discard(uid)
            self._dra_pods.pop(uid, None)
        if self._dm is not None:
            self._dm.update_allocated_devices()
        if self.dra is not None:
            self.dra.unprepare_pod(uid)  # PrepareFailed propagates: the real kubelet retries the teardown

    def _admit_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            pod, fut = item
            try:
                result = self._admit_one(pod)
            except Exception as exc:  # the simulator must not die on a bad test pod
                md = pod.get("metadata", {})
                result = AdmissionResult(
                    f"{md.get('namespace', 'default')}/{md.get('name')}",
                    md.get("uid", ""),
                    False,
                    REASON_UNEXPECTED,
                    f"simulator error: {exc!r}",
                )
            self.results.append(result)
            if self.on_result:
                self.on_result(result)
            fut.set_result(result)

    def _admit_one(self, pod: dict) -> AdmissionResult:
        md = pod.get("metadata", {})
        key = f"{md.get('namespace', 'default')}/{md.get('name')}"
        uid = md.get("uid", "")
        start = time.monotonic()
        dm = self.device_manager
        with self._pods_lock:
            self._active.add(uid)  # the pod manager has the pod before admission runs
        self.current_pod = key
        self.log.log(2, "kubelet.go:2343", "SyncLoop ADD", source="api", pods=[key])
        self.log.log(4, "topology_manager.go:212", "Topology Admit Handler")
        spec = pod.get("spec", {})
        containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
        result = AdmissionResult(key, uid, True)
        try:
            for ctr in containers:
                try:
                    dm.allocate(pod, ctr)
                except AllocationError as exc:
                    return self._reject(result, start, f"Allocate failed due to {exc}, which is unexpected")
            result.allocations = self._allocations(dm, uid, containers)
            if self.dra is not None and spec.get("resourceClaims"):
                from tests.sim.kubelet.dra import PrepareFailed

                try:  # before the containers start (kubelet SyncPod -> PrepareDynamicResources)
                    result.dra = self.dra.prepare(pod)
                except PrepareFailed as exc:
                    rejected = self._reject(result, start, str(exc))
                    rejected.reason = "FailedPrepareDynamicResources"
                    return rejected
                with self._pods_lock:
                    self._dra_pods[uid] = pod
        finally:
            self.current_pod = None
        with self._pods_lock:
            self._running.add(uid)
        result.duration_s = time.monotonic() - start
        self.log.log(2, "kubelet.go:2380", "Pod admitted", pod=key, podUID=uid)
        return result

    @staticmethod
    def _allocations(dm: DeviceManager, uid: str, containers: list[dict]) -> dict[str, dict[str, dict]]:
        out: dict[str, dict[str, dict]] = {}
        with dm.cond:
            for ctr in containers:
                for res, info in dm.pod_devices.container_resources(uid, ctr.get("name", "")).items():
                    resp = info.alloc_resp
                    out.setdefault(ctr.get("name", ""), {})[res] = {
                        "devices": sorted(info.device_ids),
                        "envs": dict(resp.envs) if resp is not None else {},
                        "mounts": [
                            {
                                "containerPath": m.container_path,
                                "hostPath": m.host_path,
                                "readOnly": m.read_only,
                            }
                            for m in (resp.mounts if resp is not None else [])
                        ],
                    }
        return out

    def _reject(self, result: AdmissionResult, start: float, message: str) -> AdmissionResult:
        result.admitted = False
        result.reason = REASON_UNEXPECTED
        result.message = message
        result.duration_s = time.monotonic() - start
        with self._pods_lock:
            self._active.discard(result.uid)  # the pod is Failed: no longer active
        self.log.log(
            0,
            "kubelet.go:2395",
            "Pod admission failed",
            pod=result.pod,
            reason=result.reason,
            message=message,
            severity="W",
        )
        return result

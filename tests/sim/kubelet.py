"""SIMULATED kubelet device manager (device plugin API v1beta1) for tests and the demo.

This is not the kubelet. It reproduces the parts of the kubelet's device manager that a device plugin
can observe, following reference/kubelet-nvidia.md §1.4-1.5 and §2:

- ``Registration`` server on ``<root>/kubelet.sock``; on start it wipes the sockets in ``<root>`` (keeping
  ``kubelet_internal_checkpoint``), exactly what makes real plugins re-register after a kubelet restart;
- ``Register``: checks the version and resource name, then *synchronously* dials the plugin (10 s),
  calls ``GetDevicePluginOptions`` (no deadline) and opens ``ListAndWatch`` (no deadline) in a thread;
  a re-registration replaces the previous endpoint; a closed stream marks the resource Unhealthy;
- pod admission in ONE thread, container by container (init containers first): pick healthy free
  devices, ``GetPreferredAllocation`` when the plugin offers it, then ``Allocate`` -- with **no deadline**,
  like the real device manager, so a plugin that never answers stalls every later pod (seed 003);
- klog-format log lines at the kubelet's levels, including the two lines seed 003 is about:
  ``"Issuing a GetPreferredAllocation call for container" containerName=... podUID=...`` (V4) and
  ``"Making allocation request for device plugin" devices=[...] resourceName=...`` (V3).

Library use: ``SimulatedKubelet(root).start()``, ``submit(pod)``/``admit(pod, timeout)``, ``restart()``.
Process use: ``python -m tests.sim.kubelet --root DIR [-v 4] [--pods pods.json]``
(``--kubeconfig K --node-name N`` also admits pods bound to N on that API server).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import queue
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import grpc

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc

SUPPORTED_VERSIONS = ("v1beta1",)
CHECKPOINT = "kubelet_internal_checkpoint"
KUBELET_SOCKET = "kubelet.sock"


# ------------------------------------------------------------------------------------------ logging
def _fmt_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(str(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


class KlogWriter:
    """Writes klog structured lines (``I1121 10:30:15.123456   1234 manager.go:956] "msg" k="v"``)."""

    def __init__(self, verbosity: int = 4, stream: TextIO | None = None) -> None:
        self.verbosity = verbosity
        self.stream = stream
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def log(self, level: int, where: str, msg: str, severity: str = "I", **kv: Any) -> None:
        if level > self.verbosity:
            return
        now = time.time()
        t = time.localtime(now)
        header = "%s%02d%02d %02d:%02d:%02d.%06d %7d %s] " % (
            severity,
            t.tm_mon,
            t.tm_mday,
            t.tm_hour,
            t.tm_min,
            t.tm_sec,
            int((now % 1) * 1e6),
            os.getpid(),
            where,
        )
        line = header + json.dumps(msg) + "".join(f" {k}={_fmt_value(v)}" for k, v in kv.items())
        with self._lock:
            self.lines.append(line)
            if self.stream is not None:
                self.stream.write(line + "\n")
                self.stream.flush()

    def grep(self, text: str) -> list[str]:
        with self._lock:
            return [ln for ln in self.lines if text in ln]


# ------------------------------------------------------------------------------------------ model
@dataclass
class Endpoint:
    resource: str
    socket: str
    channel: grpc.Channel
    stub: Any
    options: Any
    devices: dict[str, str] = field(default_factory=dict)  # id -> Healthy/Unhealthy
    topology: dict[str, list[int]] = field(default_factory=dict)
    connected: bool = True
    updates: int = 0


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


def _rpc_error_text(exc: Exception) -> str:
    """Go's status error text, as it appears in kubelet events."""
    if not isinstance(exc, grpc.RpcError) or not hasattr(exc, "code"):
        return str(exc)
    code = exc.code()
    name = "".join(p.capitalize() for p in code.name.split("_")) if code else "Unknown"
    return f"rpc error: code = {name} desc = {exc.details()}"


def is_extended_resource_name(name: str) -> bool:
    if "/" not in name:
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io")) and not name.startswith(
        "requests."
    )


class SimulatedKubelet(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        root: str,
        verbosity: int = 4,
        stream: TextIO | None = None,
        *,
        dial_timeout_s: float = 10.0,
        node_name: str = "sim-node",
        supported_versions: tuple[str, ...] = SUPPORTED_VERSIONS,
    ) -> None:
        self.root = root
        self.supported_versions = supported_versions
        self.node_name = node_name
        self.log = KlogWriter(verbosity, stream)
        self.dial_timeout_s = dial_timeout_s
        self.endpoints: dict[str, Endpoint] = {}
        self.allocated: dict[str, dict[str, set[str]]] = {}  # pod uid -> resource -> device IDs
        self.registrations: list[str] = []  # resource names, in order of successful Register calls
        # resources ever registered: like the kubelet's checkpoint, they survive restart(), so a pod that
        # needs one before its plugin re-registers is rejected instead of admitted without devices
        self.known_resources: set[str] = set()
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._queue: queue.Queue = queue.Queue()
        self._admitter: threading.Thread | None = None
        self.results: list[AdmissionResult] = []
        self.current_pod: str | None = None  # pod being admitted (to see a stall)
        self.on_result: Callable[[AdmissionResult], None] | None = None

    # ---------------------------------------------------------------------------------- lifecycle
    @property
    def socket_path(self) -> str:
        return os.path.join(self.root, KUBELET_SOCKET)

    def _cleanup_plugin_dir(self) -> None:
        """CleanupPluginDirectory: remove every socket except the checkpoint file."""
        os.makedirs(self.root, exist_ok=True)
        for name in os.listdir(self.root):
            if name == CHECKPOINT:
                continue
            path = os.path.join(self.root, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except FileNotFoundError:
                pass

    def start(self) -> SimulatedKubelet:
        self._cleanup_plugin_dir()
        server = grpc.server(cf.ThreadPoolExecutor(max_workers=8, thread_name_prefix="sim-kubelet"))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        self.log.log(
            2, "server.go:110", "Starting device plugin registration server", socket=self.socket_path
        )
        if self._admitter is None or not self._admitter.is_alive():
            self._admitter = threading.Thread(target=self._admit_loop, name="sim-kubelet-admit", daemon=True)
            self._admitter.start()
        return self

    def stop(self) -> list[threading.Thread]:
        server, self._server = self._server, None
        if server is not None:
            server.stop(0).wait(2)
        with self._cond:
            endpoints = list(self.endpoints.values())
            self.endpoints.clear()
            self._cond.notify_all()
        closers = []
        for ep in endpoints:
            ep.connected = False
            # closing a channel waits for its stream's reader (~200 ms): do it aside, like a dying process
            closer = threading.Thread(target=ep.channel.close, daemon=True)
            closer.start()
            closers.append(closer)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        return closers

    def close(self) -> None:
        for closer in self.stop():
            closer.join(2.0)
        self._queue.put(None)

    def restart(self) -> None:
        """Like ``systemctl restart kubelet``: new process, sockets wiped, plugins must re-register."""
        self.log.log(0, "kubelet.go:1500", "Restarting (simulated)")
        self.stop()
        self.start()

    def __enter__(self) -> SimulatedKubelet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------------------------- Registration
    def Register(self, request, context):  # noqa: N802 - gRPC method name
        res = request.resource_name
        self.log.log(
            2, "server.go:147", "Got registration request from device plugin with resource", resourceName=res
        )
        if request.version not in self.supported_versions:
            msg = (
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported versions are {list(self.supported_versions)!r}"
            )
            self.log.log(
                0, "server.go:152", "Bad registration request from device plugin", resourceName=res, err=msg
            )
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        if not is_extended_resource_name(res):
            msg = f"the ResourceName {res!r} is invalid"
            self.log.log(
                0, "server.go:160", "Bad registration request from device plugin", resourceName=res, err=msg
            )
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        sock = os.path.join(self.root, request.endpoint)
        self.log.log(2, "handler.go:66", "Registering plugin at endpoint", plugin=res, endpoint=sock)
        channel = grpc.insecure_channel(f"unix://{sock}")
        try:
            grpc.channel_ready_future(channel).result(timeout=self.dial_timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            msg = f"failed to dial device plugin: context deadline exceeded ({sock})"
            self.log.log(
                0, "handler.go:80", "Failed to connect to new client", resource=res, err=msg, severity="E"
            )
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(api_pb2.Empty())  # no deadline, like the kubelet
        except grpc.RpcError as exc:
            channel.close()
            context.abort(
                grpc.StatusCode.UNKNOWN, f"failed to get device plugin options: {_rpc_error_text(exc)}"
            )
        ep = Endpoint(res, sock, channel, stub, options)
        with self._cond:
            old = self.endpoints.get(res)
            self.endpoints[res] = ep
            self.registrations.append(res)
            self.known_resources.add(res)
            self._cond.notify_all()
        if old is not None:
            old.connected = False
            old.channel.close()
        threading.Thread(target=self._list_and_watch, args=(ep,), name=f"lw-{res}", daemon=True).start()
        return api_pb2.Empty()

    def _list_and_watch(self, ep: Endpoint) -> None:
        try:
            for resp in ep.stub.ListAndWatch(api_pb2.Empty()):  # no deadline
                with self._cond:
                    ep.devices = {d.ID: d.health for d in resp.devices}
                    ep.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                    ep.updates += 1
                    self._cond.notify_all()
                self.log.log(
                    2,
                    "client.go:91",
                    "State pushed for device plugin",
                    resource=ep.resource,
                    resourceCapacity=len(resp.devices),
                    healthy=sum(1 for d in resp.devices if d.health == "Healthy"),
                )
        except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed by restart()
            if ep.connected:
                self.log.log(
                    0,
                    "client.go:100",
                    "ListAndWatch ended unexpectedly for device plugin",
                    resource=ep.resource,
                    err=_rpc_error_text(exc),
                    severity="E",
                )
        with self._cond:
            if self.endpoints.get(ep.resource) is ep:
                # markResourceUnhealthy: the endpoint stays (grace period) but nothing is allocatable
                ep.connected = False
                ep.devices = dict.fromkeys(ep.devices, "Unhealthy")
                self._cond.notify_all()
        self.log.log(
            2, "manager.go:470", "Endpoint disconnected; devices marked unhealthy", resource=ep.resource
        )

    # ---------------------------------------------------------------------------------- queries
    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    def devices(self, resource: str) -> dict[str, str]:
        with self._cond:
            ep = self.endpoints.get(resource)
            return dict(ep.devices) if ep else {}

    def capacity(self, resource: str) -> int:
        return len(self.devices(resource))

    def allocatable(self, resource: str) -> int:
        return sum(1 for h in self.devices(resource).values() if h == "Healthy")

    def wait_registered(self, resource: str, timeout: float, min_devices: int = 0, after: int = 0) -> bool:
        """True once ``resource`` is registered (its registration number > ``after``) and its stream has
        delivered at least one list with >= ``min_devices`` devices."""

        def ok() -> bool:
            ep = self.endpoints.get(resource)
            return (
                ep is not None
                and ep.connected
                and ep.updates > 0
                and len(ep.devices) >= min_devices
                and self.registrations.count(resource) > after
            )

        return self.wait_for(ok, timeout)

    # ---------------------------------------------------------------------------------- admission
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
        with self._cond:
            self.allocated.pop(uid, None)

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
                    "UnexpectedAdmissionError",
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
        self.current_pod = key
        self.log.log(2, "kubelet.go:2343", "SyncLoop ADD", source="api", pods=[key])
        self.log.log(4, "topology_manager.go:212", "Topology Admit Handler")
        spec = pod.get("spec", {})
        containers = [(c, True) for c in spec.get("initContainers") or []] + [
            (c, False) for c in spec.get("containers") or []
        ]
        result = AdmissionResult(key, uid, True)
        reusable: dict[str, set[str]] = {}  # devices of init containers, reusable by later containers
        try:
            for ctr, is_init in containers:
                limits = (ctr.get("resources") or {}).get("limits") or {}
                for res, qty in limits.items():
                    if not is_extended_resource_name(res) or res not in self.known_resources:
                        continue  # not a device-plugin resource (e.g. nvidia.com/gpumem): not ours
                    needed = int(str(qty))
                    if needed <= 0:
                        continue
                    self.log.log(
                        4, "manager.go:773", "Looking for needed resources", needed=needed, resourceName=res
                    )
                    chosen, err = self._devices_to_allocate(
                        uid, ctr.get("name", ""), res, needed, reusable.get(res, set())
                    )
                    if err:
                        return self._reject(
                            result, start, f"Allocate failed due to {err}, which is unexpected"
                        )
                    ep = self.endpoints.get(res)
                    if ep is None:
                        return self._reject(
                            result,
                            start,
                            f"Allocate failed due to can't allocate unregistered "
                            f"device {res}, which is unexpected",
                        )
                    self.log.log(
                        3,
                        "manager.go:819",
                        "Making allocation request for device plugin",
                        devices=sorted(chosen),
                        resourceName=res,
                    )
                    try:
                        resp = ep.stub.Allocate(
                            api_pb2.AllocateRequest(
                                container_requests=[
                                    api_pb2.ContainerAllocateRequest(devices_ids=sorted(chosen))
                                ]
                            )
                        )  # no deadline
                    except grpc.RpcError as exc:
                        with self._cond:
                            self.allocated.get(uid, {}).get(res, set()).difference_update(chosen)
                        return self._reject(
                            result,
                            start,
                            f"Allocate failed due to {_rpc_error_text(exc)}, which is unexpected",
                        )
                    cr = (
                        resp.container_responses[0]
                        if resp.container_responses
                        else api_pb2.ContainerAllocateResponse()
                    )
                    result.allocations.setdefault(ctr.get("name", ""), {})[res] = {
                        "devices": sorted(chosen),
                        "envs": dict(cr.envs),
                        "mounts": [
                            {
                                "containerPath": m.container_path,
                                "hostPath": m.host_path,
                                "readOnly": m.read_only,
                            }
                            for m in cr.mounts
                        ],
                    }
                    if is_init:
                        reusable.setdefault(res, set()).update(chosen)
        finally:
            self.current_pod = None
        result.duration_s = time.monotonic() - start
        self.log.log(2, "kubelet.go:2380", "Pod admitted", pod=key, podUID=uid)
        return result

    def _reject(self, result: AdmissionResult, start: float, message: str) -> AdmissionResult:
        result.admitted = False
        result.reason = "UnexpectedAdmissionError"
        result.message = message
        result.duration_s = time.monotonic() - start
        self.release(result.uid)
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

    def _devices_to_allocate(
        self, uid: str, container: str, res: str, needed: int, reusable: set[str]
    ) -> tuple[set[str], str | None]:
        with self._cond:
            ep = self.endpoints.get(res)
            if ep is None:
                return set(), f"can't allocate unregistered device {res}"
            in_use = set()
            for other_uid, per_res in self.allocated.items():
                if other_uid != uid:
                    in_use |= per_res.get(res, set())
            mine = self.allocated.setdefault(uid, {}).setdefault(res, set())
            healthy = {d for d, h in ep.devices.items() if h == "Healthy"}
            must = set(list(reusable)[:needed])
            available = (healthy - in_use - mine) | must
            if not healthy:
                return set(), ("no healthy devices present; cannot allocate unhealthy devices " + res)
            if len(available) < needed:
                return set(), (
                    f"requested number of devices unavailable for {res}. Requested: {needed}, "
                    f"Available: {len(available)}"
                )
            options = ep.options
            stub = ep.stub
        self.log.log(
            3,
            "manager.go:548",
            "Need devices to allocate for pod",
            deviceNumber=needed,
            resourceName=res,
            podUID=uid,
            containerName=container,
        )
        chosen: set[str] | None = None
        if len(available) == needed:
            chosen = set(available)
        elif options.get_preferred_allocation_available:
            self.log.log(
                4,
                "manager.go:956",
                "Issuing a GetPreferredAllocation call for container",
                containerName=container,
                podUID=uid,
            )
            try:
                # the kubelet releases its mutex and waits here with no deadline (seed 003)
                resp = stub.GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=sorted(available),
                                must_include_deviceIDs=sorted(must),
                                allocation_size=needed,
                            )
                        ]
                    )
                )
                ids = list(resp.container_responses[0].deviceIDs) if resp.container_responses else []
                if len(ids) == needed and set(ids) <= available:
                    chosen = set(ids)
            except grpc.RpcError as exc:
                return (
                    set(),
                    f"device plugin GetPreferredAllocation rpc failed with err: {_rpc_error_text(exc)}",
                )
        if chosen is None:
            chosen = set(must) | set(sorted(available - must)[: needed - len(must)])
        with self._cond:
            self.allocated.setdefault(uid, {}).setdefault(res, set()).update(chosen)
        return chosen, None


# ------------------------------------------------------------------------------------------ process
def _poll_api(kubelet: SimulatedKubelet, kubeconfig: str, node: str, stop: threading.Event) -> None:
    """Admit pods bound to ``node`` (polls the API server every 0.5 s)."""
    from hami_agent.k8s.client import KubeClient

    client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=5)
    seen: set[str] = set()
    while not stop.is_set():
        try:
            pods = client.list_pods(field_selector=f"spec.nodeName={node}")
        except Exception as exc:
            kubelet.log.log(0, "kubelet.go:2200", "list pods failed", err=str(exc), severity="E")
            stop.wait(1.0)
            continue
        for pod in pods:
            uid = pod.get("metadata", {}).get("uid") or pod["metadata"]["name"]
            if uid not in seen and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                seen.add(uid)
                kubelet.submit(pod)
        stop.wait(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.sim.kubelet",
        description="SIMULATED kubelet device manager (device plugin API v1beta1)",
    )
    p.add_argument("--root", required=True, help="device-plugin directory (kubelet.sock is created here)")
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=4, help="klog verbosity (default 4)")
    p.add_argument(
        "--pods", help="JSON file with a list of pods to admit once their resources are registered"
    )
    p.add_argument(
        "--wait-resources",
        default="nvidia.com/gpu",
        help="comma list of resources to wait for before admitting pods (default nvidia.com/gpu)",
    )
    p.add_argument("--wait-timeout", type=float, default=30.0)
    p.add_argument("--results", help="append one JSON line per admission result to this file")
    p.add_argument("--kubeconfig", help="poll this API server for pods bound to --node-name and admit them")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", "sim-node"))
    p.add_argument("--exit-after-pods", action="store_true", help="exit when all --pods are admitted")
    args = p.parse_args(argv)

    kubelet = SimulatedKubelet(args.root, args.verbosity, sys.stderr, node_name=args.node_name)
    stop = threading.Event()

    def write_result(r: AdmissionResult) -> None:
        line = json.dumps(
            {
                "pod": r.pod,
                "uid": r.uid,
                "admitted": r.admitted,
                "reason": r.reason,
                "message": r.message,
                "allocations": r.allocations,
                "duration_s": round(r.duration_s, 6),
            }
        )
        if args.results:
            with open(args.results, "a") as fh:
                fh.write(line + "\n")
        else:
            print(line, flush=True)

    kubelet.on_result = write_result
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=kubelet.restart, daemon=True).start())
    kubelet.start()
    # like a kubelet whose device plugins come up first: wait for them before admitting anything
    for res in filter(None, args.wait_resources.split(",")):
        end = time.monotonic() + args.wait_timeout
        while not stop.is_set() and time.monotonic() < end and not kubelet.wait_registered(res, 0.2):
            pass
        if not stop.is_set() and not kubelet.wait_registered(res, 0):
            kubelet.log.log(
                0, "manager.go:300", "resource not registered in time", resource=res, severity="E"
            )
    if args.kubeconfig:
        threading.Thread(
            target=_poll_api, args=(kubelet, args.kubeconfig, args.node_name, stop), daemon=True
        ).start()
    futures = []
    if args.pods:
        with open(args.pods) as fh:
            pods = json.load(fh)
        futures = [kubelet.submit(pod) for pod in pods]
    while not stop.is_set():
        if args.exit_after_pods and futures and all(f.done() for f in futures):
            break
        stop.wait(0.2)
    kubelet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A SIMULATED GPU cluster in one process, for the end-to-end scheduling benchmark.

Real components: the scheduler extender (``SchedulerApp``: informers, /filter, /bind, node lock, events),
one device plugin per node (``DevicePluginManager``: gRPC server, registration, GetPreferredAllocation,
Allocate with the lock-owner lookup through its own pod and node informers, the conditional write-back and
the lock release), the node register annotation (``NodeRegistrar``), all over HTTP through the real
Kubernetes client. Simulated: the API server (``tests/sim/apiserver.py``), kube-scheduler
(``tests/sim/kube_scheduler.py``, faithful queue, concurrent binding cycles), one kubelet device manager
per node (``tests/sim/kubelet``: serial admission), and the part of each kubelet that watches pods bound to
its node and writes ``Running`` (one shared watch for all nodes here: fewer watches on the simulated API
server than a real cluster has) and, for a pod deleted gracefully (``graceful_deletion=True``), stops it
after its whole grace period and confirms the deletion. The NVML inventory is a fixed snapshot (NVML is
not on this path).

``extender=False`` is the baseline: kube-scheduler alone, placing pods on the count of ``nvidia.com/gpu``,
and a plain device plugin that hands out whatever device IDs the kubelet picked (as NVIDIA's plugin does).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from benchmarks.apiserver_proc import ApiServerProcess
from benchmarks.e2e_schedule import pinning
from benchmarks.e2e_schedule.pinning import CorePlan
from benchmarks.procstat import process_cpu_or_zero
from hami_agent.config import build_config
from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.manager import DevicePluginManager
from hami_agent.deviceplugin.node_register import NodeRegistrar
from hami_agent.deviceplugin.podsource import K8sPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.errors import NotFoundError
from hami_agent.k8s.informer import Informer
from hami_agent.protocol import keys
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kubelet import SimulatedKubelet
from tests.sim.kubelet_objects import gpu_node, kubelet_statuses
from tests.sim.ports import free_port
from tests.unit.deviceplugin.fakes import FakeGpu, FakeSnapshot, FakeSource

GPU = "nvidia.com/gpu"
CREATE_IN_FLIGHT = 16  # pod creates in flight at most (a controller's parallel batch; the client's pool)


def wait_for(pred: Any, timeout: float, step: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


# --------------------------------------------------------------------------------- plain plugin
class PlainPlugin(api_pb2_grpc.DevicePluginServicer):
    """A device plugin without HAMi: ``count`` devices, Allocate answers whatever the kubelet chose."""

    def __init__(self, count: int) -> None:
        self.ids = [f"dev-{i}" for i in range(count)]
        self._stop = threading.Event()

    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        return api_pb2.DevicePluginOptions()

    def ListAndWatch(self, request, context):  # noqa: N802
        yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health="Healthy") for i in self.ids])
        while not self._stop.wait(0.5) and context.is_active():
            pass

    def Allocate(self, request, context):  # noqa: N802
        return api_pb2.AllocateResponse(container_responses=[
            api_pb2.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(r.devices_ids)})
            for r in request.container_requests])

    def serve(self, root: str) -> grpc.Server:
        server = grpc.server(cf.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        sock = os.path.join(root, "plain.sock")
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        with grpc.insecure_channel(f"unix://{os.path.join(root, 'kubelet.sock')}") as ch:
            api_pb2_grpc.RegistrationStub(ch).Register(api_pb2.RegisterRequest(
                version="v1beta1", endpoint="plain.sock", resource_name=GPU), timeout=10)
        return server

    def stop(self) -> None:
        self._stop.set()


# ----------------------------------------------------------------------------------------- nodes
@dataclass
class SimNode:
    name: str
    root: str
    kubelet: SimulatedKubelet
    manager: Any = None
    thread: threading.Thread | None = None
    informers: list[Any] = field(default_factory=list)
    plain: PlainPlugin | None = None
    plain_server: grpc.Server | None = None


class NodeHost:
    """Some SIMULATED nodes: per node a kubelet device manager and a device plugin (ours, or the plain one
    without HAMi); and the kubelet side of pod handling for them: admit each pod bound to one of them,
    write ``Running`` (or ``Failed``), release the devices of a deleted pod. Runs in the benchmark's process
    or, for large fleets, in processes of its own (``python -m benchmarks.e2e_schedule.cluster``): a
    hundred device plugins in one Python process starve each other of the GIL."""

    def __init__(self, kubeconfig: str, names: list[str], tmp: str, *, gpus: int, split: int,
                 extender: bool) -> None:
        self.kubeconfig = kubeconfig
        self.names = names
        self.tmp = tmp
        self.gpus = gpus
        self.split = split
        self.extender = extender
        self.nodes: dict[str, SimNode] = {}
        self.client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=10, component="kubelet-sim")
        self._pods: Informer | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.rejected: dict[str, str] = {}
        self._stopping: dict[str, threading.Timer] = {}  # uid -> the end of its grace period

    def start(self) -> NodeHost:
        for name in self.names:
            self._add_node(name)
        self._pods = Informer(self.client, "pods", field_selector="spec.nodeName!=", resync_s=0,
                              name="kubelet-sim-pods")
        self._pods.add_handler(on_add=self._on_pod, on_update=lambda _o, p: self._on_pod(p),
                               on_delete=self._on_pod_gone)
        self._pods.start()
        if not self._pods.wait_synced(60):
            raise RuntimeError("kubelet pod watch did not sync")
        return self

    def _add_node(self, name: str) -> None:
        root = os.path.join(self.tmp, name)
        os.makedirs(root, exist_ok=True)
        kubelet = SimulatedKubelet(root, verbosity=0, node_name=name).start()
        node = SimNode(name, root, kubelet)
        if self.extender:
            self._start_plugin(node)
        else:
            node.plain = PlainPlugin(self.gpus * self.split)
            node.plain_server = node.plain.serve(root)
        if not kubelet.wait_registered(GPU, 60, min_devices=self.gpus * self.split):
            raise RuntimeError(f"{name}: device plugin did not register")
        self.nodes[name] = node

    def _start_plugin(self, node: SimNode) -> None:
        n = int(node.name.rsplit("-", 1)[1])
        gpus = tuple(FakeGpu(index=i, uuid=f"GPU-{n:08x}-{i:04x}-4000-8000-{n * 100 + i:012x}", numa=i // 4,
                             name="NVIDIA A100-SXM4-80GB", type="NVIDIA-NVIDIA A100-SXM4-80GB",
                             memory_mib=81920) for i in range(self.gpus))
        source = FakeSource(FakeSnapshot(gpus=gpus))
        client = KubeClient.from_kubeconfig(self.kubeconfig, timeout_s=5, component="device-plugin",
                                            qps=5.0, burst=10)
        fast = client.with_options(timeout_s=1.0, attempts=1, limiter=None)
        pods = Informer(client, "pods", field_selector=f"spec.nodeName={node.name}").start()
        nodes = Informer(client, "nodes", field_selector=f"metadata.name={node.name}").start()
        node.informers = [pods, nodes]
        s = PluginSettings(node_name=node.name, device_plugin_dir=node.root, device_split_count=self.split,
                           hook_path=os.path.join(node.root, "hook"),
                           vgpu_lock_dir=os.path.join(node.root, "lock"),
                           mig_apply_lock=os.path.join(node.root, "mig.lock"), first_snapshot_wait_s=5)
        node.manager = DevicePluginManager(s, lambda: source, K8sPodSource(node.name, fast, pods, nodes))
        node.thread = threading.Thread(target=node.manager.run, name=f"plugin-{node.name}", daemon=True)
        node.thread.start()
        cfg = build_config([{"nvidia": {"deviceSplitCount": self.split}}], node.name)
        reg = NodeRegistrar(client, node.name, source, cfg, node_source=lambda: nodes.get(None, node.name))
        if not wait_for(lambda: pods.synced and nodes.synced, 60) or not reg.register_once():
            raise RuntimeError(f"{node.name}: register annotation not written: {reg.last_error}")

    def _on_pod(self, pod: dict) -> None:
        md = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if md.get("deletionTimestamp") and node in self.nodes:
            self._stop_pod(pod)
            return
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending" or node not in self.nodes:
            return
        uid = md.get("uid")
        with self._lock:
            if uid in self._seen:
                return
            self._seen.add(uid)
        fut = self.nodes[node].kubelet.submit(pod)
        fut.add_done_callback(lambda f, p=pod: self._admitted(p, f.result()))

    def _admitted(self, pod: dict, result: Any) -> None:
        md = pod["metadata"]
        # a kubelet's two status writes (tests/sim/kubelet_objects.py), or the admission failure
        statuses = (kubelet_statuses(pod) if result.admitted else
                    [{"phase": "Failed", "reason": result.reason, "message": result.message}])
        if not result.admitted:
            with self._lock:
                self.rejected[f"{md.get('namespace')}/{md['name']}"] = result.message
        try:
            for status in statuses:
                self.client.patch_pod_status(md.get("namespace", "default"), md["name"], status)
        except Exception as exc:  # noqa: BLE001 - the pod may be gone
            with self._lock:
                self.rejected.setdefault(f"{md.get('namespace')}/{md['name']}", f"status write failed: {exc}")

    def _stop_pod(self, pod: dict) -> None:
        """A graceful deletion seen: the kubelet kills the containers within ``deletionGracePeriodSeconds``.
        Simulated as containers that ignore SIGTERM (never kinder than a real kubelet): they run the whole
        grace period from the moment this kubelet sees the deletion; then the devices are freed and the
        deletion is confirmed with grace period 0 and a UID precondition, as the kubelet's status manager
        does (kubernetes ``pkg/kubelet/status/status_manager.go``, ``syncPod``)."""
        md = pod["metadata"]
        uid = md.get("uid", "")
        with self._lock:
            if uid in self._stopping:
                return
            grace = max(0, int(md.get("deletionGracePeriodSeconds") or 0))
            timer = threading.Timer(grace, self._stopped, args=(pod,))
            timer.daemon = True
            self._stopping[uid] = timer
        timer.start()

    def _stopped(self, pod: dict) -> None:
        md = pod["metadata"]
        node = self.nodes.get(pod["spec"]["nodeName"])
        if node is not None:
            node.kubelet.release(md.get("uid", ""))
        try:
            self.client.delete("pods", md["name"], md.get("namespace", "default"), uid=md.get("uid"),
                               grace_period_s=0)
        except NotFoundError:
            pass  # already gone
        except Exception as exc:  # noqa: BLE001 - recorded; a pod that never goes shows in the figures
            with self._lock:
                self.rejected.setdefault(f"{md.get('namespace')}/{md['name']}", f"delete failed: {exc}")

    def _on_pod_gone(self, pod: dict) -> None:
        node = self.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        if node is not None:
            node.kubelet.release((pod.get("metadata") or {}).get("uid", ""))

    def stop(self) -> None:
        if self._pods is not None:
            self._pods.stop()
        with self._lock:
            timers = list(self._stopping.values())
        for timer in timers:
            timer.cancel()
        for node in self.nodes.values():
            if node.manager is not None:
                node.manager.stop()
                if node.thread is not None:
                    node.thread.join(10)
            for inf in node.informers:
                inf.stop()
            if node.plain is not None:
                node.plain.stop()
            if node.plain_server is not None:
                node.plain_server.stop(0)
            threading.Thread(target=node.kubelet.close, daemon=True).start()


def host_main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.e2e_schedule.cluster --kubeconfig K --root DIR --nodes a,b [--plain]``:
    a NodeHost process; writes ``DIR/ready`` when its nodes are registered, stops on SIGTERM."""
    import argparse
    import signal

    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--nodes", required=True)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--split", type=int, default=10)
    p.add_argument("--plain", action="store_true")
    args = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    host = NodeHost(args.kubeconfig, args.nodes.split(","), args.root, gpus=args.gpus, split=args.split,
                    extender=not args.plain).start()
    with open(os.path.join(args.root, "ready"), "w") as f:
        f.write("ok")
    stop.wait()
    host.stop()
    return 0


class SimCluster:
    def __init__(self, n_nodes: int, *, gpus: int = 8, split: int = 10, extender: bool = True,
                 config: SchedulerConfig | None = None, queue_kw: dict | None = None,
                 hosts: int = 0, extender_args: list[str] | None = None,
                 graceful_deletion: bool = False, cores: CorePlan | None = None) -> None:
        """``hosts``: node-host processes (0: the nodes run in this process). ``extender_args``: more flags
        for ``hami-agent scheduler``. ``graceful_deletion``: a deleted bound pod terminates until its
        simulated kubelet confirms (``NodeHost._stop_pod``), as in a real cluster. ``cores``: each process
        on cores of its own (``pinning.py``; None: wherever the kernel puts them)."""
        self.n_nodes = n_nodes
        self.gpus = gpus
        self.split = split
        self.extender = extender
        self.config = config or SchedulerConfig(event_nodes=5)
        self.queue_kw = queue_kw or {}
        self.hosts = hosts
        self.extender_args = list(extender_args or [])
        self.graceful_deletion = graceful_deletion
        self.cores = cores
        self._pinned: list[tuple[int, tuple[int, ...]]] = []  # (pid, its planned cores), as pinned
        self.tmp = tempfile.mkdtemp(prefix="hami-e2e-", dir="/tmp")
        self.api: ApiServerProcess | None = None
        self.host: NodeHost | None = None
        self.host_procs: list[subprocess.Popen] = []
        self.app: SchedulerApp | None = None
        self.extender_proc: subprocess.Popen | None = None
        self.extender_url: str | None = None
        self.sim: KubeSchedulerSim | None = None
        self.client: KubeClient | None = None
        self._pods: Informer | None = None
        self._locks: Informer | None = None
        self._lock = threading.Lock()
        self.running_at: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.lock_set: dict[str, float] = {}  # lock value -> first seen
        self.lock_released: dict[str, float] = {}  # lock value -> gone
        self.pod_times: dict[str, dict[str, float]] = {}  # "ns/name" -> stage -> time first seen
        self.created_at: dict[str, float] = {}  # "ns/name" -> when its create returned
        self.terminating_at: dict[str, float] = {}  # "ns/name" -> deletionTimestamp first seen
        self.gone_at: dict[str, float] = {}  # "ns/name" -> its delete event seen

    # -------------------------------------------------------------------------------- lifecycle
    def start(self, *, hold_scheduler: bool = False) -> SimCluster:
        if self.cores is not None:
            self._pin(os.getpid(), self.cores.bench)  # the kube-scheduler simulator and the observers
        self.api = ApiServerProcess(os.path.join(self.tmp, "apiserver"),
                                    graceful_deletion=int(self.graceful_deletion))
        if self.cores is not None:
            self._pin(self.api.proc.pid, self.cores.apiserver)
        self.client = KubeClient.from_kubeconfig(self.api.kubeconfig_path, timeout_s=10, component="bench")
        names = [f"node-{i:03d}" for i in range(self.n_nodes)]
        alloc = str(self.gpus * self.split)
        for name in names:
            # as large as a kubelet's (tests/sim/kubelet_objects.py): node events cost what they do in a
            # cluster
            self.client.create("nodes", gpu_node(name, {"gpu": "on"}, {GPU: alloc}, {GPU: alloc}))
        self._start_nodes(names)
        # the benchmark's observers: pod stages and node lock holds
        self._pods = Informer(self.client, "pods", field_selector="spec.nodeName!=", resync_s=0,
                              name="kubelet-sim-pods")
        self._pods.add_handler(on_add=self._on_pod, on_update=lambda _o, p: self._on_pod(p),
                               on_delete=self._on_pod_deleted)
        self._locks = Informer(self.client, "nodes", resync_s=0)
        self._locks.add_handler(on_add=self._on_node, on_update=self._on_node_update)
        self._pods.start()
        self._locks.start()
        assert self._pods.wait_synced(30) and self._locks.wait_synced(30)
        if self.extender:
            self._start_extender()
        if not hold_scheduler:
            self.start_scheduler()
        return self

    def start_scheduler(self) -> None:
        """The kube-scheduler simulator (``start(hold_scheduler=True)`` leaves it to the caller: pods
        created before it starts wait in its queue as after a kube-scheduler restart)."""
        assert self.api is not None and self.sim is None
        sched_client = KubeClient.from_kubeconfig(self.api.kubeconfig_path, component="kube-scheduler")
        self.sim = KubeSchedulerSim(sched_client, self.extender_url, post_events=True,
                                    **self.queue_kw).start()

    def _start_nodes(self, names: list[str]) -> None:
        assert self.api is not None
        if self.hosts <= 0:
            self.host = NodeHost(self.api.kubeconfig_path, names, self.tmp, gpus=self.gpus, split=self.split,
                                 extender=self.extender).start()
            return
        root = Path(__file__).resolve().parent.parent.parent
        env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        dirs = []
        for h in range(self.hosts):
            part = names[h::self.hosts]
            if not part:
                continue
            d = os.path.join(self.tmp, f"host-{h}")
            os.makedirs(d)
            dirs.append(d)
            cmd = [sys.executable, "-m", "benchmarks.e2e_schedule.cluster", "--kubeconfig",
                   self.api.kubeconfig_path, "--root", d, "--nodes", ",".join(part), "--gpus", str(self.gpus),
                   "--split", str(self.split), *([] if self.extender else ["--plain"])]
            self.host_procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL,
                                                    stderr=open(os.path.join(d, "host.log"), "w")))  # noqa: SIM115
            if self.cores is not None:
                self._pin(self.host_procs[-1].pid, self.cores.hosts[h % len(self.cores.hosts)])
        if not wait_for(lambda: all(os.path.exists(os.path.join(d, "ready")) for d in dirs), 300, step=0.5):
            logs = [open(os.path.join(d, "host.log")).read()[-1500:] for d in dirs]
            raise RuntimeError(f"node hosts did not come up: {logs}")

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system, s) used so far by each part of the simulated cluster: the API server,
        the extender, the node hosts (device plugins, kubelet simulators) and this process (the
        kube-scheduler simulator and the benchmark's observers). Linux ``/proc/<pid>/stat``."""
        cpu = process_cpu_or_zero
        return {"apiserver": cpu(self.api.proc.pid) if self.api else 0.0,
                "extender": cpu(self.extender_proc.pid) if self.extender_proc else 0.0,
                "node hosts": sum(cpu(p.pid) for p in self.host_procs),
                # this process; the nodes too when they run in it (hosts=0)
                "kube-scheduler sim" + ("" if self.host_procs else " + nodes"): cpu(os.getpid())}

    def _pin(self, pid: int, cores: tuple[int, ...]) -> None:
        pinning.pin(pid, cores)
        self._pinned.append((pid, cores))

    def pinning_not_held(self) -> list[str]:
        """Threads of the cluster's processes found off their planned cores (empty: the pinning held)."""
        return [off for pid, cores in self._pinned for off in pinning.verify(pid, cores)]

    def _start_extender(self) -> None:
        """``hami-agent scheduler`` as its own process, as in a cluster (sharing this process's GIL with a
        hundred simulated nodes would charge their work to /filter), laid out as the hami_scheduler role
        runs it: the verbs on a listener of their own (``--extender-bind-address``), the webhook and probes
        on the main one. (With one listener for both, kube-scheduler would meet the public listeners'
        per-client caps, which no deployment of the role puts in its way.)"""
        assert self.api is not None
        port, verbs_port = free_port(), free_port()
        while verbs_port == port:
            verbs_port = free_port()
        log = open(os.path.join(self.tmp, "extender.log"), "w")  # noqa: SIM115
        self.extender_proc = subprocess.Popen(
            [sys.executable, "-m", "hami_agent", "scheduler", "--kubeconfig", self.api.kubeconfig_path,
             "--bind-address", f"127.0.0.1:{port}", "--extender-bind-address", f"127.0.0.1:{verbs_port}",
             "--metrics-bind", "",
             "--node-scheduler-policy", self.config.node_policy, "--register-interval", "5s",
             *self.extender_args]
            + ([] if self.config.avoid_busy_nodes else ["--strict-node-order"])
            + ([] if self.config.write_behind else ["--sync-filter-write"]),
            stdout=log, stderr=subprocess.STDOUT)
        if self.cores is not None:
            self._pin(self.extender_proc.pid, self.cores.extender)
        self.extender_url = f"http://127.0.0.1:{verbs_port}"

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        if not wait_for(ready, 60, step=0.2):
            raise RuntimeError(f"extender did not become ready: {open(log.name).read()[-2000:]}")

    def stop(self) -> None:
        for c in (self.sim, self._pods, self._locks):
            if c is not None:
                c.stop()
        if self.app is not None:
            self.app.stop()
        for proc in [*([self.extender_proc] if self.extender_proc else []), *self.host_procs]:
            proc.terminate()
        for proc in [*([self.extender_proc] if self.extender_proc else []), *self.host_procs]:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.host is not None:
            self.host.stop()
        if self.api is not None:
            self.api.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------------------- observers
    def _stage(self, key: str, stage: str) -> None:
        with self._lock:
            self.pod_times.setdefault(key, {}).setdefault(stage, time.monotonic())

    def _on_pod(self, pod: dict) -> None:
        md = pod.get("metadata") or {}
        key = f"{md.get('namespace')}/{md.get('name')}"
        phase = (pod.get("status") or {}).get("phase", "Pending")
        self._stage(key, "bound")
        if md.get("deletionTimestamp"):
            with self._lock:
                self.terminating_at.setdefault(key, time.monotonic())
        if ((md.get("annotations") or {}).get(keys.BIND_PHASE)) == keys.BIND_PHASE_SUCCESS:
            self._stage(key, "allocated")
        if phase == "Running":
            with self._lock:
                self.running_at.setdefault(key, time.monotonic())
        elif phase == "Failed":
            with self._lock:
                self.failed.setdefault(key, (pod.get("status") or {}).get("message") or "Failed")

    def _on_pod_deleted(self, pod: dict) -> None:
        md = pod.get("metadata") or {}
        with self._lock:
            self.gone_at.setdefault(f"{md.get('namespace')}/{md.get('name')}", time.monotonic())

    def _on_node(self, node: dict) -> None:
        lock = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_LOCK)
        if lock:
            with self._lock:
                self.lock_set.setdefault(lock, time.monotonic())

    def _on_node_update(self, old: dict, new: dict) -> None:
        before = ((old.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_LOCK)
        after = ((new.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_LOCK)
        now = time.monotonic()
        with self._lock:
            if before and before != after:
                self.lock_released.setdefault(before, now)
            if after:
                self.lock_set.setdefault(after, now)

    def lock_holds(self) -> list[float]:
        with self._lock:
            return [self.lock_released[v] - t for v, t in self.lock_set.items() if v in self.lock_released]

    # ---------------------------------------------------------------------------------- workload
    def create_pods(self, prefix: str, n: int, *, gpus: int = 1, mem: int | None = 4096,
                    cores: int | None = 10, in_flight: int = CREATE_IN_FLIGHT, priority: int | None = None,
                    grace_s: int | None = None) -> list[str]:
        """Create ``n`` pods as a workload controller does: concurrently, at most ``in_flight`` requests at
        a time (the Job and ReplicaSet controllers create a batch of pods in parallel, ``slowStartBatch``
        in kubernetes ``pkg/controller/replicaset/replica_set.go``). Records each pod's create time in
        ``created_at``. Returns the pods' keys in name order. ``priority``: ``spec.priority`` as the
        Priority admission plugin resolves it from a PriorityClass; ``grace_s``:
        ``terminationGracePeriodSeconds``."""
        limits = {GPU: str(gpus)}
        if self.extender:
            if mem is not None:
                limits["nvidia.com/gpumem"] = str(mem)
            if cores is not None:
                limits["nvidia.com/gpucores"] = str(cores)
        assert self.client is not None
        client = self.client

        def create(i: int) -> str:
            name = f"{prefix}-{i:04d}"
            container = {"name": "main", "image": "cuda", "resources": {"limits": dict(limits)}}
            meta = {"name": name, "namespace": "default", "labels": {"job": prefix}}
            spec: dict[str, Any] = {"schedulerName": "hami-scheduler", "containers": [container]}
            if priority is not None:
                spec["priority"] = priority
            if grace_s is not None:
                spec["terminationGracePeriodSeconds"] = grace_s
            client.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
            with self._lock:
                self.created_at[f"default/{name}"] = time.monotonic()
            return f"default/{name}"

        with cf.ThreadPoolExecutor(max_workers=max(1, in_flight), thread_name_prefix="create") as pool:
            return list(pool.map(create, range(n)))

    def wait_running(self, keys_: list[str], timeout: float) -> bool:
        return wait_for(lambda: all(k in self.running_at for k in keys_), timeout, step=0.05)


if __name__ == "__main__":
    sys.exit(host_main())

"""A DRA cluster out of the simulators, without containers: the pieces ``tests/integration/dra`` and
``sandbox/dra_step.py`` run the real ``hami-agent dra`` process against.

* the API server: any (the in-process ``ApiServer`` or the sandbox's), through an admin kubeconfig;
* the role's DeviceClasses, rendered from ``roles/hami_agent/templates/dra-deviceclasses.yaml.j2``;
* per node: a Node object, a SIMULATED kubelet with its DRA manager (``tests/sim/kubelet``), a pod runner
  (pods bound to the node are admitted one at a time: NodePrepareResources before "starting", status
  ``Running``; a failed prepare leaves the pod Pending and is retried with backoff, as the kubelet's pod
  worker does; a deleted pod is released: NodeUnprepareResources), and the driver as a process on the
  node's gpusim state (``hami-agent dra``);
* the SIMULATED kube-scheduler with the DRA allocator (``tests/sim/dra_allocator.py``).

Sockets live under a short ``/tmp`` directory (unix socket paths are limited to 108 bytes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from hami_agent.dra import cdi
from tests.sim.dra_allocator import DraAllocator
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kubelet import AdmissionResult, SimulatedKubelet
from tests.sim.kubelet_objects import kubelet_statuses

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.hami.io"
DEVICECLASSES = REPO / "roles" / "hami_agent" / "templates" / "dra-deviceclasses.yaml.j2"


def device_classes(driver: str = DRIVER, extended: bool = False,
                   extended_name: str = "nvidia.com/gpu") -> list[dict]:
    """The role's DeviceClass manifests, rendered as the role renders them."""
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda v: str(v).strip().lower() in ("yes", "on", "1", "true", "y") \
        if not isinstance(v, bool) else v
    text = env.from_string(DEVICECLASSES.read_text()).render(
        ansible_managed="Ansible managed (test render)", hami_agent_dra_driver_name=driver,
        hami_agent_dra_extended_resource=extended, hami_agent_dra_extended_resource_name=extended_name)
    return [d for d in yaml.safe_load_all(text) if d]


@dataclass
class DraNode:
    name: str
    root: Path  # kubelet root (plugins_registry/, plugins/, the DRA checkpoint)
    gpusim_state: Path
    gpusim_lib: Path
    kubelet: SimulatedKubelet
    cdi_dir: Path
    state_dir: Path
    hook_dir: Path
    config: Path
    driver: subprocess.Popen | None = None
    driver_log: Path | None = None
    runner: PodRunner | None = None
    driver_args: list[str] = field(default_factory=list)
    kubeconfig: str | None = None  # the driver's own credential (default: the cluster's admin)

    def cdi_env(self, pod_result: AdmissionResult, container: str) -> dict[str, Any]:
        """What a CDI-aware runtime injects into ``container`` (env + mounts)."""
        return cdi.resolve(str(self.cdi_dir), pod_result.dra.get(container, []))


class PodRunner:
    """The kubelet's pod lifecycle for one node (admission + DRA prepare + status; release on delete)."""

    def __init__(self, node: DraNode, client: Any, interval_s: float = 0.1) -> None:
        self.node = node
        self.client = client
        self.interval_s = interval_s
        self.results: dict[str, AdmissionResult] = {}  # "ns/name" -> last result
        self._seen: dict[str, dict] = {}  # uid -> pod
        self._retry_at: dict[str, tuple[float, float]] = {}  # uid -> (when, delay)
        self._inflight: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"pod-runner-{node.name}", daemon=True)

    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - API outage: next round
                pass
            self._stop.wait(self.interval_s)

    def poll(self) -> None:
        pods = self.client.list_pods(field_selector=f"spec.nodeName={self.node.name}")
        live = set()
        now = time.monotonic()
        terminating = []
        for pod in pods:
            md = pod["metadata"]
            uid = md["uid"]
            if md.get("deletionTimestamp"):
                # graceful deletion (an API server that waits for the kubelet): the kubelet stops the pod,
                # unprepares its claims, then confirms the deletion with grace period 0
                terminating.append(pod)
                continue
            live.add(uid)
            phase = (pod.get("status") or {}).get("phase", "Pending")
            with self._lock:
                if phase != "Pending" or uid in self._inflight:
                    continue
                when, _delay = self._retry_at.get(uid, (0.0, 0.0))
                if uid in self._seen and when == 0.0 or now < when:
                    continue
                self._seen[uid] = pod
                self._inflight.add(uid)
            fut = self.node.kubelet.submit(pod)
            fut.add_done_callback(lambda f, p=pod: self._done(p, f.result()))
        with self._lock:
            gone = [u for u in self._seen if u not in live]
            for uid in gone:
                self._seen.pop(uid, None)
                self._retry_at.pop(uid, None)
        for uid in gone:
            try:
                self.node.kubelet.release(uid)
            except Exception:  # noqa: BLE001 - NodeUnprepareResources failed: the kubelet retries
                with self._lock:
                    self._seen[uid] = {}
                raise
        for pod in terminating:  # released above (not live): now confirm
            self._confirm_deletion(pod)

    def _confirm_deletion(self, pod: dict) -> None:
        md = pod["metadata"]
        self.client.delete("pods", md["name"], md.get("namespace", "default"), uid=md.get("uid"),
                           grace_period_s=0)

    def _done(self, pod: dict, r: AdmissionResult) -> None:
        md = pod["metadata"]
        key = f"{md.get('namespace', 'default')}/{md['name']}"
        with self._lock:
            self.results[key] = r
            self._inflight.discard(md["uid"])
        ns = md.get("namespace", "default")
        try:
            if r.admitted:
                with self._lock:
                    self._retry_at[md["uid"]] = (0.0, 0.0)
                for status in kubelet_statuses(pod):  # tests/sim/kubelet_objects.py
                    self.client.patch_pod_status(ns, md["name"], status)
            elif r.reason == "FailedPrepareDynamicResources":
                with self._lock:  # the pod worker retries the sync with backoff; the pod stays Pending
                    _w, delay = self._retry_at.get(md["uid"], (0.0, 0.1))
                    delay = min(max(delay, 0.1) * 2, 2.0)
                    self._retry_at[md["uid"]] = (time.monotonic() + delay, delay)
                self.client.patch_pod_status(ns, md["name"], {"conditions": [
                    {"type": "Ready", "status": "False", "reason": r.reason, "message": r.message[:1000]}]})
            else:
                self.client.patch_pod_status(ns, md["name"], {"phase": "Failed", "reason": r.reason,
                                                             "message": r.message})
        except Exception:  # noqa: BLE001 - the pod may be gone
            pass


class DraCluster:
    """Context manager; ``add_node`` per GPU node, then ``start_scheduler``."""

    def __init__(self, kubeconfig: str, work: Path, *, driver: str = DRIVER,
                 scheduler_name: str = "dra-scheduler-sim", hami_agent: str | None = None) -> None:
        from hami_agent.k8s.client import KubeClient

        self.kubeconfig = kubeconfig
        self.work = Path(work)
        self.driver = driver
        self.scheduler_name = scheduler_name
        self.hami_agent = hami_agent or str(Path(sys.executable).parent / "hami-agent")
        self.client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=5)
        self.nodes: dict[str, DraNode] = {}
        self.scheduler: KubeSchedulerSim | None = None
        self.allocator: DraAllocator | None = None
        self._tmp = tempfile.mkdtemp(prefix="dra-", dir="/tmp")

    def __enter__(self) -> DraCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ setup
    def apply_device_classes(self, **kw: Any) -> None:
        for doc in device_classes(self.driver, **kw):
            try:
                self.client.create("deviceclasses", doc)
            except Exception as exc:  # noqa: BLE001 - already there (a second step run): keep it
                if "already exists" not in str(exc):
                    raise

    def add_node(self, name: str, gpusim_state: Path, gpusim_lib: Path, *, config: dict | None = None,
                 driver_args: list[str] | None = None, start_driver: bool = True,
                 dra_options: dict | None = None, kubeconfig: str | None = None) -> DraNode:
        root = Path(self._tmp) / name
        (root / "dp").mkdir(parents=True, exist_ok=True)
        try:
            meta = {"name": name, "labels": {"kubernetes.io/hostname": name}}
            self.client.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta})
        except Exception as exc:  # noqa: BLE001 - the node may exist already (sandbox)
            if "already exists" not in str(exc):
                raise
        kubelet = SimulatedKubelet(str(root / "dp"), verbosity=4, node_name=name, dra_client=self.client,
                                   dra_root=str(root), dra_options=dra_options).start()
        node_work = self.work / name
        node_work.mkdir(parents=True, exist_ok=True)
        cfg_path = node_work / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(config or {"dra": {"devices": "all", "driverName": self.driver}}))
        node = DraNode(name, root, Path(gpusim_state), Path(gpusim_lib), kubelet, node_work / "cdi",
                       node_work / "state", node_work / "hook", cfg_path, driver_args=list(driver_args or []),
                       kubeconfig=kubeconfig)
        (node.hook_dir / "vgpu").mkdir(parents=True, exist_ok=True)
        node.runner = PodRunner(node, self.client).start()
        self.nodes[name] = node
        if start_driver:
            self.start_driver(node)
        return node

    def driver_argv(self, node: DraNode) -> list[str]:
        return [self.hami_agent, "dra", "-v", "4", "--node-name", node.name,
                "--kubeconfig", node.kubeconfig or self.kubeconfig,
                "--config", str(node.config), "--plugins-dir", str(node.root / "plugins"),
                "--plugins-registry-dir", str(node.root / "plugins_registry"), "--cdi-dir", str(node.cdi_dir),
                "--state-dir", str(node.state_dir), "--hook-path", str(node.hook_dir),
                "--vgpu-lock-dir", str(node.hook_dir / "vgpulock"), "--nvml-lib", str(node.gpusim_lib),
                "--metrics-bind", "none", "--mig-apply-lock", str(node.root / "mig-apply.lock"),
                "--nvml-call-timeout", "1", "--nvml-refresh-interval", "0.3", "--poll-interval", "0.05",
                "--health-recovery-quiet", "1", *node.driver_args]

    def start_driver(self, node: DraNode) -> subprocess.Popen:
        node.driver_log = self.work / node.name / "driver.log"
        env = {**os.environ, "GPUSIM_STATE": str(node.gpusim_state),
               "HAMI_NVML_LIBRARY": str(node.gpusim_lib), "PYTHONPATH": f"{REPO}:{REPO / 'agent'}"}
        log = open(node.driver_log, "ab")  # noqa: SIM115 - closed when the process is stopped
        node.driver = subprocess.Popen(self.driver_argv(node), stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        log.close()
        return node.driver

    def stop_driver(self, node: DraNode, sig: int = 15, timeout: float = 10.0) -> int | None:
        proc = node.driver
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        node.driver = None
        return proc.returncode

    def start_scheduler(self) -> KubeSchedulerSim:
        self.allocator = DraAllocator(self.client)
        self.scheduler = KubeSchedulerSim(self.client, "http://127.0.0.1:1", self.scheduler_name,
                                          initial_backoff_s=0.2, max_backoff_s=1.0,
                                          dra=self.allocator).start()
        return self.scheduler

    # ------------------------------------------------------------------------------------ queries
    def slices(self, node: str) -> list[dict]:
        items, _rv = self.client.list("resourceslices", field_selector=f"spec.nodeName={node}")
        return items

    def devices(self, node: str) -> dict[str, dict]:
        return {d["name"]: d for s in self.slices(node) for d in s["spec"].get("devices") or []}

    def wait(self, pred: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
        end = time.monotonic() + timeout
        while True:
            try:
                value = pred()
            except Exception:  # noqa: BLE001 - a transient API error counts as "not yet"
                value = None
            if value:
                return value
            if time.monotonic() >= end:
                return value
            time.sleep(interval)

    def pod_phase(self, ns: str, name: str) -> str | None:
        try:
            return (self.client.get_pod(ns, name).get("status") or {}).get("phase")
        except Exception:  # noqa: BLE001
            return None

    def result(self, node: str, ns: str, name: str) -> AdmissionResult | None:
        runner = self.nodes[node].runner
        return runner.results.get(f"{ns}/{name}") if runner else None

    # ------------------------------------------------------------------------------------ objects
    @staticmethod
    def claim(name: str, *, klass: str = DRIVER, memory: str | None = None, cores: str | None = None,
              count: int = 1, selectors: list[str] | None = None, tolerations: list[dict] | None = None,
              namespace: str = "default") -> dict:
        exact: dict[str, Any] = {"deviceClassName": klass, "count": count}
        reqs = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
        if reqs:
            exact["capacity"] = {"requests": reqs}
        if selectors:
            exact["selectors"] = [{"cel": {"expression": e}} for e in selectors]
        if tolerations:
            exact["tolerations"] = tolerations
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exact}]}}}

    def pod(self, name: str, claim: str | None = None, template: str | None = None,
            namespace: str = "default", containers: int = 1) -> dict:
        source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
        ctrs = [{"name": f"c{i}", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
                for i in range(containers)]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "spec": {"schedulerName": self.scheduler_name, "resourceClaims": [{"name": "gpu", **source}],
                         "containers": ctrs}}

    def submit(self, claim: dict | None, pod: dict) -> dict:
        if claim is not None:
            self.client.create("resourceclaims", claim)
        return self.client.create("pods", pod)

    # ------------------------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        for node in self.nodes.values():
            if node.runner is not None:
                node.runner.stop()
            self.stop_driver(node)
            node.kubelet.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

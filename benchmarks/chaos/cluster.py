"""The cluster of one chaos run: the test API server, N simulated GPU nodes (gpusim state, the REAL
``hami-agent device-plugin`` and ``hami-agent monitor`` processes, a SIMULATED kubelet), two REAL
``hami-agent scheduler`` replicas with leader election, and the SIMULATED kube-scheduler sending every
request to either replica (a Service in front of them).

``Cluster`` is a context manager: whatever happens (an exception, SIGTERM, a failed start), ``close()``
stops every process and simulator it started and, as the last resort, SIGKILLs every process that carries
this run's marker (NVML workers included); a FUSE mount of the D-state model is detached.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.api import ChaosApiServer
from benchmarks.chaos.kubelet import GPU, ChaosKubelet, RpcLog
from benchmarks.chaos.procs import RUN_ENV, STOP_TIMEOUT_S, AgentProcess, ProcScanner, kill_run
from hami_agent.k8s.client import KubeClient
from hami_agent.protocol import keys
from hami_agent.scheduler.verbs.leadership import URL_ANNOTATION
from tests.gpusim import gpusim_state as gs
from tests.gpusim.fixtures import BIN_DIR, build_lib
from tests.integration.scheduler.pki import make_pki
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kubelet_objects import gpu_node
from tests.sim.ports import free_port

# the replicas serve TLS (a follower forwards only over https to a leader its CA verifies); the soak's
# own probes only read /readyz, so they do not verify
_PROBE_TLS = ssl.create_default_context()
_PROBE_TLS.check_hostname = False
_PROBE_TLS.verify_mode = ssl.CERT_NONE

REPO = Path(__file__).resolve().parents[2]
LEASE_NS, LEASE_NAME = "kube-system", "hami-scheduler"
START_S = 150.0  # each start-up wait


@dataclass(frozen=True)
class Settings:
    """Every component's knobs in one place (production defaults where a soak can afford them)."""

    gpus_per_node: int = 4
    split: int = 4  # --device-split-count: sharing slots per GPU
    rpc_deadline_s: float = 2.0  # the device plugin's default
    api_timeout_s: float = 1.0  # the device plugin's default
    nvml_call_timeout_s: float = 2.0  # production 5 s: shorter, so a hang is noticed within the soak
    nvml_refresh_s: float = 2.0
    health_recovery_quiet_s: float = 5.0  # production 30 s
    monitor_interval_s: float = 1.0
    max_abandoned_workers: int = 2  # K, the product's default
    lease_s: tuple[float, float, float] = (6.0, 4.0, 1.0)  # duration, renew deadline, retry period
    audit_interval_s: float = 5.0  # production 60 s
    register_interval_s: float = 1.0
    verbosity: int = 3


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=_PROBE_TLS) as r:
            return r.status == 200
    except OSError:
        return False


def tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def wait_for(pred: Any, timeout_s: float, step_s: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step_s)
    return bool(pred())


@dataclass
class Node:
    name: str
    root: Path  # <workdir>/<node>: gpusim state, hook dir, logs
    sock_dir: Path  # short path for unix sockets
    state_path: Path
    plugin: AgentProcess
    monitor: AgentProcess
    kubelet: ChaosKubelet
    kubelet_log: Any

    def set_faults(self, **faults: Any) -> None:
        gs.update_state(self.state_path, lambda s: s.setdefault("faults", {}).update(faults))

    def gpu_uuids(self) -> list[str]:
        return [g["uuid"] for g in gs.read_state(self.state_path)["gpus"]]


@dataclass
class Cluster:
    workdir: Path
    node_names: tuple[str, ...]
    seed: int
    settings: Settings = field(default_factory=Settings)
    run_id: str = ""
    api: ChaosApiServer | None = None
    client: KubeClient | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    extenders: list[AgentProcess] = field(default_factory=list)
    pki: Any = None  # the replicas' CA and serving certificate (tests/integration/scheduler/pki.py)
    extender_urls: list[str] = field(default_factory=list)
    scheduler: KubeSchedulerSim | None = None
    rpc_log: RpcLog = field(default_factory=RpcLog)
    scanner: ProcScanner | None = None
    _tmp: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------------------------ start
    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "agent"), str(REPO),
                                                          env.get("PYTHONPATH", "")]))
        env[RUN_ENV] = self.run_id
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def start(self) -> None:
        self.run_id = self.run_id or f"{os.getpid()}-{self.seed}-{int(time.time())}"
        self.scanner = ProcScanner(self.run_id)
        self.workdir.mkdir(parents=True, exist_ok=True)
        lib = build_lib()
        self.api = ChaosApiServer(history_limit=5_000)
        self.api.start()
        self.client = KubeClient.from_kubeconfig(self.api.kubeconfig_path, timeout_s=5)
        for ns in ("chaos-a", "chaos-b", LEASE_NS):
            if self.api.get("Namespace", None, ns) is None:
                self.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i, name in enumerate(self.node_names):
            self.nodes[name] = self._make_node(i, name, lib)
        for node in self.nodes.values():  # start everything, then wait for all of it (in parallel)
            node.plugin.start()
            node.monitor.start()
            node.kubelet.start()
        (self.workdir / "pki").mkdir(exist_ok=True)
        self.pki = make_pki(self.workdir / "pki")
        for i in range(2):
            self.extenders.append(self._make_extender(i))
        for ext in self.extenders:
            ext.start()
        want = self.settings.gpus_per_node * self.settings.split
        # generous: on a loaded machine ten Python processes importing at once take a while
        for node in self.nodes.values():
            if not node.kubelet.kubelet.wait_registered(GPU, START_S, min_devices=want):
                raise RuntimeError(f"{node.name}: the device plugin did not register {want} devices in "
                                   f"{START_S:g}s (log {node.plugin.log_path})")
        if not wait_for(self._registered_everywhere, START_S):
            raise RuntimeError("the nodes' hami.io/node-nvidia-register annotations did not appear in "
                               f"{START_S:g}s")
        def extenders_ready() -> bool:
            dead = [e.name for e in self.extenders if not e.running()]
            if dead:  # no point waiting out the start-up time for a process that is gone
                raise RuntimeError(f"{dead} exited during start-up:\n{self._extender_diagnosis()}")
            return all(http_ok(u + "/readyz") for u in self.extender_urls)

        if not wait_for(extenders_ready, START_S):
            raise RuntimeError(f"the extender replicas were not ready after {START_S:g}s "
                               f"(logs: {self.workdir}):\n{self._extender_diagnosis()}")
        self.scheduler = KubeSchedulerSim(self.client, list(self.extender_urls), workers=2,
                                          initial_backoff_s=0.5, max_backoff_s=5.0, http_timeout_s=30.0)
        self.scheduler.start()

    def _extender_diagnosis(self) -> str:
        """Why the replicas are not ready, for the error (CI keeps no work directories): each /readyz
        answer, the Lease holder and each log's tail."""
        assert self.api is not None
        lease = self.api.get("Lease", LEASE_NS, LEASE_NAME) or {}
        out = [f"lease holder: {(lease.get('spec') or {}).get('holderIdentity')!r}, annotations: "
               f"{(lease.get('metadata') or {}).get('annotations')}"]
        for url, ext in zip(self.extender_urls, self.extenders, strict=True):
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=2, context=_PROBE_TLS) as r:
                    answer = f"{r.status} {r.read(200)!r}"
            except urllib.error.HTTPError as exc:
                answer = f"{exc.code} {exc.read(200)!r}"
            except OSError as exc:
                answer = f"no answer: {exc}"
            out.append(f"--- {ext.name} {url}/readyz: {answer}; running={ext.running()}; log tail:")
            out.append(tail(ext.log_path, 25))
        return "\n".join(out)

    def _registered_everywhere(self) -> bool:
        assert self.api is not None
        for name in self.node_names:
            node = self.api.get("Node", None, name) or {}
            if not ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER):
                return False
        return True

    def _make_node(self, i: int, name: str, lib: Path) -> Node:
        assert self.api is not None and self.client is not None and self.scanner is not None
        s = self.settings
        root = self.workdir / name
        root.mkdir(parents=True, exist_ok=True)
        sock_dir = Path(tempfile.mkdtemp(prefix=f"chaos{i}-", dir="/tmp"))  # unix socket paths: < 108 bytes
        self._tmp.append(str(sock_dir))
        state = gs.load_profile("a100-80gb-x8")
        state["gpus"] = state["gpus"][: s.gpus_per_node]
        gs.personalize(state, name)  # each node its own UUIDs (the profile's are one machine's)
        for g in state["gpus"]:
            g["processes"] = []
        gs.set_driver_version(state, gs.FIXED_DRIVER)
        state_path = root / "gpusim.json"
        gs.write_state(state_path, state)
        self.api.create(gpu_node(name, {"gpu": "on"}))  # a kubelet's size (tests/sim/kubelet_objects.py)
        env = self._env({"GPUSIM_STATE": str(state_path), "HAMI_NVML_LIBRARY": str(lib),
                         "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
                         "HAMI_NVML_MAX_ABANDONED_WORKERS": str(s.max_abandoned_workers),
                         "HOOK_PATH": str(root / "hook")})
        kubeconfig = self.api.kubeconfig_path
        common = [sys.executable, "-m", "hami_agent"]
        plugin = AgentProcess(
            f"{name}/device-plugin", "device-plugin", name,
            common + ["device-plugin", "-v", str(s.verbosity), "--node-name", name,
                      "--kubeconfig", kubeconfig, "--device-plugin-dir", str(sock_dir),
                      "--metrics-bind", "none",
                      "--device-split-count", str(s.split), "--rpc-deadline", str(s.rpc_deadline_s),
                      "--api-timeout", str(s.api_timeout_s), "--poll-interval", "0.2",
                      "--hook-path", str(root / "hook"), "--vgpu-lock-dir", str(root / "vgpulock"),
                      "--mig-apply-lock", str(root / "mig-apply.lock"),
                      "--health-recovery-quiet", str(s.health_recovery_quiet_s),
                      "--nvml-call-timeout", str(s.nvml_call_timeout_s),
                      "--nvml-refresh-interval", str(s.nvml_refresh_s)],
            env, root / "device-plugin.log", self.scanner)
        monitor = AgentProcess(
            f"{name}/monitor", "monitor", name,
            common + ["monitor", "-v", str(s.verbosity), "--node-name", name, "--kubeconfig", kubeconfig,
                      "--metrics-bind", f"127.0.0.1:{free_port()}",
                      "--dir", str(root / "hook" / "vgpu" / "containers"),
                      "--interval", str(s.monitor_interval_s),
                      "--mig-apply-lock", str(root / "mig-apply.lock")],
            env, root / "monitor.log", self.scanner)
        (root / "hook" / "vgpu" / "containers").mkdir(parents=True, exist_ok=True)
        kubelet_log = open(root / "kubelet.log", "a")  # noqa: SIM115 - closed in close()
        client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=5)
        kubelet = ChaosKubelet(name, sock_dir, client, self.rpc_log, kubelet_log, seed=self.seed * 100 + i)
        return Node(name, root, sock_dir, state_path, plugin, monitor, kubelet, kubelet_log)

    def _make_extender(self, i: int) -> AgentProcess:
        assert self.api is not None and self.scanner is not None
        s = self.settings
        port = free_port()
        # https: the Lease names this URL, whose host (127.0.0.1) is the replica's identity and an IP SAN of
        # its certificate, so a follower verifies the leader it forwards to (issue 27 item 4)
        url = f"https://127.0.0.1:{port}"
        self.extender_urls.append(url)
        lease, renew, retry = s.lease_s
        argv = [sys.executable, "-m", "hami_agent", "scheduler", "-v", str(s.verbosity),
                "--kubeconfig", self.api.kubeconfig_path, "--bind-address", f"127.0.0.1:{port}",
                "--cert-file", self.pki.server.cert, "--key-file", self.pki.server.key,
                "--forward-ca-file", self.pki.ca.cert,
                "--metrics-bind", "", "--register-interval", f"{s.register_interval_s}s",
                "--audit-interval", f"{s.audit_interval_s}s",
                "--leader-elect", "--leader-elect-namespace", LEASE_NS,
                "--leader-elect-lease-duration", f"{lease}s", "--leader-elect-renew-deadline", f"{renew}s",
                "--leader-elect-retry-period", f"{retry}s", "--advertise-url", url]
        return AgentProcess(f"extender-{i}", "extender", "", argv, self._env(),
                            self.workdir / f"extender-{i}.log", self.scanner)

    # ------------------------------------------------------------------------------------ queries
    def agents(self) -> list[AgentProcess]:
        out = list(self.extenders)
        for n in self.nodes.values():
            out += [n.plugin, n.monitor]
        return out

    def leader_index(self) -> int | None:
        """Which replica holds the Lease (from its advertised URL), None while nobody does."""
        assert self.api is not None
        lease = self.api.get("Lease", LEASE_NS, LEASE_NAME) or {}
        if not (lease.get("spec") or {}).get("holderIdentity"):
            return None
        url = ((lease.get("metadata") or {}).get("annotations") or {}).get(URL_ANNOTATION)
        return self.extender_urls.index(url) if url in self.extender_urls else None

    # ------------------------------------------------------------------------------------ stop
    def close(self) -> None:
        """Stop everything; never raises. Order: the scheduler (no new binds), the kubelets, the agents
        (SIGTERM, then SIGKILL), the API server; then anything of this run still alive is SIGKILLed."""
        errors: list[str] = []

        def guard(what: str, fn: Any) -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - clean-up goes on; reported at the end
                errors.append(f"{what}: {exc!r}")

        if self.scheduler is not None:
            guard("kube-scheduler", self.scheduler.stop)
        for node in self.nodes.values():
            guard(f"{node.name} kubelet", node.kubelet.close)
        stoppers = [threading.Thread(target=guard, args=(a.name, lambda a=a: a.stop(signal.SIGTERM)))
                    for a in self.agents()]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(STOP_TIMEOUT_S + 15)
        if self.run_id:
            guard("kill leftovers", lambda: kill_run(self.run_id))
        if self.api is not None:
            guard("api server", self.api.close)
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.kubelet_log.close()
        for d in self._tmp:
            shutil.rmtree(d, ignore_errors=True)
        if errors:
            print("chaos: clean-up problems: " + "; ".join(errors), file=sys.stderr)


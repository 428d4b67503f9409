# Over 500 lines on purpose: the sandbox's one lifecycle (up, agents' placement, down), shared state.
"""Bring the sandbox up and down.

``up``: build what is missing (gpusim, the node image, the dummy apt repo), start the SIMULATED API
server, create the Node objects, start the node containers (systemd, host network), prepare them
(apt source, the seed's driver on gpu-h20), start one SIMULATED kubelet per node, and the scheduler side
(extender + SIMULATED kube-scheduler). ``ensure_agents`` then makes sure every node has a device plugin:
the systemd service site.yml deployed in the container when there is one, otherwise the same agent run
on the host against that node's gpusim state and device-plugin directory ("host mode", reported as such).
``down``: stop every process (by pid file) and remove every sandbox container. Both are idempotent.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox import identities, podman
from sandbox.config import APT_REPO, GPUSIM_DIR, GPUSIM_LIB, IMAGE, REPO, SCHEDULER_PREEMPTION, SandboxConfig
from sandbox.procs import ProcessManager

logger = logging.getLogger("sandbox")

PLUGIN_UNIT = "hami-device-plugin.service"
SCHEDULER_UNIT = "hami-scheduler.service"
APISERVER = "apiserver"
REPLICASET_CONTROLLER = "replicaset-controller"
KUBE_SCHEDULER = "kube-scheduler-sim"
SCHEDULER = "hami-scheduler"


class SandboxError(RuntimeError):
    pass


def kubelet_name(node: str) -> str:
    return f"kubelet-sim-{node}"


def plugin_name(node: str) -> str:
    return f"device-plugin-{node}"


@dataclass
class AgentPlacement:
    """Where each agent component runs: 'container' (systemd unit from site.yml) or 'host'."""

    plugins: dict[str, str] = field(default_factory=dict)
    scheduler: str = ""


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def _env() -> dict[str, str]:
    """PATH with the venv first (ansible-playbook, hami-agent) and PYTHONPATH with the repo root, so the
    simulators (tests.sim.*) and this package import from the checkout."""
    path = f"{_venv_bin()}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    pp = os.environ.get("PYTHONPATH")
    return {"PATH": path, "PYTHONPATH": f"{REPO}:{pp}" if pp else str(REPO)}


def _run(
    argv: list[str],
    timeout_s: float,
    what: str,
    log_file: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, **_env(), **(env or {})},
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{what}: did not finish within {timeout_s:.0f}s") from None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}\n[exit {proc.returncode}]\n")
    return proc


def _stream(
    argv: list[str],
    timeout_s: float,
    what: str,
    log_file: Path,
    env: dict[str, str],
    on_line: Callable[[str], None] | None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` writing its output to ``log_file`` line by line; its process group is killed at the
    deadline (SandboxError)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    expired = threading.Event()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **_env(), **env},
        start_new_session=True,
    )

    def expire() -> None:
        expired.set()
        _kill_group(proc.pid)

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    try:
        with open(log_file, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n")
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                lines.append(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            rc = proc.wait()
            fh.write(f"[exit {rc}]\n")
    except BaseException:
        _kill_group(proc.pid)
        raise
    finally:
        timer.cancel()
    if expired.is_set():
        raise SandboxError(f"{what}: did not finish within {timeout_s:.0f}s (see {log_file})")
    return subprocess.CompletedProcess(argv, rc, "".join(lines), "")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback only
            return 200 <= resp.status < 300
    except OSError:
        return False


class Sandbox:
    def __init__(self, cfg: SandboxConfig, progress: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.procs = ProcessManager(cfg.pids, cfg.logs)
        self.say = progress or (lambda msg: logger.info("%s", msg))
        self.placement = AgentPlacement()

    # ------------------------------------------------------------------------------------ build
    def build(self) -> None:
        """gpusim, the node image and the dummy apt repo; each script is cached and quick when done."""
        steps = [
            (
                "gpusim (simulated libnvidia-ml.so.1)",
                ["make", "--no-print-directory", "-C", str(GPUSIM_DIR)],
                300,
            ),
            ("node image (debootstrap, first time ~1 min)", [str(REPO / "tests/images/build-image.sh")], 900),
            ("dummy NVIDIA apt repo", [str(REPO / "tests/images/build-apt-repo.sh")], 300),
        ]
        for what, argv, timeout in steps:
            self.say(f"build: {what}")
            proc = _run(argv, timeout, f"build {what}", self.cfg.logs / "build.log")
            if proc.returncode != 0:
                raise SandboxError(
                    f"build {what} failed (exit {proc.returncode}); see {self.cfg.logs}/build.log:"
                    f"\n{(proc.stderr or proc.stdout)[-1500:]}"
                )
        if not GPUSIM_LIB.exists():
            raise SandboxError(f"{GPUSIM_LIB} missing after the gpusim build")
        lib = self.cfg.run_dir / "artifacts" / "libvgpu.so"
        src = REPO / "sandbox" / "stub" / "libvgpu_standin.c"
        if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
            self.say("build: stand-in libvgpu.so for the hami_core role (HAMi-core's symbols, no function)")
            lib.parent.mkdir(parents=True, exist_ok=True)
            proc = _run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], 120, "gcc libvgpu.so")
            if proc.returncode != 0:
                raise SandboxError(f"building the stand-in libvgpu.so failed: {proc.stderr.strip()[-800:]}")

    # ------------------------------------------------------------------------------------ helpers
    def ansible(
        self,
        playbook: Path,
        *extra: str,
        limit: str | None = None,
        timeout_s: float = 600,
        log_name: str = "ansible",
        on_line: Callable[[str], None] | None = None,
    ) -> subprocess.CompletedProcess:
        """ansible-playbook against the sandbox inventory, with this checkout as collection hami.node.
        Output goes to ``<run>/logs/<log_name>.log`` as it comes; ``on_line`` sees every line."""
        coll = self.cfg.run_dir / "collections" / "ansible_collections" / "hami"
        coll.mkdir(parents=True, exist_ok=True)
        link = coll / "node"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(REPO)
        inventory = REPO / "inventories" / "sandbox"
        argv = [str(_venv_bin() / "ansible-playbook"), "-i", str(inventory), str(playbook)]
        argv += list(extra)
        if limit:
            argv += ["-l", limit]
        colls = f"{self.cfg.run_dir / 'collections'}:{os.environ.get('ANSIBLE_COLLECTIONS_PATH', '')}"
        env = {
            "ANSIBLE_COLLECTIONS_PATH": colls.rstrip(":"),
            "ANSIBLE_INJECT_FACT_VARS": "False",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_LOCAL_TEMP": str(self.cfg.run_dir / "ansible-tmp"),
            "PYTHONUNBUFFERED": "1",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,hami.node.fleet_account",
            "KUBECONFIG": str(self.cfg.kubeconfig),
            "HAMI_SANDBOX_DIR": str(self.cfg.run_dir),
        }
        log = self.cfg.logs / f"{log_name}.log"
        return _stream(argv, timeout_s, f"ansible-playbook {playbook.name}", log, env, on_line)

    def gpusim(self, node: str, *args: str) -> str:
        proc = _run(
            [
                sys.executable,
                str(GPUSIM_DIR / "bin" / "gpusim"),
                "--state",
                str(self.cfg.gpusim_state(node)),
                *args,
            ],
            30,
            f"gpusim {' '.join(args)}",
        )
        if proc.returncode != 0:
            raise SandboxError(f"gpusim {' '.join(args)} on {node} failed: {proc.stderr.strip()}")
        return proc.stdout

    def gpusim_state(self, node: str) -> dict:
        return json.loads(self.cfg.gpusim_state(node).read_text())

    def write_emulated_procfs(self, node: str) -> Path:
        """SIMULATED /proc/driver/nvidia of a node, from its gpusim state: what the kernel module shows
        without NVML (GPU minors, MIG GPU instances, module version), so doctor can tell a mixed MIG
        layout while NVML hangs. Lives in the bind-mounted /run/gpusim/proc of the node."""
        state = self.gpusim_state(node)
        root = self.cfg.sysfs_dir(node) / "proc" / "driver" / "nvidia"
        shutil.rmtree(root, ignore_errors=True)
        for gpu in state.get("gpus") or []:
            minor = gpu.get("minor_number", gpu["index"])
            bus = str(gpu.get("pci_bus_id", f"0000:{minor:02x}:00.0"))[-12:].lower()
            info = root / "gpus" / bus / "information"
            info.parent.mkdir(parents=True, exist_ok=True)
            info.write_text(
                f"Model: \t\t {gpu.get('name')}\nDevice Minor: \t {minor}\n"
                f"GPU UUID: \t {gpu.get('uuid')}\nBus Location: \t {bus}\n"
            )
            mig = gpu.get("mig") or {}
            if mig.get("current") == 1:
                for gi in mig.get("gpu_instances") or []:
                    (root / "capabilities" / f"gpu{minor}" / "mig" / f"gi{gi['id']}").mkdir(
                        parents=True, exist_ok=True
                    )
        if state.get("module_version"):
            (root / "version").write_text(
                f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {state['module_version']}  (SIMULATED)\n"
            )
        return root

    def kube(self):  # -> KubeClient; imported lazily (kubernetes is slow to import)
        from hami_agent.k8s.client import KubeClient

        return KubeClient.from_kubeconfig(str(self.cfg.kubeconfig), timeout_s=5)

    # ------------------------------------------------------------------------------------ up
    def up(self, agents: bool = True, build: bool = True, provision: bool = False) -> None:
        cfg = self.cfg
        if shutil.which("podman") is None:
            raise SandboxError("podman is not installed: run scripts/install-system-deps.sh (as root)")
        if not (_venv_bin() / "ansible-playbook").exists():
            raise SandboxError(
                f"ansible-playbook not found next to {sys.executable}: run `make setup` and use "
                ".venv/bin/python -m sandbox"
            )
        if build:
            self.build()
        for sub in ("logs", "pids"):
            (cfg.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self._start_apiserver()
        self._init_nodes()
        self._start_containers()
        self.say("nodes: prepare (apt source = the dummy NVIDIA repo; gpu-h20 on the seed's driver)")
        proc = self.ansible(REPO / "sandbox" / "playbooks" / "prepare.yml", log_name="prepare")
        if proc.returncode != 0:
            raise SandboxError(
                f"preparing the nodes failed; see {cfg.logs}/prepare.log:\n{proc.stdout[-2000:]}"
            )
        for node in cfg.nodes:
            self._start_kubelet(node.name)
        self._start_replicaset_controller()
        self.check_alive([kubelet_name(n.name) for n in cfg.nodes] + [REPLICASET_CONTROLLER])
        if provision:
            self.say("nodes: ansible-playbook -i inventories/sandbox playbooks/site.yml (a few minutes)")
            proc = self.ansible(REPO / "playbooks" / "site.yml", log_name="site", timeout_s=2400)
            if proc.returncode != 0:
                raise SandboxError(f"site.yml failed; see {cfg.logs}/site.log:\n{proc.stdout[-2000:]}")
        if agents:
            self.ensure_agents()

    def _start_apiserver(self) -> None:
        cfg = self.cfg
        if self.procs.running(APISERVER) and http_ok(f"{cfg.apiserver_url}/version"):
            self.say(f"apiserver: already running on {cfg.apiserver_url}")
            return
        if not port_free(cfg.apiserver_port):
            raise SandboxError(
                f"port {cfg.apiserver_port} (API server) is in use by another program; free it or "
                "change sandbox_apiserver_port in inventories/sandbox/group_vars/all.yml"
            )
        self.say(f"apiserver: SIMULATED Kubernetes API on {cfg.apiserver_url}")
        self.procs.start(
            APISERVER,
            [
                sys.executable,
                "-m",
                "sandbox.apiserver_main",
                "--port",
                str(cfg.apiserver_port),
                "--kubeconfig",
                str(cfg.kubeconfig),
                *identities.apiserver_args(cfg.run_dir, [n.name for n in cfg.nodes]),
                # pods terminate until their kubelet confirms, so a drain waits as on a real cluster
                "--graceful-deletion",
                "--request-log",
                str(self.request_log),
            ],
            env=_env(),
            cwd=REPO,
        )
        if not podman.wait(
            lambda: http_ok(f"{cfg.apiserver_url}/version") and cfg.kubeconfig.exists(), 20, 0.2
        ):
            raise SandboxError(f"the API server did not start; see {self.procs.log_path(APISERVER)}")

    @property
    def request_log(self) -> Path:
        """Every request the simulated API server received, one JSON line each."""
        return self.cfg.logs / "apiserver-requests.jsonl"

    def _start_replicaset_controller(self) -> None:
        if self.procs.running(REPLICASET_CONTROLLER):
            return
        self.say("controllers: SIMULATED ReplicaSet controller (replaces evicted pods)")
        self.procs.start(
            REPLICASET_CONTROLLER,
            [sys.executable, "-m", "sandbox.replicaset", "--kubeconfig", str(self.cfg.kubeconfig)],
            env=_env(),
            cwd=REPO,
        )

    def _init_nodes(self) -> None:
        cfg = self.cfg
        client = self.kube()
        from hami_agent.k8s.errors import NotFoundError

        for node in cfg.nodes:
            for d in (
                cfg.gpusim_dir(node.name),
                cfg.sysfs_dir(node.name),
                cfg.device_plugin_dir(node.name),
                cfg.hook_dir(node.name) / "vgpu",
                cfg.node_dir(node.name) / "vgpulock",
            ):
                d.mkdir(parents=True, exist_ok=True)
            # doctor on the host reads /sys/module/nvidia/version under --host-root: the emulated sysfs
            for name, target in (("sys", "run/gpusim/sys"), ("proc", "run/gpusim/proc")):
                link = cfg.host_root(node.name) / name
                if not link.is_symlink():
                    link.symlink_to(target)
            if not cfg.gpusim_state(node.name).exists():
                self.gpusim(node.name, "init", "--profile", node.profile, "--node", node.name)
                # the container has no driver until prepare/site.yml installs one (its postinst and the
                # emulated module load fill these in)
                state = self.gpusim_state(node.name)
                state.update({"driver_loaded": False, "module_version": None, "driver_version": None})
                tmp = cfg.gpusim_state(node.name).with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=2) + "\n")
                os.replace(tmp, cfg.gpusim_state(node.name))
            try:
                client.get_node(node.name)
            except NotFoundError:
                client.create(
                    "nodes",
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": node.name,
                            "labels": {
                                "kubernetes.io/hostname": node.name,
                                "gpu": "on",
                                "hami.io/sandbox": "true",
                            },
                        },
                    },
                )
                self.say(f"apiserver: created Node {node.name}")
        client.close()

    def _start_containers(self) -> None:
        cfg = self.cfg
        ours = set(podman.sandbox_containers())
        for name in [cfg.control_node, *(n.name for n in cfg.nodes)]:
            if podman.exists(name) and name not in ours:
                raise SandboxError(
                    f"a container named {name} exists and is not a sandbox container; remove or "
                    "rename it (the sandbox uses the inventory hostnames as container names)"
                )
            if podman.running(name):
                continue
            podman.remove(name)
            volumes: list[tuple[Path | str, str, str]] = []
            if name != cfg.control_node:
                volumes += [
                    (APT_REPO, "/srv/hami-apt", "ro"),
                    (cfg.gpusim_dir(name), "/etc/gpusim", ""),
                    (cfg.sysfs_dir(name), "/run/gpusim", ""),
                    (cfg.device_plugin_dir(name), "/var/lib/kubelet/device-plugins", ""),
                ]
            self.say(f"podman: start node container {name} (systemd, --network host)")
            podman.run_node(name, IMAGE, volumes)
        for name in [cfg.control_node, *(n.name for n in cfg.nodes)]:
            podman.wait_booted(name, 60)

    def check_alive(self, names: list[str], settle_s: float = 1.5) -> None:
        """Fail early, with the log tail, when a process just started has already died."""
        time.sleep(settle_s)
        for name in names:
            if not self.procs.running(name):
                log = self.procs.log_path(name)
                tail = log.read_text()[-1500:] if log.exists() else ""
                raise SandboxError(f"{name} exited right after starting; {log}:\n{tail}")

    def _start_kubelet(self, node: str) -> None:
        if self.procs.running(kubelet_name(node)):
            return
        cfg = self.cfg
        self.say(f"kubelet: SIMULATED kubelet for {node} (device plugins in {cfg.device_plugin_dir(node)})")
        self.procs.start(
            kubelet_name(node),
            [
                sys.executable,
                "-m",
                "sandbox.node_sim",
                "--kubeconfig",
                str(cfg.kubeconfig),
                "--node-name",
                node,
                "--root",
                str(cfg.device_plugin_dir(node)),
                "--results",
                str(cfg.node_dir(node) / "admissions.jsonl"),
                "-v",
                "4",
            ],
            env=_env(),
            cwd=REPO,
        )

    # ------------------------------------------------------------------------------------ agents
    def ensure_agents(self) -> AgentPlacement:
        """Device plugin per node + the scheduler extender + the SIMULATED kube-scheduler."""
        cfg = self.cfg
        for node in cfg.nodes:
            # a deployed unit wins; a host-mode process would hold its port (it restarts every few seconds)
            if podman.running(node.name) and podman.unit_enabled(node.name, PLUGIN_UNIT):
                self.procs.stop(plugin_name(node.name))
                self.placement.plugins[node.name] = "container"
                continue
            self.placement.plugins[node.name] = "host"
            if self.procs.running(plugin_name(node.name)):
                continue
            self._host_hami_core(node.name)
            self.say(
                f"agent: {node.name} has no {PLUGIN_UNIT}; running `hami-agent device-plugin` for it on the "
                "host (host mode)"
            )
            self.procs.start(
                plugin_name(node.name),
                [
                    str(_venv_bin() / "hami-agent"),
                    "device-plugin",
                    "-v",
                    "4",
                    "--node-name",
                    node.name,
                    "--kubeconfig",
                    str(identities.kubeconfig(cfg.run_dir, f"plugin-{node.name}") or cfg.kubeconfig),
                    "--device-plugin-dir",
                    str(cfg.device_plugin_dir(node.name)),
                    "--nvml-lib",
                    str(GPUSIM_LIB),
                    "--metrics-bind",
                    f"127.0.0.1:{node.metrics_port}",
                    "--mig-strategy",
                    node.mig_strategy,
                    "--hook-path",
                    str(cfg.hook_dir(node.name)),
                    "--vgpu-lock-dir",
                    str(cfg.node_dir(node.name) / "vgpulock"),
                    "--mig-apply-lock",
                    str(cfg.node_dir(node.name) / "mig-apply.lock"),
                    "--nvml-call-timeout",
                    "3",
                    "--nvml-refresh-interval",
                    "2",
                ],
                env={**_env(), "GPUSIM_STATE": str(cfg.gpusim_state(node.name)),
                     "HAMI_DRIVER_VERSION_FILE": str(cfg.sysfs_dir(node.name) / "sys/module/nvidia/version")},
                cwd=REPO,
            )
        ctl = cfg.control_node
        if podman.running(ctl) and podman.unit_enabled(ctl, SCHEDULER_UNIT):
            self.procs.stop(SCHEDULER)
            self.placement.scheduler = "container"
        else:
            self.placement.scheduler = "host"
            if not self.procs.running(SCHEDULER):
                self.say(
                    f"agent: {ctl} has no {SCHEDULER_UNIT}; running `hami-agent scheduler` on the host "
                    "(host mode)"
                )
                self.procs.start(
                    SCHEDULER,
                    [
                        str(_venv_bin() / "hami-agent"),
                        "scheduler",
                        "-v",
                        "4",
                        "--kubeconfig",
                        str(identities.kubeconfig(cfg.run_dir, "scheduler") or cfg.kubeconfig),
                        "--bind-address",
                        f"127.0.0.1:{cfg.scheduler_port}",
                        "--metrics-bind",
                        f"127.0.0.1:{cfg.scheduler_metrics_port}",
                        "--register-interval",
                        "2",
                        "--node-scheduler-policy",
                        "spread",
                        "--preemption",
                        SCHEDULER_PREEMPTION,
                    ],
                    env=_env(),
                    cwd=REPO,
                )
        if not podman.wait(lambda: http_ok(f"{cfg.scheduler_url}/healthz"), 30):
            raise SandboxError(
                f"the scheduler extender does not answer {cfg.scheduler_url}/healthz; see "
                f"{self.procs.log_path(SCHEDULER)}"
            )
        if not self.procs.running(KUBE_SCHEDULER):
            self.say("kube-scheduler: SIMULATED kube-scheduler calling the extender's /filter and /bind")
            self.procs.start(
                KUBE_SCHEDULER,
                [
                    sys.executable,
                    "-m",
                    "tests.sim.kube_scheduler",
                    "--kubeconfig",
                    str(cfg.kubeconfig),
                    "--extender",
                    cfg.scheduler_url,
                    "--initial-backoff",
                    "0.5",
                    "--max-backoff",
                    "4",
                    # the role's KubeSchedulerConfiguration names the preemptVerb when preemption is on
                    *(["--preempt-verb", "preempt"] if SCHEDULER_PREEMPTION != "off" else []),
                ],
                env=_env(),
                cwd=REPO,
            )
        return self.placement

    def _host_hami_core(self, node: str) -> None:
        """Host mode: what the hami_core role installs on a node (stand-in libvgpu.so + ld.so.preload),
        under the node's host-root view."""
        vgpu = self.cfg.hook_dir(node) / "vgpu"
        vgpu.mkdir(parents=True, exist_ok=True)
        lib = self.cfg.run_dir / "artifacts" / "libvgpu.so"
        if lib.exists():
            shutil.copyfile(lib, vgpu / "libvgpu.so")
        (vgpu / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")

    def restart_plugin(self, node: str) -> None:
        """Restart node's device plugin wherever it runs (like `systemctl restart hami-device-plugin`)."""
        if self.placement.plugins.get(node) == "container":
            podman.exec_(node, ["systemctl", "restart", PLUGIN_UNIT], timeout_s=60)
        else:
            self.procs.stop(plugin_name(node))
            self.ensure_agents()

    # ------------------------------------------------------------------------------------ down
    def down(self) -> list[str]:
        order = [
            KUBE_SCHEDULER,
            REPLICASET_CONTROLLER,
            SCHEDULER,
            *(plugin_name(n.name) for n in self.cfg.nodes),
            *(kubelet_name(n.name) for n in self.cfg.nodes),
            APISERVER,
        ]
        stopped = self.procs.stop_all(order)
        removed = []
        # only containers carrying the sandbox label: a container of the same name made by someone else stays
        for name in podman.sandbox_containers():
            if podman.remove(name):
                removed.append(name)
        # node state (gpusim, admissions) starts fresh next time: the API server's data is gone too
        shutil.rmtree(self.cfg.run_dir / "nodes", ignore_errors=True)
        self.cfg.kubeconfig.unlink(missing_ok=True)
        return stopped + [f"container {n}" for n in sorted(removed)]

    def status(self) -> dict:
        cfg = self.cfg
        return {
            "run_dir": str(cfg.run_dir),
            "processes": {n: self.procs.pid(n) for n in self.procs.names()},
            "containers": {n: podman.running(n) for n in [cfg.control_node, *(x.name for x in cfg.nodes)]},
            "apiserver": http_ok(f"{cfg.apiserver_url}/version"),
            "scheduler": http_ok(f"{cfg.scheduler_url}/healthz"),
            "plugins": {n.name: http_ok(f"http://127.0.0.1:{n.metrics_port}/healthz") for n in cfg.nodes},
        }


def wait_for(pred: Callable[[], bool], timeout_s: float, interval_s: float = 0.5) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if pred():
                return True
        except Exception:  # noqa: BLE001 - a transient API error is a "not yet"
            pass
        time.sleep(interval_s)
    return False

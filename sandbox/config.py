"""Sandbox settings: node names, profiles and ports come from the inventory (one source of truth)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "inventories" / "sandbox"
DEFAULT_RUN_DIR = Path(os.environ.get("HAMI_SANDBOX_DIR", "/var/tmp/hami-sandbox"))
IMAGE = os.environ.get("HAMI_TEST_IMAGE", "localhost/hami-node-test:bookworm")
GPUSIM_DIR = REPO / "tests" / "gpusim"
GPUSIM_LIB = GPUSIM_DIR / "build" / "libnvidia-ml.so.1"
APT_REPO = Path(os.environ.get("HAMI_APT_REPO", REPO / "tests" / "images" / "build" / "apt-repo"))
CONTAINER_LABEL = "io.hami-node.sandbox=1"
# GPU preemption in the sandbox (demo step g), ON unless HAMI_SANDBOX_PREEMPTION=0 (or false/no/off). The
# switch sets the extender's --preemption as hami_scheduler_preemption in
# inventories/sandbox/group_vars/all.yml does for the control node's unit (the host-mode extender and the
# RBAC the simulated API server starts with follow this), and adds step g to the demo.
PREEMPTION_ENV = "HAMI_SANDBOX_PREEMPTION"
PREEMPTION_ON = (os.environ.get(PREEMPTION_ENV) or "1").strip().lower() not in ("0", "false", "no", "off")
SCHEDULER_PREEMPTION = "extender" if PREEMPTION_ON else "off"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class GpuNode:
    name: str  # inventory hostname = container name = Kubernetes node name
    profile: str  # gpusim profile
    initial_driver: str  # "" = no driver installed at start
    metrics_port: int  # device plugin /metrics + /healthz on 127.0.0.1
    mig_strategy: str


@dataclass(frozen=True)
class SandboxConfig:
    run_dir: Path
    apiserver_port: int
    scheduler_port: int
    scheduler_metrics_port: int
    control_node: str
    nodes: tuple[GpuNode, ...]
    extra: dict = field(default_factory=dict)

    # -- paths on the host
    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def pids(self) -> Path:
        return self.run_dir / "pids"

    def node_dir(self, node: str) -> Path:
        return self.run_dir / "nodes" / node

    def gpusim_dir(self, node: str) -> Path:
        """Bind-mounted at /etc/gpusim in the node: the simulated GPUs' state."""
        return self.node_dir(node) / "etc-gpusim"

    def gpusim_state(self, node: str) -> Path:
        return self.gpusim_dir(node) / "state.json"

    def sysfs_dir(self, node: str) -> Path:
        """Bind-mounted at /run/gpusim in the node: the emulated sysfs (loaded module version)."""
        return self.node_dir(node) / "hostroot" / "run" / "gpusim"

    def host_root(self, node: str) -> Path:
        """A view of the node's filesystem for `hami-agent doctor --host-root` run on the host."""
        return self.node_dir(node) / "hostroot"

    def device_plugin_dir(self, node: str) -> Path:
        """Bind-mounted at /var/lib/kubelet/device-plugins: the kubelet simulator's socket dir."""
        return self.node_dir(node) / "device-plugins"

    def hook_dir(self, node: str) -> Path:
        """HAMi-core's hook path for a host-mode device plugin (<host-root>/usr/local, so doctor's
        --host-root view finds libvgpu.so where a node has it)."""
        return self.host_root(node) / "usr" / "local"

    @property
    def scheduler_url(self) -> str:
        return f"http://127.0.0.1:{self.scheduler_port}"

    @property
    def apiserver_url(self) -> str:
        return f"http://127.0.0.1:{self.apiserver_port}"

    def node(self, name: str) -> GpuNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"no GPU node {name!r} in {INVENTORY / 'hosts.yml'}")

    def all_ports(self) -> list[int]:
        return [
            self.apiserver_port,
            self.scheduler_port,
            self.scheduler_metrics_port,
            *(n.metrics_port for n in self.nodes),
        ]


def _port(text: str, what: str) -> int:
    try:
        return int(str(text).rsplit(":", 1)[-1])
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not HOST:PORT; fix it in {INVENTORY}") from None


def load(run_dir: Path | None = None, inventory: Path = INVENTORY) -> SandboxConfig:
    """Read the sandbox inventory (hosts.yml + group_vars/all.yml)."""
    hosts_file = inventory / "hosts.yml"
    try:
        hosts = yaml.safe_load(hosts_file.read_text())
        allvars = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the sandbox inventory: {exc}") from exc
    children = (hosts.get("all") or {}).get("children") or {}
    gpu_hosts = ((children.get("gpu_nodes") or {}).get("hosts")) or {}
    control_hosts = ((children.get("hami_scheduler") or {}).get("hosts")) or {}
    if not gpu_hosts:
        raise ConfigError(f"{hosts_file}: group gpu_nodes has no hosts")
    if len(control_hosts) != 1:
        raise ConfigError(f"{hosts_file}: group hami_scheduler must have exactly one host")
    nodes = []
    for name, host_vars in gpu_hosts.items():
        hv = host_vars or {}
        for key in ("sandbox_gpusim_profile", "hami_agent_metrics_port"):
            if key not in hv:
                raise ConfigError(f"{hosts_file}: host {name} needs {key}")
        nodes.append(
            GpuNode(
                name=name,
                profile=hv["sandbox_gpusim_profile"],
                initial_driver=str(hv.get("sandbox_initial_driver") or ""),
                metrics_port=int(hv["hami_agent_metrics_port"]),
                mig_strategy=hv.get("hami_agent_mig_strategy", "mixed"),
            )
        )
    control, cv = next(iter(control_hosts.items()))
    cv = cv or {}
    cfg = SandboxConfig(
        run_dir=Path(run_dir or DEFAULT_RUN_DIR),
        apiserver_port=int(allvars.get("sandbox_apiserver_port", 16443)),
        scheduler_port=int(cv.get("hami_scheduler_port", 18080)),
        scheduler_metrics_port=_port(cv.get("hami_scheduler_metrics_bind", "127.0.0.1:19395"), "metrics"),
        control_node=control,
        nodes=tuple(nodes),
        extra=allvars,
    )
    # the kubelet simulator listens on <run>/nodes/<node>/device-plugins/kubelet.sock: unix socket paths
    # are limited to 107 bytes (sun_path)
    longest = max(
        (cfg.device_plugin_dir(n.name) / "kubelet.sock" for n in cfg.nodes), key=lambda p: len(str(p))
    )
    if len(str(longest).encode()) > 107:
        raise ConfigError(
            f"run directory {cfg.run_dir} is too long: the kubelet socket {longest} exceeds the "
            "107-byte unix socket limit; use a shorter --run-dir / HAMI_SANDBOX_DIR"
        )
    ports = cfg.all_ports()
    dup = sorted({p for p in ports if ports.count(p) > 1})
    if dup:
        raise ConfigError(
            f"{hosts_file}: port(s) {dup} used twice; every node shares the host network, "
            "so each needs its own ports"
        )
    return cfg

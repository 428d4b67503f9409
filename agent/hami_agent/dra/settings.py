"""Typed options of the DRA driver (flags + agent config merged by ``cmd``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from hami_agent.config import DEFAULT_DRA_DRIVER, DraPartition
from hami_agent.protocol import keys

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_STATE_DIR = "/var/lib/hami/dra"
UNHEALTHY_EFFECTS = ("NoSchedule", "NoExecute")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SettingsError(ValueError):
    """Invalid option combination; the message names the option and the fix."""


@dataclass
class DraSettings:
    node_name: str = ""
    driver_name: str = DEFAULT_DRA_DRIVER
    partition: DraPartition = field(default_factory=lambda: DraPartition(all=True))
    # kubelet plugin sockets: <plugins_dir>/<driver>/dra.sock, <plugins_registry_dir>/<driver>-reg.sock
    plugins_dir: str = DEFAULT_PLUGINS_DIR
    plugins_registry_dir: str = DEFAULT_PLUGINS_REGISTRY_DIR
    # what the kubelet dials (differs from plugins_dir only when the driver runs in a container)
    kubelet_plugins_dir: str | None = None
    cdi_dir: str = DEFAULT_CDI_DIR
    state_dir: str = DEFAULT_STATE_DIR
    # HAMi-core (the same files and env as the device plugin's Allocate)
    hook_path: str = field(default_factory=lambda: os.environ.get("HOOK_PATH", "/usr/local"))
    vgpu_lock_dir: str = "/tmp/vgpulock"
    device_memory_scaling: float = 1.0
    pre_configured_device_memory: int = 0  # MiB for GPUs whose memory NVML cannot report
    lib_cuda_log_level: str = ""
    disable_core_limit: bool = False
    plugin_version: str = ""
    # timing: the kubelet gives NodePrepareResources 45 s; we answer from memory well within that
    rpc_deadline_s: float = 5.0
    api_timeout_s: float = 2.0  # cap of the one claim lookup a prepare may make on a cache miss
    rpc_reply_margin_s: float = 0.1
    commit_margin_s: float = 0.25  # least budget left to start writing CDI specs and the checkpoint
    rpc_workers: int = 8
    poll_interval_s: float = 0.25
    health_recovery_quiet_s: float = 30.0
    unhealthy_effect: str = "NoSchedule"
    first_snapshot_wait_s: float = 3.0
    publish_retry_max_s: float = 30.0
    mig_apply_lock: str = keys.MIG_APPLY_LOCK_PATH

    @property
    def plugin_socket(self) -> str:
        return os.path.join(self.plugins_dir, self.driver_name, "dra.sock")

    @property
    def kubelet_plugin_socket(self) -> str:
        """The endpoint sent to the kubelet in GetInfo (its view of the plugin socket)."""
        return os.path.join(self.kubelet_plugins_dir or self.plugins_dir, self.driver_name, "dra.sock")

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.plugins_registry_dir, f"{self.driver_name}-reg.sock")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.state_dir, "checkpoint.json")

    def validate(self) -> None:
        if not self.node_name:
            raise SettingsError("node name is empty: set --node-name or the NODE_NAME env (spec.nodeName "
                                "via the downward API)")
        if len(self.driver_name) > 63 or not _DNS_SUBDOMAIN.match(self.driver_name):
            raise SettingsError(f"--driver-name {self.driver_name!r}: use a lower-case DNS subdomain of at "
                                "most 63 characters, e.g. gpu.hami.io")
        if self.partition.empty:
            raise SettingsError(f"no GPU of node {self.node_name} is assigned to the DRA driver: set "
                                "dra.devices (all, or {index: [...]} / {uuid: [...]}) or a dra.nodes entry "
                                "for this node in --config")
        if self.unhealthy_effect not in UNHEALTHY_EFFECTS:
            raise SettingsError(f"--unhealthy-taint-effect {self.unhealthy_effect!r}: use one of "
                                f"{', '.join(UNHEALTHY_EFFECTS)}")
        if self.rpc_deadline_s <= 0 or self.api_timeout_s <= 0:
            raise SettingsError("--rpc-deadline and --api-timeout must be positive")
        if self.api_timeout_s >= self.rpc_deadline_s:
            raise SettingsError(f"--api-timeout ({self.api_timeout_s}s) must be shorter than --rpc-deadline "
                                f"({self.rpc_deadline_s}s), or a claim lookup could outlive the RPC")
        if self.rpc_deadline_s >= 45.0:
            raise SettingsError(f"--rpc-deadline ({self.rpc_deadline_s}s) must be shorter than the kubelet's "
                                "45 s NodePrepareResources timeout")
        if not 0 < self.rpc_reply_margin_s < self.commit_margin_s < self.rpc_deadline_s:
            raise SettingsError("--rpc-deadline must leave room for the commit and reply margins")
        if self.device_memory_scaling <= 0:
            raise SettingsError("deviceMemoryScaling must be > 0")

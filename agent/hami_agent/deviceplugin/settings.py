"""Typed options of the device plugin (flags + agent config merged by ``cmd``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hami_agent.protocol import keys

DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

MODE_HAMI_CORE = keys.MODE_HAMI_CORE
MODE_MPS = keys.MODE_MPS
MODE_MIG = keys.MODE_MIG  # dynamic MIG (HAMi v2.10): instances created at Allocate
MODES = (MODE_HAMI_CORE, MODE_MPS, MODE_MIG)
MIG_STRATEGIES = ("none", "single", "mixed")
REGISTRATION_MODES = ("kubelet", "plugin-watcher")


class SettingsError(ValueError):
    """Invalid option combination; the message names the option and the fix."""


@dataclass
class PluginSettings:
    node_name: str = ""
    device_plugin_dir: str = DEFAULT_DEVICE_PLUGIN_DIR
    resource_name: str = keys.RESOURCE_COUNT
    mode: str = MODE_HAMI_CORE
    mig_strategy: str = "none"
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    enable_numa_topology: bool = False
    filter_uuids: tuple[str, ...] = ()
    filter_indexes: tuple[int, ...] = ()
    # HAMi-core mounts: H = hook path (HAMi's HOOK_PATH, chart /usr/local)
    hook_path: str = field(default_factory=lambda: os.environ.get("HOOK_PATH", "/usr/local"))
    vgpu_lock_dir: str = "/tmp/vgpulock"  # host side of the /tmp/vgpulock mount
    lib_cuda_log_level: str = ""
    disable_core_limit: bool = False
    plugin_version: str = ""  # libvgpu.so.<version> preferred when present
    # MPS
    mps_root: str = "/run/nvidia/mps"
    mps_control_bin: str = "nvidia-cuda-mps-control"
    # timing
    rpc_deadline_s: float = 2.0
    api_timeout_s: float = 1.0  # cap of one lookup on an RPC path (the remaining budget may be less)
    late_write_timeout_s: float = 5.0  # per attempt of a background write (lock release, failure record)
    rpc_reply_margin_s: float = 0.1  # kept free at the end of an RPC's budget to send the answer
    commit_margin_s: float = 0.25  # least budget left to start Allocate's success write
    register_dial_timeout_s: float = 5.0
    poll_interval_s: float = 0.25
    health_recovery_quiet_s: float = 30.0
    first_snapshot_wait_s: float = 3.0
    # registration
    registration_mode: str = "kubelet"
    plugins_registry_dir: str = DEFAULT_PLUGINS_REGISTRY_DIR
    # operability
    mig_apply_lock: str = keys.MIG_APPLY_LOCK_PATH
    mig_apply_lock_permissive: bool = False  # HAMi's rule: any file at the path pauses (hami_agent.miglock)
    max_server_restarts: int = 5
    restart_window_s: float = 3600.0
    rpc_workers: int = 8
    # dynamic MIG (mode mig)
    mig_reconcile_interval_s: float = 5.0  # HAMi's reconciler period
    mig_nvml_timeout_s: float = 10.0  # NVML deadline of discovery, listing and destroy (not Allocate's)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.device_plugin_dir, KUBELET_SOCKET)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise SettingsError(f"--mode {self.mode!r} is not supported; use one of {', '.join(MODES)}")
        if self.mig_strategy not in MIG_STRATEGIES:
            raise SettingsError(
                f"--mig-strategy {self.mig_strategy!r} is not supported; "
                f"use one of {', '.join(MIG_STRATEGIES)}")
        if self.mode == MODE_MIG and self.mig_strategy != "none":
            raise SettingsError(
                "operatingmode mig creates MIG instances per pod; static MIG resources cannot be served "
                f"beside it: use --mig-strategy none (got {self.mig_strategy!r})")
        if self.mode == MODE_MPS and self.mig_strategy != "none":
            raise SettingsError(
                "MPS sharing is not supported on MIG devices: --mode mps needs --mig-strategy none "
                f"(got {self.mig_strategy!r})")
        if self.registration_mode not in REGISTRATION_MODES:
            raise SettingsError(f"--registration {self.registration_mode!r}: use one of "
                                f"{', '.join(REGISTRATION_MODES)}")
        if "/" not in self.resource_name:
            raise SettingsError(f"resource name {self.resource_name!r} must be domain-prefixed, "
                                "e.g. nvidia.com/gpu")
        if not 1 <= self.device_split_count <= 99:
            raise SettingsError(f"deviceSplitCount {self.device_split_count} must be between 1 and 99 "
                                "(replica IDs are <UUID>-<i> and must stay within 63 characters)")
        if self.rpc_deadline_s <= 0 or self.api_timeout_s <= 0:
            raise SettingsError("--rpc-deadline and --api-timeout must be positive")
        if not 0 < self.rpc_reply_margin_s < self.commit_margin_s < self.rpc_deadline_s:
            raise SettingsError(f"--rpc-deadline ({self.rpc_deadline_s}s) must be longer than the "
                                f"{self.commit_margin_s}s an Allocate needs left to start its success write "
                                f"(and that longer than the {self.rpc_reply_margin_s}s kept to answer)")
        if self.api_timeout_s >= self.rpc_deadline_s:
            raise SettingsError(f"--api-timeout ({self.api_timeout_s}s) must be shorter than --rpc-deadline "
                                f"({self.rpc_deadline_s}s), or API calls could outlive the RPC")
        if self.mode == MODE_MPS and self.device_split_count < 2:
            raise SettingsError("MPS mode needs deviceSplitCount >= 2 (replicas per GPU)")

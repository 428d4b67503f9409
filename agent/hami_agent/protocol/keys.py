"""Annotation, label and resource name constants of HAMi's NVIDIA protocol (Project-HAMi/HAMi
``pkg/util/types.go``, ``pkg/device/nvidia/device.go``, ``pkg/util/nodelock/nodelock.go``)."""

from __future__ import annotations

# --- node annotations (§1) ---------------------------------------------------------------------------
NODE_REGISTER = "hami.io/node-nvidia-register"
# NVIDIA's handshake key has no "-nvidia" suffix (other vendors use e.g. hami.io/node-handshake-dcu).
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_SCORE = "hami.io/node-nvidia-score"
NODE_LOCK = "hami.io/mutex.lock"
DEVICE_CORDON = "hami.io/device-cordon"

# --- pod annotations and labels (§2) -------------------------------------------------------------------
VGPU_NODE = "hami.io/vgpu-node"  # also set as a pod label with the same key
VGPU_TIME = "hami.io/vgpu-time"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
# GPU preemption (hami.node, issue 29; not HAMi's): the capacity the extender holds for a preemptor while its
# victims terminate (JSON: node, devices, victims, priority, deadline); removed by the assignment patch
PREEMPTION_HOLD = "hami.io/preemption-hold"
WEBHOOK_IGNORE_LABEL = "hami.io/webhook"  # value "ignore" on a pod or namespace
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

# bind phases written to BIND_PHASE
BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"
BIND_PHASES = (BIND_PHASE_ALLOCATING, BIND_PHASE_SUCCESS, BIND_PHASE_FAILED)

# --- pod annotations read by the scheduler (§3.3) ------------------------------------------------------
USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
USE_GPUUUID = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
NUMA_BIND = "nvidia.com/numa-bind"
VGPU_MODE = "nvidia.com/vgpu-mode"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"

# --- default resource names (§3.1; configurable in the nvidia: section of the device config) ------------
RESOURCE_COUNT = "nvidia.com/gpu"
RESOURCE_MEMORY = "nvidia.com/gpumem"
RESOURCE_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
RESOURCE_CORES = "nvidia.com/gpucores"
RESOURCE_PRIORITY = "nvidia.com/priority"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

# --- vendor words --------------------------------------------------------------------------------------
# The "common word" used as the device type in pod-device strings and requests.
NVIDIA_DEVICE = "NVIDIA"
# The device plugin's operating modes (per-node "operatingmode").
MODE_HAMI_CORE = "hami-core"
MODE_MIG = "mig"
MODE_MPS = "mps"
MODES = (MODE_HAMI_CORE, MODE_MIG, MODE_MPS)

# --- misc paths/values shared by the plugin and tools ---------------------------------------------------
# The MIG apply lock: NVML users pause while it exists (``hami_agent.miglock``). HAMi's path is on /tmp,
# private inside its container but shared by every local user on a host; the agent (and the roles) use a
# root-owned directory instead. HAMi's path stays usable with --mig-apply-lock (and, where /tmp is private,
# --mig-apply-lock-permissive).
MIG_APPLY_LOCK_PATH = "/run/hami/mig-apply.lock"
HAMI_MIG_APPLY_LOCK_PATH = "/tmp/hami/hami-mig-apply.lock"


def mig_resource_name(profile: str) -> str:
    """Kubelet resource name of a statically partitioned MIG profile (mixed strategy), e.g.
    ``mig_resource_name("1g.10gb") == "nvidia.com/mig-1g.10gb"``."""
    return MIG_RESOURCE_PREFIX + profile


def mig_profile_from_resource(resource: str) -> str | None:
    """Inverse of :func:`mig_resource_name`; ``None`` when ``resource`` is not a MIG resource."""
    if resource.startswith(MIG_RESOURCE_PREFIX) and len(resource) > len(MIG_RESOURCE_PREFIX):
        return resource[len(MIG_RESOURCE_PREFIX):]
    return None

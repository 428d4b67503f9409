"""Data model of the scheduler: per-device usage, requests, per-pod allocations.

Kept separate from ``hami_agent.protocol``'s wire dataclasses because these objects are mutable
scratch state copied many times per /filter; ``__slots__`` keeps copies cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hami_agent.protocol.devices import MigPlacement, MigProfile
from hami_agent.protocol.keys import NVIDIA_DEVICE as NVIDIA
from hami_agent.protocol.requests import PERCENTAGE_UNSET as PCT_UNSET
from hami_agent.protocol.requests import memory_for_request

PREEMPT_LOWER = "PreemptLowerPriority"  # spec.preemptionPolicy's default
PREEMPT_NEVER = "Never"
DEFAULT_GRACE_S = 30  # spec.terminationGracePeriodSeconds's default


@dataclass(slots=True)
class DeviceUsage:
    """One physical GPU on a node with the usage of the pods placed on it (HAMi ``DeviceUsage``)."""

    id: str
    index: int
    type: str
    count: int  # split count (time-slicing slots)
    totalmem: int  # MiB
    totalcore: int  # 100 = whole GPU
    numa: int = 0
    health: bool = True
    mode: str = ""
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()  # dynamic MIG: profiles and legal placements (register)
    score: float = 0.0
    mig_used: tuple[MigPlacement, ...] = ()  # placements reserved by the pods on this GPU
    mig_faults: int = 0  # pods whose MIG reservations contradict this GPU's mode: unhealthy while > 0

    def clone(self) -> DeviceUsage:
        return DeviceUsage(self.id, self.index, self.type, self.count, self.totalmem, self.totalcore,
                           self.numa, self.health, self.mode, self.used, self.usedmem, self.usedcores,
                           self.mig_profiles, self.score, self.mig_used, self.mig_faults)

    @property
    def healthy(self) -> bool:
        """Registered health, and no pod's MIG reservation says the GPU's instances are missing."""
        return self.health and self.mig_faults == 0


@dataclass(frozen=True, slots=True)
class ContainerDeviceRequest:
    """What one container asks of one device type (HAMi ``ContainerDeviceRequest``): the fields of
    ``protocol.ContainerRequest`` that change the fit, without the container name (memo key)."""

    nums: int
    type: str = NVIDIA
    memreq: int = 0  # MiB per device, 0 = not given
    mem_percentage: int = PCT_UNSET
    coresreq: int = 0

    def memory_for(self, totalmem: int) -> int:
        """MiB this request takes on a device with ``totalmem`` MiB (the protocol's rule, §3.1)."""
        return memory_for_request(self.memreq, self.mem_percentage, totalmem)


@dataclass(frozen=True, slots=True)
class Picked:
    """A device chosen for a container: the pod-device string record ``uuid,NVIDIA,mem,cores``; on a
    dynamic-MIG GPU also the MIG profile and placement reserved for it (``hami.io/vgpu-mig-allocations``)."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int
    mig_profile: str = ""
    mig_placement: MigPlacement | None = None


@dataclass(frozen=True)
class PodRequest:
    """All device requests of a pod: one entry per container, init containers first."""

    containers: tuple[ContainerDeviceRequest | None, ...]
    n_init: int
    mig: tuple[tuple[str, int], ...] = ()  # (profile, count) from nvidia.com/mig-<profile>

    @property
    def empty(self) -> bool:
        return not self.mig and all(c is None or c.nums <= 0 for c in self.containers)


@dataclass(slots=True)
class DeviceAmount:
    """Collapsed usage of one pod on one physical GPU (Project-HAMi/HAMi ``pkg/device/pods.go``)."""

    slots: int = 0
    mem: int = 0
    cores: int = 0


@dataclass
class PodUsage:
    """A pod in the usage cache, keyed by UID."""

    uid: str
    namespace: str
    name: str
    node: str
    devices: dict[str, DeviceAmount] = field(default_factory=dict)
    mig: tuple[tuple[str, int], ...] = ()  # static MIG resources (nvidia.com/mig-<profile>)
    # dynamic MIG: placements reserved per GPU UUID (hami.io/vgpu-mig-allocations), and GPUs whose
    # reservations contradict their mode ("*": a reservation names a GPU the node does not have)
    mig_alloc: dict[str, tuple[MigPlacement, ...]] = field(default_factory=dict)
    # What preemption reads (issue 29; kube-scheduler's ``corev1helpers.PodPriority``: spec.priority, 0
    # when unset): priority, spec.preemptionPolicy, the start time upstream orders victims by
    # (``util.GetPodStartTime``: status.startTime, else creationTimestamp; epoch seconds, 0 unknown), the
    # grace period a DELETE gives it, and whether it is terminating already (deletionTimestamp set).
    priority: int = 0
    preemption_policy: str = PREEMPT_LOWER
    created: float = 0.0
    started: float = 0.0
    grace_s: int = DEFAULT_GRACE_S
    terminating: bool = False
    bound: bool = False  # spec.nodeName set: only bound pods are victims (a /bind under way is not)

    def same_usage(self, other: PodUsage) -> bool:
        """Whether both count the same devices on the same node (the informer's echo of a decision)."""
        return (self.node, self.devices, self.mig, self.mig_alloc) == (
            other.node, other.devices, other.mig, other.mig_alloc)

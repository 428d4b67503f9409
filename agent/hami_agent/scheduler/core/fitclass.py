"""Node classes for one request: nodes that must get the same fit result, so that a pod that fits nowhere
costs one fit per class instead of one per node (docs/scheduler.md "Why /filter stays fast at 5,000 nodes").

Two keys, both pure functions of (node state, request):

* the verdict key (one asking container, no MIG-mode GPU, no UUID lists, no static MIG resource): HAMi's
  ``Fit`` (``fit.fit_devices``) counts one reason per refused device and, when the node fails, the devices
  that passed (``AllocatedCardsInsufficientRequest``, or ``NumaNotFit`` per NUMA group under numa-bind;
  topology-aware keeps every passing device and reads the pair scores only once enough passed). The order
  of the walk (by device score) does not change those counts, so the failure
  is a function of the multiset of per-device verdicts (with the NUMA node under numa-bind, where the
  sort keeps each NUMA node's devices together). A device's verdict is ``fit_devices`` itself on that one
  device, memoised by the device's ``device_profile`` (every field ``fit_devices`` reads but the UUID).
* ``state_key`` (any other case): the node's whole state but the UUIDs (cordons as per-device flags),
  cached on the node until it changes.

Only a failure is shared between the nodes of a class (a fit names its node's GPUs), and only when its
reason names none of the representative's GPUs (``shareable``).
"""

from __future__ import annotations

from dataclasses import replace

from hami_agent.protocol import reasons as R
from hami_agent.scheduler.core.fit import _NVIDIA_LOWER, NodeFit, PodContext, fit_devices
from hami_agent.scheduler.core.model import NVIDIA, ContainerDeviceRequest, DeviceUsage, PodRequest
from hami_agent.scheduler.core.nodes import NodeState

_NOT_NVIDIA = "-"  # verdict of a device the fit does not consider (another vendor's type)
_PASS = "+"


def device_profile(d: DeviceUsage, cordoned: bool) -> str:
    """Everything ``fit_devices`` reads of a device except its UUID, as a string (its hash is cached, so
    memo lookups per request cost no re-hashing). Computed when the node changes (``UsageCache._touch``)."""
    return (f"{d.numa}|{d.healthy}|{cordoned}|{d.type}|{d.mode}|{d.count}|{d.used}|{d.totalmem}|"
            f"{d.usedmem}|{d.totalcore}|{d.usedcores}")


def node_profiles(st: NodeState) -> tuple[str, ...]:
    cordoned = st.extras.cordoned
    return tuple(device_profile(d, d.id in cordoned) for d in st.devices)


def verdict_request(preq: PodRequest, ctx: PodContext) -> ContainerDeviceRequest | None:
    """The one container whose per-device verdicts decide a failure, or None when the verdict key does not
    apply to this request."""
    asking = [c for c in preq.containers if c is not None and c.nums > 0]
    if len(asking) != 1 or asking[0].type != NVIDIA or preq.mig:
        return None
    if ctx.use_uuids or ctx.nouse_uuids:
        return None
    if ctx.numa_bind and ctx.gpu_policy == ("mutex",):
        return None  # that sort orders by use before NUMA: NUMA groups are not contiguous
    return asking[0]


def device_verdict(d: DeviceUsage, req: ContainerDeviceRequest, ctx: PodContext,
                   cordoned: frozenset[str]) -> str:
    """What ``fit_devices`` makes of this one device: ``_PASS`` or the reason it refuses it."""
    if _NVIDIA_LOWER not in d.type.lower():
        return _NOT_NVIDIA
    reasons: dict[str, int] = {}
    # asking for 2 on one device: a device that passes is reported as AllocatedCardsInsufficientRequest
    fit_devices([d], replace(req, nums=2), ctx, _Cordons(cordoned), None, reasons=reasons)  # type: ignore[arg-type]
    (reason,) = reasons
    return _PASS if reason == R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST else reason


class _Cordons:
    """The ``extras`` ``fit_devices`` reads for a failure: the cordoned UUIDs only."""

    __slots__ = ("cordoned",)

    def __init__(self, cordoned: frozenset[str]) -> None:
        self.cordoned = cordoned


def state_key(st: NodeState) -> str:
    """The node's state but its UUIDs, as a string (equal strings, equal states; its hash is cached);
    "" when UUIDs repeat on the node (the MIG check matches picks by UUID): no class. A GPU's MIG profile
    list enters by identity (the devices hold it, so equal ids are the same list while both live): its
    repr would cost ~100 us a node; the usage cache shares one object per distinct list."""
    if len(st.by_id) != len(st.devices):
        return ""
    cordoned = st.extras.cordoned
    return repr((tuple((d.index, d.type, d.count, d.totalmem, d.totalcore, d.numa, d.health, d.mode, d.used,
                   d.usedmem, d.usedcores, id(d.mig_profiles), d.mig_used, d.mig_faults, d.id in cordoned)
                  for d in st.devices),
            tuple(sorted(st.mig_capacity.items())), tuple(sorted(st.mig_used.items()))))


def shareable(r: NodeFit, st: NodeState) -> bool:
    """A class member's result may stand for the whole class: a failure whose texts name no GPU."""
    if r.ok:
        return False
    return not any(d.id in r.reason or d.id in r.detail for d in st.devices)

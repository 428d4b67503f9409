"""The kubelet's device manager: device health per resource, allocation decisions, the checkpoint.

Model of kubernetes ``pkg/kubelet/cm/devicemanager/manager.go`` (``ManagerImpl``), function by function
(names in comments). What a device plugin can observe follows the real code, in particular:

* ``devicesToAllocate``: container restart / kubelet restart short cuts, then the registration and health
  checks in the real order and with the real error texts, then devices reusable from init containers
  (no GetPreferredAllocation at all when they suffice), then **GetPreferredAllocation whenever the plugin's
  options offer it** -- also when exactly as many devices are free as needed -- with ``available`` = free
  healthy devices plus those already picked, ``must_include`` = those already picked, ``size`` = the
  container's whole request. The answer is not validated: it is intersected with the free devices and
  any shortfall is filled arbitrarily (Go map order: random here too, seeded);
* ``allocateContainerResources``: one Allocate per container and resource, no deadline; an answer with no
  ``container_responses`` is refused ("no containers return in allocation response ..."), extra ones are
  ignored and the first is cached for the container; the checkpoint is written after each container;
* ``PluginDisconnected`` marks every device of the resource Unhealthy and stops its endpoint, which
  ``GetCapacity`` forgets ``endpointStopGracePeriod`` later; ``readCheckpoint`` restores allocations and,
  until the plugin registers again, a stopped endpoint with no healthy devices.

The topology manager is modelled with its default policy ``none`` (no NUMA hint: ``filterByAffinity``
puts every device in its third, "no affinity" list).
"""

from __future__ import annotations

import math
import os
import random
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from hami_agent.deviceplugin.api import api_pb2
from tests.sim.kubelet import checkpoint
from tests.sim.kubelet.endpoint import ENDPOINT_STOP_GRACE_PERIOD_S, Endpoint, EndpointStopped
from tests.sim.kubelet.klog import KlogWriter, go_quote, rpc_error_text
from tests.sim.kubelet.pod_devices import NODE_WITHOUT_TOPOLOGY, PodDevices
from tests.sim.kubelet.registration import ConnectError, PluginClient

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


class AllocationError(Exception):
    """An error of ``Allocate``; admission wraps it: "Allocate failed due to %v, which is unexpected"."""


def quantity_value(q: Any) -> int:
    """``resource.Quantity.Value()``: the quantity rounded up to an integer; 0 when unparsable."""
    m = _QUANTITY.match(str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        return 0
    return math.ceil(float(m.group(1)) * _SUFFIX[m.group(2)])


def allocate_response_text(resp: Any) -> str:
    """``%v`` of an empty ``*AllocateResponse`` (the gogo-generated ``String()`` of the v1beta1 API)."""
    assert not resp.container_responses  # only ever printed for the empty answer
    return "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"


@dataclass
class EndpointInfo:
    e: Endpoint
    opts: Any | None  # DevicePluginOptions from GetDevicePluginOptions; None when restored from a checkpoint
    updates: int = 0  # ListAndWatch lists received for the resource since this endpoint connected


class DeviceManager:
    def __init__(
        self,
        root: str,
        log: KlogWriter,
        *,
        rng: random.Random,
        active_pods: Callable[[], set[str]],
        sources_ready: Callable[[], bool],
        container_running: Callable[[str, str], bool],
        grace_period_s: float = ENDPOINT_STOP_GRACE_PERIOD_S,
    ) -> None:
        self.root = root
        self.log = log
        self.rng = rng
        self.active_pods = active_pods
        self.sources_ready = sources_ready
        self.container_running = container_running
        self.grace_period_s = grace_period_s
        # the manager's mutex; waiters (tests) are woken on every change
        self.cond = threading.Condition(threading.Lock())
        self.endpoints: dict[str, EndpointInfo] = {}
        self.all_devices: dict[str, dict[str, Any]] = {}
        self.healthy: dict[str, set[str]] = {}
        self.unhealthy: dict[str, set[str]] = {}
        self.allocated: dict[str, set[str]] = {}
        self.pod_devices = PodDevices()
        self.devices_to_reuse: dict[str, dict[str, set[str]]] = {}

    # ---------------------------------------------------------------------------------- plugin events
    def cleanup_plugin_directory(self, directory: str) -> None:
        """``CleanupPluginDirectory``: remove every socket but keep the checkpoint and anything else."""
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if name == checkpoint.CHECKPOINT_FILE:
                continue
            try:
                st = os.stat(path)
            except OSError as exc:
                self.log.error_s("manager.go:213", "Failed to stat file", exc, path=path)
                continue
            if stat.S_ISDIR(st.st_mode) or not stat.S_ISSOCK(st.st_mode):
                continue
            try:
                os.unlink(path)
            except OSError as exc:
                self.log.error_s("manager.go:222", "Failed to remove file", exc, path=path)

    def plugin_connected(self, resource: str, client: PluginClient) -> None:
        """``PluginConnected``: GetDevicePluginOptions (no deadline), then a new endpoint."""
        try:
            options = client.api.GetDevicePluginOptions(api_pb2.Empty())
        except grpc.RpcError as exc:
            raise ConnectError(f"failed to get device plugin options: {rpc_error_text(exc)}") from None
        with self.cond:
            self.endpoints[resource] = EndpointInfo(Endpoint(resource, client.api, client.socket), options)
            self.cond.notify_all()
        self.log.log(2, "manager.go:244", "Device plugin connected", resourceName=resource)

    def plugin_disconnected(self, resource: str) -> None:
        """``PluginDisconnected``: every device Unhealthy, the endpoint stopped (grace period starts)."""
        with self.cond:
            info = self.endpoints.get(resource)
            if info is None:
                return
            self._mark_resource_unhealthy(resource)
            self.log.log(
                2, "manager.go:256", "Endpoint became unhealthy", resourceName=resource, endpoint=str(info.e)
            )
            info.e.set_stop_time()
            self.cond.notify_all()

    def plugin_list_and_watch_receiver(self, resource: str, resp: Any) -> None:
        self._generic_device_update_callback(resource, list(resp.devices))

    def _generic_device_update_callback(self, resource: str, devices: list[Any]) -> None:
        with self.cond:
            self.healthy[resource] = set()
            self.unhealthy[resource] = set()
            self.all_devices[resource] = {}
            for d in devices:
                self.all_devices[resource][d.ID] = d
                (self.healthy if d.health == "Healthy" else self.unhealthy)[resource].add(d.ID)
            healthy = len(self.healthy[resource])
            info = self.endpoints.get(resource)
            if info is not None:
                info.updates += 1
            self.cond.notify_all()
        self.write_checkpoint()
        self.log.log(
            2,
            "manager.go:320",
            "Processed device updates for resource",
            resourceName=resource,
            totalCount=len(devices),
            healthyCount=healthy,
        )

    def _mark_resource_unhealthy(self, resource: str) -> None:
        self.log.log(2, "manager.go:410", "Mark all resources Unhealthy for resource", resourceName=resource)
        moved = self.healthy.get(resource, set())
        self.healthy[resource] = set()
        self.unhealthy[resource] = self.unhealthy.get(resource, set()) | moved

    # ---------------------------------------------------------------------------------- capacity
    def get_capacity(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        """``GetCapacity``: (capacity, allocatable, resources dropped after their grace period)."""
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        deleted: set[str] = set()
        with self.cond:
            for table, is_healthy in ((self.healthy, True), (self.unhealthy, False)):
                for resource, devices in list(table.items()):
                    info = self.endpoints.get(resource)
                    if info is None or info.e.stop_grace_period_expired(self.grace_period_s):
                        self.endpoints.pop(resource, None)
                        del table[resource]
                        deleted.add(resource)
                    else:
                        capacity[resource] = capacity.get(resource, 0) + len(devices)
                        if is_healthy:
                            allocatable[resource] = len(devices)
        if deleted:
            self.write_checkpoint()
        return capacity, allocatable, sorted(deleted)

    # ---------------------------------------------------------------------------------- checkpoint
    def write_checkpoint(self) -> None:
        with self.cond:
            registered = {res: sorted(devs) for res, devs in self.healthy.items()}
            entries = self.pod_devices.to_checkpoint_data() or None  # Go: a nil slice when empty
        try:
            checkpoint.write(self.root, checkpoint.CheckpointData(entries, registered))
        except OSError as exc:
            self.log.error_s("manager.go:480", "Failed to write checkpoint file", exc)
            return
        self.log.log(4, "manager.go:483", "Checkpoint file written", checkpoint=checkpoint.CHECKPOINT_FILE)

    def read_checkpoint(self) -> str | None:
        """``readCheckpoint``; returns the error the kubelet would log and continue after."""
        try:
            data = checkpoint.read(self.root)
        except checkpoint.CheckpointError as exc:
            if str(exc) == checkpoint.ERR_NOT_FOUND:
                self.log.error_s(
                    "manager.go:493",
                    "Failed to read data from checkpoint",
                    exc,
                    checkpoint=checkpoint.CHECKPOINT_FILE,
                )
                return None
            return str(exc)
        with self.cond:
            self.pod_devices.from_checkpoint_data(data.entries or [])
            self.allocated = self.pod_devices.devices()
            for resource in data.registered:
                # capacity stays zero until the plugin registers again
                self.healthy[resource] = set()
                self.unhealthy[resource] = set()
                self.endpoints[resource] = EndpointInfo(Endpoint(resource, None, stopped=True), None)
            self.cond.notify_all()
        self.log.log(
            4, "manager.go:509", "Read data from checkpoint file", checkpoint=checkpoint.CHECKPOINT_FILE
        )
        return None

    # ---------------------------------------------------------------------------------- allocation
    def update_allocated_devices(self) -> None:
        """``UpdateAllocatedDevices``: free the devices of pods no longer active (once sources are ready)."""
        active = self.active_pods()
        if not self.sources_ready():
            return
        with self.cond:
            gone = self.pod_devices.pods() - active
            if not gone:
                return
            self.log.log(3, "manager.go:531", "Pods to be removed", podUIDs=sorted(gone))
            self.pod_devices.delete(gone)
            self.allocated = self.pod_devices.devices()
            self.cond.notify_all()

    def is_device_plugin_resource(self, resource: str) -> bool:
        with self.cond:
            return resource in self.healthy or resource in self.allocated

    def allocate(self, pod: dict, container: dict) -> None:
        """``Allocate(pod, container)``; raises ``AllocationError``."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        name = container.get("name", "")
        for other in [u for u in self.devices_to_reuse if u != uid]:
            del self.devices_to_reuse[other]
        reuse = self.devices_to_reuse.setdefault(uid, {})
        for init in (pod.get("spec") or {}).get("initContainers") or []:
            if init.get("name") == name:
                self._allocate_container_resources(pod, container, reuse)
                with self.cond:
                    if init.get("restartPolicy") == "Always":  # a sidecar keeps its devices
                        self.pod_devices.remove_container_allocated_resources(uid, name, reuse)
                    else:
                        self.pod_devices.add_container_allocated_resources(uid, name, reuse)
                return
        self._allocate_container_resources(pod, container, reuse)
        with self.cond:
            self.pod_devices.remove_container_allocated_resources(uid, name, reuse)

    def _allocate_container_resources(self, pod: dict, container: dict, reuse: dict[str, set[str]]) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        name = container.get("name", "")
        limits = list(((container.get("resources") or {}).get("limits") or {}).items())
        self.rng.shuffle(limits)  # a Go map: no order
        updated = needs_checkpoint = False
        for resource, qty in limits:
            needed = quantity_value(qty)
            self.log.log(
                3, "manager.go:773", "Looking for needed resources", needed=needed, resourceName=resource
            )
            if not self.is_device_plugin_resource(resource):
                continue
            if not updated:
                self.update_allocated_devices()
                updated = True
            chosen = self._devices_to_allocate(uid, name, resource, needed, reuse.get(resource, set()))
            if not chosen:
                continue
            needs_checkpoint = True
            with self.cond:
                info = self.endpoints.get(resource)
                if info is None:
                    self.allocated = self.pod_devices.devices()
                    raise AllocationError(f"unknown Device Plugin {resource}")
            devs = sorted(chosen)
            self.rng.shuffle(devs)  # sets.UnsortedList()
            self.log.log(
                3,
                "manager.go:819",
                "Making allocation request for device plugin",
                devices=devs,
                resourceName=resource,
            )
            try:
                resp = info.e.allocate(devs)
            except (grpc.RpcError, EndpointStopped) as exc:
                with self.cond:
                    self.allocated = self.pod_devices.devices()
                raise AllocationError(rpc_error_text(exc)) from None
            if len(resp.container_responses) == 0:
                raise AllocationError(
                    f"no containers return in allocation response {allocate_response_text(resp)}"
                )
            with self.cond:
                per_numa: dict[int, list[str]] = {}
                for dev in chosen:
                    d = self.all_devices.get(resource, {}).get(dev)
                    nodes = [n.ID for n in d.topology.nodes] if d is not None else []
                    for node in nodes or [NODE_WITHOUT_TOPOLOGY]:
                        per_numa.setdefault(node, []).append(dev)
                self.pod_devices.insert(uid, name, resource, per_numa, resp.container_responses[0])
                self.cond.notify_all()
        if needs_checkpoint:
            self.write_checkpoint()

    def _devices_to_allocate(
        self, uid: str, container: str, resource: str, required: int, reusable: set[str]
    ) -> set[str] | None:
        """``devicesToAllocate``: the IDs to send to Allocate, None when no call is needed."""
        with self.cond:
            needed = required
            devices = self.pod_devices.container_devices(uid, container, resource)
            if devices is not None:
                self.log.log(
                    3,
                    "manager.go:548",
                    "Found pre-allocated devices for resource on pod",
                    resourceName=resource,
                    containerName=container,
                    podUID=uid,
                    devices=sorted(devices),
                )
                needed -= len(devices)
                if needed != 0:
                    raise AllocationError(
                        f"pod {go_quote(uid)} container {go_quote(container)} changed request "
                        f"for resource {go_quote(resource)} from {len(devices)} to {required}"
                    )
            if not self.sources_ready() and self.container_running(uid, container):
                self.log.log(
                    3,
                    "manager.go:572",
                    "Container detected running, nothing to do",
                    deviceNumber=needed,
                    resourceName=resource,
                    podUID=uid,
                    containerName=container,
                )
                return None
            self.log.log(
                3,
                "manager.go:577",
                "Need devices to allocate for pod",
                deviceNumber=needed,
                resourceName=resource,
                podUID=uid,
                containerName=container,
            )
            healthy = self.healthy.get(resource)
            if healthy is None:
                raise AllocationError(f"cannot allocate unregistered device {resource}")
            if not healthy:
                raise AllocationError(
                    f"no healthy devices present; cannot allocate unhealthy devices {resource}"
                )
            if devices is not None and not devices <= healthy:
                raise AllocationError(
                    "previously allocated devices are no longer healthy; cannot allocate "
                    f"unhealthy devices {resource}"
                )
            if needed == 0:
                self.log.log(
                    3,
                    "manager.go:598",
                    "No devices needed, nothing to do",
                    deviceNumber=needed,
                    resourceName=resource,
                    podUID=uid,
                    containerName=container,
                )
                return None
            picked: set[str] = set()

            def allocate_remaining_from(candidates: set[str]) -> bool:
                nonlocal needed
                in_use = self.allocated.setdefault(resource, set())
                order = sorted(candidates - picked)  # sorted first: the seed alone decides the order
                self.rng.shuffle(order)
                for dev in order:
                    in_use.add(dev)
                    picked.add(dev)
                    needed -= 1
                    if needed == 0:
                        return True
                return False

            if allocate_remaining_from(reusable):
                return picked
            available = self.healthy.get(resource, set()) - self.allocated.get(resource, set())
            if len(available) < needed:
                raise AllocationError(
                    f"requested number of devices unavailable for {resource}. "
                    f"Requested: {needed}, Available: {len(available)}"
                )
            preferred = self._call_get_preferred_allocation(
                uid, container, resource, available | picked, picked, required
            )
            if allocate_remaining_from(preferred & available) or allocate_remaining_from(available):
                return picked
            raise AllocationError(
                "unexpectedly allocated less resources than required. "
                f"Requested: {required}, Got: {required - needed}"
            )

    def _call_get_preferred_allocation(
        self, uid: str, container: str, resource: str, available: set[str], must_include: set[str], size: int
    ) -> set[str]:
        """``callGetPreferredAllocationIfAvailable``; called holding the mutex, released around the RPC."""
        info = self.endpoints.get(resource)
        if info is None:
            raise AllocationError(f"endpoint not found in cache for a registered resource: {resource}")
        if info.opts is None or not info.opts.get_preferred_allocation_available:
            self.log.log(
                5,
                "manager.go:950",
                "Plugin options indicate to skip GetPreferredAllocation for resource",
                resourceName=resource,
                podUID=uid,
                containerName=container,
            )
            return set()
        avail = sorted(available)
        self.rng.shuffle(avail)
        error: str | None = None
        self.cond.release()
        try:
            self.log.log(
                4,
                "manager.go:956",
                "Issuing a GetPreferredAllocation call for container",
                containerName=container,
                podUID=uid,
            )
            resp = info.e.get_preferred_allocation(avail, sorted(must_include), size)
        except (grpc.RpcError, EndpointStopped) as exc:
            error = rpc_error_text(exc)
        finally:
            self.cond.acquire()
        if error is not None:
            raise AllocationError(f"device plugin GetPreferredAllocation rpc failed with err: {error}")
        return set(resp.container_responses[0].deviceIDs) if resp.container_responses else set()

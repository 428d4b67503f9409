"""Which devices each pod's containers hold, with the Allocate answer each got.

Model of kubernetes ``pkg/kubelet/cm/devicemanager/pod_devices.go`` (``podDevices``): pod UID ->
container -> resource -> (device IDs per NUMA node, cached ``ContainerAllocateResponse``). Not locked on
its own: the device manager calls it under its mutex, as the real one does.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami_agent.deviceplugin.api import api_pb2
from tests.sim.kubelet.checkpoint import PodDevicesEntry

NODE_WITHOUT_TOPOLOGY = -1


@dataclass
class DeviceAllocateInfo:
    devices_per_numa: dict[int, list[str]]
    alloc_resp: api_pb2.ContainerAllocateResponse | None

    @property
    def device_ids(self) -> set[str]:
        return {d for ids in self.devices_per_numa.values() for d in ids}


class PodDevices:
    def __init__(self) -> None:
        self._pods: dict[str, dict[str, dict[str, DeviceAllocateInfo]]] = {}

    def pods(self) -> set[str]:
        return set(self._pods)

    def has_pod(self, uid: str) -> bool:
        return uid in self._pods

    def insert(
        self,
        uid: str,
        container: str,
        resource: str,
        devices_per_numa: dict[int, list[str]],
        resp: api_pb2.ContainerAllocateResponse | None,
    ) -> None:
        self._pods.setdefault(uid, {}).setdefault(container, {})[resource] = DeviceAllocateInfo(
            {k: list(v) for k, v in devices_per_numa.items()}, resp
        )

    def delete(self, uids: set[str] | list[str]) -> None:
        for uid in uids:
            self._pods.pop(uid, None)

    def container_devices(self, uid: str, container: str, resource: str) -> set[str] | None:
        info = self._pods.get(uid, {}).get(container, {}).get(resource)
        return None if info is None else info.device_ids

    def container_resources(self, uid: str, container: str) -> dict[str, DeviceAllocateInfo]:
        return dict(self._pods.get(uid, {}).get(container, {}))

    def add_container_allocated_resources(self, uid: str, container: str, into: dict[str, set[str]]) -> None:
        for resource, info in self._pods.get(uid, {}).get(container, {}).items():
            into[resource] = into.get(resource, set()) | info.device_ids

    def remove_container_allocated_resources(
        self, uid: str, container: str, into: dict[str, set[str]]
    ) -> None:
        for resource, info in self._pods.get(uid, {}).get(container, {}).items():
            into[resource] = into.get(resource, set()) - info.device_ids

    def devices(self) -> dict[str, set[str]]:
        """Devices in use per resource (entries without an Allocate answer do not count)."""
        out: dict[str, set[str]] = {}
        for containers in self._pods.values():
            for resources in containers.values():
                for resource, info in resources.items():
                    out.setdefault(resource, set())
                    if info.alloc_resp is not None:
                        out[resource] |= info.device_ids
        return out

    def to_checkpoint_data(self) -> list[PodDevicesEntry]:
        entries = []
        for uid, containers in sorted(self._pods.items()):
            for container, resources in sorted(containers.items()):
                for resource, info in sorted(resources.items()):
                    if info.alloc_resp is None:
                        continue  # "Can't marshal allocResp ...: allocation response is missing"
                    entries.append(
                        PodDevicesEntry(
                            uid,
                            container,
                            resource,
                            {k: sorted(v) for k, v in info.devices_per_numa.items()},
                            info.alloc_resp.SerializeToString(),
                        )
                    )
        return entries

    def from_checkpoint_data(self, entries: list[PodDevicesEntry]) -> None:
        for e in entries:
            resp = api_pb2.ContainerAllocateResponse()
            try:
                resp.ParseFromString(e.alloc_resp or b"")
            except Exception:  # "Can't unmarshal allocResp": the entry is skipped
                continue
            self.insert(e.pod_uid, e.container_name, e.resource_name, e.device_ids or {}, resp)

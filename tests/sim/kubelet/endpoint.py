"""One registered device plugin as the device manager sees it: the RPCs it makes, and its stop time.

Model of kubernetes ``pkg/kubelet/cm/devicemanager/endpoint.go`` (``endpointImpl``): GetPreferredAllocation
and Allocate go out with ``context.Background()`` (no deadline: the seed-003 stall), a stopped endpoint
(its plugin disconnected, or not re-registered since a kubelet restart) refuses every call, and it is
forgotten ``endpointStopGracePeriod`` (5 minutes) after it stopped.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from hami_agent.deviceplugin.api import api_pb2

ENDPOINT_STOP_GRACE_PERIOD_S = 300.0  # endpointStopGracePeriod, pkg/kubelet/cm/devicemanager/types.go


class EndpointStopped(Exception):
    """``errEndpointStopped``: "endpoint %v has been stopped"."""


class Endpoint:
    def __init__(self, resource: str, api: Any | None, socket: str = "", stopped: bool = False) -> None:
        self.resource = resource
        self.api = api  # DevicePluginStub; None for an endpoint restored from the checkpoint
        self.socket = socket
        self._lock = threading.Lock()
        self._stop_time: float | None = time.monotonic() if stopped else None

    def __str__(self) -> str:
        # Go prints the *endpointImpl struct here; its pointer values are meaningless in a simulator
        return f"&{{resourceName:{self.resource} socket:{self.socket}}}"

    def is_stopped(self) -> bool:
        with self._lock:
            return self._stop_time is not None

    def set_stop_time(self, when: float | None = None) -> None:
        with self._lock:
            self._stop_time = time.monotonic() if when is None else when

    def stop_grace_period_expired(self, grace_s: float) -> bool:
        with self._lock:
            return self._stop_time is not None and time.monotonic() - self._stop_time > grace_s

    def _check(self) -> None:
        if self.is_stopped() or self.api is None:
            raise EndpointStopped(f"endpoint {self} has been stopped")

    def get_preferred_allocation(self, available: list[str], must_include: list[str], size: int) -> Any:
        self._check()
        return self.api.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must_include,
                        allocation_size=size,
                    )
                ]
            )
        )  # no deadline

    def allocate(self, devices: list[str]) -> Any:
        self._check()
        return self.api.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=devices)]
            )
        )  # no deadline

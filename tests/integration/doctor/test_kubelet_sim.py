"""The stall detector against the simulated kubelet's own log, with a device plugin whose
GetPreferredAllocation never returns (the seed-003 mechanism), and with one that answers."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from tests.integration.doctor.helpers import codes, run_doctor
from tests.sim.kubelet import SimulatedKubelet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RESOURCE = "nvidia.com/gpu"
DEVICES = ("GPU-aaaaaaaa-0000-0000-0000-000000000000-0", "GPU-aaaaaaaa-0000-0000-0000-000000000000-1")


class StubPlugin(api_pb2_grpc.DevicePluginServicer):
    """A minimal device plugin; with ``hang`` its GetPreferredAllocation blocks like a plugin stuck in
    nvmlInit (until the test releases it)."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.release = threading.Event()
        self.updates: queue.Queue = queue.Queue()

    def _devices(self):
        return [api_pb2.Device(ID=d, health="Healthy") for d in DEVICES]

    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):  # noqa: N802
        yield api_pb2.ListAndWatchResponse(devices=self._devices())
        while context.is_active() and not self.release.is_set():
            try:
                self.updates.get(timeout=0.1)
            except queue.Empty:
                continue
            yield api_pb2.ListAndWatchResponse(devices=self._devices())

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        if self.hang:
            self.release.wait(30)
        req = request.container_requests[0]
        ids = list(req.available_deviceIDs)[: req.allocation_size]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids)])

    def Allocate(self, request, context):  # noqa: N802
        return api_pb2.AllocateResponse(container_responses=[
            api_pb2.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-aaaaaaaa"})
            for _ in request.container_requests])


@pytest.mark.parametrize("hang", [True, False])
def test_stall_detected_in_simulated_kubelet_log(tmp_path: Path, capsys, hang: bool) -> None:
    # unix socket paths are limited to 108 bytes: pytest's tmp_path is too deep
    root = Path(tempfile.mkdtemp(prefix="doctor-dp-", dir="/tmp"))
    request_cleanup = shutil.rmtree
    log_path = tmp_path / "kubelet.log"
    snapshot = tmp_path / "kubelet-snapshot.log"
    plugin = StubPlugin(hang)
    server = grpc.server(cf.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    sock = root / "stub.sock"
    with open(log_path, "w", encoding="utf-8") as stream:
        # the kubelet wipes the plugin directory on start: the plugin binds its socket afterwards
        kubelet = SimulatedKubelet(str(root), verbosity=4, stream=stream).start()
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        try:
            with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as ch:
                api_pb2_grpc.RegistrationStub(ch).Register(api_pb2.RegisterRequest(
                    version="v1beta1", endpoint=sock.name, resource_name=RESOURCE,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=10)
            assert kubelet.wait_registered(RESOURCE, timeout=10, min_devices=2)
            uid = str(uuid.uuid4())
            pod = {"metadata": {"name": "trainer", "namespace": "default", "uid": uid},
                   "spec": {"containers": [{"name": "main", "resources": {"limits": {RESOURCE: "1"}}}]}}
            result = kubelet.admit(pod, timeout=1.0)
            assert (result is None) is hang  # a hanging plugin blocks admission
            time.sleep(0.3)
            plugin.updates.put(1)  # the kubelet keeps logging in other threads: later lines exist
            assert kubelet.wait_for(lambda: len(kubelet.log.grep("State pushed")) >= 2, timeout=5)
            # what an operator reads while the plugin still hangs
            snapshot.write_text("\n".join(kubelet.log.lines) + "\n", encoding="utf-8")
        finally:
            plugin.release.set()
            kubelet.wait_for(lambda: bool(kubelet.log.grep("Making allocation request")), timeout=10)
            kubelet.close()  # stop() leaves the admission thread waiting forever
            server.stop(0)
            request_cleanup(root, ignore_errors=True)
    rc, report = run_doctor(capsys, "logs", "--kubelet", str(snapshot), "--stall-after", "0.2")
    if hang:
        assert rc == 1 and codes(report) == ["KUBELET_DEVICE_MANAGER_STALL"]
        assert report["facts"]["kubelet.stall.pod_uid"] == uid
        assert report["facts"]["kubelet.stall.container"] == "main"
        assert report["facts"]["kubelet.stall.resource"] == RESOURCE
    else:
        assert rc == 0 and codes(report) == []
        assert report["facts"]["kubelet.answered_calls"] == 1
    # the full log, written after the test released the plugin, shows the call answered in the end
    _rc, full = run_doctor(capsys, "logs", "--kubelet", str(log_path), "--stall-after", "0.2")
    assert "KUBELET_DEVICE_MANAGER_STALL" not in codes(full)

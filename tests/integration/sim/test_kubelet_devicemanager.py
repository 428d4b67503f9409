"""The SIMULATED kubelet behaves like kubernetes' device manager where a plugin can tell the difference.

Each test drives the simulator with a small scripted plugin over real gRPC sockets and checks one rule of
``pkg/kubelet/cm/devicemanager`` (manager.go ``devicesToAllocate`` / ``allocateContainerResources`` /
``readCheckpoint`` / ``GetCapacity``, plugin/v1beta1 ``server.go`` / ``handler.go``), with its error text.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from tests.sim.kubelet import SimulatedKubelet, is_extended_resource_name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
RES = "example.com/dev"


class ScriptedPlugin(api_pb2_grpc.DevicePluginServicer):
    """Serves ``ids``; records every GetPreferredAllocation / Allocate request it gets."""

    def __init__(
        self,
        ids: list[str],
        *,
        preferred: bool = True,
        gpa: Callable[[object], list[str]] | None = None,
        alloc: Callable[[object], object] | None = None,
    ) -> None:
        self.ids = ids
        self.options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=preferred)
        self.gpa, self.alloc = gpa, alloc
        self.gpa_calls: list[tuple[list[str], list[str], int]] = []
        self.alloc_calls: list[list[str]] = []
        self.done = threading.Event()

    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        return self.options

    def ListAndWatch(self, request, context):  # noqa: N802
        yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health="Healthy") for i in self.ids])
        while context.is_active() and not self.done.wait(0.05):
            pass

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        r = request.container_requests[0]
        self.gpa_calls.append(
            (sorted(r.available_deviceIDs), sorted(r.must_include_deviceIDs), r.allocation_size)
        )
        ids = self.gpa(r) if self.gpa else sorted(r.available_deviceIDs)[: r.allocation_size]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids)]
        )

    def Allocate(self, request, context):  # noqa: N802
        self.alloc_calls.append(sorted(request.container_requests[0].devices_ids))
        if self.alloc:
            return self.alloc(request)
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"IDS": ",".join(sorted(r.devices_ids))})
                for r in request.container_requests
            ]
        )


@pytest.fixture
def root() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kl-", dir="/tmp")  # unix socket paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def serve(root):
    servers: list[tuple[grpc.Server, ScriptedPlugin]] = []

    def start(
        plugin: ScriptedPlugin,
        kubelet: SimulatedKubelet,
        endpoint: str = "dev.sock",
        version: str = "v1beta1",
        resource: str = RES,
    ) -> None:
        server = grpc.server(cf.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{os.path.join(root, endpoint)}")
        server.start()
        servers.append((server, plugin))
        with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as ch:
            api_pb2_grpc.RegistrationStub(ch).Register(
                api_pb2.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource),
                timeout=15,
            )

    yield start
    for server, plugin in servers:
        plugin.done.set()
        server.stop(0)


@pytest.fixture
def kubelet(root) -> Iterator[SimulatedKubelet]:
    k = SimulatedKubelet(root, verbosity=5).start()
    yield k
    k.close()


def pod(name: str, *requests: int, init: tuple[int, ...] = ()) -> dict:
    def ctr(prefix: str, i: int, n: int) -> dict:
        return {"name": f"{prefix}{i}", "resources": {"limits": {RES: str(n)}}}

    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "initContainers": [ctr("init", i, n) for i, n in enumerate(init)],
            "containers": [ctr("app", i, n) for i, n in enumerate(requests)],
        },
    }


def ready(kubelet: SimulatedKubelet, n: int, after: int = 0) -> None:
    assert kubelet.wait_registered(RES, 5, min_devices=n, after=after)


def test_get_preferred_allocation_is_called_even_when_exactly_the_needed_devices_are_free(kubelet, serve):
    plugin = ScriptedPlugin(["d0", "d1"])
    serve(plugin, kubelet)
    ready(kubelet, 2)
    assert kubelet.admit(pod("p", 2), timeout=10).admitted
    assert plugin.gpa_calls == [(["d0", "d1"], [], 2)]
    assert plugin.alloc_calls == [["d0", "d1"]]


def test_get_preferred_allocation_is_skipped_when_the_options_do_not_offer_it(kubelet, serve):
    plugin = ScriptedPlugin(["d0", "d1", "d2"], preferred=False)
    serve(plugin, kubelet)
    ready(kubelet, 3)
    assert kubelet.admit(pod("p", 1), timeout=10).admitted
    assert plugin.gpa_calls == [] and len(plugin.alloc_calls) == 1
    assert kubelet.log.grep('"Plugin options indicate to skip GetPreferredAllocation for resource"')


def test_init_container_devices_are_reused_first_and_passed_as_must_include(kubelet, serve):
    plugin = ScriptedPlugin(["d0", "d1", "d2", "d3"])
    serve(plugin, kubelet)
    ready(kubelet, 4)
    # init takes 1; app needs 1: the init's device is enough, no GetPreferredAllocation for the app
    res = kubelet.admit(pod("a", 1, init=(1,)), timeout=10)
    assert res.admitted and len(plugin.gpa_calls) == 1
    assert res.allocations["app0"][RES]["devices"] == res.allocations["init0"][RES]["devices"]
    # init takes 1; app needs 2: the init's device is picked first and must be included, size is the
    # container's whole request, and the picked device is offered as available too
    plugin.gpa_calls.clear()
    res = kubelet.admit(pod("b", 2, init=(1,)), timeout=10)
    assert res.admitted
    init_dev = res.allocations["init0"][RES]["devices"]
    (avail, must, size) = plugin.gpa_calls[1]
    assert must == init_dev and size == 2 and set(init_dev) <= set(avail)
    assert set(init_dev) < set(res.allocations["app0"][RES]["devices"])


def test_the_preferred_answer_is_not_validated_only_intersected_with_the_free_devices(kubelet, serve):
    plugin = ScriptedPlugin(["d0", "d1", "d2", "d3"], gpa=lambda r: ["bogus", "d3", "d3", "d2", "d1"])
    serve(plugin, kubelet)
    ready(kubelet, 4)
    res = kubelet.admit(pod("p", 2), timeout=10)
    assert res.admitted
    got = res.allocations["app0"][RES]["devices"]
    assert len(got) == 2 and set(got) <= {"d1", "d2", "d3"}  # any 2 of the valid preferred ones


def test_an_allocate_answer_without_container_responses_is_refused(kubelet, serve):
    plugin = ScriptedPlugin(["d0"], alloc=lambda r: api_pb2.AllocateResponse())
    serve(plugin, kubelet)
    ready(kubelet, 1)
    res = kubelet.admit(pod("p", 1), timeout=10)
    assert not res.admitted and res.reason == "UnexpectedAdmissionError"
    assert res.message == (
        "Allocate failed due to no containers return in allocation response "
        "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}, which is unexpected"
    )


def test_too_few_devices_is_refused_with_the_kubelets_text(kubelet, serve):
    serve(ScriptedPlugin(["d0", "d1"]), kubelet)
    ready(kubelet, 2)
    res = kubelet.admit(pod("p", 3), timeout=10)
    assert res.message == (
        f"Allocate failed due to requested number of devices unavailable for {RES}. "
        "Requested: 3, Available: 2, which is unexpected"
    )


def test_checkpoint_keeps_allocations_across_a_restart_and_refuses_pods_until_the_plugin_is_back(
    kubelet, serve, root
):
    serve(ScriptedPlugin(["d0", "d1"]), kubelet)
    ready(kubelet, 2)
    first = kubelet.admit(pod("a", 1), timeout=10)
    held = first.allocations["app0"][RES]["devices"]
    doc = json.loads(open(kubelet.checkpoint_path, "rb").read())
    assert [(e["PodUID"], e["ResourceName"], e["DeviceIDs"]) for e in doc["Data"]["PodDeviceEntries"]] == [
        ("uid-a", RES, {"-1": held})
    ]
    assert sorted(doc["Data"]["RegisteredDevices"][RES]) == ["d0", "d1"]

    kubelet.restart()
    assert kubelet.checkpoint_error is None and kubelet.capacity(RES) == 0
    assert not os.path.exists(os.path.join(root, "dev.sock"))  # sockets wiped, checkpoint kept
    res = kubelet.admit(pod("early", 1), timeout=10)
    assert res.message == (
        f"Allocate failed due to no healthy devices present; cannot allocate unhealthy "
        f"devices {RES}, which is unexpected"
    )

    before = kubelet.registrations.count(RES)
    serve(ScriptedPlugin(["d0", "d1"]), kubelet)
    ready(kubelet, 2, after=before)
    assert "Available: 1" in kubelet.admit(pod("both", 2), timeout=10).message  # "a" still holds its device
    other = kubelet.admit(pod("b", 1), timeout=10)
    assert other.admitted and other.allocations["app0"][RES]["devices"] != held


def test_a_corrupted_checkpoint_is_logged_and_ignored(kubelet, serve):
    serve(ScriptedPlugin(["d0"]), kubelet)
    ready(kubelet, 1)
    assert kubelet.admit(pod("a", 1), timeout=10).admitted
    with open(kubelet.checkpoint_path, "r+b") as fh:
        blob = fh.read().replace(b"uid-a", b"uid-x")
        fh.seek(0)
        fh.write(blob)
    kubelet.restart()
    assert kubelet.checkpoint_error == "checkpoint is corrupted"
    assert kubelet.log.grep("Continue after failing to read checkpoint file")
    assert not kubelet.holds("uid-a") and not kubelet.holds("uid-x")


def test_a_stream_that_ends_makes_devices_unhealthy_and_the_resource_goes_after_the_grace_period(root, serve):
    k = SimulatedKubelet(root, endpoint_stop_grace_period_s=0.5).start()
    try:
        plugin = ScriptedPlugin(["d0", "d1"])
        serve(plugin, k)
        ready(k, 2)
        plugin.done.set()  # the plugin ends its stream and never registers again
        assert k.wait_for(lambda: k.allocatable(RES) == 0, 5)
        assert k.capacity(RES) == 2  # still counted, as Unhealthy, during the grace period
        assert "no healthy devices present" in k.admit(pod("p", 1), timeout=10).message
        assert k.wait_for(lambda: k.capacity(RES) == 0 and RES not in k.known_resources, 5)
    finally:
        k.close()


def test_registration_refusals_use_the_kubelets_texts(kubelet, serve):
    with pytest.raises(grpc.RpcError) as err:
        serve(ScriptedPlugin(["d0"]), kubelet, version="v1alpha")
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert err.value.details() == (
        'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]'
    )
    with pytest.raises(grpc.RpcError) as err:
        serve(ScriptedPlugin(["d0"]), kubelet, resource="gpu")
    assert err.value.details() == 'the ResourceName "gpu" is invalid'


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("example.com/" + "x" * 63, True),
        ("example.com/" + "x" * 64, False),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("foo.kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),
        ("nvidia.com/gpu/x", False),
        ("nvidia.com/-gpu", False),
    ],
)
def test_extended_resource_names(name, ok):
    assert is_extended_resource_name(name) is ok


def test_the_late_end_of_an_old_stream_disconnects_the_new_registration(root, serve):
    """The upstream race (kubernetes #121994): clients are kept by resource name only."""
    k = SimulatedKubelet(root, stream_end_delay_s=0.3).start()
    try:
        old = ScriptedPlugin(["d0", "d1"])
        serve(old, k, endpoint="old.sock")
        ready(k, 2)
        serve(ScriptedPlugin(["d0", "d1"]), k, endpoint="new.sock")  # re-registered; old stream still open
        ready(k, 2, after=1)
        old.done.set()  # now the old one goes away
        assert k.wait_for(lambda: not k.endpoints[RES].connected, 5)
        assert k.allocatable(RES) == 0 and k.endpoints[RES].socket.endswith("new.sock")
    finally:
        k.close()

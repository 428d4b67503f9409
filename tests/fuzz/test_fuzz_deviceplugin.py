"""Fuzz the device plugin's kubelet-facing gRPC inputs (issue 14 deliverable 7): Allocate and
GetPreferredAllocation with random, duplicated, foreign and real device IDs and sizes, against a
running plugin on a SIMULATED A100 node (gpusim's libnvidia-ml through the real NVML worker),
registered with the SIMULATED kubelet. A refusal is fine (UNKNOWN with a message, as a Go plugin's
error); an INTERNAL (an unexpected exception) is a bug. Afterwards the plugin still answers, as fast as
before. Its HTTP side (/healthz, /metrics) is fuzzed with arbitrary requests too."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.manager import DevicePluginManager
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.nvml import NvmlSupervisor
from hami_agent.protocol import keys
from tests.gpusim.fixtures import build_lib, make_node
from tests.sim.kubelet import SimulatedKubelet
from tests.unit.deviceplugin.fakes import hami_pod, lock_value, node_register

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GPU = "nvidia.com/gpu"
NODE = "fuzz-node"
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    lib = build_lib()
    node = make_node(tmp_path_factory.mktemp("gpusim"), "a100-80gb-x8", lib_path=lib)
    saved = {k: os.environ.get(k) for k in ("GPUSIM_STATE", "HAMI_NVML_LIBRARY")}
    os.environ["GPUSIM_STATE"] = str(node.state_path)
    os.environ["HAMI_NVML_LIBRARY"] = str(lib)
    sock_dir = tempfile.mkdtemp(prefix="dpfuzz-", dir="/tmp")
    work = tmp_path_factory.mktemp("plugin")
    kubelet = SimulatedKubelet(sock_dir, verbosity=2).start()
    settings_ = PluginSettings(node_name=NODE, device_plugin_dir=sock_dir, device_split_count=4,
                               hook_path=str(work / "hook"), vgpu_lock_dir=str(work / "lock"),
                               mig_apply_lock=str(work / "mig.lock"), poll_interval_s=0.05,
                               health_recovery_quiet_s=1.0, first_snapshot_wait_s=15)
    pods = MemoryPodSource(NODE)
    manager = DevicePluginManager(
        settings_, lambda: NvmlSupervisor(lib_path=str(lib), call_timeout_s=2.0, refresh_interval_s=1.0),
        pods)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    channel = None
    try:
        assert kubelet.wait_registered(GPU, 30, min_devices=32), "plugin did not register"
        channel = grpc.insecure_channel(f"unix://{kubelet.endpoints[GPU].socket}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        yield stub, sorted(kubelet.devices(GPU)), manager, pods
    finally:
        if channel is not None:
            channel.close()
        manager.stop()
        thread.join(15)
        kubelet.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def device_ids(real: list[str]):
    junk = st.text(max_size=60) | st.sampled_from(
        ["", "-", "GPU-", "GPU-00000000-0000-0000-0000-000000000000-0", "MIG-1", "\x00", "../../etc",
         "a" * 300])
    return st.lists(st.sampled_from(real) | junk, max_size=12)


def call_ok(fn, request) -> str:
    """The status code name; INTERNAL (an unexpected exception in the plugin) fails the test."""
    try:
        fn(request, timeout=10)
        return "OK"
    except grpc.RpcError as exc:
        code = exc.code()
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE), (code, exc.details(),
                                                                                     request)
        assert code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.FAILED_PRECONDITION), code
        assert exc.details(), "a refusal must say why"
        return code.name


def median_rpc_ms(stub, real: list[str], n: int = 20) -> float:
    req = api_pb2.PreferredAllocationRequest(container_requests=[api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=real, must_include_deviceIDs=[], allocation_size=1)])
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        stub.GetPreferredAllocation(req, timeout=10)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@pytest.fixture(scope="module")
def baseline(plugin):
    stub, real, *_ = plugin
    return median_rpc_ms(stub, real)


@FUZZ
@given(data=st.data())
def test_allocate_random_requests(plugin, baseline, data):
    stub, real, *_ = plugin
    containers = data.draw(st.lists(device_ids(real), max_size=4))
    req = api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
    call_ok(stub.Allocate, req)


@FUZZ
@given(data=st.data())
def test_get_preferred_allocation_random_requests(plugin, baseline, data):
    stub, real, *_ = plugin
    reqs = []
    for _ in range(data.draw(st.integers(0, 3))):
        available = data.draw(device_ids(real))
        must = data.draw(st.lists(st.sampled_from(available) if available else st.text(max_size=8),
                                  max_size=3))
        size = data.draw(st.integers(min_value=-(2**31), max_value=2**31 - 1))
        reqs.append(api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size))
    call_ok(stub.GetPreferredAllocation, api_pb2.PreferredAllocationRequest(container_requests=reqs))


@FUZZ
@given(data=st.data())
def test_allocate_for_a_pending_pod_with_hostile_annotations(plugin, baseline, data):
    """A pod bound to this node whose allocation annotations (written by the scheduler, or forged
    where no admission policy stops it) are near-valid or garbage; Allocate for devices of this node."""
    stub, real, _manager, pods = plugin
    uuids = sorted({d.rsplit("-", 1)[0] for d in real})
    entry = st.tuples(st.sampled_from(uuids) | st.text(max_size=20), st.sampled_from(["NVIDIA", "", "x"]),
                      st.integers(-5, 200000).map(str) | st.text(max_size=6),
                      st.integers(-5, 200).map(str) | st.text(max_size=4)).map(",".join)
    devices = data.draw(st.lists(st.lists(entry, max_size=3).map(lambda es: ":".join(es) + ":"), max_size=3)
                        .map(";".join) | st.text(max_size=80))
    n = data.draw(st.integers(0, 3))
    containers = [{"name": f"c{i}", "resources": {"limits": {GPU: data.draw(
        st.sampled_from(["1", "2", "0", "x", "-1"]))}}} for i in range(n)]
    pod = hami_pod("fuzz-pod", NODE, containers, devices, bind_time=int(time.time()))
    pods.add_pod(pod)
    try:
        ids = data.draw(st.lists(st.lists(st.sampled_from(real), max_size=3), min_size=1, max_size=3))
        call_ok(stub.Allocate, api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=i) for i in ids]))
    finally:
        with pods._lock:
            pods.pods.clear()


def test_plugin_alive_and_latency_unchanged(plugin, baseline):
    stub, real, manager, pods = plugin
    after = median_rpc_ms(stub, real)
    assert after < 3 * baseline + 5.0, (baseline, after)
    # and it still allocates: one well-formed pod, one replica of the GPU its annotation names
    uuid = real[0].rsplit("-", 1)[0]
    pods.add_pod(hami_pod("good", NODE, [{"name": "c", "resources": {"limits": {GPU: "1"}}}],
                          f"{uuid},NVIDIA,1000,10:;", bind_time=int(time.time())))
    # as the scheduler's /bind leaves the node: Allocate serves only the lock's owner, within the
    # capacity the node registered
    pods.node_annotations[keys.NODE_LOCK] = lock_value("good")
    pods.node_annotations[keys.NODE_REGISTER] = node_register(sorted({r.rsplit("-", 1)[0] for r in real}),
                                                              count=4)
    resp = stub.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=[real[0]])]), timeout=10)
    assert resp.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5).get_preferred_allocation_available
    ok, msg = manager.healthz()
    assert ok, msg

"""Device plugin + SIMULATED kubelet over real gRPC unix sockets (inventory from a fake NVML source)."""

from __future__ import annotations

import os
import time

import grpc
import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.protocol import keys
from tests.integration.deviceplugin.conftest import NODE
from tests.unit.deviceplugin.fakes import (
    FakeGpu,
    FakeSnapshot,
    FakeSource,
    ctr,
    full_gpus,
    gpu_uuid,
    h20_mig_mixed,
    hami_pod,
    lock_value,
    node_register,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("gpus", "strategy", "split", "expected"),
    [
        (full_gpus(8), "none", 10, {GPU: 80}),
        (full_gpus(4), "none", 5, {GPU: 20}),
        (
            h20_mig_mixed(),
            "mixed",
            10,
            {GPU: 50, "nvidia.com/mig-3g.48gb": 3, "nvidia.com/mig-1g.24gb": 3, "nvidia.com/mig-1g.12gb": 6},
        ),
        (h20_mig_mixed(), "none", 2, {GPU: 10}),
    ],
)
def test_registration_and_listandwatch_counts(kubelet, start_plugin, gpus, strategy, split, expected):  # noqa: PLR0917
    start_plugin(FakeSource(FakeSnapshot(gpus=gpus)), mig_strategy=strategy, device_split_count=split)
    for res, n in expected.items():
        assert kubelet.wait_registered(res, 5, min_devices=n), res
        assert kubelet.allocatable(res) == n
    assert set(kubelet.known_resources) == set(expected)
    ep = kubelet.endpoints[GPU]
    assert ep.options.get_preferred_allocation_available and not ep.options.pre_start_required
    assert os.path.basename(ep.socket) == "nvidia-gpu.sock"


def test_numa_topology_is_sent_only_when_enabled(kubelet, start_plugin):
    start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(8))), enable_numa_topology=True, device_split_count=1)
    assert kubelet.wait_registered(GPU, 5, min_devices=8)
    topo = kubelet.endpoints[GPU].topology
    assert topo[f"{gpu_uuid(0)}-0"] == [0] and topo[f"{gpu_uuid(7)}-0"] == [1]


def test_admission_single_multi_gpu_and_init_container_pods(kubelet, start_plugin):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(4))), device_split_count=4)
    assert kubelet.wait_registered(GPU, 5, min_devices=16)
    u0, u1, u2 = gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)
    pods = [
        hami_pod("single", NODE, [ctr("c", 1)], f"{u2},NVIDIA,3000,50:;", bind_time=1),
        hami_pod("multi", NODE, [ctr("c", 2)], f"{u0},NVIDIA,1000,20:{u1},NVIDIA,1000,20:;", bind_time=2),
        hami_pod(
            "withinit",
            NODE,
            [ctr("app", 1)],
            f"{u1},NVIDIA,500,10:;{u0},NVIDIA,7000,80:;",
            init=[ctr("init", 1)],
            bind_time=3,
        ),
    ]
    r.pods.node_annotations[keys.NODE_REGISTER] = node_register(4, count=4)
    results = {}
    for pod in pods:
        r.pods.add_pod(pod)
        r.pods.node_annotations[keys.NODE_LOCK] = lock_value(pod["metadata"]["name"])  # the scheduler's /bind
        res = kubelet.admit(pod, timeout=10)
        assert res is not None and res.admitted, res
        results[pod["metadata"]["name"]] = res
    single = results["single"].allocations["c"][GPU]
    assert single["envs"]["NVIDIA_VISIBLE_DEVICES"] == u2 and single["envs"]["CUDA_DEVICE_SM_LIMIT"] == "50"
    # GetPreferredAllocation made the kubelet pick a replica of the scheduler's GPU
    assert single["devices"][0].startswith(u2)
    multi = results["multi"].allocations["c"][GPU]
    assert multi["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{u0},{u1}"
    assert {d.rsplit("-", 1)[0] for d in multi["devices"]} == {u0, u1}
    wi = results["withinit"].allocations
    # the kubelet re-used the init container's replica for the app container; it is the same pod's
    assert wi["app"][GPU]["devices"] == wi["init"][GPU]["devices"]
    assert wi["init"][GPU]["envs"]["NVIDIA_VISIBLE_DEVICES"] == u1
    assert wi["app"][GPU]["envs"]["NVIDIA_VISIBLE_DEVICES"] == u0
    assert wi["app"][GPU]["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "7000m"
    for name in ("single", "multi", "withinit"):
        ann = r.pods.pods[("default", name)]["metadata"]["annotations"]
        assert ann[keys.BIND_PHASE] == "success"
    assert kubelet.log.grep('"Issuing a GetPreferredAllocation call for container" containerName="c"')
    assert kubelet.log.grep('"Making allocation request for device plugin" devices=[')


def test_allocate_errors_reach_the_kubelet_as_unexpected_admission_errors(kubelet, start_plugin):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(2))), device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=4)
    r.pods.node_annotations[keys.NODE_REGISTER] = node_register(2, count=2)
    nopod = hami_pod("ghost", NODE, [ctr("c", 1)], "")
    res = kubelet.admit(nopod, timeout=10)
    assert not res.admitted and res.reason == "UnexpectedAdmissionError"
    assert f"code = Unknown desc = no binding pod found on node {NODE}: no node lock" in res.message
    mismatch = hami_pod("mm", NODE, [ctr("c", 2)], f"{gpu_uuid(0)},NVIDIA,1,1:;")
    r.pods.add_pod(mismatch)
    r.pods.node_annotations[keys.NODE_LOCK] = lock_value("mm")
    res = kubelet.admit(mismatch, timeout=10)
    assert not res.admitted and "device number not matched" in res.message
    assert r.manager.allocator.writer.wait_idle(5)
    assert r.pods.pods[("default", "mm")]["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
    assert keys.NODE_LOCK not in r.pods.node_annotations


def test_kubelet_restart_50_times_reregisters_every_time_within_2s(kubelet, start_plugin):
    start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(2))), device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=4)
    worst = 0.0
    for i in range(50):
        before = kubelet.registrations.count(GPU)
        t0 = time.monotonic()
        kubelet.restart()
        assert kubelet.wait_registered(GPU, 2.0, min_devices=4, after=before), (
            f"restart {i}: not re-registered"
        )
        worst = max(worst, time.monotonic() - t0)
    print(f"kubelet restart x50: worst re-registration {worst * 1000:.0f} ms")
    assert worst < 2.0


def test_deleted_plugin_socket_is_recreated_and_reregistered(kubelet, start_plugin, sock_dir):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(1))), device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=2)
    before = kubelet.registrations.count(GPU)
    os.unlink(os.path.join(sock_dir, "nvidia-gpu.sock"))
    assert kubelet.wait_registered(GPU, 2.0, min_devices=2, after=before)
    assert r.manager.reregistrations >= 1


def test_health_change_is_pushed_and_recovers_after_quiet_period(kubelet, start_plugin):
    src = FakeSource(FakeSnapshot(gpus=full_gpus(2)))
    start_plugin(src, device_split_count=2, health_recovery_quiet_s=0.5)
    assert kubelet.wait_registered(GPU, 5, min_devices=4)
    src.set(
        gpus=(
            FakeGpu(0, gpu_uuid(0), numa=0),
            FakeGpu(1, gpu_uuid(1), healthy=False, unhealthy_reason="xid 79"),
        )
    )
    assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2, 3)
    t_ok = time.monotonic()
    src.set(gpus=full_gpus(2))
    assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4, 5)
    assert time.monotonic() - t_ok >= 0.4  # held back for the quiet period


def test_pause_on_mig_apply_lock_releases_nvml_and_resumes(kubelet, start_plugin, tmp_path, sock_dir):
    src = FakeSource(FakeSnapshot(gpus=full_gpus(1)))
    r = start_plugin(src, device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=2)
    lock = tmp_path / "mig-apply.lock"
    lock.write_text("")
    assert kubelet.wait_for(lambda: not os.path.exists(os.path.join(sock_dir, "nvidia-gpu.sock")), 3)
    assert kubelet.wait_for(lambda: src.stopped >= 1, 3) and r.manager.paused
    assert r.manager.healthz() == (True, "paused for MIG reconfiguration")
    before = kubelet.registrations.count(GPU)
    lock.unlink()
    assert kubelet.wait_registered(GPU, 3, min_devices=2, after=before)
    assert src.started >= 2


def test_repeated_server_failures_end_with_the_seed_message(sock_dir, start_plugin, caplog):
    blocker = os.path.join(sock_dir, "not-a-dir")
    open(blocker, "w").close()  # the plugin dir is a file: every server start fails
    r = start_plugin(
        FakeSource(FakeSnapshot(gpus=full_gpus(1))), device_plugin_dir=blocker, max_server_restarts=2
    )
    r.thread.join(10)
    assert r.rc == [1]
    assert "GRPC server has repeatedly crashed" in r.manager._fatal


def test_unsupported_version_is_a_permanent_registration_error(sock_dir, start_plugin):
    from tests.sim.kubelet import SimulatedKubelet

    k = SimulatedKubelet(sock_dir, supported_versions=("v1",)).start()
    try:
        r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(1))))
        r.thread.join(10)
        assert r.rc == [1]
        assert "not supported by kubelet" in r.manager._fatal and "v1beta1" in r.manager._fatal
    finally:
        k.close()


def test_healthz_checks_the_grpc_loop(kubelet, start_plugin):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(1))))
    assert r.manager.wait_registered(5)
    assert r.manager.healthz() == (True, "ok")
    # the loop restarts a server whose socket vanished at once (inotify wakes it): keep it from healing
    # so that what answers here is healthz's own check
    r.manager._check_sockets = lambda: None
    r.manager.servers[GPU].stop()
    ok, msg = r.manager.healthz()
    assert not ok and "missing" in msg


def test_the_kubelets_rpcs_prove_a_server_alive_and_only_a_quiet_one_is_probed(kubelet, start_plugin):
    """Issue 31: a probe RPC wakes grpc's thread pool for ~1 ms of CPU, so the loop probes only a server
    that answered nothing for SELF_CHECK_EVERY_S; one whose probe fails restarts as unresponsive."""
    from hami_agent.deviceplugin import manager as manager_mod

    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(2))), device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=4)
    server = r.manager.servers[GPU]
    # the kubelet's own calls count: an admission (GetPreferredAllocation, Allocate) marks the server
    r.pods.node_annotations[keys.NODE_REGISTER] = node_register(2, count=2)
    pod = hami_pod("p", NODE, [ctr("c", 1)], f"{gpu_uuid(0)},NVIDIA,1000,10:;", bind_time=1)
    r.pods.add_pod(pod)
    r.pods.node_annotations[keys.NODE_LOCK] = lock_value("p")
    before = time.monotonic()
    assert kubelet.admit(pod, timeout=10).admitted
    assert server.answered_at >= before

    probes: list[str] = []
    restarts: list[tuple[str, str]] = []
    answer: list[str | None] = [None]

    def probe(timeout: float = 1.0) -> str | None:
        probes.append(GPU)
        return answer[0]

    server.self_check = probe
    r.manager._restart_server = lambda name, cause: restarts.append((name, cause))
    r.manager._last_self_check = 0.0  # a check is due now
    r.manager._check_sockets()
    assert probes == [] and restarts == []  # answered the kubelet a moment ago
    server.answered_at = time.monotonic() - manager_mod.SELF_CHECK_EVERY_S - 1
    r.manager._last_self_check = 0.0
    answer[0] = "GetDevicePluginOptions on the socket: DEADLINE_EXCEEDED"
    r.manager._check_sockets()
    assert probes == [GPU] and restarts == [(GPU, "unresponsive")]


def test_a_probe_over_the_socket_marks_the_server_answered(kubelet, start_plugin):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(1))))
    assert kubelet.wait_registered(GPU, 5)
    server = r.manager.servers[GPU]
    server.answered_at = 0.0
    assert server.self_check(timeout=2.0) is None
    assert server.quiet_for(time.monotonic()) < 2.0


def test_options_constant_and_prestart_noop_over_the_socket(kubelet, start_plugin, sock_dir):
    start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(1))))
    assert kubelet.wait_registered(GPU, 5)
    with grpc.insecure_channel(f"unix://{sock_dir}/nvidia-gpu.sock") as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        opts = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)
        assert opts.get_preferred_allocation_available and not opts.pre_start_required
        stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["x"]), timeout=2)


def test_lock_file_present_at_start_keeps_nvml_untouched_until_released(
    kubelet, start_plugin, tmp_path, sock_dir
):
    lock = tmp_path / "mig-apply.lock"
    lock.write_text("")
    src = FakeSource(FakeSnapshot(gpus=full_gpus(1)))
    r = start_plugin(src, device_split_count=2)
    time.sleep(0.5)
    assert src.started == 0 and r.manager.paused
    assert not os.path.exists(os.path.join(sock_dir, "nvidia-gpu.sock"))
    lock.unlink()
    assert kubelet.wait_registered(GPU, 5, min_devices=2)
    assert src.started == 1


def test_init_container_devices_reused_by_a_bigger_app_container(kubelet, start_plugin):
    """The kubelet reuses the init container's device for the app container and asks GetPreferredAllocation
    for the rest with that device as must_include and the app's whole request as size."""
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(4))), device_split_count=4)
    assert kubelet.wait_registered(GPU, 5, min_devices=16)
    u0, u1, u2 = gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)
    annotated = f"{u1},NVIDIA,500,10:;{u0},NVIDIA,1000,20:{u2},NVIDIA,1000,20:;"
    pod = hami_pod("reuse", NODE, [ctr("app", 2)], annotated, init=[ctr("init", 1)], bind_time=4)
    r.pods.node_annotations[keys.NODE_REGISTER] = node_register(4, count=4)
    r.pods.node_annotations[keys.NODE_LOCK] = lock_value("reuse")  # the scheduler's /bind
    r.pods.add_pod(pod)
    res = kubelet.admit(pod, timeout=10)
    assert res is not None and res.admitted, res
    init_dev = res.allocations["init"][GPU]["devices"]
    app = res.allocations["app"][GPU]
    assert init_dev[0].startswith(u1) and set(init_dev) < set(app["devices"]) and len(app["devices"]) == 2
    assert app["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{u0},{u2}"  # the scheduler's GPUs, whatever the IDs
    assert r.pods.pods[("default", "reuse")]["metadata"]["annotations"][keys.BIND_PHASE] == "success"

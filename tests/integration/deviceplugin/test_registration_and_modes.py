"""Registration retry/backoff, plugin-watcher mode, MPS start-up check, CLI validation."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from hami_agent import cli
from hami_agent.deviceplugin.api import pluginregistration_pb2 as reg_pb2
from hami_agent.deviceplugin.api import pluginregistration_pb2_grpc as reg_grpc
from hami_agent.deviceplugin.kubelet_registration import RegistrationError, register_once, register_with_retry
from hami_agent.deviceplugin.mps import MpsError, check_mps_control
from tests.gpusim.fixtures import BIN_DIR
from tests.sim.kubelet import SimulatedKubelet
from tests.unit.deviceplugin.fakes import FakeSnapshot, FakeSource, full_gpus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_register_without_kubelet_is_a_clear_transient_error(sock_dir):
    with pytest.raises(
        RegistrationError, match="cannot dial kubelet at .*kubelet.sock: socket does not exist"
    ) as err:
        register_once(os.path.join(sock_dir, "kubelet.sock"), "nvidia.com/gpu", "nvidia-gpu.sock", 0.2)
    assert not err.value.permanent


def test_a_superseded_registration_leaves_no_thread_behind_to_fail(sock_dir, monkeypatch):
    """A registration cancelled while it waits for the kubelet closes its channel at once. gRPC's
    ``channel_ready_future`` had a helper thread polling that channel, which then died with "Cannot monitor
    channel state: Channel closed!" (a traceback the chaos soak counts as a crash)."""
    import socket

    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    path = os.path.join(sock_dir, "kubelet.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # a socket file nobody listens on: a kubelet that is restarting
    try:
        for i in range(40):  # cancelled at different points of the helper's 0.2 s poll cycle
            t0 = time.monotonic()
            with pytest.raises(RegistrationError, match="cancelled .superseded."):
                register_once(path, "nvidia.com/gpu", "nvidia-gpu.sock", 5.0,
                              cancelled=lambda t0=t0, i=i: time.monotonic() - t0 > 0.01 * (i % 25))
        time.sleep(0.5)  # a helper thread left behind would fail within its 0.2 s poll
    finally:
        dead.close()
    assert errors == []


def test_a_kubelet_that_never_answers_is_a_transient_error_after_the_deadline(sock_dir, monkeypatch):
    import socket

    from hami_agent.deviceplugin import kubelet_registration

    monkeypatch.setattr(kubelet_registration, "REGISTER_RPC_TIMEOUT_S", 0.3)
    path = os.path.join(sock_dir, "kubelet.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    try:
        with pytest.raises(RegistrationError, match="no answer within 0.5s .is the kubelet running.") as err:
            register_once(path, "nvidia.com/gpu", "nvidia-gpu.sock", 0.2)
    finally:
        dead.close()
    assert not err.value.permanent


def test_plugin_registers_once_a_late_kubelet_comes_up(sock_dir, start_plugin):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(1))), device_split_count=2)
    time.sleep(0.5)  # registration is retrying with backoff meanwhile; the plugin is already serving
    assert os.path.exists(os.path.join(sock_dir, "nvidia-gpu.sock"))
    k = SimulatedKubelet(sock_dir).start()
    try:
        assert k.wait_registered("nvidia.com/gpu", 5, min_devices=2)
        assert r.manager.wait_registered(5)
        time.sleep(0.5)
        # regression: the retry that was dialing when the kubelet wiped our socket must not register a
        # second time and replace the endpoint in the middle of an admission
        assert k.registrations == ["nvidia.com/gpu"]
    finally:
        k.close()


def test_register_with_retry_stops_when_asked(sock_dir):
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    ok = register_with_retry(
        os.path.join(sock_dir, "kubelet.sock"), "nvidia.com/gpu", "x.sock", 0.1, stop=stop
    )
    assert ok is False and time.monotonic() - t0 < 2


def test_plugin_watcher_mode_serves_getinfo_on_the_registry_socket(sock_dir, start_plugin):
    registry = os.path.join(sock_dir, "registry")
    r = start_plugin(
        FakeSource(FakeSnapshot(gpus=full_gpus(1))),
        registration_mode="plugin-watcher",
        plugins_registry_dir=registry,
    )
    path = os.path.join(registry, "nvidia-gpu-reg.sock")
    end = time.monotonic() + 5
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)
    with grpc.insecure_channel(f"unix://{path}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DevicePlugin",
            "nvidia.com/gpu",
            ["v1beta1"],
        )
        assert info.endpoint == os.path.join(sock_dir, "nvidia-gpu.sock")
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
    assert r.manager.servers["nvidia.com/gpu"].watcher_registered.wait(2)
    r.stop()
    assert not os.path.exists(path)


def test_mps_startup_check_names_the_binary(gpusim_factory, monkeypatch):
    node = gpusim_factory("a100-80gb-x8")
    monkeypatch.setenv("PATH", f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    assert check_mps_control().endswith("nvidia-cuda-mps-control")
    node.set_fault(mps_binary_missing=True)
    with pytest.raises(
        MpsError, match="MPS mode needs nvidia-cuda-mps-control: .*exit 127.*nvidia-compute-utils"
    ):
        check_mps_control()
    with pytest.raises(MpsError, match='exec: "no-such-mps-control": executable file not found in \\$PATH'):
        check_mps_control("no-such-mps-control")


def test_cli_rejects_bad_combinations_with_exit_2(capsys):
    rc = cli.main(
        [
            "device-plugin",
            "--node-name",
            "n",
            "--standalone",
            "--mode",
            "mps",
            "--mig-strategy",
            "mixed",
            "--metrics-bind",
            "none",
        ]
    )
    assert rc == 2
    rc = cli.main(
        [
            "device-plugin",
            "--standalone",
            "--rpc-deadline",
            "0.5",
            "--api-timeout",
            "1",
            "--metrics-bind",
            "none",
        ]
    )
    assert rc == 2


def test_cli_mps_mode_fails_fast_when_the_binary_is_missing(tmp_path):
    rc = cli.main(
        [
            "device-plugin",
            "--node-name",
            "n",
            "--standalone",
            "--mode",
            "mps",
            "--mps-control",
            "no-such-mps-control",
            "--metrics-bind",
            "none",
            "--device-plugin-dir",
            str(tmp_path),
        ]
    )
    assert rc == 1

"""Our plugin against the kubelet's ListAndWatch handling (SIMULATED kubelet, real gRPC sockets).

The real kubelet never reconnects a plugin by itself: when a plugin's ListAndWatch stream ends it marks
the resource's devices Unhealthy and stops the endpoint, and when a re-registered plugin's *old* stream
ends late it disconnects the *new* registration (kubernetes #121994, #127803). The plugin must notice
that its stream was ended by the kubelet and register again.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.sim.kubelet import SimulatedKubelet
from tests.unit.deviceplugin.fakes import FakeSnapshot, FakeSource, full_gpus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GPU = "nvidia.com/gpu"


def _stays(kubelet: SimulatedKubelet, predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not predicate():
            return False
        time.sleep(0.05)
    return True


def test_plugin_registers_again_when_the_kubelet_ends_its_stream(kubelet, start_plugin):
    r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(2))), device_split_count=2)
    assert kubelet.wait_registered(GPU, 5, min_devices=4)
    before = kubelet.registrations.count(GPU)
    assert kubelet.drop_stream(GPU)
    # the kubelet's reaction, as in client.go Run -> handler.go runClient -> PluginDisconnected
    assert kubelet.wait_for(lambda: bool(kubelet.log.grep('"Endpoint became unhealthy"')), 5)
    assert kubelet.log.grep('"ListAndWatch ended unexpectedly for device plugin"')
    # ...and the plugin's: register again, devices back
    assert kubelet.wait_registered(GPU, 5, min_devices=4, after=before)
    assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4, 5)
    assert r.manager.metrics.reregistrations.labels(GPU, "stream-lost")._value.get() >= 1


def test_late_end_of_the_old_stream_does_not_leave_the_resource_unhealthy(sock_dir, start_plugin):
    # a busy kubelet notices the end of the old stream after the plugin has registered its new server
    k = SimulatedKubelet(sock_dir, verbosity=4, stream_end_delay_s=0.5).start()
    try:
        r = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(2))), device_split_count=2)
        assert k.wait_registered(GPU, 5, min_devices=4)
        before = k.registrations.count(GPU)
        os.unlink(os.path.join(sock_dir, "nvidia-gpu.sock"))  # the plugin restarts its server
        assert k.wait_registered(GPU, 5, min_devices=4, after=before)
        # the old stream's late end disconnects the NEW registration (the upstream race) ...
        assert k.wait_for(lambda: bool(k.log.grep('"Endpoint became unhealthy"')), 5)
        # ... and the plugin recovers by itself, for good
        assert k.wait_for(lambda: k.allocatable(GPU) == 4 and k.endpoints[GPU].connected, 10)
        assert _stays(k, lambda: k.allocatable(GPU) == 4, 1.5)
        assert r.manager.reregistrations >= 2
    finally:
        k.close()

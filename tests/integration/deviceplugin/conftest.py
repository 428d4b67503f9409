"""Fixtures: a short socket directory, the SIMULATED kubelet, and a running device plugin manager."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator

import pytest

from hami_agent.deviceplugin.manager import DevicePluginManager
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from tests.gpusim.fixtures import gpusim_factory, gpusim_lib  # noqa: F401
from tests.sim.fixtures import api_server  # noqa: F401
from tests.sim.kubelet import SimulatedKubelet

NODE = "gpu-1"


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer
    d = tempfile.mkdtemp(prefix="dp-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(sock_dir) -> Iterator[SimulatedKubelet]:
    k = SimulatedKubelet(sock_dir, verbosity=4).start()
    yield k
    k.close()


class Running:
    def __init__(self, manager: DevicePluginManager, thread: threading.Thread, pods: MemoryPodSource) -> None:
        self.manager = manager
        self.thread = thread
        self.pods = pods
        self.rc: list[int] = []

    def stop(self, timeout: float = 10.0) -> int | None:
        self.manager.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "device plugin manager did not stop"
        return self.rc[0] if self.rc else None


@pytest.fixture
def start_plugin(sock_dir, tmp_path):
    running: list[Running] = []

    def start(source, pods: MemoryPodSource | None = None, **overrides) -> Running:
        kw = dict(
            node_name=NODE,
            device_plugin_dir=sock_dir,
            hook_path=str(tmp_path / "hook"),
            vgpu_lock_dir=str(tmp_path / "vgpulock"),
            mig_apply_lock=str(tmp_path / "mig-apply.lock"),
            poll_interval_s=0.05,
            health_recovery_quiet_s=0.3,
            first_snapshot_wait_s=0.5,
        )
        kw.update(overrides)
        pods = pods or MemoryPodSource(NODE)
        m = DevicePluginManager(PluginSettings(**kw), lambda: source, pods)
        r = Running(m, threading.Thread(target=lambda: r.rc.append(m.run()), daemon=True), pods)
        r.thread.start()
        running.append(r)
        return r

    yield start
    for r in running:
        if r.thread.is_alive():
            r.stop()

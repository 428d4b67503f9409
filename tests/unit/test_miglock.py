"""The MIG apply lock is honoured only when root made it in a directory nobody else can write to
(``hami_agent.miglock``): a local user on a node must not be able to pause NVML (devices Unhealthy, no
registration) by creating HAMi's ``/tmp/hami/hami-mig-apply.lock``. Each untrusted case is ignored with a
warning and the ``hami_mig_apply_lock_untrusted`` metric, in the device plugin, its register loop and the
monitor; ``permissive`` keeps HAMi's rule."""

from __future__ import annotations

import logging
import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hami_agent.miglock import MigApplyLock, check_lock_file

pytestmark = pytest.mark.unit

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")


@pytest.fixture
def lockdir(tmp_path):
    """A root-owned 0755 directory, like /run/hami as the nvidia_mig role makes it."""
    d = tmp_path / "hami"
    d.mkdir()
    d.chmod(0o755)
    return d


def make_lock(d, mode=0o644, owner=None):
    path = d / "mig-apply.lock"
    path.write_text("nvidia_mig role\n")
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return str(path)


def test_no_file_no_lock(lockdir):
    assert not check_lock_file(str(lockdir / "mig-apply.lock")).present
    assert not check_lock_file(str(lockdir / "missing" / "mig-apply.lock")).present
    assert not check_lock_file("").present


def test_a_root_owned_lock_in_a_root_owned_directory_is_held(lockdir):
    got = check_lock_file(make_lock(lockdir))
    assert got.present and got.trusted and got.held and got.reason == ""


@as_root
def test_a_lock_made_by_another_user_is_ignored(lockdir):
    got = check_lock_file(make_lock(lockdir, owner=NOBODY))
    assert got.present and not got.held
    assert f"owned by uid {NOBODY}, not by root" in got.reason


@as_root
def test_a_sticky_world_writable_directory_is_not_trusted(tmp_path):
    """The /tmp/hami case: a sticky 1777 directory lets anyone create the lock, even if root made it."""
    d = tmp_path / "hami"
    d.mkdir()
    d.chmod(0o1777)
    got = check_lock_file(make_lock(d))  # a root-owned file: still in a directory anyone can write to
    assert got.present and not got.held
    assert "writable by group or others (mode 1777)" in got.reason


@as_root
def test_a_directory_someone_else_created_is_not_trusted(tmp_path):
    d = tmp_path / "hami"
    d.mkdir()
    d.chmod(0o755)
    os.chown(d, NOBODY, NOBODY)  # a user created /tmp/hami before root did: they can replace files in it
    got = check_lock_file(make_lock(d))
    assert not got.held and f"lock directory {d} is owned by uid {NOBODY}" in got.reason


def test_a_group_or_world_writable_lock_file_is_not_trusted(lockdir):
    got = check_lock_file(make_lock(lockdir, mode=0o666))
    assert not got.held and "the lock file" in got.reason and "mode 0666" in got.reason


def test_a_symlink_or_fifo_is_not_a_lock(lockdir, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (lockdir / "mig-apply.lock").symlink_to(target)
    got = check_lock_file(str(lockdir / "mig-apply.lock"))
    assert got.present and not got.held and "not a regular file" in got.reason
    os.unlink(lockdir / "mig-apply.lock")
    os.mkfifo(lockdir / "mig-apply.lock")
    assert not check_lock_file(str(lockdir / "mig-apply.lock")).held


def test_a_symlinked_directory_is_not_trusted(lockdir, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(lockdir)
    make_lock(lockdir)
    got = check_lock_file(str(link / "mig-apply.lock"))
    assert not got.held and "is not a directory" in got.reason


@as_root
def test_permissive_keeps_hamis_rule(tmp_path):
    d = tmp_path / "hami"
    d.mkdir()
    d.chmod(0o1777)
    path = make_lock(d, mode=0o666, owner=NOBODY)
    assert not check_lock_file(path).held
    assert check_lock_file(path, permissive=True).held


def test_untrusted_lock_warns_once_per_change_and_is_exposed(lockdir, caplog):
    path = make_lock(lockdir, mode=0o666)
    lock = MigApplyLock(path, component="device plugin")
    with caplog.at_level(logging.INFO, logger="hami_agent.miglock"):
        assert not lock.held() and not lock.held()
        assert "mode 0666" in lock.untrusted
        os.chmod(path, 0o644)
        assert lock.held() and lock.untrusted == ""
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "device plugin: IGNORING an untrusted MIG apply lock" in warnings[0].getMessage()
    assert "NVML is NOT paused" in warnings[0].getMessage()


# ------------------------------------------------------------------------------- the three users
def test_register_loop_ignores_an_untrusted_lock_and_pauses_on_a_trusted_one(lockdir):
    from tests.unit.register.test_register import FakeClient, cfg, gpu, make, snap

    path = make_lock(lockdir, mode=0o666)
    client = FakeClient()
    r, _ = make(client, snap(gpu(0)), cfg(agent={"migApplyLockPath": path}))
    assert r.register_once() and len(client.patches) == 1  # not paused: anyone could have written it
    assert r.mig_lock.untrusted
    os.chmod(path, 0o644)
    assert not r.register_once() and r.last_result == "paused"


def test_register_loop_uses_the_lock_it_is_given(lockdir):
    """The device-plugin process hands its own lock (its --mig-apply-lock, its rule) to the register
    loop: before, the loop read only the config file's path and missed the flag."""
    from tests.unit.register.test_register import FakeClient, cfg, gpu, make, snap

    client = FakeClient()
    r, _ = make(client, snap(gpu(0)), cfg(), mig_lock=MigApplyLock(make_lock(lockdir)))
    assert not r.register_once() and r.last_result == "paused" and client.patches == []


def test_device_plugin_ignores_an_untrusted_lock_and_counts_it(lockdir):
    from hami_agent.deviceplugin.manager import DevicePluginManager
    from hami_agent.deviceplugin.metrics import PluginMetrics
    from hami_agent.deviceplugin.podsource import MemoryPodSource
    from hami_agent.deviceplugin.settings import PluginSettings

    path = make_lock(lockdir, mode=0o666)
    metrics = PluginMetrics()
    manager = DevicePluginManager(PluginSettings(node_name="gpu-1", mig_apply_lock=path), lambda: None,
                                  MemoryPodSource("gpu-1"), metrics)
    try:
        assert manager._should_pause() is False
        assert b"hami_mig_apply_lock_untrusted 1.0" in generate_latest(metrics.registry)
        os.chmod(path, 0o644)
        assert manager._should_pause() is True
        assert b"hami_mig_apply_lock_untrusted 0.0" in generate_latest(metrics.registry)
    finally:
        manager.allocator.close()


def test_monitor_ignores_an_untrusted_lock_and_exports_it(lockdir, tmp_path):
    from hami_agent.monitor.collector import RegionMonitor
    from hami_agent.monitor.hostgpu import HostGpuSource

    class Client:  # NVML is not reached in this test: only the pause decision is
        class reaper:
            @staticmethod
            def reap():
                return 0

        def close(self):
            pass

    path = make_lock(lockdir, mode=0o666)
    source = HostGpuSource(Client(), path, 1.0)
    assert not source.mig_locked()
    regions = tmp_path / "regions"
    regions.mkdir()
    registry = CollectorRegistry()
    registry.register(RegionMonitor(str(regions), node_name="gpu-1", host_source=source))
    assert b"hami_mig_apply_lock_untrusted 1.0" in generate_latest(registry)
    os.chmod(path, 0o644)
    assert source.mig_locked()
    assert b"hami_mig_apply_lock_untrusted 0.0" in generate_latest(registry)
    assert HostGpuSource(Client(), path, 1.0, permissive=True).mig_locked()


def test_the_default_path_is_root_owned_not_tmp():
    from hami_agent.config import AgentSettings
    from hami_agent.protocol import keys

    assert keys.MIG_APPLY_LOCK_PATH == "/run/hami/mig-apply.lock"
    assert AgentSettings().mig_apply_lock_path == keys.MIG_APPLY_LOCK_PATH

"""The loop reacts to the kubelet's and the MIG lock's files through inotify, not a tick (issue 31 item 2),
and still by polling where inotify cannot be had."""

from __future__ import annotations

import os

import pytest

from hami_agent import fswatch
from tests.unit.deviceplugin.fakes import FakeSnapshot, FakeSource, full_gpus

GPU = "nvidia.com/gpu"


def exercise(kubelet, r, src, tmp_path, sock_dir) -> None:
    """A kubelet restart, a deleted socket of ours and the MIG lock each get their reaction."""
    assert kubelet.wait_registered(GPU, 5, min_devices=2)
    for i in range(3):
        before = kubelet.registrations.count(GPU)
        kubelet.restart()
        assert kubelet.wait_registered(GPU, 2.0, min_devices=2, after=before), f"restart {i}"
    before = kubelet.registrations.count(GPU)
    os.unlink(os.path.join(sock_dir, "nvidia-gpu.sock"))
    assert kubelet.wait_registered(GPU, 2.0, min_devices=2, after=before)
    lock = tmp_path / "mig-apply.lock"
    lock.write_text("")
    assert kubelet.wait_for(lambda: r.manager.paused and src.stopped >= 1, 3)
    before = kubelet.registrations.count(GPU)
    lock.unlink()
    assert kubelet.wait_registered(GPU, 3, min_devices=2, after=before)


def test_with_inotify_no_tick_is_needed(kubelet, start_plugin, tmp_path, sock_dir):
    src = FakeSource(FakeSnapshot(gpus=full_gpus(1)))
    # a 60 s tick: every reaction within the bounds below comes from an event
    r = start_plugin(src, device_split_count=2, poll_interval_s=60.0)
    exercise(kubelet, r, src, tmp_path, sock_dir)
    assert r.manager._waker.watching()


def test_without_inotify_the_loop_polls(kubelet, start_plugin, tmp_path, sock_dir, monkeypatch):
    def no_inotify():
        raise fswatch.InotifyError(38, "inotify_init1: Function not implemented")

    monkeypatch.setattr(fswatch, "inotify_init", no_inotify)
    src = FakeSource(FakeSnapshot(gpus=full_gpus(1)))
    r = start_plugin(src, device_split_count=2)  # the fixture's 50 ms poll
    exercise(kubelet, r, src, tmp_path, sock_dir)
    assert not r.manager._waker.watching()
    assert r.manager._wait_s() == pytest.approx(0.05)

"""LoadedDriver: the kernel module's version file, read only while an NVML retry is pending."""

from __future__ import annotations

import threading
from pathlib import Path

from hami_agent.nvml.loaded import VERSION_FILE, VERSION_FILE_ENV, LoadedDriver


def test_reads_the_version_and_none_when_no_module_is_loaded(tmp_path: Path) -> None:
    f = tmp_path / "version"
    driver = LoadedDriver(str(f))
    assert driver.read() is None  # no file: no module
    f.write_text("570.172.08\n")
    assert driver.read() == "570.172.08"
    assert not driver.changed_since("570.172.08")
    assert driver.changed_since("570.158.01") and driver.changed_since(None)


def test_the_path_comes_from_the_environment_else_sysfs(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(VERSION_FILE_ENV, raising=False)
    assert LoadedDriver().path == VERSION_FILE
    monkeypatch.setenv(VERSION_FILE_ENV, str(tmp_path / "v"))
    assert LoadedDriver().path == str(tmp_path / "v")
    assert LoadedDriver("/explicit").path == "/explicit"


def test_wait_changed_returns_at_a_change_and_not_before(tmp_path: Path) -> None:
    f = tmp_path / "version"
    f.write_text("570.158.01\n")
    driver = LoadedDriver(str(f), poll_s=0.01)
    stop = threading.Event()
    assert driver.wait_changed("570.158.01", 0.05, stop) is False  # unchanged: the whole wait
    timer = threading.Timer(0.05, lambda: f.write_text("570.172.08\n"))
    timer.start()
    try:
        assert driver.wait_changed("570.158.01", 30.0, stop) is True
    finally:
        timer.cancel()
    f.unlink()  # a module that goes is a change too
    assert driver.wait_changed("570.172.08", 0.0, stop) is True
    stop.set()
    assert driver.wait_changed(None, 30.0, stop) is False  # stopped: no change, no wait

"""Sandbox processes: pid files survive the starting process, stop() ends the whole process group."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from sandbox.procs import ProcessManager

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_start_stop_kills_children_and_removes_pid_file(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path / "pids", tmp_path / "logs")
    child_pid_file = tmp_path / "child.pid"
    # a parent that starts a child in its group: stop() must end both (e.g. the NVML worker)
    code = ("import subprocess,sys,time;"
            f"p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']);"
            f"open({str(child_pid_file)!r},'w').write(str(p.pid));"
            "print('ready', flush=True); time.sleep(60)")
    pid = pm.start("worker", [sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while not child_pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(child_pid_file.read_text())
    assert pm.pid("worker") == pid and pm.names() == ["worker"]
    # another manager on the same directory (a second `sandbox down`) sees and stops it
    other = ProcessManager(tmp_path / "pids", tmp_path / "logs")
    assert other.stop("worker", timeout_s=5)
    assert not _alive(pid) or pm.pid("worker") is None
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert not (tmp_path / "pids" / "worker.pid").exists()
    assert "ready" in pm.log_path("worker").read_text()
    assert other.stop("worker") is False  # idempotent


def test_stale_pid_file_is_not_signalled(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path / "pids", tmp_path / "logs")
    (tmp_path / "pids").mkdir()
    # our own pid with a wrong start time: a recycled pid must never be killed
    (tmp_path / "pids" / "ghost.pid").write_text(f"{os.getpid()} 1\n")
    assert pm.pid("ghost") is None
    assert pm.stop("ghost") is False
    assert _alive(os.getpid())

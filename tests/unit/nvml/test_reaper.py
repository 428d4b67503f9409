"""WorkerReaper bookkeeping: the limit, /proc reading, workers left behind by an earlier agent process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hami_agent.nvml.errors import NvmlStuckUnkillable
from hami_agent.nvml.reaper import LIMIT_ENV, WorkerReaper, limit_from_env, read_proc_info

pytestmark = pytest.mark.unit

WORKER = b"/usr/bin/python3\0-m\0hami_agent.nvml.worker\0--mode\0serve\0"


def fake_proc(root: Path, pid: int, *, ppid: int = 1, state: str = "D", sigpnd: str = "0000000000000100",
              start: int = 777, cmdline: bytes = WORKER, wchan: str = "request_wait_answer") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cmdline").write_bytes(cmdline)
    rest = " ".join(["0"] * 17)  # fields 5..21; starttime is field 22
    (d / "stat").write_text(f"{pid} (python3 (x)) {state} {ppid} {rest} {start} 0 0\n")
    (d / "status").write_text(f"State:\t{state}\nSigPnd:\t0000000000000000\nShdPnd:\t{sigpnd}\n")
    (d / "wchan").write_text(wchan)


def test_read_proc_info_parses_state_wchan_and_pending_sigkill(tmp_path: Path) -> None:
    fake_proc(tmp_path, 42)
    info = read_proc_info(42, str(tmp_path))
    assert (info.state, info.wchan, info.sigkill_pending) == ("D", "request_wait_answer", True)
    assert info.describe() == "state D, wchan request_wait_answer, SIGKILL pending"
    gone = read_proc_info(43, str(tmp_path))
    assert gone.state is None and gone.describe() == "state ?"


def test_orphans_of_an_earlier_agent_count_until_they_exit(tmp_path: Path) -> None:
    fake_proc(tmp_path, 100)  # killed, stuck, reparented to init: an earlier agent's
    fake_proc(tmp_path, 101)
    fake_proc(tmp_path, 102, ppid=4242)  # a living agent's worker: not ours to count
    fake_proc(tmp_path, 103, sigpnd="0000000000000000")  # never killed: not abandoned
    fake_proc(tmp_path, 104, cmdline=b"/usr/bin/sleep\0100\0")  # not a worker
    reaper = WorkerReaper(limit=2, proc_root=str(tmp_path))
    assert reaper.adopt_orphans() == 2
    assert reaper.adopt_orphans() == 0  # idempotent
    assert sorted(reaper.pids()) == [100, 101] and not reaper.can_spawn()
    err = reaper.blocked_error()
    assert isinstance(err, NvmlStuckUnkillable) and "nvml-stuck-unkillable: 2 NVML worker" in str(err)
    assert "pid 100 in an earlier agent process's call" in str(err)
    shutil.rmtree(tmp_path / "100")  # it finally exited
    assert reaper.can_spawn() and reaper.pids() == [101]
    fake_proc(tmp_path, 101, start=999)  # PID 101 now belongs to another process
    assert reaper.pids() == []


def test_limit_from_env() -> None:
    assert limit_from_env({}) == 2
    assert limit_from_env({LIMIT_ENV: "5"}) == 5
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match=LIMIT_ENV):
            limit_from_env({LIMIT_ENV: bad})
    with pytest.raises(ValueError):
        WorkerReaper(limit=0)

"""The soak's process bookkeeping, against real processes: NVML workers found in /proc by the run's
marker (node and agent from their environment and command line), a crash noticed and restarted, a
stop that ends the unit's leftover workers (``KillMode=mixed``), and the last-resort clean-up."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from benchmarks.chaos.procs import RUN_ENV, AgentProcess, ProcScanner, kill_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# a stand-in "agent": starts one stand-in NVML worker (same command-line mark, its own session, as the
# real one) and then sleeps; exits 3 on SIGUSR1 (a crash), 0 on SIGTERM
AGENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(3))
w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "hami_agent.nvml.worker",
                      "--mode", "watch"], start_new_session=True)
while True:
    time.sleep(0.1)
"""


def wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


@pytest.fixture
def run_id():
    rid = f"test-procs-{os.getpid()}-{time.monotonic_ns()}"
    yield rid
    kill_run(rid)


def agent(tmp_path, run_id: str) -> AgentProcess:
    env = dict(os.environ, **{RUN_ENV: run_id, "GPUSIM_STATE": str(tmp_path / "node-7" / "gpusim.json")})
    return AgentProcess("node-7/device-plugin", "device-plugin", "node-7", [sys.executable, "-c", AGENT], env,
                        tmp_path / "agent.log", ProcScanner(run_id))


def test_workers_are_found_by_marker_and_a_stop_kills_what_the_unit_leaves(tmp_path, run_id):
    a = agent(tmp_path, run_id)
    a.start()
    scanner = ProcScanner(run_id)
    assert wait(lambda: len(scanner.workers()) == 1, 15), (tmp_path / "agent.log").read_text()
    w = scanner.workers()[0]
    assert (w.node, w.role, w.ppid, w.sigkill_pending) == ("node-7", "device-plugin", a.pid, False)
    assert ProcScanner("another-run").workers() == []
    assert a.stop(signal.SIGTERM) == 0
    assert a.unclean_stops() == [] and a.crashes() == []
    # the worker ran in its own session (a process-group kill would miss it): stop() killed it anyway
    assert wait(lambda: scanner.workers() == [] or all(not x.alive for x in scanner.workers()), 10)


def test_an_exit_nobody_asked_for_is_a_crash_and_is_restarted(tmp_path, run_id):
    a = agent(tmp_path, run_id)
    a.start()
    assert wait(lambda: a.running() and len(ProcScanner(run_id).workers()) == 1, 15)
    assert a.supervise() is None  # running: nothing to do
    os.kill(a.pid, signal.SIGUSR1)
    assert wait(lambda: not a.running(), 10)
    crash = a.supervise(restart_after_s=0.0)
    assert crash is not None and crash.rc == 3 and not crash.expected
    assert wait(a.running, 10) and a.starts == 2
    assert len(a.crashes()) == 1
    # a SIGKILL the soak sends on purpose is no crash, a SIGTERM that needs SIGKILL is unclean
    a.stop(signal.SIGKILL)
    assert len(a.crashes()) == 1 and a.unclean_stops() == []
    assert kill_run(run_id) >= 1  # the orphaned stand-in workers
    assert wait(lambda: ProcScanner(run_id).all_run_pids() == [], 10)

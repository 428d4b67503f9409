"""The chaos soak for 60 seconds (issue 17 deliverable 4), as ``make test`` runs it: four simulated GPU nodes
with the REAL device plugin and monitor processes on gpusim, SIMULATED kubelets, the test API server and two
REAL extender replicas behind the SIMULATED kube-scheduler, under seed 1's fault schedule (every fault kind
at least once), then the invariant checker. ``python -m benchmarks chaos --seconds 3600`` is the long soak
(docs/testing.md, "Chaos soak").

The soak runs as its own process (in its own session), so that whatever happens to it, the teardown can
end it and every process it started: each carries ``HAMI_CHAOS_RUN=<run id>`` in its environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.chaos.plan import KIND_NAMES, make_plan
from benchmarks.chaos.procs import ProcScanner, kill_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]
REPO = Path(__file__).resolve().parents[3]
SEED = 1
MUST_BE_ZERO = ("late_writes", "over_commits", "double_allocations", "lost_allocations", "leaked_node_locks",
                "crashes", "other_violations", "unanswered_rpcs", "unclean_stops", "harness_errors")


@pytest.fixture
def soak(tmp_path):
    run_id = f"pytest-{os.getpid()}-{time.monotonic_ns()}"
    started: list[subprocess.Popen] = []

    def run(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "chaos", *args, "--run-id", run_id,
                                 "--workdir", str(tmp_path / "soak")],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        started.append(proc)
        out, err = proc.communicate(timeout=420)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    yield run, run_id, tmp_path / "soak"
    for proc in started:  # a soak cut short (timeout, failure): its own clean-up first, then ours
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    kill_run(run_id)
    for mount in (tmp_path / "soak" / "fuse").glob("*"):  # FUSE mounts of the D-state model, if any left
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def test_sixty_seconds_of_faults_hold_every_invariant(soak):
    run, run_id, workdir = soak
    plan = make_plan(SEED, 60, 4)
    assert all(plan.counts()[k] for k in KIND_NAMES), plan.counts()  # the seed covers every kind
    t0 = time.monotonic()
    res = run("--seconds", "60", "--seed", str(SEED), "--nodes", "4")
    took = time.monotonic() - t0
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, (res.stdout, res.stderr[-4000:])
    report = json.loads(lines[0])
    print(f"\nchaos soak, 60 s, seed {SEED}, {took:.0f}s in all:\n{lines[0]}")
    assert res.returncode == 0, res.stderr[-6000:]
    assert report["seed"] == SEED and report["seconds"] == 60 and report["plan"] == plan.digest
    for name in MUST_BE_ZERO:
        assert report[name] == 0, (name, report, res.stderr[-4000:])
    assert report["max_nvml_processes"] <= report["k"] + 1
    assert report["max_abandoned_workers"] <= report["k"]
    # the soak did what it says: pods were admitted (how many depends on the machine's load), the late-
    # write check had success writes to look at, the faults happened
    assert report["pods_admitted"] >= 1 and report["success_writes"] >= 1, report
    done = report["faults"]
    assert sum(done.values()) >= len(plan.faults) - 2, (done, report["faults_skipped"])
    assert report["unkillable_model"].startswith(("fuse-d-state", "killable-fallback"))
    if report["unkillable_model"].startswith("fuse"):
        assert report["max_d_state_workers"] >= 1, "the unkillable hang left no worker in state D"
    # nothing of the run is left behind (its own clean-up, before our teardown's)
    end = time.monotonic() + 10  # a process SIGKILLed a moment ago may still be exiting
    while ProcScanner(run_id).all_run_pids() and time.monotonic() < end:
        time.sleep(0.2)
    assert ProcScanner(run_id).all_run_pids() == []
    assert not list(workdir.glob("fuse/*/hang"))

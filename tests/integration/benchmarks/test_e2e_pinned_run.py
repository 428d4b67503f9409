"""``python -m benchmarks e2e-schedule --pin``'s plumbing on a small run: every process of the SIMULATED
cluster (the benchmark with the kube-scheduler simulator, the API server, the extender, a node host) is on
its planned cores at the end of the run, and the run reports it. The cores here overlap (a build machine
has two); on the lent 16-core machine each part gets two of its own (docs/hardware.md)."""

from __future__ import annotations

import os

import pytest

from benchmarks.e2e_schedule.bench import run_case
from benchmarks.e2e_schedule.pinning import CorePlan, pin

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_a_pinned_run_keeps_every_process_on_its_cores_and_says_so() -> None:
    mine = os.sched_getaffinity(0)
    first, last = min(mine), max(mine)
    plan = CorePlan(bench=(first,), apiserver=(last,), extender=(last,), hosts=((first,),))
    try:
        r = run_case(2, 6, extender=True, hosts=1, timeout_s=60, queued=True, cores=plan)
    finally:
        pin(os.getpid(), mine)  # the benchmark pinned every thread of pytest's process: give them back
    assert r["running"] == 6 and r["all_running"]
    assert r["pinning"] == {"cores": plan.as_dict(), "held": True, "not_held": []}

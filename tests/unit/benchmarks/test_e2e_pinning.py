"""``benchmarks.e2e_schedule.pinning`` (``--pin``): disjoint cores per process, every thread pinned, the
threads started later included, and a report that says when the pinning did not hold."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.e2e_schedule.pinning import pin, plan_cores, verify

pytestmark = pytest.mark.unit

# a child that has three threads at once and starts a fourth after 0.5 s
CHILD = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
time.sleep(0.5)
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
time.sleep(30)
"""


def test_sixteen_cores_give_every_part_two_of_its_own() -> None:
    plan = plan_cores(range(15, -1, -1), hosts=4)
    assert plan.bench == (0, 1) and plan.apiserver == (2, 3) and plan.extender == (4, 5)
    assert plan.hosts == ((6, 7), (8, 9), (10, 11), (12, 13))
    every = [*plan.bench, *plan.apiserver, *plan.extender, *(c for h in plan.hosts for c in h)]
    assert len(every) == len(set(every)) == 14


def test_too_few_cores_is_refused_with_what_is_needed() -> None:
    with pytest.raises(ValueError, match=r"--pin needs 14 cores .* may use 2 \(\[0, 1\]\).*fewer --hosts"):
        plan_cores([0, 1], hosts=4)
    assert plan_cores(range(8), hosts=1).hosts == ((6, 7),)


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_every_thread_is_pinned_and_a_later_thread_inherits_the_cores() -> None:
    core = min(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        pin(child.pid, [core])  # at once, as the benchmark does: the interpreter is still starting
        end = time.monotonic() + 20
        while _threads(child.pid) < 5 and time.monotonic() < end:
            time.sleep(0.05)
        assert _threads(child.pid) == 5  # main, three at once, one started after the pin
        assert verify(child.pid, [core]) == []
        if len(os.sched_getaffinity(0)) > 1:  # a mask that differs is reported, thread by thread
            other = max(os.sched_getaffinity(0))
            off = verify(child.pid, [other])
            assert len(off) == 5 and all(f": [{core}]" in line for line in off)
    finally:
        child.kill()
        child.wait(10)

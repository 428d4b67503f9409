"""NVML_WORKER_UNKILLABLE: doctor names NVML workers that were killed and cannot exit, from /proc alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_agent.doctor import predicates
from hami_agent.doctor.collect import host
from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.collect.nvmlworkers import collect_nvml_workers
from hami_agent.doctor.engine import evaluate
from hami_agent.doctor.model import Facts
from hami_agent.doctor.trees import TREES

pytestmark = pytest.mark.unit

WORKER = b"/usr/bin/python3\0-m\0hami_agent.nvml.worker\0--mode\0watch\0"


def fake_proc(root: Path, pid: int, cmdline: bytes, state: str, wchan: str, sigpnd: str, ppid: int = 4000):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(cmdline)
    (d / "stat").write_text(f"{pid} (python3) {state} {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0\n")
    (d / "wchan").write_text(wchan)
    (d / "status").write_text(f"Name:\tpython3\nState:\t{state}\nSigPnd:\t{sigpnd}\n"
                              "ShdPnd:\t0000000000000000\n")


def verdicts(facts: Facts) -> dict:
    return {v.code: v for v in evaluate(TREES, facts, predicates.REGISTRY)}


def test_killed_workers_in_d_state_are_named_with_state_and_wchan(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 101, WORKER, "D", "request_wait_answer", "0000000000000100")  # SIGKILL pending
    fake_proc(proc, 102, WORKER, "D", "os_nv_ioctl", "0000000000000100")
    fake_proc(proc, 103, WORKER, "S", "0", "0000000000000000")  # the live, healthy worker
    fake_proc(proc, 104, b"/usr/bin/sleep\0100\0", "D", "request_wait_answer", "0000000000000100")  # not ours
    facts = Facts()
    collect_nvml_workers(Context(proc_root=str(proc)), facts)
    assert facts.get("nvml.workers.count") == 3
    assert [w["pid"] for w in facts.get("nvml.workers.unkillable")] == [101, 102]
    v = verdicts(facts)["NVML_WORKER_UNKILLABLE"]
    assert "2 NVML worker process(es) were killed but cannot exit" in v.summary
    assert "pid 101 state D wchan request_wait_answer" in v.summary
    assert "pid 102 state D wchan os_nv_ioctl" in v.summary
    assert any("/101: NVML worker (parent 4000) state D" in line for line in v.evidence)
    assert "reboot" in v.fix


def test_no_verdict_when_no_worker_is_stuck(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 103, WORKER, "S", "0", "0000000000000000")
    facts = Facts()
    collect_nvml_workers(Context(proc_root=str(proc)), facts)
    assert facts.get("nvml.workers.unkillable_count") == 0
    assert "NVML_WORKER_UNKILLABLE" not in verdicts(facts)


def test_known_bad_driver_points_at_the_upgrade_playbook(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 101, WORKER, "D", "request_wait_answer", "0000000000000100")
    facts = Facts()
    collect_nvml_workers(Context(proc_root=str(proc)), facts)
    facts.set("host.driver.version", "570.158.01")
    host.derive_driver_facts(facts)
    v = verdicts(facts)["NVML_WORKER_UNKILLABLE"]
    assert "remediate_nvml_hang.yml" in v.fix and "570.158.01 is known-bad" in v.summary


def test_doctor_does_not_add_a_stuck_probe_of_its_own(tmp_path: Path) -> None:
    """With workers already stuck in the driver, doctor's NVML probe would hang and leave one more."""
    proc = tmp_path / "proc"
    fake_proc(proc, 101, WORKER, "D", "request_wait_answer", "0000000000000100")
    facts = Facts()
    host.collect_nvml(Context(proc_root=str(proc), nvml_lib="/nonexistent/libnvidia-ml.so.1"), facts)
    assert facts.get("nvml.status") == "hung"
    assert "not probed" in facts.lines("nvml.status")[0] and "101" in facts.lines("nvml.status")[0]


def test_plugin_metric_alone_is_enough() -> None:
    facts = Facts()
    facts.set("plugin.metrics.nvml_stuck_unkillable", 1.0, "http://127.0.0.1:9394 metric ... = 1")
    assert "NVML_WORKER_UNKILLABLE" in verdicts(facts)

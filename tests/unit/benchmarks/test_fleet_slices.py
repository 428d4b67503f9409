"""benchmarks/fleet in slices: the sliced projection (model.project_slices) and the merge of the runner's
per-process benchmark accounts (benchmarks/fleet/slices.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fleet import model, slices


def test_each_slice_pays_its_own_host_count_s_cost_and_the_cores_are_shared() -> None:
    # main 2 ms + 0.02 ms per host in the process, workers 40 ms, hosts 100 ms, 100 tasks/host, no fixed cost
    p = model.Params(tasks_per_host=100, main_s=(0.002, 0.00002), worker_s=(0.04, 0.0), host_s=0.1, fixed_s=0)
    one = model.project_slices(p, 1000, 1, forks=50, cores=8)
    assert one["main_per_host_task_s"] == pytest.approx(0.022)
    assert one["phase1_s"] == pytest.approx(0.022 * 100_000 + 100 * 0.15)  # main-bound, as project()
    assert one["phase1_s"] == pytest.approx(model.project(p, 1000, 50, 8)["total_s"])
    four = model.project_slices(p, 1000, 4, forks=50, cores=8)
    main_1 = (0.002 + 0.00002 * 250) * 100 * 250  # 175 s
    assert four["main_s"] == pytest.approx(main_1)
    assert four["cpu_s"] == pytest.approx(4 * main_1 + 0.04 * 100_000)
    assert four["bound"] == "cpu" and four["phase1_s"] == pytest.approx(four["cpu_s"] / 8 + 15)
    assert four["total_s"] == pytest.approx(four["phase1_s"] + model.project(p, 2, 50, 8)["total_s"])
    # more slices than cores: the main processes share them
    p0 = model.Params(tasks_per_host=100, main_s=(0.01, 0.0), worker_s=(0.0, 0.0), host_s=0.0, fixed_s=0)
    r = model.project_slices(p0, 1000, 16, forks=1000, cores=4, rtt_s=0.0)
    assert r["bound"] == "main" and r["phase1_s"] == pytest.approx(0.01 * 100 * 62.5 * 4)
    with pytest.raises(ValueError):
        model.project_slices(p, 1000, 0, forks=50, cores=8)


def _doc(hosts: list[str], tasks_each: int, self_s: float, work_s: float, t: float) -> dict:
    return {
        "plays": [{"name": "Plan", "t": 0.0}],
        "task_starts": [],
        "tasks": [{"host": h, "status": "ok"} for h in hosts for _ in range(tasks_each)]
        + [{"host": "localhost", "status": "ok"}],
        "end": {"t": t, "self_s": self_s, "children_s": 2 * self_s,
                "main": {"work_s": work_s, "spin_s": 1.0}},
        "stats": {h: {"changed": 0} for h in hosts},
    }


def test_the_processes_accounts_merge_into_one_and_each_keeps_its_cost(tmp_path: Path) -> None:
    docs = {"1": _doc(["a", "c"], 10, 4.0, 2.0, 50), "2": _doc(["b"], 10, 3.0, 1.0, 40),
            "final": _doc(["a"], 5, 1.0, 0.5, 10)}
    for name, doc in docs.items():
        (tmp_path / f"size-3-account-{name}.json").write_text(json.dumps(doc))
    (tmp_path / "size-30-account-1.json").write_text("{}")  # another run's: not read
    got = slices.accounts(str(tmp_path / "size-3-{run}.json"))
    assert sorted(got) == ["1", "2", "final"]
    merged = slices.merge(got)
    assert len(merged["tasks"]) == 20 + 10 + 5 + 3
    assert merged["end"]["self_s"] == 8.0 and merged["end"]["children_s"] == 16.0
    assert merged["end"]["main"]["work_s"] == 3.5 and merged["end"]["main"]["spin_s"] == 3.0
    assert model.host_tasks(merged, ["a", "b", "c"]) == {"a": 15, "b": 10, "c": 10}
    rows = slices.per_process(got, ["a", "b", "c"])
    assert [(r["process"], r["hosts"], r["host_tasks"]) for r in rows] == [("1", 2, 20), ("2", 1, 10),
                                                                            ("final", 1, 5)]
    assert rows[0]["main_work_per_host_task_s"] == pytest.approx(0.1)
    assert slices.merge({}) == {}

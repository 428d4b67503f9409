"""api-load's figures: the idle CPU an idle node pays for the product, judged against issue 31's budget."""

import pytest

from benchmarks.api_load.bench import figures

pytestmark = pytest.mark.unit


def _result(plugin_pct: float, monitor_pct: float, workers_pct: tuple[float, float] = (0.0, 0.0)) -> dict:
    idle = {"_writes": 0, "_non_watch": 0, "_total": 0, "watch": {"requests": 0}}
    agent = {"rss_max_mb": 60.0, "n": 4}
    return {"idle": idle, "idle_agents": {
        "device-plugin": {**agent, "cpu_pct": plugin_pct, "worker_cpu_pct": workers_pct[0]},
        "monitor": {**agent, "cpu_pct": monitor_pct, "worker_cpu_pct": workers_pct[1]}}}


FIGURE = "api-load: idle device plugin + monitor CPU per node, NVML workers included"


def _row(rows, figure):
    return next(r for r in rows if r[0] == figure)


def test_idle_cpu_per_node_is_device_plugin_plus_monitor_in_ms_per_second():
    row = _row(figures(_result(0.31, 0.03)), FIGURE)
    assert row[1].startswith("3.40 ms/s") and row[2] == "<= 1 ms/s" and row[3] is False


def test_idle_cpu_within_the_budget_is_met():
    row = _row(figures(_result(0.07, 0.02)), FIGURE)
    assert row[1].startswith("0.90 ms/s") and row[3] is True


def test_the_agents_nvml_workers_count_against_the_budget():
    """The workers are the agents' own processes: an idle node pays for them too."""
    row = _row(figures(_result(0.05, 0.02, (0.02, 0.02))), FIGURE)
    assert row[1] == "1.10 ms/s (agents 0.70, their NVML workers 0.40; never scraped)" and row[3] is False


WAKEUPS = "api-load: idle wakeups per node, device plugin + monitor + their NVML workers"


def test_wakeups_per_node_add_the_agents_and_their_workers_and_give_the_cpu_per_wakeup():
    r = _result(0.05, 0.02, (0.02, 0.02))  # 1.10 ms/s in all
    r["idle_agents"]["device-plugin"] |= {"wakeups_per_s": 4.0, "worker_wakeups_per_s": 1.5}
    r["idle_agents"]["monitor"] |= {"wakeups_per_s": 0.5, "worker_wakeups_per_s": 5.0}
    row = _row(figures(r), WAKEUPS)
    assert row[1] == "11.0 /s (0.100 ms of CPU per wakeup on this machine)" and row[3] is True


def test_a_result_without_wakeup_counts_has_no_wakeup_row():
    assert not [r for r in figures(_result(0.05, 0.02)) if r[0] == WAKEUPS]


def test_process_wakeups_counts_a_live_process_and_grows_when_it_sleeps():
    import os
    import time

    from benchmarks.procstat import process_wakeups

    before = process_wakeups(os.getpid())
    for _ in range(3):
        time.sleep(0.001)  # each sleep blocks the thread: a voluntary switch
    assert process_wakeups(os.getpid()) >= before + 3

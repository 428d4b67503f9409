"""``python -m benchmarks``: names with dashes, and the summary table of every benchmark's figures."""

from __future__ import annotations

import pytest

from benchmarks import __main__ as runner

pytestmark = pytest.mark.unit


def test_a_name_may_be_written_with_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"api_load", "e2e_schedule", "doctor_cluster", "requeue", "scheduler"} <= set(runner.discover())
    with pytest.raises(SystemExit) as exc:  # dispatched to the benchmark, whose --help exits 0
        runner.main(["e2e-schedule", "--help"])
    assert exc.value.code == 0
    assert "e2e_schedule" in capsys.readouterr().out
    assert runner.main(["no-such-bench"]) == 2


def test_summary_table_lists_every_figure_with_its_goal(capsys: pytest.CaptureFixture[str]) -> None:
    runner.print_summary([("scheduler", "filter: cold p99", "98.9 ms", "<= 20 ms", False),
                          ("requeue", "natural", "0.03 s", "<= 2 s", True)])
    out = capsys.readouterr().out.splitlines()
    assert "| benchmark | figure | value | goal | met |" in out
    assert "| scheduler | filter: cold p99 | 98.9 ms | <= 20 ms | **no** |" in out
    assert "| requeue | natural | 0.03 s | <= 2 s | yes |" in out

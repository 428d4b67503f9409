"""``python -m benchmarks``: names with dashes, and the summary table of every benchmark's figures."""

from __future__ import annotations

import sys
import types

import pytest

from benchmarks import __main__ as runner
from benchmarks import goals

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


def _fake_bench(monkeypatch: pytest.MonkeyPatch, rows: list[tuple], rc: int = 0) -> list[list[str]]:
    """A benchmark ``fake`` whose main leaves ``rows`` in SUMMARY and returns ``rc``; returns its argvs."""
    calls: list[list[str]] = []
    module = types.ModuleType("benchmarks.fake.bench")

    def main(argv: list[str]) -> int:
        calls.append(list(argv))
        module.SUMMARY[:] = rows
        return rc

    module.main = main  # type: ignore[attr-defined]
    module.SUMMARY = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.fake.bench", module)
    monkeypatch.setattr(runner, "discover", lambda: ["fake"])
    return calls


def test_a_missed_goal_fails_the_run_unless_no_goals(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_bench(monkeypatch, [("x", "3 s", "<= 2 s", False), ("y", "1", "-", True)])
    assert runner.main(["fake"]) == 1  # the bench itself returned 0: the runner's backstop
    assert runner.main(["--no-goals", "fake"]) == 0
    assert runner.main(["fake", "--quick", "--no-goals"]) == 0
    assert calls == [[], ["--no-goals"], ["--quick", "--no-goals"]]  # passed on to the benchmark
    capsys.readouterr()


def test_met_goals_and_a_failing_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_bench(monkeypatch, [("x", "1 s", "<= 2 s", True)])
    assert runner.main(["fake"]) == 0
    _fake_bench(monkeypatch, [("x", "1 s", "<= 2 s", True)], rc=1)
    assert runner.main(["--no-goals", "fake"]) == 1  # --no-goals does not hide a benchmark that failed


def test_exit_code_names_the_misses(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [("filter p99", "30 ms", "<= 20 ms", False), ("rss", "300 MB", "<= 500 MB", True)]
    assert goals.exit_code(rows, no_goals=False) == 1
    assert "filter p99" in capsys.readouterr().err
    assert goals.exit_code(rows, no_goals=True) == 0
    assert "reported only" in capsys.readouterr().err
    assert goals.exit_code(rows[1:], no_goals=False) == 0


def test_every_benchmark_accepts_no_goals() -> None:
    """The runner gives --no-goals to every benchmark it runs: each parser must take it (--help exits 0
    before anything runs; the flag must be listed)."""
    import contextlib
    import importlib
    import io

    for name in runner.discover():
        module = importlib.import_module(f"benchmarks.{name}.bench")
        out = io.StringIO()
        with pytest.raises(SystemExit) as exc, contextlib.redirect_stdout(out):
            module.main(["--help"])
        assert exc.value.code == 0, name
        assert goals.FLAG in out.getvalue(), name

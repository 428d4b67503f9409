"""``benchmarks/webhook_flood``: its arguments and the shape of its figures (no flood is run here)."""

from __future__ import annotations

import pytest

from benchmarks import __main__ as runner
from benchmarks.webhook_flood import bench

pytestmark = pytest.mark.unit


def test_quick_is_one_round_of_four_windows_and_nonsense_is_refused() -> None:
    args = bench.parse_args(["--quick"])
    assert (args.rounds, args.windows, args.clients) == (1, 4, 200)
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
    assert args.arrangements == ["own process", "one process"]  # the figures' and the control
    with pytest.raises(SystemExit):
        bench.parse_args(["--arrangements", "own process,neither"])


def _run(on: list[float], off: list[float], codes: dict) -> dict:
    return {"on": on, "off": off, "codes": codes, "flood_requests": 100, "arrival_on": [0.2],
            "arrival_off": [0.1]}


def test_pooled_rounds_give_one_ratio_and_every_non_200_counts() -> None:
    runs = {"own process": [_run([2.0] * 97 + [3.0] * 3, [1.0] * 100, {200: 200}),
                            _run([2.0] * 100, [1.0] * 97 + [2.0] * 3, {200: 199, 503: 1})],
            "one process": [_run([7.0] * 100, [2.0] * 100, {"200": 200})]}
    stats = bench.summarise(runs)
    own = stats["own process"]
    assert (own["n_on"], own["n_off"], own["p99_on"], own["p99_off"]) == (200, 200, 3.0, 2.0)
    assert own["ratio"] == 1.5 and own["non_200"] == 1 and own["flood_requests"] == 200
    assert stats["one process"]["ratio"] == 3.5  # the control: printed, not a figure
    rows = bench.figures(stats)
    assert [len(r) for r in rows] == [4, 4]
    assert rows[0] == ("/filter p99 flooded / quiet", "1.5x (3.0 / 2.0 ms)", "<= 2x", True)
    assert rows[1] == ("/filter answers other than 200 under the flood", "1", "0", False)
    assert bench.RUN_BY_DEFAULT is True and "webhook_flood" in runner.discover()

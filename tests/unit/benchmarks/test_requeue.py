"""``benchmarks/requeue``: its variants and how a trial's times become figures (no cluster is run here)."""

from __future__ import annotations

import pytest

from benchmarks.requeue import bench

pytestmark = pytest.mark.unit


def _trial(wait: float | None, backoff_left: float = 0.0) -> dict:
    return {"delete_to_bound_s": wait, "backoff_left_s": backoff_left}


def test_the_harsher_variants_are_there() -> None:
    v = bench.VARIANTS
    assert {v["crowd-3"].holders, v["crowd-8"].holders} == {3, 8}
    assert v["busy-node"].gpus == 8 and v["lag-2s"].lag_s == 2.0 and v["in-backoff"].refusals > 0
    assert not v[bench.CONTROL].readback


def test_figures_judge_every_variant_but_the_control() -> None:
    rows = bench.figures({"raced": [_trial(0.03), _trial(2.5)], "crowd-8": [_trial(0.02)],
                          bench.CONTROL: [_trial(3.0)], "natural": [_trial(None)]})
    by_name = {r[0].split(")")[0].split("(")[1]: r for r in rows}
    assert set(by_name) == {"raced", "crowd-8", "natural"}  # the control is printed, not judged
    assert by_name["raced"][1] == "p50 2.50 s, max 2.50 s (2 trials)" and not by_name["raced"][3]
    assert by_name["crowd-8"][3] and by_name["crowd-8"][2] == "<= 2 s"
    assert by_name["natural"][1] == "never bound" and not by_name["natural"][3]


def test_in_backoff_is_judged_against_the_backoff_left() -> None:
    """kube-scheduler does not try a pod in backoff: the bound is the backoff left + the 1 s flush."""
    (row,) = bench.figures({"in-backoff": [_trial(4.9, backoff_left=4.0)]})
    assert row[3] and "5.25 s" in row[2]
    (row,) = bench.figures({"in-backoff": [_trial(5.4, backoff_left=4.0)]})
    assert not row[3]

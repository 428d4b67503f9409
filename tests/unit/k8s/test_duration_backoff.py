"""Go duration formatting and the backoff shape (HAMi's node lock constants)."""

from __future__ import annotations

import random

import pytest

from hami_agent.k8s.backoff import Backoff, hami_nodelock_backoff
from hami_agent.protocol.timefmt import format_go_duration

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("seconds", "text"), [
    (300, "5m0s"),
    (30, "30s"),
    (90, "1m30s"),
    (3600, "1h0m0s"),
    (3661, "1h1m1s"),
    (1.5, "1.5s"),
    (61.25, "1m1.25s"),
    (0.5, "500ms"),
    (0.0015, "1.5ms"),
    (0.000002, "2\u00b5s"),
    (0, "0s"),
    (-30, "-30s"),
    (28, "28s"),
])
def test_go_duration_string(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text


def test_nodelock_backoff_matches_hami_constants() -> None:
    bo = hami_nodelock_backoff()
    bo.rng = random.Random(7)
    delays = []
    while not bo.exhausted:
        delays.append(bo.next())
    assert len(delays) == 5
    for i, d in enumerate(delays):
        base = 0.1 * 2 ** i
        assert base <= d <= base * 1.5, (i, d)


def test_backoff_caps_and_resets() -> None:
    bo = Backoff(duration_s=1, factor=10, jitter=0, steps=10, cap_s=5)
    assert [bo.next() for _ in range(3)] == [1, 5, 5]
    bo.reset()
    assert bo.next() == 1
    assert not bo.exhausted

"""Token bucket of the client-side rate limit (client-go's flowcontrol defaults and semantics)."""

from __future__ import annotations

import pytest

from hami_agent.k8s.ratelimit import DEFAULT_BURST, DEFAULT_QPS, RateLimiter
from tests.clock import ManualClock

pytestmark = pytest.mark.unit


def test_burst_then_reservations_in_order() -> None:
    clock = ManualClock()
    rl = RateLimiter(qps=2.0, burst=3, clock=clock)
    assert [rl.reserve(10) for _ in range(3)] == [0.0, 0.0, 0.0]
    # no token left: each caller reserves the next one, queued behind the previous reservation
    assert rl.reserve(10) == pytest.approx(0.5)
    assert rl.reserve(10) == pytest.approx(1.0)
    assert rl.throttled == 2 and rl.waited_s == pytest.approx(1.5)


def test_refill_is_capped_at_burst() -> None:
    clock = ManualClock()
    rl = RateLimiter(qps=1.0, burst=2, clock=clock)
    rl.reserve(0)
    rl.reserve(0)
    clock.t += 3600  # an idle hour does not bank more than ``burst`` tokens
    assert [rl.reserve(0) for _ in range(2)] == [0.0, 0.0]
    assert rl.reserve(0) is None


def test_a_wait_beyond_the_deadline_takes_nothing() -> None:
    clock = ManualClock()
    rl = RateLimiter(qps=1.0, burst=1, clock=clock)
    assert rl.reserve(0) == 0.0
    assert rl.reserve(0.5) is None and rl.refused == 1  # would need 1 s
    clock.t += 1.0
    assert rl.reserve(0) == 0.0  # the refused caller did not consume the refilled token


def test_try_accept_never_waits() -> None:
    rl = RateLimiter(qps=1 / 300, burst=2, clock=ManualClock())
    assert rl.try_accept() and rl.try_accept() and not rl.try_accept()


def test_client_go_defaults_and_bad_values() -> None:
    assert (DEFAULT_QPS, DEFAULT_BURST) == (5.0, 10)
    with pytest.raises(ValueError, match="qps > 0"):
        RateLimiter(qps=0, burst=1)

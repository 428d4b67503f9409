"""``ManualClock``: a clock a test moves by hand, for code that takes a ``clock`` (``time.monotonic``-like)
and, where it waits, a ``sleep``."""

from __future__ import annotations


class ManualClock:
    def __init__(self, start: float = 100.0) -> None:
        self.t = start
        self.sleeps: list[float] = []  # every sleep() asked for, in order

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        """Sleeping moves the clock at once."""
        self.sleeps.append(s)
        self.t += s

"""Exponential backoff with jitter, shaped like apimachinery's ``wait.Backoff`` so HAMi's constants
(e.g. the node lock's 5 steps, 100 ms, factor 2, jitter 0.5) mean the same thing here."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_SHARED_RNG = random.Random()


@dataclass
class Backoff:
    """``next()`` returns the next sleep: ``duration * (1 + jitter * rand)``, then ``duration *= factor``
    (capped at ``cap_s``). ``steps`` bounds the number of sleeps; ``exhausted`` says when it is used up."""

    duration_s: float = 0.1
    factor: float = 2.0
    jitter: float = 0.5
    steps: int = 5
    cap_s: float = 30.0
    # one generator for all backoffs: a Backoff is made per API call, and seeding a new Random from
    # os.urandom cost more than the rest of the call's client-side bookkeeping (random() is thread-safe)
    rng: random.Random = field(default_factory=lambda: _SHARED_RNG, repr=False)
    _current: float = field(default=-1.0, init=False, repr=False)
    _taken: int = field(default=0, init=False, repr=False)

    def next(self) -> float:
        if self._current < 0:
            self._current = self.duration_s
        base = min(self._current, self.cap_s)
        self._current = min(self._current * self.factor, self.cap_s)
        self._taken += 1
        return base * (1.0 + self.jitter * self.rng.random()) if self.jitter > 0 else base

    @property
    def exhausted(self) -> bool:
        return self._taken >= self.steps

    def reset(self) -> None:
        self._current = -1.0
        self._taken = 0


def hami_nodelock_backoff() -> Backoff:
    """HAMi's node lock retry: 5 steps starting at 100 ms, factor 2, jitter 0.5 (Project-HAMi/HAMi
    pkg/util/nodelock/nodelock.go)."""
    return Backoff(duration_s=0.1, factor=2.0, jitter=0.5, steps=5)

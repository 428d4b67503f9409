"""Client-side rate limit of API requests: a token bucket, as client-go's ``flowcontrol`` limiter.

client-go gives every client ``QPS`` 5 and ``Burst`` 10 by default (``rest.DefaultQPS``/``DefaultBurst``
in ``staging/src/k8s.io/client-go/rest/config.go``) and waits for a token before each request, retries
included (``Request.tryThrottle`` in ``rest/request.go``); a wait longer than the request's deadline
fails the request instead of sleeping past it. This module does the same for ``KubeClient``.

Why hand-written: the rule is twenty lines (refill ``qps`` tokens per second up to ``burst``; a caller
that finds no token *reserves* the next one and sleeps until it is due, so waiters are served in order),
and the limiter libraries on PyPI bring storage backends and async variants we do not need.

A limiter never sits on a kubelet RPC path: the device plugin's Allocate client and the scheduler's
request-path clients are views without one (``KubeClient.with_options(limiter=None)``); see
docs/kubernetes.md "Client-side rate limits".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# client-go rest.DefaultQPS / rest.DefaultBurst
DEFAULT_QPS = 5.0
DEFAULT_BURST = 10


class RateLimiter:
    """Token bucket: ``burst`` tokens, refilled at ``qps`` per second. Thread-safe."""

    def __init__(self, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"rate limit needs qps > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0  # total time callers were told to wait (metrics, benchmarks)
        self.throttled = 0  # requests that had to wait
        self.refused = 0  # requests whose wait would have exceeded their deadline

    def reserve(self, max_wait_s: float) -> float | None:
        """Take a token now or reserve the next one. Returns how long the caller must sleep before it
        may send (0 when a token was free), or None when that would exceed ``max_wait_s`` (then nothing
        is taken)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            wait = (1.0 - self._tokens) / self.qps
            if wait > max_wait_s:
                self.refused += 1
                return None
            self._tokens -= 1.0  # below zero: a reservation the next callers queue behind
            self.throttled += 1
            self.waited_s += wait
            return wait

    def try_accept(self) -> bool:
        """Take a token only if one is free now (client-go's ``TryAccept``: never waits)."""
        return self.reserve(0.0) == 0.0


__all__ = ["DEFAULT_BURST", "DEFAULT_QPS", "RateLimiter"]

"""One deadline budget per kubelet RPC, and the rule that decides who answers the kubelet.

The kubelet calls GetPreferredAllocation and Allocate with no deadline and admits pods one at a time, so
the plugin answers every RPC within ``rpc_deadline_s`` itself (``server.DeadlineRunner``). A budget is
created when the RPC arrives and passed down the whole path:

* every API call on the path gets the *remaining* time (minus a reply margin) as its timeout, and none
  is started when too little is left (``call_timeout``; lookups are also capped at ``--api-timeout`` so
  that one slow read leaves time for the write);
* the success write (the pod annotation patch that consumes the allocation) goes through ``commit``;
  it is the last step of Allocate and starts only while the RPC is unanswered and at least
  ``commit_margin_s`` is left;
* the runner, before it answers an error (deadline passed or the body raised), calls ``answer_error``.

``commit`` and ``answer_error`` check-and-set one state under one lock, so exactly one of
{success committed, error answered} wins:

    OPEN --commit starts--> COMMITTING --write returned OK--> COMMITTED   (the runner answers success)
      |                        |   \\--write failed--------> ABANDONED   (the body raises; error answered)
      |                        \\--answer_error-------------> ANSWERED    (write still in flight)
      \\--answer_error------------------------------------> ANSWERED

A write that returns after ANSWERED raises ``LateCommit``: its outcome is unknown to the kubelet's
answer, so the caller records the truth (``bind-phase=failed``, allocation restored, lock released).
A COMMITTED result is handed to the runner through the budget itself, so a deadline that fires between
the commit and the body's return still answers the success that was written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")

MIN_CALL_S = 0.05  # an API call with a shorter timeout cannot succeed; do not start it


class BudgetExhausted(RuntimeError):
    """The RPC was answered, or too little of its deadline is left to start the next step."""


class LateCommit(RuntimeError):
    """The success write returned after the kubelet had been answered with an error."""


class State(Enum):
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABANDONED = "abandoned"
    ANSWERED = "answered"


class RpcBudget(Generic[T]):
    """The deadline and answer state of one kubelet RPC. Thread-safe."""

    def __init__(self, what: str, deadline_s: float, *, reply_margin_s: float = 0.1,
                 commit_margin_s: float = 0.25, api_timeout_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.deadline_s = deadline_s
        self.reply_margin_s = reply_margin_s
        self.commit_margin_s = commit_margin_s
        self.api_timeout_s = api_timeout_s
        self._clock = clock
        self._end = clock() + deadline_s
        self._lock = threading.Lock()
        self._state = State.OPEN
        self._result: T | None = None

    # ------------------------------------------------------------------------------------ time
    def remaining(self) -> float:
        return self._end - self._clock()

    def call_timeout(self, what: str) -> float:
        """Timeout for the next API call: what is left minus the reply margin (capped at the API
        timeout). Raises ``BudgetExhausted`` when the RPC is answered or the call could not finish."""
        with self._lock:
            state = self._state
        if state is State.ANSWERED:
            raise BudgetExhausted(f"{self.what} was already answered; not starting {what}")
        left = self.remaining() - self.reply_margin_s
        if self.api_timeout_s is not None:
            left = min(left, self.api_timeout_s)
        if left < MIN_CALL_S:
            raise BudgetExhausted(f"{self.what}: {max(0.0, self.remaining()):.3f}s left of the "
                                  f"{self.deadline_s:g}s deadline, not enough for {what}")
        return left

    def wait_timeout(self) -> float:
        """How long the body may wait for a local lock: what is left minus the reply margin (may be <= 0)."""
        return self.remaining() - self.reply_margin_s

    # ------------------------------------------------------------------------------- the rule
    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    def commit(self, write: Callable[[float], object], result: T) -> T:
        """Run the success ``write(timeout_s)`` and return ``result`` if it wins the race with the
        runner's error answer. Raises ``BudgetExhausted`` (not started: nothing written),
        ``LateCommit`` (written, but the kubelet was answered with an error meanwhile) or whatever
        ``write`` raised (outcome up to the caller to classify)."""
        with self._lock:
            if self._state is not State.OPEN:
                raise BudgetExhausted(f"{self.what}: success write not started, RPC state is "
                                      f"{self._state.value}")
            left = self.remaining()
            if left < self.commit_margin_s:
                raise BudgetExhausted(f"{self.what}: only {max(0.0, left):.3f}s left of the "
                                      f"{self.deadline_s:g}s deadline; not starting the success write "
                                      f"(needs {self.commit_margin_s:g}s)")
            self._state = State.COMMITTING
        try:
            # all that is left: it is the last call, so capping it (like lookups) would only fail it sooner
            write(left - self.reply_margin_s)
        except BaseException:
            with self._lock:
                if self._state is State.COMMITTING:
                    self._state = State.ABANDONED
            raise
        with self._lock:
            if self._state is State.COMMITTING:
                self._state = State.COMMITTED
                self._result = result
                return result
        raise LateCommit(f"{self.what}: the success write returned after the kubelet was answered "
                         "with an error")

    def answer_error(self) -> tuple[bool, T | None]:
        """Called by the runner before it answers an error. Returns ``(True, result)`` when a success
        was already committed (the runner must answer it instead), else marks the RPC answered and
        returns ``(False, None)``; from then on ``commit`` cannot succeed."""
        with self._lock:
            if self._state is State.COMMITTED:
                return True, self._result
            self._state = State.ANSWERED
            return False, None

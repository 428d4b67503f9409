"""NodeLockWaiter's recheck of a lock judged busy from the watches alone (lock_node's judge_cached_lock):
a stalled watch costs a bind RECHECK_S at most, and a live watch that shows the lock change hands (a
queue of binds behind one node) costs no read of the node. The clock is the test's; the waiter's own
thread is woken after each step."""

from __future__ import annotations

import threading

import pytest

from hami_agent.scheduler.verbs.lockwait import RECHECK_S, NodeLockWaiter

pytestmark = pytest.mark.unit


class _Locks:
    """The node watch's lock table, as state/nodelocks.py offers it to the waiter."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)

    def value(self, node: str) -> str | None:
        return self.values.get(node)

    def subscribe(self, released, gone) -> None:
        self.released = released


class _Bind:
    def __init__(self) -> None:
        self.answers: list[bool] = []
        self.event = threading.Event()

    def resume(self, timed_out: bool) -> None:
        self.answers.append(timed_out)
        self.event.set()


@pytest.fixture
def waiter():
    clock = [100.0]
    locks = _Locks(n1="t1,ns,a")
    w = NodeLockWaiter(locks, wait_s=15.0, clock=lambda: clock[0])

    def at(t: float) -> None:
        clock[0] = t
        with w._cond:
            w._cond.notify_all()

    yield w, locks, at
    w.stop()


def test_a_recheck_waits_on_while_the_watch_shows_the_lock_change_hands(waiter) -> None:
    w, locks, at = waiter
    bind = _Bind()
    assert w.wait("n1", "t1,ns,a", bind.resume, recheck=True)
    locks.values["n1"] = "t2,ns,b"  # another waiter was woken and took the lock: the watch is alive
    at(100.0 + RECHECK_S)
    assert not bind.event.wait(0.3) and w.waiting("n1") == 1
    at(100.0 + 1.9 * RECHECK_S)  # not yet RECHECK_S after the change it saw
    assert not bind.event.wait(0.3)
    at(100.0 + 2.1 * RECHECK_S)  # the same lock for RECHECK_S: the bind reads the node itself
    assert bind.event.wait(5) and bind.answers == [False] and w.timeouts == 0


def test_a_recheck_of_a_watch_that_showed_nothing_resumes_the_bind(waiter) -> None:
    w, _locks, at = waiter
    bind = _Bind()
    assert w.wait("n1", "t1,ns,a", bind.resume, recheck=True)
    at(100.0 + RECHECK_S)
    assert bind.event.wait(5) and bind.answers == [False]


def test_a_live_watch_never_keeps_a_bind_past_its_deadline(waiter) -> None:
    w, locks, at = waiter
    bind = _Bind()
    deadline = 100.0 + 1.5 * RECHECK_S
    assert w.wait("n1", "t1,ns,a", bind.resume, deadline=deadline, recheck=True)
    locks.values["n1"] = "t2,ns,b"
    at(100.0 + RECHECK_S)  # re-armed for the deadline itself, as the time-out
    assert not bind.event.wait(0.3)
    locks.values["n1"] = "t3,ns,c"  # a change at the time-out does not extend it
    at(deadline + 0.01)
    assert bind.event.wait(5) and bind.answers == [True] and w.timeouts == 1 and w.waiting() == 0

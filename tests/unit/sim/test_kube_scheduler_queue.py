"""The simulated kube-scheduler's scheduling queue follows kube-scheduler's rules (scheduling_queue.go):
an extender-refused pod is parked until a cluster event or the 5-minute flush; errors back off; events
during an attempt send the pod to backoffQ; backoff doubles to its cap; plugins only see their events."""

from __future__ import annotations

import pytest

from tests.clock import ManualClock
from tests.sim import kube_scheduler_queue as qu

pytestmark = pytest.mark.unit


@pytest.fixture
def q() -> qu.SchedulingQueue:
    return qu.SchedulingQueue(clock=ManualClock(start=1000.0))


def _attempt(q: qu.SchedulingQueue, key: str = "ns/p") -> qu.QueuedPod:
    qp = q.pop(timeout=0)
    assert qp is not None and qp.key == key
    return qp


def test_extender_refusal_parks_the_pod_until_a_cluster_event(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    assert q.failed(_attempt(q), frozenset({qu.EXTENDER})) == qu.UNSCHEDULABLE
    q.clock.t += 3600
    q.flush_backoff_completed()
    assert q.pop(timeout=0) is None  # no retry on a timer: this is what the old simulator got wrong
    assert q.move_all(qu.ASSIGNED_POD_DELETE) == 1
    assert q.where("ns/p") == qu.ACTIVE  # its backoff ran out long ago: straight to activeQ


def test_a_moved_pod_still_backing_off_waits_in_backoffq(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    q.failed(_attempt(q), frozenset({qu.EXTENDER}))
    q.clock.t += 0.2
    q.move_all(qu.NODE_UPDATE)
    assert q.where("ns/p") == qu.BACKOFF
    q.clock.t += 0.9  # 1 s after the attempt
    q.flush_backoff_completed()
    assert q.where("ns/p") == qu.ACTIVE


def test_an_event_during_the_attempt_sends_the_pod_to_backoff(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    qp = _attempt(q)
    q.move_all(qu.ASSIGNED_POD_DELETE)  # e.g. a GPU freed while /filter was running
    assert q.failed(qp, frozenset({qu.EXTENDER})) == qu.BACKOFF


def test_errors_back_off_and_double_to_the_cap(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    waits = []
    for _ in range(6):
        qp = _attempt(q)
        assert q.failed(qp) == qu.BACKOFF  # no rejector: an error, retried after backoff
        waits.append(q.backoff_s(qp))
        q.clock.t += waits[-1]
        q.flush_backoff_completed()
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_five_minute_flush_of_the_unschedulable_pool(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    q.failed(_attempt(q), frozenset({qu.EXTENDER}))
    q.clock.t += 299
    q.flush_unschedulable_leftover()
    assert q.where("ns/p") == qu.UNSCHEDULABLE
    q.clock.t += 2
    q.flush_unschedulable_leftover()
    assert q.where("ns/p") == qu.ACTIVE


def test_the_pods_own_update_moves_it_but_a_status_change_does_not(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    q.failed(_attempt(q), frozenset({qu.EXTENDER}))
    q.clock.t += 20
    q.update("ns/p", {"v": 1}, spec_changed=False)
    assert q.where("ns/p") == qu.UNSCHEDULABLE
    q.update("ns/p", {"v": 2}, spec_changed=True)
    assert q.where("ns/p") == qu.ACTIVE


def test_plugins_are_moved_only_by_their_events(q: qu.SchedulingQueue) -> None:
    q.add("ns/fit", {})
    q.failed(_attempt(q, "ns/fit"), frozenset({qu.NODE_RESOURCES_FIT}))
    q.clock.t += 20
    assert q.move_all(qu.NODE_UPDATE) == 0  # an annotation change frees no count
    assert q.move_all(qu.NODE_ALLOCATABLE) == 1


def test_a_binding_failure_moves_the_others_but_not_itself(q: qu.SchedulingQueue) -> None:
    q.add("ns/a", {})
    q.add("ns/b", {})
    q.failed(_attempt(q, "ns/a"), frozenset({qu.EXTENDER}))
    qb = _attempt(q, "ns/b")
    q.clock.t += 20
    q.failed(qb)
    assert q.move_all(qu.ASSIGNED_POD_DELETE, skip="ns/b") == 1
    assert q.where("ns/a") == qu.ACTIVE and q.where("ns/b") == qu.BACKOFF


def test_deleted_pods_leave_every_queue(q: qu.SchedulingQueue) -> None:
    q.add("ns/p", {})
    q.delete("ns/p")
    assert q.pop(timeout=0) is None and q.empty()


def _pod(prio: int) -> dict:
    return {"spec": {"priority": prio}}


def test_pop_from_backoffq_takes_a_backing_off_pod_when_activeq_is_empty() -> None:
    """SchedulerPopFromBackoffQ (KEP-5142): an idle cycle takes a pod a plugin rejected from backoffQ while it
    still backs off, the earliest expiry first and, in one window, the higher priority; without the gate the
    same pod waits for its backoff."""
    for gate in (True, False):
        q = qu.SchedulingQueue(clock=ManualClock(start=1000.0), pop_from_backoff_q=gate)
        for key, prio in (("ns/low", 0), ("ns/high", 10)):
            q.add(key, _pod(prio))
            q.failed(_attempt(q, key), frozenset({qu.EXTENDER}))
        q.clock.t += 0.2
        assert q.move_all(qu.ASSIGNED_POD_DELETE) == 2
        assert q.where("ns/low") == q.where("ns/high") == qu.BACKOFF  # 1 s of backoff left, both
        got = q.pop(timeout=0)
        if gate:
            assert got is not None and got.key == "ns/high" and got.attempts == 2
            assert q.where("ns/high") == qu.IN_FLIGHT and q.where("ns/low") == qu.BACKOFF
        else:
            assert got is None
            q.clock.t += 1.0
            q.flush_backoff_completed()
            assert {q.pop(timeout=0).key, q.pop(timeout=0).key} == {"ns/high", "ns/low"}


def test_pop_from_backoffq_leaves_pods_that_failed_with_an_error() -> None:
    """Only podBackoffQ is popped early; an error's pod waits in podErrorBackoffQ for its backoff."""
    q = qu.SchedulingQueue(clock=ManualClock(start=1000.0), pop_from_backoff_q=True)
    q.add("ns/p", {})
    assert q.failed(_attempt(q)) == qu.BACKOFF  # an error: no plugin rejected it
    assert q.pop(timeout=0) is None
    q.clock.t += 1.0  # the expiry's own window (aligned): still backing off
    q.flush_backoff_completed()
    assert q.pop(timeout=0) is None
    q.clock.t += 1.0
    q.flush_backoff_completed()
    assert _attempt(q).attempts == 2


def test_the_gate_aligns_backoff_expiry_to_the_flush_window() -> None:
    """alignToWindow: with the gate an expiry is truncated to its window, and a pod whose expiry falls in
    the current window still backs off (isPodBackingoff); the flush frees it in the next window."""
    q = qu.SchedulingQueue(clock=ManualClock(start=1000.3), pop_from_backoff_q=True)
    q.add("ns/p", {})
    q.failed(_attempt(q), frozenset({qu.EXTENDER}))  # expiry 1001.3, aligned to 1001.0
    q.clock.t = 1000.9
    q.move_all(qu.NODE_UPDATE)
    assert q.where("ns/p") == qu.BACKOFF
    q.clock.t = 1001.05  # the expiry's window: still backing off
    q.flush_backoff_completed()
    assert q.where("ns/p") == qu.BACKOFF
    q.clock.t = 1002.0
    q.flush_backoff_completed()
    assert q.where("ns/p") == qu.ACTIVE

"""The answers to the extender's own assignment writes that /bind reads instead of GETting the pod
(``PodStates.note_written`` / ``written``): the same pod only (namespace, name, uid), pending for this
scheduler only, bounded, forgotten when the bind ends."""

from __future__ import annotations

import copy

import pytest

from hami_agent.scheduler.state import podstate
from hami_agent.scheduler.state.podstate import PodStates
from tests.unit.scheduler.helpers import gpu_pod

pytestmark = pytest.mark.unit

OURS = "hami-scheduler"


def states() -> PodStates:
    return PodStates(None, None, OURS)


def test_the_same_pending_pod_is_answered_until_forgotten():
    s = states()
    pod = gpu_pod("p", uid="u1")
    s.note_written(pod)
    assert s.written("default", "p", "u1") is pod
    assert s.written("default", "p", "u1") is pod  # a bind that waited for a lock reads it again
    assert s.written_hits == 2
    s.forget_written("u1")
    assert s.written("default", "p", "u1") is None


@pytest.mark.parametrize("ns,name,uid", [("other", "p", "u1"), ("default", "q", "u1"),
                                         ("default", "p", "u2")])
def test_another_pod_is_not_answered(ns, name, uid):
    s = states()
    s.note_written(gpu_pod("p", uid="u1"))
    assert s.written(ns, name, uid) is None


@pytest.mark.parametrize("change", [
    lambda p: p["spec"].__setitem__("nodeName", "n1"),
    lambda p: p["metadata"].__setitem__("deletionTimestamp", "2026-11-29T00:00:00Z"),
    lambda p: p["spec"].__setitem__("schedulerName", "default-scheduler"),
    lambda p: p["status"].__setitem__("phase", "Failed"),
], ids=["bound", "terminating", "other-scheduler", "finished"])
def test_an_answer_the_extender_may_not_decide_on_is_not_used(change):
    s = states()
    pod = copy.deepcopy(gpu_pod("p", uid="u1"))
    change(pod)
    s.note_written(pod)
    assert s.written("default", "p", "u1") is None and s.written_hits == 0


def test_the_answers_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(podstate, "WRITTEN_KEPT", 3)
    s = states()
    for i in range(5):
        s.note_written(gpu_pod(f"p{i}", uid=f"u{i}"))
    kept = [s.written("default", f"p{i}", f"u{i}") is not None for i in range(5)]
    assert kept == [False, False, True, True, True]


@pytest.mark.parametrize("answer", [None, {}, "x", {"metadata": {"name": "p"}}])
def test_an_answer_that_is_not_a_pod_with_a_uid_is_not_kept(answer):
    s = states()
    s.note_written(answer)
    assert s.written("default", "p", "") is None and not s._written  # noqa: SLF001

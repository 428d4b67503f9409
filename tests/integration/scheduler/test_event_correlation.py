"""Scheduler events through the correlator, against the simulated API server: client-go's spam filter
(25 per object, then one per 5 minutes), aggregation of similar events (10 messages in 10 minutes →
one "(combined from similar events)" event whose count and message move), and identical events counted."""

from __future__ import annotations

import pytest

from hami_agent.k8s import KubeClient
from hami_agent.scheduler.verbs.events import COMBINED_PREFIX, EventCorrelator, EventSink
from tests.clock import ManualClock
from tests.sim.apiserver import ApiServer
from tests.sim.fixtures import api_server  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _pod(api: ApiServer, name: str = "p") -> dict:
    return api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "x"}]}})


def _sink(api: ApiServer, clock: ManualClock) -> tuple[KubeClient, EventSink]:
    kube = KubeClient.from_kubeconfig(api.kubeconfig_path)
    sink = EventSink(kube, "hami-scheduler", correlator=EventCorrelator(clock), qps=1000, burst=1000)
    sink.start()
    return kube, sink


def test_similar_events_are_aggregated_into_one(api_server: ApiServer) -> None:  # noqa: F811
    clock = ManualClock(start=1000.0)
    kube, sink = _sink(api_server, clock)
    try:
        pod = _pod(api_server)
        for i in range(14):
            clock.t += 1
            sink.emit(pod, "Warning", "FilteringFailed", f"{i + 1} nodes CardInsufficientMemory(gpu-{i})")
        assert sink.flush(10)
        events = api_server.list("events", "default")
        plain = [e for e in events if not e["message"].startswith(COMBINED_PREFIX)]
        combined = [e for e in events if e["message"].startswith(COMBINED_PREFIX)]
        assert len(plain) == 9  # the first nine distinct messages are posted as they are
        assert len(combined) == 1  # the 10th..14th update one aggregate event
        assert combined[0]["count"] == 5
        assert combined[0]["message"] == COMBINED_PREFIX + "14 nodes CardInsufficientMemory(gpu-13)"
        assert sink.correlator.aggregated == 5
    finally:
        sink.stop()
        kube.close()


def test_identical_events_bump_the_count(api_server: ApiServer) -> None:  # noqa: F811
    clock = ManualClock(start=1000.0)
    kube, sink = _sink(api_server, clock)
    try:
        pod = _pod(api_server)
        for _ in range(5):
            sink.emit(pod, "Warning", "FilteringFailed", "no available node, 3 nodes do not meet")
        assert sink.flush(10)
        events = api_server.list("events", "default")
        assert len(events) == 1 and events[0]["count"] == 5
    finally:
        sink.stop()
        kube.close()


def test_spam_filter_per_object_with_slow_refill() -> None:
    clock = ManualClock(start=1000.0)
    c = EventCorrelator(clock)
    meta = {"namespace": "default", "name": "p", "uid": "u1"}
    verdicts = [c.correlate(meta, "Pod", "Warning", "FilteringFailed", "same", "hami-scheduler")
                for _ in range(30)]
    assert [v.skip for v in verdicts] == [False] * 25 + [True] * 5 and c.filtered == 5
    other = {"namespace": "default", "name": "q", "uid": "u2"}  # another object has its own budget
    assert not c.correlate(other, "Pod", "Warning", "FilteringFailed", "same", "hami-scheduler").skip
    clock.t += 300  # one new event every 5 minutes
    assert not c.correlate(meta, "Pod", "Warning", "FilteringFailed", "same", "hami-scheduler").skip
    assert c.correlate(meta, "Pod", "Warning", "FilteringFailed", "same", "hami-scheduler").skip


def test_aggregation_window_restarts_after_ten_minutes() -> None:
    clock = ManualClock(start=1000.0)
    c = EventCorrelator(clock)
    meta = {"namespace": "default", "name": "p", "uid": "u1"}
    for i in range(9):
        assert c.correlate(meta, "Pod", "Warning", "R", f"m{i}", "s").key is None
    clock.t += 601  # the similar events are older than the interval: a fresh record
    assert c.correlate(meta, "Pod", "Warning", "R", "m9", "s").key is None

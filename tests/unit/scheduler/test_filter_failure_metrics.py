"""/filter's per-node failures counted by reason, with a bounded label set (the refusals panel)."""

from __future__ import annotations

import threading

import pytest

from hami_agent.protocol import reasons as R
from hami_agent.scheduler.serve.metrics import SchedulerMetrics, failure_reasons

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, want", [
    ("1/2 CardInsufficientMemory, 1/2 CardTypeMismatch", ["CardInsufficientMemory", "CardTypeMismatch"]),
    (R.NODE_INSUFFICIENT_DEVICE, ["NodeInsufficientDevice"]),
    (R.NODE_UNREGISTERED, ["NodeUnregistered"]),
    (R.NODE_USAGE_UNAVAILABLE, ["NodeUsageUnavailable"]),
    ("1/1 SomethingNew", ["Other"]),          # an unknown word never becomes a label value
    ("free text from a tenant: {x}", ["Other"]),
    ("", ["Other"]),
])
def test_failure_reasons(text, want):
    assert failure_reasons(text) == want


class _EmptyCache:
    lock = threading.Lock()
    nodes: dict = {}
    pods: dict = {}


def test_count_node_failures_counts_each_reason_once_per_node():
    m = SchedulerMetrics(cache=_EmptyCache())
    m.count_node_failures({"n1": "1/2 CardInsufficientMemory, 1/2 CardTypeMismatch",
                           "n2": "2/2 CardInsufficientMemory", "n3": R.NODE_UNREGISTERED})
    got = {s.labels["reason"]: s.value for f in m.registry.collect()
           if f.name == "hami_scheduler_filter_node_failures" for s in f.samples if s.name.endswith("_total")}
    assert got == {"CardInsufficientMemory": 2.0, "CardTypeMismatch": 1.0, "NodeUnregistered": 1.0}

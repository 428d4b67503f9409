"""The pieces of the public listeners' process that need no process (scheduler/serve/public.py): the
request/answer channel, the child's cached questions, the merged /metrics and the webhook's portable
copy."""

from __future__ import annotations

import pickle
import socket
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from hami_agent.scheduler.serve.public import (
    Channel,
    ChannelClosed,
    ChildMetrics,
    MergedRegistry,
    Remote,
    portable_webhook,
)
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.verbs.extender import SchedulerConfig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture
def pair():
    here, there = socket.socketpair()
    asker, server = Channel(here, 5), Channel(there, None)
    calls: list[tuple] = []

    def quota(ns):
        calls.append(("quota", ns))
        if ns == "broken":
            raise KeyError(ns)
        return (1024, None)

    t = threading.Thread(target=server.serve, args=({"quota": quota},), daemon=True)
    t.start()
    yield asker, calls
    asker.close()
    t.join(5)
    assert not t.is_alive()  # the serving side ends when the asking side closes


def test_a_question_is_answered_and_a_failure_names_its_cause(pair):
    asker, _ = pair
    assert asker.call("quota", "team-a") == (1024, None)
    with pytest.raises(RuntimeError, match="quota failed in the other process: KeyError: 'broken'"):
        asker.call("quota", "broken")
    with pytest.raises(RuntimeError, match="KeyError: 'nope'"):  # an unknown question is a failure too
        asker.call("nope")


def test_the_child_asks_once_per_namespace_and_ttl_whatever_the_rate(pair):
    asker, calls = pair
    remote = Remote(asker, "quota", ttl_s=60)
    for _ in range(100):
        assert remote("team-a") == (1024, None)
        with pytest.raises(RuntimeError):
            remote("broken")  # a failure is kept too: a flood asks again only after the ttl
    assert calls == [("quota", "team-a"), ("quota", "broken")]
    expired = Remote(asker, "quota", ttl_s=0)
    expired("team-b")
    expired("team-b")
    assert calls[-2:] == [("quota", "team-b"), ("quota", "team-b")]


def test_a_closed_channel_is_reported_not_hung():
    here, there = socket.socketpair()
    there.close()
    with pytest.raises(ChannelClosed):
        Channel(here, 5).call("quota", "x")


def test_metrics_are_the_scheduler_s_with_the_child_s_latency_samples_added():
    parent = CollectorRegistry()
    Histogram("hami_scheduler_request_duration_seconds", "Extender request latency", ["verb"],
              registry=parent).labels("filter").observe(0.001)
    Counter("hami_scheduler_requests", "Extender requests", ["verb", "result"],
            registry=parent).labels("filter", "ok").inc()
    child = ChildMetrics()
    child.latency.labels("webhook").observe(0.002)
    text = generate_latest(MergedRegistry(lambda: generate_latest(parent), child.registry)).decode()
    assert text.count("# TYPE hami_scheduler_request_duration_seconds histogram") == 1
    assert 'hami_scheduler_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'hami_scheduler_request_duration_seconds_count{verb="webhook"} 1.0' in text
    assert 'hami_scheduler_requests_total{result="ok",verb="filter"} 1.0' in text


def test_the_webhook_travels_without_the_scheduler_s_state():
    hook = Webhook(SchedulerConfig(), quota=lambda ns: None, namespace_labels=lambda ns: {})
    twin = pickle.loads(pickle.dumps(portable_webhook(hook)))  # lambdas would not pickle
    assert (twin.quota, twin.namespace_labels) == ("remote:quota", "remote:labels")
    assert twin.config == hook.config and hook.quota is not None  # the original is untouched
    bare = portable_webhook(Webhook(SchedulerConfig()))
    assert (bare.quota, bare.namespace_labels) == (None, None)


def _serving(*argv: str) -> dict:
    import argparse

    from hami_agent.scheduler.serve import cmd

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    return cmd.build_serving(p.parse_args(list(argv)))


def test_the_flags_choose_the_process_only_where_the_verbs_have_their_own_listener():
    on = _serving("--extender-bind-address", "127.0.0.1:9444")
    assert (on["public_process"], on["public_nice"]) == (True, 10)
    assert _serving("--extender-bind-address", "127.0.0.1:9444", "--public-listener-process",
                    "false")["public_process"] is False
    assert _serving()["public_process"] is False  # one listener for everything: nothing to separate
    assert _serving("--public-listener-nice", "0")["public_nice"] == 0
    with pytest.raises(ValueError, match="--public-listener-nice 20: want 0 to 19"):
        _serving("--public-listener-nice", "20")


def test_a_slow_question_does_not_hold_up_an_answer_already_known():
    here, there = socket.socketpair()
    asker, server = Channel(here, 10), Channel(there, None)
    release = threading.Event()

    def labels(ns):
        if ns == "slow":
            release.wait(10)
        return {"ns": ns}

    threading.Thread(target=server.serve, args=({"labels": labels},), daemon=True).start()
    remote = Remote(asker, "labels", ttl_s=60)
    assert remote("known") == {"ns": "known"}
    slow = threading.Thread(target=remote, args=("slow",), daemon=True)
    slow.start()
    done = threading.Event()
    threading.Thread(target=lambda: (remote("known"), done.set()), daemon=True).start()
    assert done.wait(5)  # answered from what the child keeps while "slow" is still asked
    release.set()
    slow.join(5)
    asker.close()

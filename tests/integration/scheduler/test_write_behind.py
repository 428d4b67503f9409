"""Write-behind (scheduler/verbs/writebehind.py): /filter answers once its decision is reserved, the pod's
assignment is written in a bounded pool, and /bind waits for that write: it binds only a written
assignment and refuses, writing nothing, when the write failed. Faults and delays come from the simulated
API server; every test ends with the invariant checker."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from hami_agent.scheduler.verbs.writebehind import WriteBehind
from tests.integration.scheduler.cluster import check_cluster, events_for, gpu_node, gpu_pod
from tests.integration.scheduler.test_trust import bind, create, extender, filter_, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PATCH_DELAY_S = 3.0  # longer than any scheduling hiccup between /filter's answer and the test's GET


def assignment(api, name: str) -> str | None:
    return (api.get("Pod", "default", name)["metadata"].get("annotations") or {}).get(keys.VGPU_NODE)


def test_filter_answers_before_its_write_and_bind_waits_for_it(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    with extender(api_server, SchedulerConfig(api_timeout_s=10.0)) as (app, ext):
        # the assignment PATCH is slow (applied after PATCH_DELAY_S; the client waits 10 s)
        api_server.inject_fault(None, method="PATCH", path_regex=r"/pods/p$", delay_s=PATCH_DELAY_S)
        t0 = time.monotonic()
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        answered = time.monotonic() - t0
        assert assignment(api_server, "p") is None, "the write is still in flight"
        assert answered < PATCH_DELAY_S
        # /bind waits for the write: the binder finds the pod carrying the decision and binds it
        assert bind(ext, p) == {"Error": ""}
        pod = api_server.get("Pod", "default", "p")
        assert pod["spec"]["nodeName"] == "gpu-1" and assignment(api_server, "p") == "gpu-1"
        app.events.flush()
        assert {e["reason"] for e in events_for(api_server, "p")} >= {"FilteringSucceed", "BindingSucceed"}
        check_cluster(api_server, [app])


def test_a_failed_write_refuses_the_bind_and_binds_nothing(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    with extender(api_server, SchedulerConfig(api_timeout_s=2.0)) as (app, ext):
        api_server.inject_fault(409, method="PATCH", path_regex=r"/pods/p$")  # definitive: not applied
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        res = bind(ext, p)
        assert "was not written" in res["Error"] and "409" in res["Error"], res
        assert "nothing bound" in res["Error"]
        pod = api_server.get("Pod", "default", "p")
        assert not pod["spec"].get("nodeName") and assignment(api_server, "p") is None
        node = api_server.get("Node", None, "gpu-1")
        assert keys.NODE_LOCK not in (node["metadata"].get("annotations") or {})
        assert api_server.requests_matching("POST", r"/pods/p/binding$") == []
        assert wait_for(lambda: app.cache.pods == {}), "the reservation was given back"
        assert app.extender.busy.nodes() == frozenset()
        app.events.flush()
        assert "BindingFailed" in {e["reason"] for e in events_for(api_server, "p")}
        # kube-scheduler schedules the pod again: the next decision is written and bound
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        assert bind(ext, p) == {"Error": ""}
        check_cluster(api_server, [app])


def test_a_write_with_unknown_outcome_keeps_the_reservation_and_refuses_the_bind(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    config = SchedulerConfig(api_timeout_s=0.5, settle_s=3.0)
    with extender(api_server, config, timeout_s=0.5) as (app, ext):
        # answered 500 after the client gave up, applied nothing: the outcome is unknown to the extender
        api_server.inject_fault(500, method="PATCH", path_regex=r"/pods/p$", delay_s=0.8)
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        res = bind(ext, p)
        assert "outcome is not known yet" in res["Error"], res
        assert p["metadata"]["uid"] in app.cache.pods  # never under-count while unknown
        assert not api_server.get("Pod", "default", "p")["spec"].get("nodeName")
        check_cluster(api_server, [app], timeout_s=15)  # converges on the truth: nothing assigned
        assert app.cache.pods == {}


def test_a_second_filter_of_the_pod_waits_for_the_first_write(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    with extender(api_server, SchedulerConfig(api_timeout_s=10.0)) as (app, ext):
        api_server.inject_fault(None, method="PATCH", path_regex=r"/pods/p$", delay_s=PATCH_DELAY_S)
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        res = filter_(ext, p)
        assert "still being written" in res["Error"] and res["NodeNames"] is None
        assert bind(ext, p) == {"Error": ""}
        check_cluster(api_server, [app])


def test_a_full_pool_writes_inline(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    with extender(api_server) as (app, ext):
        app.extender.writer = WriteBehind(max_pending=0)  # back-pressure: every write is inline
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        assert assignment(api_server, "p") == "gpu-1"  # written before the answer
        assert bind(ext, p) == {"Error": ""}
        check_cluster(api_server, [app])


def test_the_pool_is_bounded_and_stops():
    release = threading.Event()
    pool = WriteBehind(threads=1, max_pending=2)
    try:
        first = pool.submit(lambda: "" if release.wait(10) else "timeout")
        second = pool.submit(lambda: "err")
        assert first is not None and second is not None and pool.pending() == 2
        assert pool.submit(lambda: "") is None  # full: the caller writes inline
        release.set()
        assert first.result(10) == "" and second.result(10) == "err"
        assert wait_for(lambda: pool.pending() == 0, 5)
        assert pool.submit(lambda: "") is not None
    finally:
        release.set()
        pool.stop()
    assert pool.submit(lambda: "") is None  # stopped: inline


def test_bind_takes_the_answer_to_its_own_write_when_the_watch_lags(api_server):
    """/bind usually comes milliseconds after its /filter's write, before the pending-pod watch shows it:
    the binder uses the API's answer to that write (the pod as a GET would read it then) instead of
    GETting the pod; without that answer it reads the API as before. The bind-phase write is
    conditional on the copy's resourceVersion either way."""
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    api_server.create(gpu_node("gpu-2", gpus=1, mem=8000))  # p's bind holds gpu-1's lock (no plugin here)
    p = create(api_server, gpu_pod("p", mem=1000))
    q = create(api_server, gpu_pod("q", mem=1000))
    with extender(api_server) as (app, ext):
        created = {"p": p, "q": q}
        app.extender.pods.cached = lambda _ns, name: created.get(name)  # the watch shows only the create
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        assert wait_for(lambda: app.extender.decisions.get(p["metadata"]["uid"]).write_error() == "")
        assert bind(ext, p) == {"Error": ""}
        assert api_server.requests_matching("GET", r"/pods/p$") == []
        assert app.extender.pods.written_hits == 1
        assert api_server.get("Pod", "default", "p")["spec"]["nodeName"] == "gpu-1"
        assert app.extender.pods.written("default", "p", p["metadata"]["uid"]) is None  # dropped at the end
        # without the answer (evicted, or never kept): the API is read
        assert filter_(ext, q, nodes=("gpu-2",))["NodeNames"] == ["gpu-2"]
        assert wait_for(lambda: app.extender.decisions.get(q["metadata"]["uid"]).write_error() == "")
        app.extender.pods.forget_written(q["metadata"]["uid"])  # as if never kept (or evicted)
        assert bind(ext, q, "gpu-2") == {"Error": ""}
        assert len(api_server.requests_matching("GET", r"/pods/q$")) == 1
        check_cluster(api_server, [app])


def test_an_answer_overtaken_by_a_later_change_fails_the_conditional_write(api_server):
    """The answer kept for /bind is older than a change made after it (here a label): the bind-phase
    write conditional on it meets 409, the pod is read afresh, and the bind goes on from the API's copy."""
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api_server, gpu_pod("p", mem=1000))
    with extender(api_server) as (app, ext):
        app.extender.pods.cached = lambda _ns, _name: p
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        assert wait_for(lambda: app.extender.decisions.get(p["metadata"]["uid"]).write_error() == "")
        api_server.patch("pods", "default", "p", {"metadata": {"labels": {"later": "yes"}}})
        assert bind(ext, p) == {"Error": ""}
        assert app.extender.pods.written_hits == 1
        assert len(api_server.requests_matching("GET", r"/pods/p$")) == 1  # read afresh after the 409
        pod = api_server.get("Pod", "default", "p")
        assert pod["spec"]["nodeName"] == "gpu-1" and pod["metadata"]["labels"]["later"] == "yes"
        check_cluster(api_server, [app])

"""/bind that meets a node lock held by a pod still being allocated waits for the lock's release (node
watch, FIFO per node) instead of failing with ``node lock contention`` and costing the pod kube-scheduler's
backoff (Project-HAMi/HAMi#1367). The wait holds no handler thread: /filter is served meanwhile even with a
single handler thread."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.httpserve.model import Limits
from hami_agent.protocol import keys
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import gpu_node, gpu_pod
from tests.integration.scheduler.test_trust import bind, create, extender, filter_, wait_for
from tests.sim.kube_scheduler import ExtenderClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _locked_by_allocating_pod(api) -> None:
    """gpu-1 locked by ``holder``, bound there and waiting for its Allocate (the lock is busy, not stale)."""
    node = gpu_node("gpu-1", gpus=2, mem=16384)
    node["metadata"]["annotations"][keys.NODE_LOCK] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + \
        ",default,holder"
    api.create(node)
    holder = gpu_pod("holder", mem=1000, annotations={keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
                                                      keys.VGPU_NODE: "gpu-1"})
    holder["spec"]["nodeName"] = "gpu-1"
    holder["metadata"].setdefault("labels", {})[keys.VGPU_NODE] = "gpu-1"  # as the extender's assignment
    api.create(holder)


def _release(api) -> None:
    api.patch("Node", None, "gpu-1", {"metadata": {"annotations": {keys.NODE_LOCK: None}}})


def test_bind_waits_for_the_lock_without_holding_a_handler_thread(api_server):
    _locked_by_allocating_pod(api_server)
    serving = {"limits": Limits(workers=1, max_queued=2)}
    with extender(api_server, SchedulerConfig(bind_lock_wait_s=20.0), serving=serving) as (app, ext):
        p1 = create(api_server, gpu_pod("p1", mem=1000))
        p2 = create(api_server, gpu_pod("p2", mem=1000))
        assert filter_(ext, p1)["NodeNames"] == ["gpu-1"]
        answers: dict[str, dict] = {}
        t = threading.Thread(target=lambda: answers.update(p1=bind(ext, p1)))
        t.start()
        assert wait_for(lambda: app.lock_waiter.waiting("gpu-1") == 1, 10)
        # the only handler thread is free: another pod's /filter is answered while p1's bind waits
        other = ExtenderClient(app.url, timeout_s=5)
        t0 = time.monotonic()
        assert filter_(other, p2)["NodeNames"] == ["gpu-1"]
        assert time.monotonic() - t0 < 3.0
        other.close()
        _release(api_server)  # holder's Allocate released the lock
        released = time.monotonic()
        t.join(15)
        assert answers["p1"] == {"Error": ""}
        assert time.monotonic() - released < 3.0  # woken by the node watch, not a retry timer
        lock = api_server.get("Node", None, "gpu-1")["metadata"]["annotations"][keys.NODE_LOCK]
        assert lock.endswith(",default,p1")
        assert api_server.get("Pod", "default", "p1")["spec"]["nodeName"] == "gpu-1"


def test_waiters_are_served_in_order_and_time_out_with_hamis_error(api_server):
    _locked_by_allocating_pod(api_server)
    with extender(api_server, SchedulerConfig(bind_lock_wait_s=3.0)) as (app, ext):
        pods = [create(api_server, gpu_pod(f"q{i}", mem=1000)) for i in range(3)]
        answers: dict[str, dict] = {}
        threads = []
        for p in pods:
            assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
            c = ExtenderClient(app.url, timeout_s=30)
            th = threading.Thread(target=lambda p=p, c=c: answers.update({p["metadata"]["name"]: bind(c, p)}))
            th.start()
            threads.append(th)
            n_waiting = len(threads)
            assert wait_for(lambda n=n_waiting: app.lock_waiter.waiting("gpu-1") == n, 10)
        _release(api_server)
        # q0 (first in line) takes the lock; q1 and q2 wait for q0's Allocate, which never comes here,
        # and get HAMi's contention error after their deadline
        for th in threads:
            th.join(20)
        assert answers["q0"] == {"Error": ""}
        for n in ("q1", "q2"):
            assert "node gpu-1 has been locked within 5m0s: node lock contention" in answers[n]["Error"]
        lock = api_server.get("Node", None, "gpu-1")["metadata"]["annotations"][keys.NODE_LOCK]
        assert lock.endswith(",q0")
        assert not api_server.get("Pod", "default", "q1")["spec"].get("nodeName")
        assert app.lock_waiter.timeouts == 2 and app.lock_waiter.waiting() == 0


def test_waiting_disabled_fails_at_once_like_hami(api_server):
    _locked_by_allocating_pod(api_server)
    with extender(api_server, SchedulerConfig(bind_lock_wait_s=0)) as (app, ext):
        p = create(api_server, gpu_pod("p", mem=1000))
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        t0 = time.monotonic()
        assert "node lock contention" in bind(ext, p)["Error"]
        assert time.monotonic() - t0 < 5.0 and app.lock_waiter is None


def test_a_lagging_node_watch_cannot_turn_the_wait_into_a_loop(api_server):
    """The node watch shows gpu-1 free (a dropped stream, an API outage) while the API says it is locked.
    Each wake then meets the lock again: the bind used to be woken at once every time, with a new deadline
    each time (it never timed out) and a new Future chained to the last (the chaos soak ended in a
    RecursionError when the lock finally went). Now the bind keeps its first deadline and its retries
    back off."""
    _locked_by_allocating_pod(api_server)
    with extender(api_server, SchedulerConfig(bind_lock_wait_s=3.0)) as (app, ext):
        p = create(api_server, gpu_pod("p", mem=1000))
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        app.sync.on_node_seen = lambda _node: None  # the watch stops showing gpu-1's lock...
        app.extender.node_locks.on_node({"metadata": {"name": "gpu-1", "annotations": {}}})  # ...as if free
        before = len(api_server.requests_matching("GET", r"/api/v1/nodes/gpu-1$"))
        answer: dict[str, dict] = {}
        t = threading.Thread(target=lambda: answer.update(p=bind(ext, p)))
        t.start()
        t.join(20)
        assert not t.is_alive(), "the bind never answered: its wait was renewed on every retry"
        assert "node lock contention" in answer["p"]["Error"]
        reads = len(api_server.requests_matching("GET", r"/api/v1/nodes/gpu-1$")) - before
        # 0.05 s doubling to 1 s within 3 s: about 7 tries; at once every time it was hundreds
        assert 1 <= reads <= 15, reads
        assert app.lock_waiter.waiting() == 0


def test_a_lock_judged_busy_from_a_stalled_watch_is_read_after_a_second(api_server):
    """A bind's first attempt judges a busy lock from the watches' copies alone (no GET of the node). The
    node watch may be stale: here it stalls showing the lock after the API released it. The bind reads the
    node itself RECHECK_S later and takes the lock, instead of waiting out its 20 s for a release the
    watch will not show."""
    from hami_agent.scheduler.verbs.lockwait import RECHECK_S

    _locked_by_allocating_pod(api_server)
    with extender(api_server, SchedulerConfig(bind_lock_wait_s=20.0)) as (app, ext):
        p = create(api_server, gpu_pod("p", mem=1000))
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        frozen = api_server.get("Node", None, "gpu-1")  # the watch's last copy: holder's lock
        app.extender.binder.watched_node = lambda name: frozen
        app.sync.on_node_seen = lambda _node: None  # the lock table no longer hears of gpu-1
        _release(api_server)
        reads = len(api_server.requests_matching("GET", r"/api/v1/nodes/gpu-1$"))
        t0 = time.monotonic()
        answer = bind(ext, p)
        waited = time.monotonic() - t0
        assert answer == {"Error": ""}
        assert RECHECK_S * 0.9 <= waited < RECHECK_S + 4.0, waited  # the recheck, not the 20 s wait
        assert len(api_server.requests_matching("GET", r"/api/v1/nodes/gpu-1$")) - reads == 1
        lock = api_server.get("Node", None, "gpu-1")["metadata"]["annotations"][keys.NODE_LOCK]
        assert lock.endswith(",default,p")

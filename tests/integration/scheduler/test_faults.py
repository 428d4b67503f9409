"""Consistent state under API faults (issue 16 findings 2-4): writes whose answer is lost are read back,
never guessed; the usage cache never under-counts; a node lock whose release fails heals; a bound pod
keeps its lock until Allocate. Faults come from the simulated API server (``inject_fault``); with
``code=None`` and a delay longer than the client's timeout, the server applies the write *after* the
client gave up — the lost-answer case. Every test ends with the invariant checker."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from hami_agent.protocol import keys
from hami_agent.protocol.nodelock import parse_lock_value
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import check_cluster, gpu_node, gpu_pod
from tests.integration.scheduler.test_trust import bind, create, extender, filter_, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FAST = SchedulerConfig(api_timeout_s=0.5, settle_s=3.0)
# /filter answers after its write (HAMi's order), so its answer carries the write's outcome; the same
# faults under write-behind, where /bind carries it: test_write_behind.py
SYNC_WRITE = replace(FAST, write_behind=False)


def lock_owner(api, node: str = "gpu-1") -> str | None:
    raw = (api.get("Node", None, node)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)
    if not raw:
        return None
    v = parse_lock_value(raw)
    return f"{v.namespace}/{v.name}"


def test_filter_patch_applied_after_the_client_gave_up_stays_counted(api_server):
    # Regression (issue 16 finding 3): /filter's pod PATCH was applied but its answer lost; the error
    # path removed the pod from the cache after the informer had added it: 24,000 MiB cached vs 45,000
    # MiB annotated, and the next pod over-committed the GPU. Every attempt is delayed past the
    # client's timeout, so even a client that retries sees only timeouts.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=10000))
    a = create(api_server, gpu_pod("a", mem=6000))
    b = create(api_server, gpu_pod("b", mem=6000))
    with extender(api_server, SYNC_WRITE, timeout_s=0.5) as (app, ext):
        api_server.inject_fault(None, method="PATCH", path_regex=r"/pods/a$", times=5, delay_s=1.2)
        res = filter_(ext, a)
        assert res["Error"].startswith("patch pod error") and "timeout" in res["Error"]
        # the write lands after the client gave up: the pod carries the allocation
        assert wait_for(lambda: keys.VGPU_NODE in (api_server.get("Pod", "default", "a")["metadata"]
                                                   .get("annotations") or {}), 10)
        check_cluster(api_server, [app])  # the cache counts exactly what the annotations say
        # and the next pod does not over-commit the GPU
        assert filter_(ext, b)["FailedNodes"] == {"gpu-1": "1/1 CardInsufficientMemory"}
        check_cluster(api_server, [app])


def test_filter_patch_that_never_lands_frees_the_reservation_once_known(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=10000))
    a = create(api_server, gpu_pod("a", mem=6000))
    with extender(api_server, SYNC_WRITE, timeout_s=0.5) as (app, ext):
        api_server.inject_fault(503, method="PATCH", path_regex=r"/pods/a$", times=1)
        res = filter_(ext, a)
        assert res["Error"].startswith("patch pod error: patch pod error: 503")
        assert app.cache.pods == {}  # 503: refused before processing: nothing is reserved any more
        # a timeout that leaves the pod unchanged: reserved until the outcome is known (settle_s)
        # (a fault with a code and a delay: the server answers 500 after 0.8 s and applies nothing)
        api_server.inject_fault(500, method="PATCH", path_regex=r"/pods/a$", times=1, delay_s=0.8)
        res = filter_(ext, a)
        assert "outcome is not known yet" in res["Error"]
        assert a["metadata"]["uid"] in app.cache.pods
        check_cluster(api_server, [app], timeout_s=15)  # converges on the truth: nothing assigned
        assert app.cache.pods == {}


def test_lost_bind_answer_is_read_back_and_the_lock_is_kept(api_server):
    # Regression (issue 16 finding 4): the API server applied the binding but the answer was lost; the
    # extender reported failure and released the node lock although the pod was bound, so the next pod
    # took the lock and Allocate handed each pod the other's devices.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=10000))
    a = create(api_server, gpu_pod("a", mem=1000))
    with extender(api_server, FAST, timeout_s=0.5) as (app, ext):
        assert filter_(ext, a)["NodeNames"] == ["gpu-1"]
        api_server.inject_fault(None, method="POST", path_regex=r"/pods/a/binding$", times=2, delay_s=3.0)
        t0 = time.monotonic()
        res = bind(ext, a)
        # both attempts time out; the read-back cannot see the binding yet: the outcome is unknown,
        # reported as an error, and the lock is kept
        assert "outcome is unknown" in res["Error"], res
        assert lock_owner(api_server) == "default/a"
        assert wait_for(lambda: api_server.get("Pod", "default", "a")["spec"].get("nodeName") == "gpu-1", 10)
        # resolved in the background: bound, so the lock stays for the pod's Allocate
        assert app.healer.wait_idle(10)
        assert lock_owner(api_server) == "default/a"
        assert not app.extender.binder.in_doubt(a["metadata"]["uid"])
        b = create(api_server, gpu_pod("b", mem=1000))
        assert filter_(ext, b)["NodeNames"] == ["gpu-1"]
        assert "node lock contention" in bind(ext, b)["Error"]  # a's Allocate has not run yet
        print(f"resolved in {time.monotonic() - t0:.1f}s")
        # the simulated Allocate releases a's lock; b binds
        api_server.patch("Pod", "default", "a", {"metadata": {"annotations": {
            keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS}}})
        assert bind(ext, b)["Error"] == ""  # a's lock is stale (allocated): taken over
        check_cluster(api_server, [app], allocations=None)


def test_an_in_doubt_binding_whose_repair_cannot_be_queued_ends_with_the_node_lock(api_server):
    # The repair queue full (an API outage): the in-doubt mark, which refuses the pod's /filter and /bind,
    # used to stay for good since only the repair task removed it. It ends when the node lock expires.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=10000))
    a = create(api_server, gpu_pod("a", mem=1000))
    with extender(api_server, replace(FAST, node_lock_timeout_s=2.0), timeout_s=0.5) as (app, ext):
        app.healer.max_tasks = 0  # every submit refused, as with 1,024 repairs queued
        assert filter_(ext, a)["NodeNames"] == ["gpu-1"]
        api_server.inject_fault(None, method="POST", path_regex=r"/pods/a/binding$", times=2, delay_s=3.0)
        res = bind(ext, a)
        assert "outcome is unknown" in res["Error"], res
        uid = a["metadata"]["uid"]
        assert app.healer.refused >= 1
        assert app.extender.binder.in_doubt(uid)
        assert "still being resolved" in bind(ext, a)["Error"]
        assert wait_for(lambda: not app.extender.binder.in_doubt(uid), 6)  # the 2 s lock timeout


def test_lost_bind_answer_read_back_as_bound_is_a_success(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=10000))
    a = create(api_server, gpu_pod("a", mem=1000))
    with extender(api_server, FAST, timeout_s=0.5) as (app, ext):
        assert filter_(ext, a)["NodeNames"] == ["gpu-1"]
        # the first binding lands after 0.7 s, long after the client gave up at 0.5 s; the extender
        # reads back (not bound yet), sends again: 409 "already assigned" or success, and reads back
        api_server.inject_fault(None, method="POST", path_regex=r"/pods/a/binding$", times=1, delay_s=0.7)
        api_server.inject_fault(None, method="GET", path_regex=r"/pods/a$", times=1, delay_s=0.3)
        res = bind(ext, a)
        assert res["Error"] == "", res
        assert api_server.get("Pod", "default", "a")["spec"]["nodeName"] == "gpu-1"
        assert lock_owner(api_server) == "default/a"  # kept for Allocate
        check_cluster(api_server, [app])


def test_failed_lock_release_heals_in_the_background(api_server):
    # Regression (issue 16 finding 2): when the release after a failed bind itself failed (409/500 on
    # the node GET/PATCH), nothing retried it: the node refused every other GPU pod until the 5-minute
    # expiry.
    api_server.create(gpu_node("gpu-1", gpus=1, mem=10000))
    a = create(api_server, gpu_pod("a", mem=1000))
    b = create(api_server, gpu_pod("b", mem=1000))
    with extender(api_server, FAST, timeout_s=0.5) as (app, ext):
        assert filter_(ext, a)["NodeNames"] == ["gpu-1"]
        api_server.inject_fault(422, method="POST", path_regex=r"/pods/a/binding$", times=1, delay_s=0.3)

        def break_release() -> None:  # once the binding is in flight, the lock is taken: fail its release
            wait_for(lambda: api_server.requests_matching("POST", r"/pods/a/binding$"), 5)
            # five failures: more than a client's own retry budget (5 attempts) can absorb
            api_server.inject_fault(500, method="PATCH", path_regex=r"/nodes/gpu-1$", times=5)
            api_server.inject_fault(500, method="GET", path_regex=r"/nodes/gpu-1$", times=1)

        t = threading.Thread(target=break_release)
        t.start()
        res = bind(ext, a)
        t.join(5)
        assert "422" in res["Error"]
        assert lock_owner(api_server) == "default/a"  # the release failed...
        assert wait_for(lambda: lock_owner(api_server) is None, 15), "...and was not retried"
        assert filter_(ext, b)["NodeNames"] == ["gpu-1"]
        assert bind(ext, b)["Error"] == ""
        check_cluster(api_server, [app])

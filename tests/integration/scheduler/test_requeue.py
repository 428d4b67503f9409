"""Issue 18 item 7 / Project-HAMi/HAMi#1368: a pod the extender refused while its predecessor still held
the GPU must run as soon as the GPU frees, against a kube-scheduler whose queue parks refused pods until a
cluster event (or 5 minutes). The race that strands it: kube-scheduler acts on the predecessor's deletion
before the extender's informer does, retries at once, and is refused again. The extender then announces
the freed capacity with a node update (``scheduler/verbs/requeue.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.verbs.requeue import ANNOTATION
from tests.integration.scheduler.cluster import check_cluster, gpu_node, gpu_pod, stack
from tests.sim import kube_scheduler_queue as qu

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _wait(fn, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.02)
    return bool(fn())


def _race(api_server, app, sim, lag_s: float, expect_refusal: bool = True) -> float:
    """Bind ``first`` on the single GPU, park ``second``, then delete ``first`` while the extender's
    informer lags ``lag_s`` behind kube-scheduler's. Returns when the extender's informer freed the GPU.
    ``expect_refusal``: the retry the deletion triggers is refused (the read-back of ``confirm.py`` is
    off: the announcement is the backstop under test)."""
    if expect_refusal:
        app.extender.gone_check = None
    api_server.create(gpu_pod("first", gpus=1, mem=16384))
    assert sim.wait_idle(10, expect_bound=1)
    api_server.create(gpu_pod("second", gpus=1, mem=16384))

    def parked_and_backed_off() -> bool:
        # parked, and its backoff has run out: the deletion event sends it straight to /filter (the lock
        # release of ``first`` is a node update that retries it once more first)
        qp = sim.queue.get("default/second")
        return (qp is not None and qp.where == qu.UNSCHEDULABLE
                and time.monotonic() > qp.timestamp + sim.queue.backoff_s(qp) + 0.2
                and keys.NODE_LOCK not in api_server.get("Node", None, "gpu-1")["metadata"]["annotations"])

    assert _wait(parked_and_backed_off, 20)
    freed_at: list[float] = []
    real = app.cache.observe_gone

    def lagging(uid: str):
        time.sleep(lag_s)  # this informer is behind kube-scheduler's
        out = real(uid)
        freed_at.append(time.monotonic())
        return out

    app.cache.observe_gone = lagging
    refused_before = sum(1 for k, _m in sim.failures if k == "default/second")
    api_server.delete("Pod", "default", "first")
    assert _wait(lambda: freed_at, 10)
    refusals = sum(1 for k, _m in sim.failures if k == "default/second") - refused_before
    if expect_refusal:
        assert refusals >= 1, "kube-scheduler did not retry before the extender freed the GPU: no race"
    else:
        assert refusals == 0, sim.failures[-3:]
    return freed_at[0]


def test_the_retry_after_the_deletion_is_placed_by_reading_the_pod_back(api_server):
    """The race, with /filter reading back the pod in its way before refusing (``confirm.py``): the API
    no longer has ``first``, so the retry that ``first``'s deletion triggered places ``second`` at once —
    no refusal, no backoff — while the lagging informer has not freed the GPU yet."""
    api_server.create(gpu_node("gpu-1", gpus=1, mem=16384, split=1))
    with stack(api_server, backoff_s=1.0) as (app, sim):
        bound_before_informer = []
        real_gone = app.cache.observe_gone

        def informer_frees(uid: str):
            bound_before_informer.append("default/second" in sim.bound_at)
            return real_gone(uid)

        app.cache.observe_gone = informer_frees
        _race(api_server, app, sim, lag_s=1.0, expect_refusal=False)
        assert sim.wait_idle(15, expect_bound=2)
        assert bound_before_informer == [True]
        assert app.extender.gone_check.released == 1 and app.extender.gone_check.gets >= 1
        # the informer's late deletion changed nothing: the GPU is counted once, for ``second``
        usage = app.cache.pods
        assert [u.name for u in usage.values()] == ["second"]
        check_cluster(api_server, [app])


def test_refused_pod_runs_once_the_extender_frees_the_gpu(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=16384, split=1))
    with stack(api_server, backoff_s=1.0) as (app, sim):
        freed = _race(api_server, app, sim, lag_s=0.5)
        assert sim.wait_idle(15, expect_bound=2), (sim.queue.get("default/second"), sim.failures[-3:])
        # one refusal right after the deletion: backoff 2 s, then the retry the node update triggered
        assert sim.bound_at["default/second"] - freed < 10.0  # vs 300 s (the flush) without the announcement
        assert ANNOTATION in api_server.get("Node", None, "gpu-1")["metadata"]["annotations"]
        assert app.requeue.kicks >= 1


def test_without_the_announcement_the_pod_waits_for_the_five_minute_flush(api_server):
    """Control: the simulator is as harsh as kube-scheduler. With the announcement off, nothing moves the
    refused pod (its own informer lagged, no other event comes) and it stays parked."""
    api_server.create(gpu_node("gpu-1", gpus=1, mem=16384, split=1))
    with stack(api_server, backoff_s=1.0) as (app, sim):
        app.requeue.window_s = -1.0  # never announce
        _race(api_server, app, sim, lag_s=0.5)
        time.sleep(6.0)
        assert "default/second" not in sim.bound
        assert sim.queue.where("default/second") == qu.UNSCHEDULABLE
        assert app.requeue.kicks == 0


def test_no_announcement_without_a_refusal(api_server):
    api_server.create(gpu_node("gpu-1", gpus=2, mem=16384, split=1))
    with stack(api_server, backoff_s=1.0) as (app, sim):
        api_server.create(gpu_pod("only", gpus=1, mem=16384))
        assert sim.wait_idle(10, expect_bound=1)
        done = threading.Event()
        real = app.cache.observe_gone
        app.cache.observe_gone = lambda uid: (real(uid), done.set())[0]
        api_server.delete("Pod", "default", "only")
        assert done.wait(10)
        time.sleep(0.5)
        assert app.requeue.kicks == 0 and app.requeue.pending() == 0

"""Where /bind takes the pod from (verbs/binder.py ``_checked``): the pending-pod informer's copy when
it already carries this extender's decision, so a bind costs no GET; the ``bind-phase`` write is
conditional on that copy's resourceVersion, so a copy older than the API meets a 409 and the pod is
checked once more as the API has it. SIMULATED API server; every test that binds ends with the invariant
checker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from hami_agent.protocol import keys
from tests.integration.scheduler.cluster import check_cluster, gpu_node, gpu_pod
from tests.integration.scheduler.test_trust import bind, create, extender, filter_, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def pod_gets(api, name: str) -> int:
    return len(api.requests_matching("GET", rf"/namespaces/default/pods/{name}$"))


def informer_shows_decision(app, name: str) -> bool:
    cached = app.sync.pending_pod("default", name)
    return bool(cached) and keys.DEVICES_TO_ALLOCATE in (cached["metadata"].get("annotations") or {})


def lock_of(api, node: str) -> str | None:
    return (api.get("Node", None, node)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)


@contextmanager
def filtered(api) -> Iterator[tuple]:
    """One 1-GPU node, one pod filtered onto it by a running extender whose informer already shows the
    decision: (app, extender client, pod)."""
    api.create(gpu_node("gpu-1", gpus=1, mem=8000))
    p = create(api, gpu_pod("p", mem=1000))
    with extender(api) as (app, ext):
        assert filter_(ext, p)["NodeNames"] == ["gpu-1"]
        assert wait_for(lambda: informer_shows_decision(app, "p"))
        yield app, ext, p


def test_bind_takes_the_pod_from_the_informer_when_it_shows_the_decision(api_server):
    with filtered(api_server) as (app, ext, p):
        before = pod_gets(api_server, "p")
        assert bind(ext, p) == {"Error": ""}
        assert pod_gets(api_server, "p") == before, "the bind read the pod although its copy was current"
        pod = api_server.get("Pod", "default", "p")
        assert pod["spec"]["nodeName"] == "gpu-1"
        assert pod["metadata"]["annotations"][keys.BIND_PHASE] == keys.BIND_PHASE_ALLOCATING
        check_cluster(api_server, [app])


def test_a_conflict_on_the_bind_phase_write_checks_the_pod_afresh_and_binds(api_server):
    with filtered(api_server) as (app, ext, p):
        # the copy was current when checked, the API moved on (a 409, as after a label change)
        api_server.inject_fault(409, method="PATCH", path_regex=r"/pods/p$")
        before = pod_gets(api_server, "p")
        assert bind(ext, p) == {"Error": ""}
        assert pod_gets(api_server, "p") == before + 1  # read afresh once, still this extender's decision
        assert api_server.get("Pod", "default", "p")["spec"]["nodeName"] == "gpu-1"
        check_cluster(api_server, [app])


def test_a_decision_changed_behind_the_copy_fails_the_bind_and_releases_the_lock(api_server):
    """Whether the informer has seen the change yet or not, nothing is bound and the lock is not kept:
    a current copy refuses before the lock, a stale one meets the conditional write's 409 and the fresh
    read no longer carries the decision."""
    with filtered(api_server) as (app, ext, p):
        api_server.patch("pods", "default", "p", {"metadata": {"annotations": {
            keys.DEVICES_TO_ALLOCATE: "GPU-forged,NVIDIA,8000,100:;"}}})
        res = bind(ext, p)
        assert res["Error"] and "decision" in res["Error"], res
        pod = api_server.get("Pod", "default", "p")
        assert not pod["spec"].get("nodeName") and keys.BIND_PHASE not in pod["metadata"]["annotations"]
        assert wait_for(lambda: lock_of(api_server, "gpu-1") is None), "the node lock was kept"
        assert api_server.requests_matching("POST", r"/pods/p/binding$") == []


def test_a_stale_copy_meets_the_conditional_write_and_the_fresh_read_refuses(api_server):
    """The stale path made certain: the pending-pod informer is stopped after it showed the decision,
    so its copy still carries it when the decision is changed in the API."""
    with filtered(api_server) as (app, ext, p):
        app.sync.pending_informer.stop()
        api_server.patch("pods", "default", "p", {"metadata": {"annotations": {
            keys.DEVICES_TO_ALLOCATE: "GPU-forged,NVIDIA,8000,100:;"}}})
        assert informer_shows_decision(app, "p")  # the copy is stale and still shows the old decision
        res = bind(ext, p)
        assert "409" in res["Error"] and "no longer carries this extender's decision" in res["Error"], res
        pod = api_server.get("Pod", "default", "p")
        assert not pod["spec"].get("nodeName") and keys.BIND_PHASE not in pod["metadata"]["annotations"]
        assert lock_of(api_server, "gpu-1") is None, "the node lock was not released at once"
        assert api_server.requests_matching("POST", r"/pods/p/binding$") == []

"""List semantics of the simulated API server (resourceVersion=0, limit/continue, 410 on an expired continue
token), the client's pager, where informers list from, and per-client request accounting."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.k8s import ExpiredError, Informer, KubeClient, KubeError
from hami_agent.k8s.client import too_large_rv, user_agent
from tests.integration.k8s.conftest import node, pod
from tests.integration.k8s.test_informer import wait_until
from tests.sim import apiserver_lists
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _pods(api: ApiServer, n: int, node_name: str = "gpu-1") -> None:
    for i in range(n):
        api.create(pod(f"p{i:02d}", node_name=node_name))


def _get(kube: KubeClient, **query: str) -> dict:
    return kube.call("GET", "/api/v1/namespaces/default/pods", verb="list", kind="pods", query=query)


def test_consistent_list_pages_at_the_first_pages_revision(api_server: ApiServer, kube: KubeClient) -> None:
    _pods(api_server, 5)
    first = _get(kube, limit="2")
    assert [p["metadata"]["name"] for p in first["items"]] == ["p00", "p01"]
    token, rv = first["metadata"]["continue"], first["metadata"]["resourceVersion"]
    assert first["metadata"]["remainingItemCount"] == 3
    # changes after the first page do not show up in later pages: they are read at its revision
    api_server.delete("pods", "default", "p03")
    api_server.create(pod("p02a"))
    api_server.patch("pods", "default", "p04", {"metadata": {"labels": {"late": "yes"}}})
    second = _get(kube, limit="2", **{"continue": token})
    third = _get(kube, limit="2", **{"continue": second["metadata"]["continue"]})
    names = [p["metadata"]["name"] for p in second["items"] + third["items"]]
    assert names == ["p02", "p03", "p04"]
    assert "late" not in (third["items"][-1]["metadata"].get("labels") or {})
    assert not third["metadata"].get("continue")
    assert second["metadata"]["resourceVersion"] == rv


def test_continue_pages_do_not_reread_the_store(api_server: ApiServer, kube: KubeClient,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A later page is cut from the first page's selection at its revision (etcd's range read costs
    O(page)); re-reading and sorting every object per page made a 10,000-pod list quadratic."""
    _pods(api_server, 6)
    api_server.create(pod("other", node_name="gpu-2"))
    calls: list[str] = []
    real_list, real_state_at = api_server.store.list, apiserver_lists._state_at

    def counting_list(*a, **k):
        # the simulated disruption controller, woken by the delete below, lists on its own thread
        if threading.current_thread().name != "sim-disruption-controller":
            calls.append("list")
        return real_list(*a, **k)

    monkeypatch.setattr(api_server.store, "list", counting_list)
    monkeypatch.setattr(apiserver_lists, "_state_at",
                        lambda *a: calls.append("state_at") or real_state_at(*a))
    sel = {"fieldSelector": "spec.nodeName=gpu-1"}
    first = _get(kube, limit="2", **sel)
    api_server.delete("pods", "default", "p03")  # after the first page: not seen by the later pages
    names = [p["metadata"]["name"] for p in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = _get(kube, limit="2", **{"continue": token}, **sel)
        names += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue")
    assert names == ["p00", "p01", "p02", "p03", "p04", "p05"]
    assert calls == ["list"]  # the first page read the store, the later pages did not
    # another selection at the same revision is its own list
    everything = _get(kube, limit="100")
    assert len(everything["items"]) == 6 and calls == ["list", "list"]


def test_watch_cache_list_ignores_limit(api_server: ApiServer, kube: KubeClient) -> None:
    _pods(api_server, 5)
    out = _get(kube, limit="2", resourceVersion="0")
    assert len(out["items"]) == 5 and not out["metadata"].get("continue")
    out = _get(kube, resourceVersion=str(api_server.store.current_rv()))  # not older than N, no limit
    assert len(out["items"]) == 5


def test_expired_continue_token_is_410(api_server: ApiServer, kube: KubeClient) -> None:
    _pods(api_server, 4)
    token = _get(kube, limit="2")["metadata"]["continue"]
    api_server.create(pod("later"))
    api_server.compact()
    with pytest.raises(ExpiredError) as e:
        _get(kube, limit="2", **{"continue": token})
    assert e.value.status == 410 and "continue parameter is too old" in e.value.message


def test_continue_with_resource_version_is_refused(api_server: ApiServer, kube: KubeClient) -> None:
    _pods(api_server, 3)
    token = _get(kube, limit="1")["metadata"]["continue"]
    with pytest.raises(KubeError) as e:
        _get(kube, limit="1", resourceVersion="1", **{"continue": token})
    assert e.value.status == 400 and "not allowed when using continue" in e.value.message


def test_exact_revision_with_limit_is_410_once_compacted(api_server: ApiServer, kube: KubeClient) -> None:
    _pods(api_server, 3)
    old = str(api_server.store.current_rv())
    api_server.create(pod("newer"))
    assert len(_get(kube, limit="10", resourceVersion=old)["items"]) == 3  # exactly at that revision
    api_server.compact()
    with pytest.raises(ExpiredError):
        _get(kube, limit="10", resourceVersion=old)


def test_too_large_resource_version_is_504(api_server: ApiServer, kube: KubeClient,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apiserver_lists, "TOO_LARGE_WAIT_S", 0.2)
    future = str(api_server.store.current_rv() + 100)
    with pytest.raises(KubeError) as e:
        kube.with_options(attempts=1).call("GET", "/api/v1/pods", verb="list", kind="pods",
                                           query={"resourceVersion": future})
    assert too_large_rv(e.value)


def test_pager_collects_every_page(api_server: ApiServer, kube: KubeClient) -> None:
    _pods(api_server, 7)
    api_server.create(pod("elsewhere", node_name="gpu-2"))
    items, rv = kube.list("pods", field_selector="spec.nodeName=gpu-1", page_size=3)
    assert [p["metadata"]["name"] for p in items] == [f"p{i:02d}" for i in range(7)]
    assert rv == str(api_server.store.current_rv())
    pages = [r for r in api_server.requests if r.path == "/api/v1/pods"]
    assert len(pages) == 3 and "continue" in pages[1].query and "resourceVersion" not in pages[1].query


def test_pager_falls_back_to_a_full_list_when_the_token_expires(api_server: ApiServer, kube: KubeClient,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _pods(api_server, 5)
    real_call = KubeClient.call
    calls = []

    def call(self: KubeClient, *a, **kw):  # noqa: ANN002, ANN003
        out = real_call(self, *a, **kw)
        calls.append(kw.get("query"))
        if len(calls) == 1:  # etcd compacts right after the first page
            api_server.create(pod("p99"))
            api_server.compact()
        return out

    monkeypatch.setattr(KubeClient, "call", call)
    items, _rv = kube.list("pods", page_size=2)
    assert sorted(p["metadata"]["name"] for p in items) == [f"p{i:02d}" for i in range(5)] + ["p99"]
    assert "limit" not in calls[-1] and "continue" not in calls[-1]  # the full list, one request


def test_informer_lists_from_the_watch_cache_and_relist_reads_the_present(
        api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    inf = Informer(kube, kind="nodes", resync_s=0, watch_timeout_s=30).start()
    try:
        assert inf.wait_synced(5)
        lists = [r for r in api_server.requests if r.path == "/api/v1/nodes" and "watch" not in r.query]
        assert lists[0].query.get("resourceVersion") == "0"
        assert inf.relist(5)
        lists = [r for r in api_server.requests if r.path == "/api/v1/nodes" and "watch" not in r.query]
        assert "resourceVersion" not in lists[-1].query and lists[-1].query.get("limit") == "500"
        assert inf.consistent_lists == 1
    finally:
        inf.stop()


def test_informer_relists_from_the_cache_after_an_expired_watch(api_server: ApiServer,
                                                                kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    inf = Informer(kube, kind="nodes", resync_s=0, watch_timeout_s=1).start()
    try:
        assert inf.wait_synced(5)
        api_server.stop()
        api_server.create(node("gpu-2"))
        api_server.compact()  # the informer's resourceVersion left the history while it was away
        api_server.start()
        assert wait_until(lambda: inf.get(None, "gpu-2") is not None, 10)
        lists = [r for r in api_server.requests if r.path == "/api/v1/nodes" and "watch" not in r.query]
        relist = lists[-1].query
        assert relist.get("resourceVersion") not in (None, "", "0") and "limit" not in relist
        assert inf.consistent_lists == 0
    finally:
        inf.stop()


def test_accounting_by_user_agent_and_verb(api_server: ApiServer) -> None:
    kube = KubeClient.from_kubeconfig(api_server.kubeconfig_path, component="unit-test")
    try:
        api_server.create(node("gpu-1"))
        api_server.accounting.reset()
        kube.get_node("gpu-1")
        kube.list("nodes", resource_version="0")
        kube.list("nodes")
        kube.patch_node_annotations("gpu-1", {"a": "b"})
        with kube.watch("nodes", str(api_server.store.current_rv() - 1), timeout_s=1) as w:
            next(iter(w))
        ua = user_agent("unit-test")
        assert ua.startswith("hami-agent/") and ua.endswith(" unit-test")
        tally = api_server.accounting.by(user_agent=ua)
        assert {v: t.requests for v, t in tally.items()} == {"get": 1, "list": 1, "list-etcd": 1, "patch": 1,
                                                           "watch": 1}
        assert tally["watch"].bytes_out > 0 and tally["patch"].bytes_in > 0
        assert api_server.accounting.by(agent_contains="someone-else") == {}
    finally:
        kube.close()


def test_list_timing_window_is_resettable(api_server: ApiServer) -> None:
    acc = api_server.accounting
    before = acc.since
    time.sleep(0.01)
    acc.reset()
    assert acc.since > before and acc.snapshot() == {}

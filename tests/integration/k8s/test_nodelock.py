"""HAMi node lock over real HTTP: races, expiry, orphaned owners, legacy values, release rules."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from hami_agent.k8s import KubeClient, NodeLockError, lock_node, release_node_lock
from hami_agent.k8s.backoff import Backoff
from hami_agent.k8s.nodelock import owner_done
from hami_agent.protocol import keys
from hami_agent.protocol.nodelock import parse_lock_value
from tests.integration.k8s.conftest import node, pod
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

UTC = timezone.utc


def lock_value(api: ApiServer, name: str = "gpu-1") -> str | None:
    return (api.get("nodes", None, name)["metadata"].get("annotations") or {}).get(keys.NODE_LOCK)


def test_lock_sets_value_and_same_pod_relocks(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    lock_node(kube, "gpu-1", "ns", "p1")
    value = lock_value(api_server)
    parsed = parse_lock_value(value)
    assert parsed.namespace == "ns" and parsed.name == "p1"
    assert abs((datetime.now(UTC) - parsed.when).total_seconds()) < 5
    # the write was conditional: the merge patch carried the node's resourceVersion
    patch = api_server.requests_matching("PATCH", "/nodes/gpu-1$")[-1]
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body["metadata"]["resourceVersion"]
    lock_node(kube, "gpu-1", "ns", "p1")  # same pod: acquired, value unchanged
    assert lock_value(api_server) == value


def test_busy_node_gives_hamis_exact_error(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    api_server.create(pod("p1", namespace="ns"))
    lock_node(kube, "gpu-1", "ns", "p1")
    with pytest.raises(NodeLockError) as ei:
        lock_node(kube, "gpu-1", "ns", "p2")
    assert str(ei.value) == "node gpu-1 has been locked within 5m0s: node lock contention"
    assert ei.value.holder == "ns/p1"
    with pytest.raises(NodeLockError,
                       match=r"^node gpu-1 has been locked within 1m30s: node lock contention$"):
        lock_node(kube, "gpu-1", "ns", "p2", expiry_s=90)


def test_expired_lock_is_taken_over(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(pod("old", namespace="ns"))  # owner still exists: only expiry frees it
    old = (datetime.now(UTC) - timedelta(minutes=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{old},ns,old"}))
    lock_node(kube, "gpu-1", "ns", "new")
    assert lock_value(api_server).endswith(",ns,new")


def test_fresh_lock_with_live_owner_is_not_taken(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(pod("old", namespace="ns"))
    recent = (datetime.now(UTC) - timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{recent},ns,old"}))
    with pytest.raises(NodeLockError, match="node lock contention"):
        lock_node(kube, "gpu-1", "ns", "new")
    assert lock_value(api_server) == f"{recent},ns,old"


def test_orphaned_lock_is_taken_over(api_server: ApiServer, kube: KubeClient) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{now},ns,gone"}))
    lock_node(kube, "gpu-1", "ns", "new")
    assert lock_value(api_server).endswith(",ns,new")


def test_legacy_bare_timestamp(api_server: ApiServer, kube: KubeClient) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: now}))
    with pytest.raises(NodeLockError, match="node lock contention"):  # no owner to check: wait for expiry
        lock_node(kube, "gpu-1", "ns", "p")
    old = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.patch("nodes", None, "gpu-1", {"metadata": {"annotations": {keys.NODE_LOCK: old}}})
    lock_node(kube, "gpu-1", "ns", "p")
    assert lock_value(api_server).endswith(",ns,p")


def test_unparsable_lock_is_taken_over(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: "garbage,,"}))
    lock_node(kube, "gpu-1", "ns", "p")
    assert lock_value(api_server).endswith(",ns,p")


def test_release_rules(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    assert release_node_lock(kube, "gpu-1", "ns", "p1") is False  # absent: no-op
    api_server.create(pod("p1", namespace="ns"))
    lock_node(kube, "gpu-1", "ns", "p1")
    with pytest.raises(NodeLockError) as ei:
        release_node_lock(kube, "gpu-1", "ns", "p2")
    assert str(ei.value) == "node gpu-1 lock is held by ns/p1, not by ns/p2: refusing to release it"
    assert lock_value(api_server) is not None
    # a pod whose name is a suffix of the owner's must not match either
    with pytest.raises(NodeLockError):
        release_node_lock(kube, "gpu-1", "s", "p1")
    assert release_node_lock(kube, "gpu-1", "ns", "p1") is True
    assert lock_value(api_server) is None
    node_obj = api_server.get("nodes", None, "gpu-1")
    assert keys.NODE_LOCK not in (node_obj["metadata"].get("annotations") or {})


def test_two_contenders_race_exactly_one_wins(api_server: ApiServer, kube: KubeClient) -> None:
    """20 rounds of two threads locking the same node at the same moment over real HTTP."""
    conflicted_rounds = 0
    for round_ in range(20):
        name = f"gpu-{round_}"
        api_server.create(node(name))
        for p in ("a", "b"):
            api_server.create(pod(f"{p}{round_}", namespace="ns"))
        barrier = threading.Barrier(2)
        results: dict[str, str] = {}

        def contend(p: str, name: str = name, round_: int = round_, barrier=barrier, results=results) -> None:
            barrier.wait()
            try:
                lock_node(kube, name, "ns", f"{p}{round_}", backoff=Backoff(0.005, 2, 0.5, 5))
                results[p] = "won"
            except NodeLockError as e:
                results[p] = str(e)

        threads = [threading.Thread(target=contend, args=(p,)) for p in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [p for p, r in results.items() if r == "won"]
        assert len(winners) == 1, (round_, results)
        loser = "b" if winners[0] == "a" else "a"
        assert results[loser] == f"node {name} has been locked within 5m0s: node lock contention"
        assert lock_value(api_server, name).endswith(f",ns,{winners[0]}{round_}")
        if len(api_server.requests_matching("PATCH", f"/nodes/{name}$")) == 2:
            conflicted_rounds += 1  # both wrote; the resourceVersion check turned one away (409)
    # The race is real: in practice ~90 % of rounds reach the conditional-write conflict.
    assert conflicted_rounds >= 1


class _StaleFirstRead:
    """Delegates to a KubeClient but serves one stale node read first (as if another scheduler locked
    the node between our GET and our PATCH)."""

    def __init__(self, inner: KubeClient, stale: dict) -> None:
        self._inner = inner
        self._stale: dict | None = stale
        self.patches = 0

    def get_node(self, name: str) -> dict:
        if self._stale is not None:
            stale, self._stale = self._stale, None
            return stale
        return self._inner.get_node(name)

    def patch_node_annotations(self, *args, **kwargs) -> dict:
        self.patches += 1
        return self._inner.patch_node_annotations(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def test_lost_race_is_detected_by_resource_version(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    api_server.create(pod("a", namespace="ns"))
    stale = kube.get_node("gpu-1")
    lock_node(kube, "gpu-1", "ns", "a")
    racer = _StaleFirstRead(kube, stale)
    with pytest.raises(NodeLockError, match="node lock contention"):
        lock_node(racer, "gpu-1", "ns", "b", backoff=Backoff(0.001, 2, 0.5, 5))  # type: ignore[arg-type]
    assert racer.patches == 1  # its conditional patch got 409, the re-read saw a's lock
    assert lock_value(api_server).endswith(",ns,a")


def test_persistent_conflicts_exhaust_hamis_backoff(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    api_server.inject_fault(409, method="PATCH", path_regex="/nodes/gpu-1", times=100)
    with pytest.raises(NodeLockError) as ei:
        lock_node(kube, "gpu-1", "ns", "p", backoff=Backoff(0.001, 2, 0.5, 5))
    assert str(ei.value).startswith("node gpu-1 lock failed after 5 retries: patch node error: 409 Conflict "
                                    "on node gpu-1")
    assert len(api_server.requests_matching("PATCH", "/nodes/gpu-1")) == 6  # first try + 5 retries


@pytest.mark.parametrize(("owner", "why"), [
    (pod("old", namespace="ns", node_name="gpu-2", phase="Running"), "bound to node gpu-2"),
    (pod("old", namespace="ns", node_name="gpu-1", phase="Succeeded"), "owner pod Succeeded"),
    (dict(pod("old", namespace="ns", node_name="gpu-1", phase="Running"),
          metadata={"name": "old", "namespace": "ns", "annotations": {keys.BIND_PHASE: "success"}}),
     "allocated"),
])
def test_lock_of_an_owner_that_no_longer_needs_it_is_taken_over(api_server: ApiServer, kube: KubeClient,
                                                                 owner: dict, why: str) -> None:
    # Deliberate difference from HAMi (which waits for the 5-minute expiry): a lock whose release failed
    # heals at the next bind once its owner provably no longer needs it.
    api_server.create(owner)
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{recent},ns,old"}))
    assert why in owner_done(kube, "ns", "old", "gpu-1")
    lock_node(kube, "gpu-1", "ns", "new")
    assert lock_value(api_server).endswith(",ns,new")


@pytest.mark.parametrize("owner", [
    pod("old", namespace="ns"),  # pending: may be between its lock and its binding
    dict(pod("old", namespace="ns", node_name="gpu-1", phase="Pending"),
         metadata={"name": "old", "namespace": "ns", "annotations": {keys.BIND_PHASE: "allocating"}}),
])
def test_lock_of_an_owner_that_may_still_need_it_is_kept(api_server: ApiServer, kube: KubeClient,
                                                         owner: dict) -> None:
    api_server.create(owner)
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{recent},ns,old"}))
    assert owner_done(kube, "ns", "old", "gpu-1") == ""
    with pytest.raises(NodeLockError, match="node lock contention"):
        lock_node(kube, "gpu-1", "ns", "new")


def test_release_of_an_expected_value_leaves_a_newer_lock_of_the_same_pod(api_server: ApiServer,
                                                                          kube: KubeClient) -> None:
    api_server.create(node("gpu-1"))
    first = lock_node(kube, "gpu-1", "ns", "p1")
    assert first == lock_value(api_server)
    newer = "2030-01-01T00:00:00Z,ns,p1"
    api_server.patch("nodes", None, "gpu-1", {"metadata": {"annotations": {keys.NODE_LOCK: newer}}})
    assert release_node_lock(kube, "gpu-1", "ns", "p1", expected=first) is False
    assert lock_value(api_server) == newer
    assert release_node_lock(kube, "gpu-1", "ns", "p1", expected=newer) is True
    assert lock_value(api_server) is None


def test_lock_from_the_watchs_copy_skips_the_read(api_server: ApiServer, kube: KubeClient) -> None:
    seen = api_server.create(node("gpu-1"))  # the copy a node watch holds
    before = len(api_server.requests)
    lock_node(kube, "gpu-1", "ns", "p1", cached=seen)
    made = [(r.method, r.path) for r in list(api_server.requests)[before:]]
    assert made == [("PATCH", "/api/v1/nodes/gpu-1")], made  # no GET
    assert parse_lock_value(lock_value(api_server)).name == "p1"
    patch = api_server.requests_matching("PATCH", "/nodes/gpu-1$")[-1]
    assert patch.body["metadata"]["resourceVersion"] == seen["metadata"]["resourceVersion"]


def test_a_stale_copy_costs_one_conflict_then_the_node_is_read(api_server: ApiServer,
                                                               kube: KubeClient) -> None:
    stale = api_server.create(node("gpu-1"))
    api_server.patch("nodes", None, "gpu-1", {"metadata": {"labels": {"moved": "on"}}})  # newer rv
    # a backoff with no retries left: the stale copy's conflict must not use one up, nor sleep
    lock_node(kube, "gpu-1", "ns", "p1", cached=stale, backoff=Backoff(steps=0))
    assert parse_lock_value(lock_value(api_server)).name == "p1"
    assert len(api_server.requests_matching("GET", "/nodes/gpu-1$")) == 1


def test_a_lock_in_the_copy_is_read_afresh(api_server: ApiServer, kube: KubeClient) -> None:
    api_server.create(pod("p1", namespace="ns"))
    api_server.create(pod("p2", namespace="ns"))  # an owner that still needs its lock
    api_server.create(node("gpu-1"))
    lock_node(kube, "gpu-1", "ns", "p1")
    locked = api_server.get("nodes", None, "gpu-1")
    release_node_lock(kube, "gpu-1", "ns", "p1")
    # the watch still shows p1's lock; the node is free: read afresh and taken
    lock_node(kube, "gpu-1", "ns", "p2", cached=locked)
    assert parse_lock_value(lock_value(api_server)).name == "p2"
    # and a copy showing a lock the node really holds gives HAMi's contention error
    with pytest.raises(NodeLockError, match="node lock contention"):
        lock_node(kube, "gpu-1", "ns", "p3", cached=api_server.get("nodes", None, "gpu-1"))


def test_an_owner_the_watch_shows_still_needing_the_lock_costs_no_get(api_server: ApiServer,
                                                                      kube: KubeClient) -> None:
    owner = api_server.create(pod("old", namespace="ns"))  # pending: still needs its lock
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{recent},ns,old"}))
    before = len(api_server.requests)
    with pytest.raises(NodeLockError, match="node lock contention"):
        lock_node(kube, "gpu-1", "ns", "new", watched_pod=lambda ns, name: owner)
    assert not [r for r in list(api_server.requests)[before:] if "/pods/" in r.path]  # no GET of the owner


def test_an_owner_the_watch_shows_done_is_confirmed_before_the_take_over(api_server: ApiServer,
                                                                         kube: KubeClient) -> None:
    live = api_server.create(pod("old", namespace="ns"))  # the API: still pending, still needs its lock
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{recent},ns,old"}))
    ahead = dict(live, spec={**live["spec"], "nodeName": "gpu-2"})  # a copy that says "bound elsewhere"
    with pytest.raises(NodeLockError, match="node lock contention"):  # the API is asked, and it wins
        lock_node(kube, "gpu-1", "ns", "new", watched_pod=lambda ns, name: ahead)
    assert api_server.requests_matching("GET", "/pods/old$")
    assert lock_value(api_server).endswith(",ns,old")
    gone = {}  # a copy missing (the owner not in the watch): asked of the API too
    with pytest.raises(NodeLockError, match="node lock contention"):
        lock_node(kube, "gpu-1", "ns", "new", watched_pod=lambda ns, name: gone.get(name))


def test_a_busy_lock_judged_from_the_copies_costs_no_request(api_server: ApiServer, kube: KubeClient) -> None:
    """judge_cached_lock (a bind's first attempt with a waiter): the node watch's copy shows a live lock
    whose owner the pod watch shows still needing it: busy, without reading the node or the owner."""
    owner = api_server.create(pod("old", namespace="ns"))  # pending: still needs its lock
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    locked = api_server.create(node("gpu-1", annotations={keys.NODE_LOCK: f"{recent},ns,old"}))
    before = len(api_server.requests)
    with pytest.raises(NodeLockError, match="node lock contention") as info:
        lock_node(kube, "gpu-1", "ns", "new", cached=locked, watched_pod=lambda ns, name: owner,
                  judge_cached_lock=True)
    assert info.value.from_watch and info.value.holder == "ns/old"
    assert list(api_server.requests)[before:] == []
    # without the flag the same copies cost a read of the node (the lock is judged from the API)
    with pytest.raises(NodeLockError, match="node lock contention") as info:
        lock_node(kube, "gpu-1", "ns", "new", cached=locked, watched_pod=lambda ns, name: owner)
    assert not info.value.from_watch
    assert [r.method for r in list(api_server.requests)[before:]] == ["GET"]


def test_copies_that_do_not_show_a_live_lock_are_judged_by_the_api(api_server: ApiServer,
                                                                   kube: KubeClient) -> None:
    """Every case the copies cannot settle goes to the API: an owner the pod watch shows done or does not
    show, an expired lock, the caller's own lock. The node is free in the API in each (a stale copy):
    the lock is taken, never refused on the copies."""
    owner = api_server.create(pod("old", namespace="ns"))
    done = dict(owner, spec={**owner["spec"], "nodeName": "gpu-2"})
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api_server.create(node("gpu-1"))
    cases = ((f"{recent},ns,old", lambda ns, name: done), (f"{recent},ns,old", lambda ns, name: None),
             (f"{old},ns,old", lambda ns, name: owner), (f"{recent},ns,new", lambda ns, name: owner))
    for value, seen in cases:
        stale = api_server.get("nodes", None, "gpu-1")
        stale["metadata"]["annotations"] = {keys.NODE_LOCK: value}
        before = len(api_server.requests_matching("GET", "/nodes/gpu-1$"))
        lock_node(kube, "gpu-1", "ns", "new", cached=stale, watched_pod=seen, judge_cached_lock=True)
        assert parse_lock_value(lock_value(api_server)).name == "new", value
        assert len(api_server.requests_matching("GET", "/nodes/gpu-1$")) == before + 1, value
        release_node_lock(kube, "gpu-1", "ns", "new")

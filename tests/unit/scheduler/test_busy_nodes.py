"""/filter prefers a node where no other pod is being admitted (scheduler/state/busy.py): the busy set, the
node choice with ``avoid`` on every path of the cache, and the extender end to end with a fake API."""

from __future__ import annotations

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.core.fit import PodContext, QuotaBudget
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.state.busy import BusyNodes
from hami_agent.scheduler.state.cache import EAGER_DIRTY, UsageCache
from hami_agent.scheduler.state.nodelocks import NodeLocks
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.clock import ManualClock
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod, preq, req

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def node(name: str, lock: str | None = None) -> dict:
    return {"metadata": {"name": name, "annotations": {keys.NODE_LOCK: lock} if lock else {}}}


def test_a_claim_makes_a_node_busy_until_its_bind_settles_or_it_expires() -> None:
    clock = ManualClock()
    b = BusyNodes(claim_ttl_s=5, clock=clock)
    b.claim("n1", "u1")
    b.claim("n1", "u2")
    b.claim("n2", "u3")
    assert b.nodes() == {"n1", "n2"}
    b.settle("u1")
    assert b.nodes() == {"n1", "n2"}  # u2 is still between /filter and /bind there
    b.settle("u2")
    assert b.nodes() == {"n2"}
    clock.t += 5.1
    assert b.nodes() == set()  # a /bind that never came (kube-scheduler gave up) stops counting
    b.settle("u3")  # settling an expired claim is harmless
    assert b.nodes() == set()


def test_a_filter_again_moves_the_claim() -> None:
    b = BusyNodes()
    b.claim("n1", "u1")
    b.claim("n2", "u1")  # the same pod filtered again (its bind failed, kube-scheduler retried)
    assert b.nodes() == {"n2"}
    b.settle("u1")
    assert b.nodes() == set()


def test_the_node_watch_lock_makes_a_node_busy_until_released() -> None:
    locks = NodeLocks()
    b = BusyNodes(locks)
    locks.on_node(node("n1", "2026-11-23T10:00:00Z,default,p1"))
    locks.on_node(node("n2"))
    assert b.nodes() == {"n1"}
    locks.on_node(node("n1"))  # the device plugin's Allocate released it
    assert b.nodes() == set()
    locks.on_node(node("n3", "x"))
    locks.on_node_delete(node("n3"))
    assert b.nodes() == set()


def test_the_locks_are_kept_once_and_tell_who_listens() -> None:
    locks = NodeLocks()
    heard: list[tuple[str, str]] = []
    locks.subscribe(lambda n: heard.append(("released", n)), lambda n: heard.append(("gone", n)))
    locks.on_node(node("n1", "v1"))
    assert locks.value("n1") == "v1" and locks.held() == {"n1"} and heard == []
    locks.on_node(node("n1"))
    assert locks.value("n1") is None and heard == [("released", "n1")]
    locks.on_node(node("n2", "v2"))
    locks.on_node_delete(node("n2"))
    assert locks.held() == set() and heard[-1] == ("gone", "n2")


def test_claims_are_bounded_oldest_dropped_first() -> None:
    b = BusyNodes(max_claims=3)
    for i in range(5):
        b.claim(f"n{i}", f"u{i}")
    assert b.nodes() == {"n2", "n3", "n4"}


def _cache(n: int) -> UsageCache:
    c = UsageCache()
    for i in range(n):
        c.set_node(f"n{i}", [dev(0, uuid=f"n{i}-0", mem=8000)])
    # binpack ranks: n0 fullest, then n1, then every other node
    c.add_pod(PodUsage("f0", "ns", "f0", "n0", {"n0-0": DeviceAmount(1, 4000, 0)}))
    c.add_pod(PodUsage("f1", "ns", "f1", "n1", {"n1-0": DeviceAmount(1, 2000, 0)}))
    return c


@pytest.mark.parametrize("n_nodes", [3, EAGER_DIRTY + 10], ids=["memo-eager", "best-first-walk"])
def test_the_best_node_outside_avoid_else_the_best_inside(n_nodes: int) -> None:
    names = [f"n{i}" for i in range(n_nodes)]
    r, ctx = preq(req(mem=1000)), PodContext(node_policy="binpack")
    assert _cache(n_nodes).decide(names, r, ctx, avoid={"n0"}).node == "n1"
    assert _cache(n_nodes).decide(names, r, ctx, avoid=set()).node == "n0"
    # every fitting node avoided: the best of them, not a refusal
    big = preq(req(mem=5000))  # fits n1 (6000 free) and the empty ones, not n0 (4000 free)
    c = _cache(n_nodes)
    assert c.decide(names, big, ctx, avoid=set(names)).node == "n1"
    assert c.decide(["n0", "n1"], big, ctx, avoid={"n1"}).node == "n1"
    # a warm memo answers the same
    assert c.decide(names, r, ctx, avoid={"n0", "n1"}).node not in ("n0", "n1")
    assert c.decide(names, r, ctx).node == "n0"


def test_avoid_with_a_namespace_quota() -> None:
    c = _cache(3)
    r, ctx = preq(req(mem=1000)), PodContext(node_policy="binpack")
    quota = QuotaBudget(100000, None)
    assert c.decide(["n0", "n1", "n2"], r, ctx, quota, avoid={"n0"}).node == "n1"
    assert c.decide(["n0", "n1", "n2"], r, ctx, quota, avoid={"n0", "n1", "n2"}).node == "n0"


def _extender(avoid: bool) -> tuple[Extender, FakePodClient]:
    cache = UsageCache()
    for n in ("n1", "n2"):
        cache.set_node(n, [dev(0, uuid=f"GPU-{n}-0", mem=8000), dev(1, uuid=f"GPU-{n}-1", mem=8000)])
    client = FakePodClient()
    ext = Extender(cache, SchedulerConfig(avoid_busy_nodes=avoid), client)
    ext.synced.set()
    return ext, client


def _filter(ext: Extender, client: FakePodClient, name: str) -> list[str]:
    pod = client.add(gpu_pod(name, mem=1000))
    res = ext.filter({"Pod": pod, "NodeNames": ["n1", "n2"]})
    assert not res["Error"], res
    return res["NodeNames"]


def test_binpack_sends_the_next_pod_elsewhere_while_a_pod_is_admitted_on_the_best_node() -> None:
    ext, client = _extender(avoid=True)
    try:
        first = _filter(ext, client, "p1")[0]
        other = "n2" if first == "n1" else "n1"
        assert _filter(ext, client, "p2") == [other]  # p1 is between /filter and Allocate on `first`
        # p1's bind took the node lock (the watch shows it) and finished; p2's bind settles too
        ext.node_locks.on_node(node(first, "2026-11-23T10:00:00Z,default,p1"))
        ext.busy.settle("uid-p1")
        ext.busy.settle("uid-p2")
        assert _filter(ext, client, "p3") == [other]  # `first` is still locked; `other` is free
        # p3 not bound yet: both nodes busy, so the best of them by policy (`other` holds two pods)
        assert _filter(ext, client, "p4") == [other]
        ext.node_locks.on_node(node(first))  # Allocate released p1's lock; `other` still has p3 and p4 coming
        assert _filter(ext, client, "p5") == [first]
    finally:
        ext.healer.stop()


def test_switched_off_the_best_node_by_policy_alone() -> None:
    ext, client = _extender(avoid=False)
    try:
        first = _filter(ext, client, "p1")[0]
        assert _filter(ext, client, "p2") == [first]
    finally:
        ext.healer.stop()


def test_a_new_leader_learns_the_busy_nodes_from_pending_pods_with_an_assignment() -> None:
    from types import SimpleNamespace

    from hami_agent.scheduler.serve.app import SchedulerApp

    pending = [
        {"metadata": {"uid": "u1", "annotations": {keys.VGPU_NODE: "n1"}}},  # chosen, not bound yet
        {"metadata": {"uid": "u2", "annotations": {}}},  # never filtered
        {"metadata": {"uid": "u3", "annotations": {keys.VGPU_NODE: "n3"}}},
    ]
    busy = BusyNodes()
    fake = SimpleNamespace(sync=SimpleNamespace(pending_informer=SimpleNamespace(list=lambda: pending)),
                           extender=SimpleNamespace(busy=busy))
    SchedulerApp._busy_from_pending(fake)  # type: ignore[arg-type]
    assert busy.nodes() == {"n1", "n3"}
    busy.settle("u1")  # its /bind, on this leader, ends the claim as any other
    assert busy.nodes() == {"n3"}

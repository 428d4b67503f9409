"""Usage cache: incremental usage, init-container collapsing, and the fit memo giving exactly the
decisions of a full re-evaluation."""

from __future__ import annotations

import random

import pytest

from hami_agent.scheduler.core.fit import PodContext, fit_node, node_score
from hami_agent.scheduler.core.model import DeviceAmount, Picked, PodUsage
from hami_agent.scheduler.state.cache import UsageCache, collapse
from tests.unit.scheduler.helpers import dev, preq, req

pytestmark = pytest.mark.unit


def pick(uuid, mem, cores=0):
    return Picked(uuid, "NVIDIA", mem, cores)


def test_collapse_init_and_app_containers():
    containers = [[pick("A", 5000, 50)], [pick("A", 3000, 60)], [pick("A", 1000, 10), pick("B", 2000)],
                  [pick("A", 1500, 20)]]
    out = collapse(containers, n_init=2)
    # A: max(init max 5000/60, app sum 2500/30); slots = 2 app occurrences
    assert out["A"] == DeviceAmount(slots=2, mem=5000, cores=60)
    assert out["B"] == DeviceAmount(slots=1, mem=2000, cores=0)
    assert collapse([[pick("C", 100)], []], n_init=1)["C"] == DeviceAmount(slots=1, mem=100, cores=0)


def test_pod_usage_applied_and_removed_incrementally():
    c = UsageCache()
    c.set_node("n1", [dev(0), dev(1)])
    c.add_pod(PodUsage("u1", "ns", "p1", "n1", {"GPU-0": DeviceAmount(1, 3000, 30)}))
    d0 = c.nodes["n1"].by_id["GPU-0"]
    assert (d0.used, d0.usedmem, d0.usedcores) == (1, 3000, 30)
    assert c.nodes["n1"].score == pytest.approx(node_score(c.nodes["n1"].devices))
    # the same UID again (informer echo): no double count
    c.add_pod(PodUsage("u1", "ns", "p1", "n1", {"GPU-0": DeviceAmount(1, 3000, 30)}))
    assert d0.usedmem == 3000
    assert c.namespace_usage("ns") == (3000, 30)
    c.remove_pod("u1")
    assert (d0.used, d0.usedmem, d0.usedcores) == (0, 0, 0)
    assert c.namespace_usage("ns") == (0, 0)


def test_pod_churn_leaves_no_entry_per_node_or_namespace_behind():
    # autoscaled nodes and per-run namespaces come and go: the indexes keep only what holds pods
    c = UsageCache()
    for i in range(50):
        c.set_node(f"n{i}", [dev(0)])
        c.add_pod(PodUsage(f"u{i}", f"ci-run-{i}", "p", f"n{i}", {"GPU-0": DeviceAmount(1, 1000, 10)}))
        c.remove_pod(f"u{i}")
        c.remove_node(f"n{i}")
    c.add_pod(PodUsage("kept", "prod", "p", "n0", {"GPU-0": DeviceAmount(1, 1000, 10)}))
    assert c._pods_by_node == {"n0": {"kept"}}
    assert c._ns_usage == {"prod": [1000, 10]}
    assert c.namespace_usage("ci-run-3") == (0, 0)


def test_pod_before_node_and_node_reregistration_keep_usage():
    c = UsageCache()
    c.add_pod(PodUsage("u1", "ns", "p1", "n1", {"GPU-0": DeviceAmount(1, 1000, 0)}))
    c.set_node("n1", [dev(0)])
    assert c.nodes["n1"].by_id["GPU-0"].usedmem == 1000
    c.set_node("n1", [dev(0), dev(1)])  # plugin re-registers: usage re-applied to fresh devices
    assert c.nodes["n1"].by_id["GPU-0"].usedmem == 1000


def test_unknown_uuid_is_ignored_and_counted():
    c = UsageCache()
    c.set_node("n1", [dev(0)])
    c.add_pod(PodUsage("u1", "ns", "p1", "n1", {"GPU-gone": DeviceAmount(1, 1000, 0)}))
    assert c.unknown_uuid_warnings == 1
    assert c.nodes["n1"].by_id["GPU-0"].used == 0


def test_binpack_picks_most_loaded_node_spread_least():
    c = UsageCache()
    for n in ("a", "b", "c"):
        c.set_node(n, [dev(0, uuid=f"{n}-0")])
    c.add_pod(PodUsage("u1", "ns", "p1", "b", {"b-0": DeviceAmount(1, 4000, 0)}))
    r = preq(req(mem=1000))
    assert c.decide(["a", "b", "c"], r, PodContext(node_policy="binpack")).node == "b"
    assert c.decide(["a", "b", "c"], r, PodContext(node_policy="spread")).node in ("a", "c")
    assert c.decide(["a", "c"], r, PodContext(node_policy="binpack")).node in ("a", "c")


def test_no_fit_reports_every_node():
    c = UsageCache()
    c.set_node("a", [dev(0, mem=1000)])
    dec = c.decide(["a", "ghost"], preq(req(mem=2000)), PodContext())
    assert dec.node is None
    assert dec.failed == {"a": "1/1 CardInsufficientMemory", "ghost": "node unregistered"}


@pytest.mark.parametrize("seed", range(6))
def test_memo_matches_full_evaluation(seed):
    """Random placements/removals/re-registrations: the memoised decision always equals a fresh fit
    of every node (same fitting set, and the chosen node is a best-ranked fitting node)."""
    rng = random.Random(seed)
    c = UsageCache(memo_shapes=4)
    names = [f"n{i}" for i in range(12)]
    for n in names:
        c.set_node(n, [dev(g, uuid=f"{n}-{g}", mem=8000, count=3, numa=g % 2) for g in range(2)])
    shapes = [preq(req(mem=2000)), preq(req(nums=2, mem=1000, cores=20)), preq(req(mem=1000, cores=100)),
              preq(req(pct=50)), preq(req(mem=3000), req(mem=1000)),
              preq(req(mem=500), req(mem=7000), n_init=1)]
    ctxs = [PodContext(), PodContext(node_policy="spread"), PodContext(gpu_policy=("binpack",)),
            PodContext(numa_bind=True)]
    live: list[str] = []
    for step in range(250):
        op = rng.random()
        if op < 0.15 and live:
            c.remove_pod(live.pop(rng.randrange(len(live))))
            continue
        if op < 0.18:
            n = rng.choice(names)
            c.set_node(n, [dev(g, uuid=f"{n}-{g}", mem=8000, count=3, numa=g % 2) for g in range(2)])
            continue
        r, ctx = rng.choice(shapes), rng.choice(ctxs)
        subset = rng.sample(names, rng.randint(1, len(names)))
        dec = c.decide(subset, r, ctx, event_nodes=100)
        truth = {n: fit_node(c.nodes[n].devices, r, ctx, c.nodes[n].extras) for n in subset}
        ok = {n for n, t in truth.items() if t.ok}
        if not ok:
            assert dec.node is None
            assert dec.failed == {n: t.reason for n, t in truth.items()}
            continue
        assert dec.node in ok and set(dec.fit_nodes) == ok and dec.n_fit == len(ok)
        scores = [c.nodes[n].score for n in ok]
        want = min(scores) if ctx.node_policy == "spread" else max(scores)
        assert c.nodes[dec.node].score == pytest.approx(want)
        assert dec.fit.containers == truth[dec.node].containers
        uid = f"u{step}"
        c.add_pod(PodUsage(uid, "ns", uid, dec.node, collapse(dec.fit.containers, r.n_init)))
        live.append(uid)
    for n in names:  # no device ever over-committed
        for d in c.nodes[n].devices:
            assert d.usedmem <= d.totalmem and d.usedcores <= d.totalcore and d.used <= d.count

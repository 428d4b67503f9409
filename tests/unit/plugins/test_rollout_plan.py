"""The roll planner (plugins/module_utils/_rollout.py): batches bounded by serial, GPUs out of service,
failure domains and PodDisruptionBudget headroom; resume nodes first; nodes that fit nowhere deferred with
the reason; bounds read from the playbook's variables with errors that name the variable and the fix."""

from __future__ import annotations

import itertools
import random

import pytest
from ansible_collections.hami.node.plugins.module_utils import _rollout as r

pytestmark = pytest.mark.unit


def fleet(nodes, allowed=None, extra=()):
    return r.Fleet(list(nodes) + list(extra), allowed or {})


def gpu_nodes(n, gpus=8, domain=None, **kw):
    return [r.Node("n%02d" % i, gpus=gpus, domain=domain(i) if callable(domain) else domain, **kw)
            for i in range(n)]


def test_serial_alone_gives_batches_in_order() -> None:
    nodes = gpu_nodes(5)
    plan = r.plan(nodes, r.Bounds(serial=2), fleet(nodes))
    assert plan.batches == [["n00", "n01"], ["n02", "n03"], ["n04"]]
    assert plan.deferred == {}


def test_canary_is_a_first_batch_of_one() -> None:
    nodes = gpu_nodes(5)
    plan = r.plan(nodes, r.Bounds(serial=3, canary=True), fleet(nodes))
    assert plan.sizes == [1, 3, 1]


def test_resume_nodes_go_first_and_only_serial_holds_them() -> None:
    nodes = gpu_nodes(4)
    nodes[3].resume = nodes[3].out = True  # parked by an earlier run: still cordoned
    # 8 GPUs may be out: n03's are out already, so no other node fits beside it; it still goes first
    plan = r.plan(nodes, r.Bounds(serial=2, max_unavailable=8), fleet(nodes))
    assert plan.batches[0][0] == "n03"
    assert plan.batches == [["n03"], ["n00"], ["n01"], ["n02"]]


def test_gpus_out_of_service_count_nodes_already_out() -> None:
    roll = gpu_nodes(4)
    down = r.Node("other", gpus=8, out=True)  # an operator's cordon elsewhere in the fleet
    # 40 GPUs in the fleet; at most 16 out: 8 are out already, so one roll node at a time
    plan = r.plan(roll, r.Bounds(serial=4, max_unavailable=16), fleet(roll, extra=[down]))
    assert plan.sizes == [1, 1, 1, 1]
    assert all(note["gpus_out"] <= 16 for note in plan.notes)


def test_a_roll_node_already_out_costs_nothing_more() -> None:
    roll = gpu_nodes(3)
    roll[1].out = True  # an operator cordoned it: its GPUs are out either way
    plan = r.plan(roll, r.Bounds(serial=3, max_unavailable=16), fleet(roll))
    assert plan.batches == [["n00", "n01"], ["n02"]]


def test_failure_domains_at_most_n_per_domain_counting_nodes_already_out() -> None:
    roll = gpu_nodes(6, domain=lambda i: "rack-%d" % (i % 2))  # n00,n02,n04 rack-0; n01,n03,n05 rack-1
    down = r.Node("x", gpus=8, domain="rack-1", out=True)
    plan = r.plan(roll, r.Bounds(serial=10, max_per_domain=1), fleet(roll, extra=[down]))
    # rack-1 already has x out: none of its nodes may go; rack-0 one at a time
    assert plan.batches == [["n00"], ["n02"], ["n04"]]
    assert set(plan.deferred) == {"n01", "n03", "n05"}
    assert "failure domain rack-1" in plan.deferred["n01"] and "x" in plan.deferred["n01"]


def test_a_budget_allows_as_many_nodes_with_its_pods_as_disruptions() -> None:
    roll = gpu_nodes(4)
    for n in roll[:3]:
        n.budgets = {"ml/trainer": 2}  # two trainer pods on each of n00..n02
    plan = r.plan(roll, r.Bounds(serial=4), fleet(roll, allowed={"ml/trainer": 1}))
    # one node with trainers per batch; n03 (no trainers) joins the first
    assert plan.batches == [["n00", "n03"], ["n01"], ["n02"]]


def test_a_budget_at_zero_defers_its_nodes_with_the_reason() -> None:
    roll = gpu_nodes(3)
    roll[0].budgets = {"ml/db": 1}
    plan = r.plan(roll, r.Bounds(serial=3), fleet(roll, allowed={"ml/db": 0}))
    assert plan.batches == [["n01", "n02"]]
    assert plan.deferred == {"n00": "PodDisruptionBudget ml/db allows 0 disruption(s) now"}


def test_admit_takes_the_members_that_fit_now() -> None:
    members = gpu_nodes(3)
    members[0].budgets = {"ml/a": 1}
    members[1].budgets = {"ml/a": 1}
    go, wait = r.admit(members, r.Bounds(serial=3), fleet(members, allowed={"ml/a": 1}))
    assert go == ["n00", "n02"]
    assert list(wait) == ["n01"] and "ml/a" in wait["n01"]


def test_a_node_bigger_than_the_gpu_bound_is_an_error_naming_the_fix() -> None:
    nodes = gpu_nodes(2, gpus=8)
    with pytest.raises(r.BoundError, match="max_unavailable allows 4 GPU.*n00 alone has 8.*at least 8"):
        r.plan(nodes, r.Bounds(serial=1, max_unavailable=4), fleet(nodes))


@pytest.mark.parametrize(("value", "total", "want"), [
    (None, 100, None), ("", 100, None), (0, 100, None), ("0", 100, None),
    (4, 100, 4), ("4", 100, 4), ("10%", 1000, 100), ("10%", 7, 0), ("12.5%", 80, 10),
])
def test_resolve_counts_and_percentages(value, total, want) -> None:
    assert r.resolve(value, total, "x") == want


@pytest.mark.parametrize("value", ["ten", "-1", "150%", "0.5"])
def test_resolve_names_the_variable(value) -> None:
    with pytest.raises(r.BoundError, match="site_rollout_max_unavailable=.*count or a percentage"):
        r.resolve(value, 100, "site_rollout_max_unavailable")


def test_bounds_read_percentages_of_the_roll_and_of_the_fleet() -> None:
    nodes = gpu_nodes(20)
    b = r.Bounds.read("10%", "25%", "2", False, 20, fleet(nodes))
    assert (b.serial, b.max_unavailable, b.max_per_domain) == (2, 40, 2)
    with pytest.raises(r.BoundError, match="site_rollout_max_per_domain"):
        r.Bounds.read(1, None, "10%", False, 20, fleet(nodes))


def _violations(plan, nodes, bounds, fl):
    """Every batch checked against every bound from scratch (independent of why_not)."""
    by = {n.name: n for n in nodes}
    bad = []
    done: set[str] = set()  # rolled in an earlier batch: back in service unless an operator's cordon stays

    def out_now(n):
        return n.keeps_out if n.name in done else n.out

    for batch in plan.batches:
        names = set(batch)
        if len(batch) > bounds.serial:
            bad.append(("serial", batch))
        out = sum(n.gpus for n in fl.nodes.values() if out_now(n) or n.name in names)
        added = any(not out_now(by[b]) and not by[b].resume for b in batch)
        if bounds.max_unavailable is not None and added and out > bounds.max_unavailable:
            bad.append(("gpus", batch, out))
        for dom in {by[b].domain for b in batch if by[b].domain and not out_now(by[b]) and not by[b].resume}:
            count = sum(1 for n in fl.nodes.values() if n.domain == dom and (out_now(n) or n.name in names))
            if bounds.max_per_domain is not None and count > bounds.max_per_domain:
                bad.append(("domain", batch, dom))
        for key, allowed in fl.allowed.items():
            holders = sum(1 for b in batch if by[b].budgets.get(key, 0) > 0 and not by[b].resume)
            if holders > max(allowed, 0) and holders:
                bad.append(("budget", batch, key))
        done |= names
    return bad


def test_random_fleets_never_break_a_bound_and_place_every_node_once() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 40)
        nodes = [r.Node("n%02d" % i, gpus=rng.choice([4, 8]), domain=rng.choice([None, "a", "b", "c"]),
                        out=rng.random() < 0.1) for i in range(n)]
        for node in nodes:
            node.resume = node.out and rng.random() < 0.5
            node.keeps_out = node.out and not node.resume and rng.random() < 0.5
            for key in ("ml/a", "ml/b"):
                if rng.random() < 0.3:
                    node.budgets[key] = rng.randint(1, 3)
        extra = [r.Node("x%d" % i, gpus=8, domain=rng.choice(["a", "b"]), out=rng.random() < 0.3)
                 for i in range(3)]
        allowed = {"ml/a": rng.randint(0, 3), "ml/b": rng.randint(0, 2)}
        fl = fleet(nodes, allowed, extra)
        bounds = r.Bounds(serial=rng.randint(1, 10), max_unavailable=rng.choice([None, 16, 24, 64]),
                          max_per_domain=rng.choice([None, 1, 2]), canary=rng.random() < 0.3)
        plan = r.plan(nodes, bounds, fl)
        placed = list(itertools.chain.from_iterable(plan.batches))
        assert len(placed) == len(set(placed))
        assert sorted(placed + list(plan.deferred)) == sorted(x.name for x in nodes)
        assert _violations(plan, nodes, bounds, fl) == []
        if bounds.canary and plan.batches:
            assert len(plan.batches[0]) == 1


def test_cluster_reading_helpers() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}],
                        "capacity": {"nvidia.com/gpu": "8"}}}
    assert not r.node_out(ready) and r.node_gpus(ready, "nvidia.com/gpu") == 8
    assert r.node_out({"spec": {"unschedulable": True}, **ready})
    assert r.node_out({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    pod = {"metadata": {"namespace": "ml", "labels": {"app": "t", "tier": "x"}}}
    pdbs = [
        {"metadata": {"namespace": "ml", "name": "a"}, "spec": {"selector": {"matchLabels": {"app": "t"}}},
         "status": {"disruptionsAllowed": 2}},
        {"metadata": {"namespace": "ml", "name": "b"},
         "spec": {"selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["y"]}]}}},
        {"metadata": {"namespace": "other", "name": "c"}, "spec": {"selector": {}}},
        {"metadata": {"namespace": "ml", "name": "all"}, "spec": {"selector": {}}},
    ]
    assert r.budgets_of(pod, pdbs) == ["ml/a", "ml/all"]
    assert r.allowed_disruptions(pdbs) == {"ml/a": 2, "ml/b": 0, "other/c": 0, "ml/all": 0}

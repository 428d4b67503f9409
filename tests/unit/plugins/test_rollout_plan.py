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
        plan = r.plan(nodes, bounds, fl, order=rng.choice(r.ORDERS), leave_last=rng.choice([0, 0, 1, 2]))
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


# -- the order batches fill in, pods counted per budget, the reserve, leave_last, admit_soon ---------------

def test_spread_takes_the_most_pressed_domain_first_and_needs_fewer_batches() -> None:
    # one node per domain out at once, two nodes' GPUs at once: rack a (3 nodes) needs 3 batches whatever
    # happens, so its nodes must go in every batch; in inventory order b and c take the first batch
    roll = [r.Node("b0", 8, "b"), r.Node("c0", 8, "c"), r.Node("a0", 8, "a"), r.Node("a1", 8, "a"),
            r.Node("a2", 8, "a")]
    bounds = r.Bounds(serial=5, max_unavailable=16, max_per_domain=1)
    inventory = r.plan(roll, bounds, fleet(roll), order="inventory")
    assert inventory.batches == [["b0", "c0"], ["a0"], ["a1"], ["a2"]]
    assert r.plan(roll, bounds, fleet(roll)).batches == [["a0", "b0"], ["a1", "c0"], ["a2"]]


def test_spread_keeps_the_canary_the_first_node_given() -> None:
    roll = [r.Node("b0", 8, "b"), r.Node("a0", 8, "a"), r.Node("a1", 8, "a"), r.Node("a2", 8, "a")]
    plan = r.plan(roll, r.Bounds(serial=4, max_per_domain=1, canary=True), fleet(roll))
    assert plan.batches[0] == ["b0"]
    assert plan.batches[1:] == [["a0"], ["a1"], ["a2"]]


def test_spread_prefers_among_equals_the_nodes_whose_budgets_the_last_batch_did_not_use_up() -> None:
    a = r.Node("a", 8, "d", budgets={"ml/job": 1})
    b = r.Node("b", 8, "d")
    bounds = r.Bounds(serial=4, max_per_domain=1)
    given = {"a": 0, "b": 1}
    fl = fleet([a, b], allowed={"ml/job": 1})
    assert [n.name for n in r.spread([a, b], bounds, fl, given)] == ["a", "b"]
    # ml/job's replacement is not Ready when the next batch starts: b (same domain, same pressure) first
    assert [n.name for n in r.spread([a, b], bounds, fl, given, used_up={"ml/job"})] == ["b", "a"]


def test_spread_is_deterministic_and_only_reorders() -> None:
    rng = random.Random(3)
    nodes = [r.Node("n%02d" % i, 8, rng.choice("abc"), budgets={"ml/x": 1} if rng.random() < 0.3 else {})
             for i in range(30)]
    bounds = r.Bounds(serial=6, max_unavailable=48, max_per_domain=2)
    fl = fleet(nodes, allowed={"ml/x": 2})
    one, two = r.plan(nodes, bounds, fl), r.plan(list(nodes), bounds, fl)
    assert one.batches == two.batches
    assert sorted(one.order) == sorted(n.name for n in nodes)


def test_an_unknown_order_names_the_choices() -> None:
    with pytest.raises(r.BoundError, match="site_rollout_order='random' is not one of spread, inventory"):
        r.plan(gpu_nodes(2), r.Bounds(), fleet(gpu_nodes(2)), order="random")


def test_a_budget_counts_the_batch_s_pods_not_its_nodes() -> None:
    roll = gpu_nodes(3)
    roll[0].budgets = {"serve/a": 2}
    roll[1].budgets = {"serve/a": 2}
    roll[2].budgets = {"serve/a": 1}
    plan = r.plan(roll, r.Bounds(serial=3), fleet(roll, allowed={"serve/a": 3}), order="inventory")
    # n00 and n01 together would evict 4 pods where 3 may go: n01's drain would wait on a replacement
    assert plan.batches == [["n00", "n02"], ["n01"]]
    assert "already hold 2 of its pods (this node 2)" in plan.notes[0]["held_back"]["n01"]


def test_a_node_with_more_pods_than_its_budget_allows_goes_without_other_holders() -> None:
    roll = gpu_nodes(3)
    roll[0].budgets = {"ml/t": 3}  # its drain evicts them one after another as the budget recovers
    roll[1].budgets = {"ml/t": 1}
    plan = r.plan(roll, r.Bounds(serial=3), fleet(roll, allowed={"ml/t": 2}), order="inventory")
    assert plan.batches == [["n00", "n02"], ["n01"]]
    go, wait = r.admit(roll, r.Bounds(serial=3), fleet(roll, allowed={"ml/t": 2}))
    assert go == ["n00", "n02"] and list(wait) == ["n01"]


def test_later_batches_leave_one_disruption_of_wide_budgets_for_pods_that_move() -> None:
    roll = gpu_nodes(8)
    for n in roll:
        n.budgets = {"serve/a": 1}
    plan = r.plan(roll, r.Bounds(serial=8), fleet(roll, allowed={"serve/a": 3, "ml/one": 1}),
                  order="inventory")
    # the first batch is admitted against the reading it was planned on: all 3; later ones plan 2
    assert plan.sizes == [3, 2, 2, 1]
    assert r.RESERVE == 1
    why = plan.notes[1]["held_back"]["n05"]
    assert "allows 3 disruption(s) now (2 planned: the rest is kept for pods that move" in why
    narrow = gpu_nodes(2)
    for n in narrow:
        n.budgets = {"ml/one": 1}
    # a budget allowing one disruption keeps it: its nodes still go one per batch
    assert r.plan(narrow, r.Bounds(serial=2), fleet(narrow, allowed={"ml/one": 1})).sizes == [1, 1]
    # admit decides against the budget as it is: no reserve
    go, _ = r.admit(roll[:4], r.Bounds(serial=8), fleet(roll, allowed={"serve/a": 3}))
    assert go == ["n00", "n01", "n02"]


def test_leave_last_defers_the_plan_s_last_batches_to_the_next_pass_never_all() -> None:
    roll = gpu_nodes(5)
    plan = r.plan(roll, r.Bounds(serial=2, canary=True), fleet(roll), leave_last=2)
    assert plan.batches == [["n00"]] and plan.sizes == [1]
    assert sorted(plan.deferred) == ["n01", "n02", "n03", "n04"]
    assert all(why == r.LEFT_LATER for why in plan.deferred.values())
    assert len(plan.notes) == 1
    one = r.plan(gpu_nodes(2), r.Bounds(serial=2), fleet(gpu_nodes(2)), leave_last=2)
    assert one.batches == [["n00", "n01"]] and one.deferred == {}  # a pass that rolls nothing hands on all
    for bad in (-1, True, "2"):
        with pytest.raises(r.BoundError, match="leave_last"):
            r.plan(roll, r.Bounds(), fleet(roll), leave_last=bad)


def test_admit_soon_names_the_members_that_replacements_on_their_way_would_let_go() -> None:
    members = gpu_nodes(3)
    members[0].budgets = {"ml/t": 1}
    members[1].budgets = {"ml/u": 1}
    bounds = r.Bounds(serial=3)
    # ml/t allows nothing now, its replacement is placed (not Ready); ml/u allows nothing, nothing comes
    fl = r.Fleet(members, {"ml/t": 0, "ml/u": 0}, recovering={"ml/t": 1})
    go, wait = r.admit(members, bounds, fl)
    assert go == ["n02"] and sorted(wait) == ["n00", "n01"]
    assert [n for n in r.admit_soon(members, bounds, fl)] == ["n00"]
    assert r.admit_soon(members, bounds, r.Fleet(members, {"ml/t": 0, "ml/u": 0})) == []
    # room for one node's GPUs: waiting would let n00 go instead of n01, not both: nothing to wait for
    tight = r.Bounds(serial=3, max_unavailable=8)
    assert r.admit_soon(members, tight, r.Fleet(members, {"ml/t": 0}, recovering={"ml/t": 1})) == []


def test_pod_recovering_is_placed_running_or_starting_and_not_ready() -> None:
    def pod(node="n1", phase="Running", ready="False", deleting=False):
        md = {"deletionTimestamp": "2026-11-27T00:00:00Z"} if deleting else {}
        return {"metadata": md, "spec": {"nodeName": node} if node else {},
                "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}}

    assert r.pod_recovering(pod())
    assert r.pod_recovering(pod(phase="Pending"))
    assert not r.pod_recovering(pod(ready="True"))
    assert not r.pod_recovering(pod(node=None))            # Pending without a node: may wait for room
    assert not r.pod_recovering(pod(deleting=True))
    assert not r.pod_recovering(pod(phase="Succeeded"))
    assert r.pod_recovering({"spec": {"nodeName": "n1"}, "status": {}})  # no conditions yet: starting

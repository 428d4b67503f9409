"""The chaos soak's schedule is a pure function of (seed, seconds, nodes): a failing seed replays the same
faults at the same offsets; lanes never overlap; every fault kind happens in a 60 s run."""

from __future__ import annotations

from collections import defaultdict

import pytest

from benchmarks.chaos.plan import KIND_NAMES, KINDS, make_plan, pod_object

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]
LANE = {k.name: k for k in KINDS}


def test_same_arguments_same_plan_byte_for_byte():
    a, b = make_plan(7, 600, 4), make_plan(7, 600, 4)
    assert a.to_json() == b.to_json() and a.digest == b.digest
    assert make_plan(8, 600, 4).digest != a.digest
    assert make_plan(7, 600, 3).digest != a.digest


@pytest.mark.parametrize("seed", range(1, 11))
def test_faults_stay_in_their_window_and_lanes_never_overlap(seed):
    plan = make_plan(seed, 300, 4)
    lanes: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in plan.faults:
        assert 0 <= f.at and f.end <= plan.seconds, f
        kind = LANE[f.kind]
        if kind.per_node:
            assert f.target in plan.nodes
        lanes[kind.lane.format(node=f.target)].append((f.at, f.end + kind.busy))
    for lane, spans in lanes.items():
        spans.sort()
        for (_a0, a1), (b0, _b1) in zip(spans, spans[1:], strict=False):
            assert b0 >= a1 - 1e-6, (lane, spans)


def test_seed_1_covers_every_kind_in_sixty_seconds():
    assert all(make_plan(1, 60, 4).counts()[k] >= 1 for k in KIND_NAMES)


def test_one_kind_does_not_move_another():
    """Each kind draws from its own stream: the API outages of seed 5 do not depend on the node count."""
    outages = [f for f in make_plan(5, 900, 4).faults if f.kind == "api_outage"]
    assert outages == [f for f in make_plan(5, 900, 6).faults if f.kind == "api_outage"]


def test_pods_are_unique_and_well_formed():
    plan = make_plan(3, 300, 4)
    names = [(p.namespace, p.name) for p in plan.pods]
    assert len(names) == len(set(names)) and len(names) > 100
    for p in plan.pods:
        assert p.delete_at is None or p.at < p.delete_at < plan.seconds
        obj = pod_object(p)
        ctrs = obj["spec"]["containers"] + obj["spec"].get("initContainers", [])
        assert all(c["resources"]["limits"]["nvidia.com/gpu"] in ("1", "2") for c in ctrs)
        assert obj["spec"]["schedulerName"] == "hami-scheduler"
    assert {p.shape for p in plan.pods} == {"shared", "whole", "multi", "init", "percent", "cores-only"}

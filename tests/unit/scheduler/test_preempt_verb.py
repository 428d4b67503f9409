"""Issue 29 item 3: the extender's ``/preempt`` (kube-scheduler's preemptVerb, reached only where a framework
resource is short too). A preemptor whose own GPU preemption is under way gets a veto (no candidate); else
each node keeps kube-scheduler's victims plus the fewest GPU victims HAMi's fit needs, and a node where GPU
victims cannot make room is dropped; with ``--preemption off`` the candidates come back unchanged. The
body's shape is checked before anything is decided."""

from __future__ import annotations

import json

import pytest

from hami_agent.httpserve import HTTPError
from hami_agent.protocol.devices import MigPlacement
from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.serve.shapes import preemption_args
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.holds import Hold, Holds
from hami_agent.scheduler.verbs import preemption as P
from tests.unit.scheduler.helpers import dev, preq, req

pytestmark = pytest.mark.unit

REC = {"priority": 100, "preemption_policy": "PreemptLowerPriority"}


def bound(uid: str, node: str, prio: int, mem: int, gpu: int = 0) -> PodUsage:
    return PodUsage(uid=uid, namespace="ns", name=uid, node=node, priority=prio, bound=True,
                    devices={f"GPU-{gpu}": DeviceAmount(slots=1, mem=mem)})


def setup() -> P.Preemption:
    cache = UsageCache()
    for n in ("n1", "n2"):
        cache.set_node(n, [dev(0, mem=16000)])
    cache.add_pod(bound("gpu-low", "n1", 0, 12000))  # must go for 8 GB on n1
    cache.add_pod(bound("gpu-high", "n2", 500, 12000))  # above the preemptor: n2 cannot be helped
    return P.Preemption(cache, Holds(), rclient=None, wclient=None, gate=None, writer=None, events=None,
                        metrics=None, scheduler_name="hami-scheduler")


def test_gpu_victims_are_added_and_a_hopeless_node_dropped():
    prem = setup()
    cands = {"n1": (["cpu-pod"], 0), "n2": (["cpu-pod-2"], 1), "no-gpus": (["x"], 0)}
    out = P.refine(prem, "uid-pre", preq(req(mem=8000)), PodContext(), REC, cands)
    assert out == {"n1": (["cpu-pod", "gpu-low"], 0)}
    # kube-scheduler's victims already free the GPU: nothing added
    out = P.refine(prem, "uid-pre", preq(req(mem=8000)), PodContext(), REC, {"n1": (["gpu-low"], 0)})
    assert out == {"n1": (["gpu-low"], 0)}


def test_a_preemptor_with_a_hold_gets_a_veto():
    prem = setup()
    prem.holds.put(Hold(bound("uid-pre", "n1", 100, 8000), ("gpu-low",), 1e12))
    assert P.refine(prem, "uid-pre", preq(req(mem=8000)), PodContext(), REC, {"n1": (["cpu-pod"], 0)}) == {}


def test_wire_format_both_forms_and_off_mode():
    args = {"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}},
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "a"}, {"UID": "b"}], "NumPDBViolations": 1}}}
    assert P.parse_candidates(preemption_args(args)) == {"n1": (["a", "b"], 1)}
    whole = {"Pod": args["Pod"], "NodeNameToVictims": {"n2": {"Pods": [{"metadata": {"uid": "c"}}]}}}
    assert P.parse_candidates(preemption_args(whole)) == {"n2": (["c"], 0)}

    class Off:
        preemption = None

    assert P.preempt_verb(Off(), args) == {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "a"}, {"UID": "b"}], "NumPDBViolations": 1}}}


@pytest.mark.parametrize(("body", "field"), [
    ({"NodeNameToMetaVictims": {}}, "ExtenderPreemptionArgs.Pod: missing"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": "x"}}, "ExtenderPreemptionArgs.NodeNameToMetaVictims['n']"),
    ({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": "x"}}}, "NodeNameToMetaVictims['n'].Pods"),
    ({"Pod": {}, "NodeNameToVictims": {"n": {"NumPDBViolations": "1"}}},
     "NodeNameToVictims['n'].NumPDBViolations"),
])
def test_bad_bodies_are_refused_naming_the_field(body, field):
    with pytest.raises(HTTPError) as err:
        preemption_args(body)
    assert err.value.status == 400 and field in str(err.value)


class RecordingClient:
    """The API calls acting makes, recorded; the victim's GET answers a running pod."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def get_pod(self, ns, name):
        return {"metadata": {"namespace": ns, "name": name, "uid": name}, "status": {"conditions": []}}

    def patch_pod_metadata(self, ns, name, annotations=None, labels=None, resource_version=None, decode=True):
        self.calls.append(("annotations", name, tuple(annotations)))

    def patch_pod_status(self, ns, name, status):
        self.calls.append(("status", name, tuple(sorted(status.items()))[0]))

    def delete(self, kind, name, ns, uid=None):
        self.calls.append(("delete", name, uid))


def test_a_higher_priority_preemption_clears_a_lower_ones_hold_and_nomination():
    from hami_agent.scheduler.verbs.leadership import LeaderGate

    class Inline:
        def submit(self, _fn):
            return None  # "the pool is full": acting runs inline

    cache = UsageCache()
    cache.set_node("n1", [dev(0, mem=16000)])
    cache.add_pod(bound("v1", "n1", 0, 12000))
    api = RecordingClient()
    prem = P.Preemption(cache, Holds(), rclient=api, wclient=api, gate=LeaderGate(), writer=Inline(),
                        events=None, metrics=None, scheduler_name="hami-scheduler")

    def pod(name: str) -> dict:
        return {"metadata": {"namespace": "ns", "name": name, "uid": name}}

    low = {"priority": 100, "preemption_policy": "PreemptLowerPriority"}
    out = prem.refused(pod("a"), "a", ["n1"], preq(req(mem=8000)), PodContext(), low, {"n1": "x"})
    assert out == {"n1": "waiting for 1 preempted pod(s) on GPU-0 to terminate"}
    assert ("delete", "v1", "v1") in api.calls and prem.holds.get("a") is not None
    high = {"priority": 500, "preemption_policy": "PreemptLowerPriority"}
    prem.refused(pod("b"), "b", ["n1"], preq(req(mem=8000)), PodContext(), high, {"n1": "x"})
    assert prem.holds.get("a") is None and prem.holds.get("b") is not None
    assert ("status", "a", ("nominatedNodeName", None)) in api.calls
    assert ("status", "b", ("nominatedNodeName", "n1")) in api.calls
    # while b's victim terminates, b's next /filter waits; a call without the held node adds nothing
    assert prem.refused(pod("b"), "b", ["n1"], preq(req(mem=8000)), PodContext(), high, {}) == {
        "n1": "waiting for 1 preempted pod(s) on GPU-0 to terminate"}
    assert prem.refused(pod("b"), "b", ["n2"], preq(req(mem=8000)), PodContext(), high, {}) == {}


def test_a_new_leader_rebuilds_the_holds_from_the_annotations():
    """Failover: the hold's annotation carries what a new leader needs to hold the same capacity; an expired
    or malformed one is skipped."""
    holds = Holds(clock=lambda: 50.0)
    hold = Hold(bound("uid-a", "n1", 100, 8000), ("v1", "v2"), 1000.0 + 90)  # 90 s left at mono 1000
    value = P.hold_annotation(hold, now_wall=1_800_000_000.0, now_mono=1000.0)

    def pending(uid: str, raw: str) -> dict:
        return {"metadata": {"uid": uid, "namespace": "ns", "name": uid,
                             "annotations": {"hami.io/preemption-hold": raw}},
                "spec": {"priority": 100}}

    pods = [pending("uid-a", value), pending("uid-bad", "{not json"), pending("uid-old", value)]
    # 30 s later on another replica's clocks: uid-a and uid-old (same annotation) come back with 60 s left
    assert P.rebuild_holds(holds, pods, now_wall=1_800_000_030.0, now_mono=50.0) == 2
    back = holds.get("uid-a")
    assert back.node == "n1" and back.victims == ("v1", "v2") and back.priority == 100
    assert back.usage.devices == hold.usage.devices and back.deadline == pytest.approx(50.0 + 60)
    assert P.rebuild_holds(Holds(), pods, now_wall=1_800_000_100.0, now_mono=0.0) == 0  # past the deadline


def _pending(uid: str, raw: str) -> dict:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": uid,
                         "annotations": {"hami.io/preemption-hold": raw}},
            "spec": {"priority": 100}}


def test_a_rebuilt_hold_keeps_its_mig_parts():
    """Static MIG counts (``nvidia.com/mig-<profile>``) and dynamic MIG placements travel in the annotation
    and come back: without them a rebuilt dynamic-MIG hold would count a MIG GPU without a reservation,
    which HAMi's usage rules take for a fault (the whole GPU unhealthy), and a static one would free its
    MIG instances to lower-priority pods."""
    usage = PodUsage(uid="uid-m", namespace="ns", name="uid-m", node="n1", priority=100,
                     devices={"GPU-0": DeviceAmount(slots=1, mem=10240)},
                     mig=(("1g.10gb", 2), ("2g.20gb", 1)),
                     mig_alloc={"GPU-0": (MigPlacement(0, 1), MigPlacement(4, 2))})
    hold = Hold(usage, ("v1",), 1000.0 + 90)
    raw = P.hold_annotation(hold, now_wall=1_800_000_000.0, now_mono=1000.0)
    parsed = json.loads(raw)
    assert parsed["mig"] == [["1g.10gb", 2], ["2g.20gb", 1]]
    assert parsed["migPlacements"] == {"GPU-0": [[0, 1], [4, 2]]}
    holds = Holds(clock=lambda: 50.0)
    assert P.rebuild_holds(holds, [_pending("uid-m", raw)], now_wall=1_800_000_030.0, now_mono=50.0) == 1
    back = holds.get("uid-m").usage
    assert back.same_usage(usage)  # node, devices, static counts, placements
    assert (back.mig, back.mig_alloc) == (usage.mig, usage.mig_alloc)


def test_an_annotation_without_mig_parts_still_parses():
    """Backward compatible: a hold written before the MIG parts existed (and a hold without MIG now, which
    writes neither key) comes back with none."""
    old = json.dumps({"node": "n1", "devices": ["GPU-0"], "usage": {"GPU-0": [1, 8000, 0]},
                      "victims": ["v1"], "priority": 100, "deadline": "2027-01-15T08:01:30Z"})
    holds = Holds(clock=lambda: 0.0)
    assert P.rebuild_holds(holds, [_pending("uid-o", old)], now_wall=1_800_000_000.0, now_mono=0.0) == 1
    back = holds.get("uid-o").usage
    assert back.devices == {"GPU-0": DeviceAmount(1, 8000, 0)} and back.mig == () and back.mig_alloc == {}
    plain = P.hold_annotation(Hold(bound("uid-p", "n1", 100, 8000), ("v1",), 90.0), 1_800_000_000.0, 0.0)
    assert "mig" not in json.loads(plain) and "migPlacements" not in json.loads(plain)
    # malformed MIG parts: the hold is skipped, as any malformed annotation
    bad = json.dumps({**json.loads(old), "mig": [["1g.10gb"]]})
    assert P.rebuild_holds(Holds(), [_pending("uid-b", bad)], now_wall=1_800_000_000.0, now_mono=0.0) == 0

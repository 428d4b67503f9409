"""Issue 29 item 3, step 4: holds (``scheduler/state/holds.py``). A hold counts as used for every other pod
of lower or equal priority, never for its owner or a higher-priority pod; the victims still count while they
terminate, so no sample of the node is ever over-committed; holds end at their deadline, when a
higher-priority hold on the node replaces them, or when the owner's own decision is reserved; held nodes are
fitted outside the memo and the best node by policy wins."""

from __future__ import annotations

import pytest

from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.state import holds as H
from hami_agent.scheduler.state.cache import UsageCache
from tests.unit.scheduler.helpers import dev, preq, req

pytestmark = pytest.mark.unit

CTX = PodContext()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def usage(uid: str, node: str, prio: int, mem: int, gpu: int = 0, grace: int = 30) -> PodUsage:
    return PodUsage(uid=uid, namespace="ns", name=uid, node=node, priority=prio, grace_s=grace,
                    devices={f"GPU-{gpu}": DeviceAmount(slots=1, mem=mem)})


def hold(owner: str, node: str, prio: int, mem: int, deadline: float, victims=("v",)) -> H.Hold:
    return H.Hold(usage(owner, node, prio, mem), tuple(victims), deadline)


def cache_with(*nodes: str, gpus: int = 1) -> UsageCache:
    c = UsageCache()
    for n in nodes:
        c.set_node(n, [dev(i, mem=16000) for i in range(gpus)])
    return c


def test_a_hold_counts_for_lower_or_equal_priority_never_for_its_owner_or_higher():
    clock = Clock()
    holds = H.Holds(clock)
    holds.put(hold("high", "n1", 100, 8000, deadline=clock.t + 10))
    assert set(holds.against("other", 100)) == {"n1"} and set(holds.against("other", 5)) == {"n1"}
    assert holds.against("high", 100) == {} and holds.against("higher", 101) == {}
    clock.t += 11  # past the deadline: nothing counts, and expire() drops it
    assert holds.against("other", 5) == {} and holds.get("high") is None
    assert [h.owner for h in holds.expire()] == ["high"] and len(holds) == 0


def test_deadline_is_the_last_victims_grace_plus_slack():
    assert H.deadline_for([usage("a", "n", 0, 1, grace=5), usage("b", "n", 0, 1, grace=40)], 100.0) == (
        100.0 + 40 + H.SLACK_S)


def test_the_wait_runs_from_the_hold_to_the_binding_on_the_held_node_only():
    """``hami_scheduler_preemption_wait_seconds``'s sample: kept from the reservation on the held node to the
    binding there; none for another node, for a rebuilt hold (start unknown), or for an owner never bound
    there once ``WAIT_TTL_S`` has passed."""
    clock = Clock()
    holds = H.Holds(clock)
    since = clock.t
    holds.put(H.Hold(usage("p", "n1", 100, 8000), ("v",), clock.t + 60, since=since))
    clock.t += 7
    holds.reserved("p", "n1")
    assert holds.get("p") is None  # the reservation ends the hold
    clock.t += 2
    assert holds.waited("p", "n2") is None  # bound elsewhere: no sample
    holds.put(H.Hold(usage("p", "n1", 100, 8000), ("v",), clock.t + 60, since=since))
    holds.reserved("p", "n1")
    assert holds.waited("p", "n1") == 9.0 and holds.waited("p", "n1") is None  # once
    holds.put(H.Hold(usage("q", "n1", 100, 8000), ("v",), clock.t + 60, since=clock.t))
    holds.reserved("q", "n2")  # decided on another node
    holds.put(hold("r", "n1", 100, 8000, deadline=clock.t + 60))  # rebuilt: since None
    holds.reserved("r", "n1")
    assert [holds.waited(o, "n1") for o in ("q", "r")] == [None, None]
    holds.put(H.Hold(usage("s", "n1", 100, 8000), ("v",), clock.t + 60, since=clock.t))
    holds.reserved("s", "n1")  # then deleted before its binding: its entry goes by age
    clock.t += H.WAIT_TTL_S + 1
    holds.reserved("t", "n1")  # (any reservation prunes)
    assert holds.waited("s", "n1") is None


def test_a_higher_priority_hold_clears_lower_ones_on_its_node_only():
    holds = H.Holds(Clock())
    holds.put(hold("low", "n1", 10, 4000, 1e9))
    holds.put(hold("elsewhere", "n2", 10, 4000, 1e9))
    cleared = holds.put(hold("high", "n1", 100, 4000, 1e9))
    assert [h.owner for h in cleared] == ["low"]
    assert {h.owner for h in holds.all()} == {"high", "elsewhere"}
    assert holds.release("high").owner == "high" and holds.release("high") is None


def test_no_over_commit_while_victims_terminate_and_after():
    """16 GB GPU: a victim of 12 GB terminates for the preemptor's 8 GB. At every sample (victim still
    there; victim gone) a rival of equal priority asking 10 GB (which the freed GPU alone could take) fits
    nowhere, the owner fits only once the victim is gone, and the memory counted (the cache's, the holds')
    never exceeds the GPU once the terminating victim is set aside."""
    cache = cache_with("n1")
    victim = usage("victim", "n1", 0, 12000)
    victim.terminating = True
    cache.add_pod(victim)
    holds = H.Holds(Clock())
    holds.put(H.Hold(usage("owner", "n1", 100, 8000), ("victim",), 1e9))
    for victim_there in (True, False):
        if not victim_there:
            cache.remove_pod("victim")
        with cache.lock:
            rival = H.decide(cache, ["n1"], holds.against("rival", 100), preq(req(mem=10000)), CTX, None)
            mine = H.decide(cache, ["n1"], holds.against("owner", 100), preq(req(mem=8000)), CTX, None)
        assert rival.node is None and "CardInsufficientMemory" in rival.failed["n1"]
        assert (mine.node == "n1") is not victim_there
        d = cache.nodes["n1"].devices[0]
        held = sum(u.devices["GPU-0"].mem for us in holds.against("rival", 100).values() for u in us)
        going = sum(p.devices["GPU-0"].mem for p in cache.pods.values() if p.terminating)
        assert d.usedmem - going + held <= d.totalmem
    # a smaller pod still fits beside the hold, and a higher-priority pod is not held back (kube-scheduler's
    # rule for nominated pods)
    with cache.lock:
        small = H.decide(cache, ["n1"], holds.against("small", 0), preq(req(mem=8000)), CTX, None)
        vip = H.decide(cache, ["n1"], holds.against("vip", 1000), preq(req(mem=10000)), CTX, None)
    assert small.node == vip.node == "n1"


def test_held_and_free_nodes_compete_by_policy():
    cache = cache_with("a", "b")
    cache.add_pod(usage("x", "b", 0, 2000))  # b is fuller: binpack prefers it
    holds = H.Holds(Clock())
    holds.put(H.Hold(usage("owner", "b", 100, 2000), ("v",), 1e9))
    rq = preq(req(mem=4000))
    with cache.lock:
        dec = H.decide(cache, ["a", "b"], holds.against("p", 0), rq, CTX, None)
    assert dec.node == "b" and dec.fit.ok  # the held node still fits, and is fuller (x + the hold)
    with cache.lock:
        spread = H.decide(cache, ["a", "b"], holds.against("p", 0), rq, PodContext(node_policy="spread"),
                          None)
    assert spread.node == "a"
    holds.put(H.Hold(usage("owner", "b", 100, 12000), ("v",), 1e9))  # now b is full for p
    with cache.lock:
        assert H.decide(cache, ["a", "b"], holds.against("p", 0), rq, CTX, None).node == "a"
        refused = H.decide(cache, ["b", "gone"], holds.against("p", 0), rq, CTX, None)
    assert refused.node is None and "CardInsufficientMemory" in refused.failed["b"]
    assert set(refused.failed) == {"b", "gone"}


def test_filter_keeps_the_hold_from_others_and_releases_it_at_the_owners_decision():
    from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
    from tests.unit.scheduler.helpers import FakePodClient, gpu_pod

    cache = cache_with("n1")
    client = FakePodClient()
    ext = Extender(cache, SchedulerConfig(write_behind=False), client)
    ext.synced.set()
    try:
        ext.holds.put(H.Hold(usage("uid-owner", "n1", 100, 10000), ("gone",), 1e12))
        rival = gpu_pod("rival", mem=8000)
        rival["spec"]["priority"] = 100
        out = ext.filter({"Pod": client.add(rival), "NodeNames": ["n1"]})
        assert out["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"} and len(ext.holds) == 1
        owner = gpu_pod("owner", mem=10000)
        owner["spec"]["priority"] = 100
        assert ext.filter({"Pod": client.add(owner), "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        assert len(ext.holds) == 0 and cache.pods["uid-owner"].priority == 100  # the assumption counts now
    finally:
        ext.healer.stop()


def test_a_dynamic_mig_hold_keeps_its_placement_not_only_its_memory():
    """Dynamic MIG: what a victim frees is a placement. ``low``'s 3g.40gb at slices 0-3 is gone (deleted),
    ``mid``'s 1g.10gb sits at slice 4, and ``owner``'s hold is for the 3g.40gb at 0-3. A lower-priority
    1g.10gb fits by memory beside the hold (49,920 of 81,920 MiB counted); it must be placed at 5 or 6,
    never inside the held run, and the owner still gets its placement."""
    from hami_agent.protocol import MigPlacement
    from tests.unit.scheduler.helpers import mig_dev

    cache = UsageCache()
    cache.set_node("n1", [mig_dev(0)])
    mid = PodUsage(uid="mid", namespace="ns", name="mid", node="n1", priority=5,
                   devices={"GPU-0": DeviceAmount(slots=1, mem=9728, cores=15)},
                   mig_alloc={"GPU-0": (MigPlacement(4, 1),)})
    cache.add_pod(mid)
    owner = PodUsage(uid="owner", namespace="ns", name="owner", node="n1", priority=1000,
                     devices={"GPU-0": DeviceAmount(slots=1, mem=40192, cores=43)},
                     mig_alloc={"GPU-0": (MigPlacement(0, 4),)})
    holds = H.Holds(Clock())
    holds.put(H.Hold(owner, ("low",), 1e9))
    with cache.lock:
        rival = H.decide(cache, ["n1"], holds.against("rival", -10), preq(req(mem=9000)), CTX, None)
        mine = H.decide(cache, ["n1"], holds.against("owner", 1000), preq(req(mem=40000)), CTX, None)
    assert rival.node == "n1", rival.failed
    (pick,) = rival.fit.containers[0]
    assert pick.mig_profile == "1g.10gb" and pick.mig_placement in (MigPlacement(5, 1), MigPlacement(6, 1))
    (own,) = mine.fit.containers[0]
    assert mine.node == "n1" and own.mig_placement == MigPlacement(0, 4)

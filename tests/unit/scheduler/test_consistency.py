"""The usage cache never under-counts: assumptions survive lagging informer events until confirmed; which
pods' allocations count at all; the repair queue, the decision log and the leader gate's forwarding."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.decisions import DecisionLog, FilterDecision
from hami_agent.scheduler.state.heal import Healer
from hami_agent.scheduler.state.podinfo import countable_usage, signature
from hami_agent.scheduler.verbs.leadership import (
    FORWARDED_BY,
    URL_ANNOTATION,
    ForwardSettings,
    LeaderGate,
    NotLeader,
)
from tests.unit.scheduler.helpers import dev, gpu_pod

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SIG = ("n1", "GPU-0,NVIDIA,4000,0:;", "100")
OLD = ("n1", "GPU-0,NVIDIA,1000,0:;", "90")


def usage(mem: int, uid: str = "u1") -> PodUsage:
    return PodUsage(uid=uid, namespace="default", name="p", node="n1",
                    devices={"GPU-0": DeviceAmount(slots=1, mem=mem)})


def used(cache: UsageCache) -> int:
    return cache.nodes["n1"].devices[0].usedmem


@pytest.fixture
def cache() -> UsageCache:
    c = UsageCache()
    c.set_node("n1", [dev(0, uuid="GPU-0", mem=8000)])
    return c


def test_lagging_informer_event_never_drops_a_reservation(cache):
    cache.assume("u1", usage(4000), SIG)
    cache.observe("u1", usage(1000), OLD)  # an older state of the pod, delivered late
    cache.observe("u1", None, None)  # an even older one: no assignment at all
    assert used(cache) == 4000  # the reservation stands
    cache.observe("u1", usage(4000), SIG)  # the informer shows our write: confirmed
    assert cache.assumption("u1") is None
    cache.observe("u1", usage(4000), SIG)
    assert used(cache) == 4000
    cache.observe_gone("u1")
    assert used(cache) == 0


def test_deletion_ends_an_assumption(cache):
    cache.assume("u1", usage(4000), SIG)
    cache.observe_gone("u1")
    assert used(cache) == 0 and cache.assumption("u1") is None


def test_exclude_and_restore_keep_the_assumption(cache):
    cache.assume("u1", usage(4000), SIG)
    with cache.lock:
        prev = cache.exclude("u1")
        assert used(cache) == 0
        cache.restore("u1", prev)
    assert used(cache) == 4000 and cache.assumption("u1").signature == SIG


def test_late_repairs_never_overwrite_a_newer_decision(cache):
    cache.assume("u1", usage(4000), SIG)
    newer = ("n1", "GPU-0,NVIDIA,2000,0:;", "101")
    cache.assume("u1", usage(2000), newer)
    assert not cache.replace_assumption("u1", SIG, None, None)  # the repair for SIG comes too late
    assert not cache.drop_assumption("u1", SIG)
    assert not cache.settle("u1", SIG, None)
    assert used(cache) == 2000
    assert cache.replace_assumption("u1", newer, usage(1000), OLD)
    assert used(cache) == 1000


def test_stale_assumptions_are_listed_after_their_ttl(cache):
    cache.assume("u1", usage(4000), SIG, ttl_s=10, now=100.0)
    assert cache.stale_assumptions(now=105.0) == []
    assert cache.stale_assumptions(now=111.0) == ["u1"]


# ------------------------------------------------------------------------- which allocations count
def assigned(name: str = "p", *, node: str = "n1", bound: str | None = None,
             scheduler: str = "hami-scheduler", gpus: int = 1, phase: str = "Pending") -> dict:
    pod = gpu_pod(name, gpus=gpus, mem=1000, annotations={
        keys.VGPU_NODE: node, keys.DEVICES_ALLOCATED: "GPU-0,NVIDIA,1000,0:;", keys.VGPU_TIME: "1"})
    pod["spec"]["schedulerName"] = scheduler
    if bound:
        pod["spec"]["nodeName"] = bound
    pod["status"]["phase"] = phase
    return pod


def test_which_allocations_count():
    ours = "hami-scheduler"
    assert countable_usage(assigned(), scheduler_name=ours)[0].devices["GPU-0"].mem == 1000  # in flight
    assert countable_usage(assigned(bound="n1", phase="Running"), scheduler_name=ours)[0] is not None
    # a forged Pending pod for another scheduler must not hold capacity (issue 14 finding 3, reverse)
    u, sig = countable_usage(assigned(scheduler="default-scheduler"), scheduler_name=ours)
    assert u is None and sig == signature(assigned())
    # bound elsewhere than its annotation: drift, it holds nothing on the annotated node
    assert countable_usage(assigned(bound="n2", phase="Running"), scheduler_name=ours)[0] is None
    # a pod that asks for no GPU cannot have been handed one
    assert countable_usage(assigned(gpus=0), scheduler_name=ours)[0] is None
    assert countable_usage(assigned(phase="Succeeded", bound="n1"), scheduler_name=ours)[0] is None


# ------------------------------------------------------------------------------------- healer
def test_healer_retries_with_backoff_until_done():
    h = Healer().start()
    try:
        calls: list[float] = []

        def flaky() -> float | None:
            calls.append(time.monotonic())
            if len(calls) < 3:
                raise RuntimeError("API down")
            return None

        assert h.submit("t", flaky)
        assert h.wait_idle(10)
        assert len(calls) == 3 and h.done == 1
        assert calls[2] - calls[1] > (calls[1] - calls[0]) * 0.9  # backoff does not shrink
    finally:
        h.stop()


def test_healer_is_bounded_replaces_by_key_and_gives_up_at_the_deadline():
    h = Healer(max_tasks=2).start()
    try:
        ran: list[str] = []
        gate = threading.Event()
        assert h.submit("a", lambda: ran.append("a1") or None, delay_s=0.3)
        assert h.submit("a", lambda: ran.append("a2") or None, delay_s=0.3)  # replaces a1
        assert h.submit("b", lambda: gate.wait(0) and None or 0.05, deadline_s=0.3)
        assert not h.submit("c", lambda: None)  # full: refused, counted
        assert h.refused == 1
        assert h.wait_idle(10)
        assert ran == ["a2"] and h.abandoned == 1
    finally:
        h.stop()


# -------------------------------------------------------------------------------- decision log
def test_decision_log_is_bounded_and_expires():
    now = [0.0]
    log = DecisionLog(ttl_s=10, max_entries=3, clock=lambda: now[0])
    for i in range(5):
        log.put(FilterDecision(f"u{i}", "default", f"p{i}", "n1", "", "0"))
    assert len(log) == 3 and log.get("u0") is None and log.get("u4").name == "p4"
    now[0] = 11.0
    assert log.get("u4") is None


def test_decision_log_drops_expired_records_without_a_lookup():
    # the records of pods that never reach /bind (deleted while pending) must not wait for the cap
    now = [0.0]
    log = DecisionLog(ttl_s=10, max_entries=20000, clock=lambda: now[0])
    for i in range(100):
        now[0] = i * 0.5  # two /filters a second
        log.put(FilterDecision(f"u{i}", "default", f"p{i}", "n1", "", "0"))
    assert len(log) == 20  # the last ten seconds' records, never looked up again
    assert log.get("u79") is None and log.get("u80").name == "p80"


# ------------------------------------------------------------------------------- leader gate
class FakeElector:
    def __init__(self, leading: bool, holder: str = "b", url: str | None = "https://b:9443") -> None:
        self.identity = "a"
        self.leading = leading
        self.holder = holder
        self.url = url

    def is_leader(self) -> bool:
        return self.leading

    def lease_valid(self) -> bool:
        return self.leading

    def leader(self) -> str:
        return self.holder

    def leader_annotation(self, key: str) -> str | None:
        return self.url if key == URL_ANNOTATION else None


class FakeForwarder:
    def __init__(self, settings: ForwardSettings | None = None) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.settings = settings or ForwardSettings(ca_file="/etc/hami/pki/ca.crt")
        self.names: list[str | None] = []

    def post(self, url: str, verb: str, body: dict, expect_name: str | None = None) -> dict:
        self.calls.append((url, verb, body))
        self.names.append(expect_name)
        return {"Error": "", "from": "leader"}


def test_follower_forwards_once_and_never_writes():
    fwd = FakeForwarder()
    gate = LeaderGate()
    gate.attach(FakeElector(False), fwd)
    out = gate.forward("bind", {"PodName": "p"}, lambda e: {"Error": e})
    assert out["from"] == "leader"
    assert fwd.calls == [("https://b:9443", "bind", {"PodName": "p", FORWARDED_BY: "a"})]
    assert fwd.names == ["b"]  # the leader's certificate must name the Lease holder
    # a request that was already forwarded is not forwarded again (no loops)
    out = gate.forward("bind", {"PodName": "p", FORWARDED_BY: "c"}, lambda e: {"Error": e})
    assert "not the leader" in out["Error"] and len(fwd.calls) == 1
    with pytest.raises(NotLeader, match="fencing"):
        gate.check("pod annotations")
    gate.attach(FakeElector(False, url=None), fwd)
    out = gate.forward("filter", {}, lambda e: {"Error": e})
    assert URL_ANNOTATION in out["Error"] and len(fwd.calls) == 1
    assert not gate.can_forward()


def test_new_leader_decides_only_after_relisting():
    relisted = threading.Event()
    gate = LeaderGate(relist=lambda _t: relisted.wait(5))
    el = FakeElector(True, holder="a")
    gate.attach(el, None)
    assert not gate.wait_ready(0)
    t = threading.Thread(target=gate.started_leading)
    t.start()
    assert not gate.wait_ready(0.2)  # leading, but the pod cache is not relisted yet
    relisted.set()
    t.join(5)
    assert gate.wait_ready(1)
    gate.stopped_leading()
    el.leading = False
    assert not gate.wait_ready(0)


def test_ready_hooks_run_before_the_new_leader_decides():
    """The hooks rebuild a previous leader's state (busy nodes, preemption holds): a filter answered before
    they ran would not see a hold and could give its room to a rival."""
    gate = LeaderGate(relist=lambda _t: True)
    gate.attach(FakeElector(True, holder="a"), None)
    seen: list[bool] = []
    gate.on_ready(lambda: seen.append(gate.wait_ready(0)))
    gate.started_leading()
    assert seen == [False]  # not deciding while the hook ran
    assert gate.wait_ready(0)  # and deciding once it has


def test_ready_hooks_do_not_run_for_a_term_already_lost():
    el = FakeElector(True, holder="a")
    gate = LeaderGate(relist=lambda _t: (setattr(el, "leading", False), True)[1])
    gate.attach(el, None)
    ran: list[int] = []
    gate.on_ready(lambda: ran.append(1))
    gate.started_leading()
    assert ran == [] and not gate.wait_ready(0)

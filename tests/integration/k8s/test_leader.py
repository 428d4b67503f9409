"""Leader election on a coordination.k8s.io/v1 Lease (short durations for speed)."""

from __future__ import annotations

import threading
import time

import pytest

from hami_agent.k8s import KubeClient, LeaderElector
from tests.integration.k8s.test_informer import wait_until
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FAST = {"lease_duration_s": 1.0, "renew_deadline_s": 0.7, "retry_period_s": 0.15}


class Calls:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.leaders: list[str] = []


def elector(kube: KubeClient, ident: str, calls: Calls | None = None, **kw) -> LeaderElector:
    c = calls or Calls()
    return LeaderElector(kube, "kube-system", "hami-scheduler", ident,
                         on_started_leading=c.started.set, on_stopped_leading=c.stopped.set,
                         on_new_leader=c.leaders.append, **{**FAST, **kw})


@pytest.fixture
def electors():
    made: list[LeaderElector] = []
    yield made
    for e in made:
        e.stop()


def holder(api: ApiServer) -> str:
    lease = api.get("leases", "kube-system", "hami-scheduler")
    return (lease or {}).get("spec", {}).get("holderIdentity", "")


def test_two_electors_one_leader_then_handover_on_release(api_server: ApiServer, kube: KubeClient,
                                                          electors: list) -> None:
    ca, cb = Calls(), Calls()
    a, b = elector(kube, "a", ca), elector(kube, "b", cb)
    electors += [a.start(), b.start()]
    assert wait_until(lambda: a.is_leader() or b.is_leader(), 5)
    time.sleep(0.5)  # several retry periods: still exactly one
    assert a.is_leader() != b.is_leader()
    leader, follower = (a, b) if a.is_leader() else (b, a)
    lcalls, fcalls = (ca, cb) if leader is a else (cb, ca)
    assert holder(api_server) == leader.identity
    assert lcalls.started.is_set() and not fcalls.started.is_set()
    assert follower.leader() == leader.identity
    assert fcalls.leaders[-1] == leader.identity
    lease = api_server.get("leases", "kube-system", "hami-scheduler")
    assert lease["spec"]["leaseDurationSeconds"] == 1
    assert lease["spec"]["renewTime"].endswith("Z")

    t0 = time.monotonic()
    leader.stop()  # releases the lease
    assert lcalls.stopped.is_set()
    assert wait_until(follower.is_leader, 5)
    assert time.monotonic() - t0 < 1.0  # released: no need to wait for expiry
    assert holder(api_server) == follower.identity
    assert api_server.get("leases", "kube-system", "hami-scheduler")["spec"]["leaseTransitions"] >= 1


def test_crashed_leader_is_replaced_within_lease_duration(api_server: ApiServer, kube: KubeClient,
                                                          electors: list) -> None:
    a = elector(kube, "a", release_on_stop=False)
    electors.append(a.start())
    assert wait_until(a.is_leader, 5)
    b = elector(kube, "b")
    electors.append(b.start())
    time.sleep(0.3)
    assert not b.is_leader()
    a.stop()  # no release: like a process that died
    t0 = time.monotonic()
    assert wait_until(b.is_leader, 5)
    took = time.monotonic() - t0
    assert took < 1.0 + 2 * 0.15 * 2.2 + 0.3, took  # lease duration + a couple of jittered retries
    assert holder(api_server) == "b"


def test_leader_steps_down_when_it_cannot_renew(api_server: ApiServer, kube: KubeClient,
                                                electors: list) -> None:
    c = Calls()
    a = elector(kube, "a", c)
    electors.append(a.start())
    assert wait_until(a.is_leader, 5)
    api_server.stop()
    assert c.stopped.wait(3)  # renew deadline 0.7 s (+ a few failed, bounded calls)
    assert not a.is_leader()
    api_server.start()
    assert wait_until(a.is_leader, 5)  # the only candidate re-acquires once the API is back


def test_invalid_timings_rejected(kube: KubeClient) -> None:
    with pytest.raises(ValueError, match="lease_duration_s > renew_deadline_s"):
        LeaderElector(kube, "kube-system", "x", "a", lease_duration_s=5, renew_deadline_s=10)


def test_fence_closes_before_anyone_else_may_lead_even_if_the_elector_is_stuck(
        api_server: ApiServer, kube: KubeClient, electors: list) -> None:
    # A leader whose renew loop hangs (GC pause, starved thread) has not stepped down, but its fence —
    # renew deadline after the start of its last successful renew, on its monotonic clock — closes
    # before the lease duration after which the other candidate may take over.
    a = elector(kube, "a", lease_duration_s=2.0, renew_deadline_s=1.2, retry_period_s=0.2)
    electors.append(a.start())
    assert wait_until(a.is_leader, 5) and a.lease_valid()
    stuck = threading.Event()
    a._try_acquire_or_renew = lambda: stuck.wait(30) and False  # the next renew never returns
    b = elector(kube, "b", lease_duration_s=2.0, renew_deadline_s=1.2, retry_period_s=0.2)
    electors.append(b.start())
    try:
        assert wait_until(lambda: not a.lease_valid(), 3)
        fence_closed = time.monotonic()
        assert a.is_leader(), "the stuck leader has not noticed"
        assert wait_until(b.is_leader, 5)
        assert time.monotonic() - fence_closed > 0.5  # lease 2 s - renew deadline 1.2 s, minus polling
    finally:
        stuck.set()


def test_lease_annotations_travel_with_the_holder(api_server: ApiServer, kube: KubeClient,
                                                  electors: list) -> None:
    a = elector(kube, "a", annotations={"hami.io/extender-url": "https://a:9443"})
    electors.append(a.start())
    assert wait_until(a.is_leader, 5)
    b = elector(kube, "b", annotations={"hami.io/extender-url": "https://b:9443"})
    electors.append(b.start())
    assert wait_until(lambda: b.leader_annotation("hami.io/extender-url") == "https://a:9443", 5)
    lease = api_server.get("leases", "kube-system", "hami-scheduler")
    assert lease["metadata"]["annotations"]["hami.io/extender-url"] == "https://a:9443"
    a.stop()  # releases: the holder becomes "" and its URL means nothing any more
    assert wait_until(b.is_leader, 5)
    assert wait_until(lambda: api_server.get("leases", "kube-system", "hami-scheduler")["metadata"]
                      ["annotations"]["hami.io/extender-url"] == "https://b:9443", 5)

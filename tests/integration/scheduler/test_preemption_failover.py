"""Issue 29 item 4: GPU preemption survives a leader change. Two extender replicas with leader election and
``--preemption extender`` behind one "Service" (the SIMULATED kube-scheduler sends each call to either);
the leader starts a preemption (the hold recorded on the preemptor's ``hami.io/preemption-hold``, the victim
terminating) and is stopped. The new leader rebuilds the hold from the annotation
(``verbs/preemption.py`` ``rebuild_holds``), so a lower-priority rival arriving while the victim terminates
cannot take the room. The victim is deleted once, nothing else is evicted, the preemptor runs on the node it
held, and a sampler never sees the GPU over-committed."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.protocol import keys
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from hami_agent.scheduler.verbs.leadership import ForwardSettings
from tests.integration.scheduler.cluster import gpu_node
from tests.integration.scheduler.pki import Pki, make_pki
from tests.integration.scheduler.test_preemption_limit import Sampler, _graceful, _wait, vgpu_pod
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kube_scheduler_allocator import AllocatorStub
from tests.sim.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LEASE = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.3}  # as test_ha.py


def replica(api, pki: Pki) -> SchedulerApp:
    """One in-process replica serving TLS (a follower forwards only over TLS, to a leader whose certificate
    the CA verifies and names the Lease holder: 127.0.0.1, an IP SAN of the test certificate)."""
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    port = free_port()
    return SchedulerApp(client, SchedulerConfig(preemption="extender"), port=port, register_interval_s=0.5,
                        cert_file=pki.server.cert, key_file=pki.server.key, leader_elect=True,
                        lease_namespace="default", leader_kwargs=dict(LEASE),
                        advertise_url=f"https://127.0.0.1:{port}",
                        forward=ForwardSettings(ca_file=pki.ca.cert)).start()


def leader_of(apps: list[SchedulerApp]) -> SchedulerApp | None:
    return next((a for a in apps if a.gate.wait_ready(0)), None)


@contextlib.contextmanager
def two_replicas(api, tmp_path) -> Iterator[tuple[list[SchedulerApp], KubeSchedulerSim]]:
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    apps = [replica(api, pki) for _ in range(2)]
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    stub = AllocatorStub(client).start()
    sim = None
    try:
        assert _wait(lambda: sum(a.gate.wait_ready(0) for a in apps) == 1, 15), "no leader elected"
        assert all(a.extender.synced.wait(10) for a in apps)
        # upstream's default backoff (1 s doubling to 10 s): the preemptor, refused several times while its
        # victim terminates, may still be backing off when the room frees, and a newer pod comes first
        sim = KubeSchedulerSim(client, [a.url for a in apps], initial_backoff_s=1.0, max_backoff_s=10.0,
                               preempt_verb="preempt").start()
        yield apps, sim
    finally:
        if sim is not None:
            sim.stop()
        stub.stop()
        for a in apps:
            a.stop()


def test_a_new_leader_keeps_the_hold_and_nothing_is_evicted_twice(api_server, tmp_path):
    _graceful(api_server)
    api_server.create(gpu_node("gpu-0", gpus=1, mem=16384))
    with two_replicas(api_server, tmp_path) as (apps, sim), Sampler(api_server) as sampler:
        # low-b (600) ranks above the rival (500): only low-a, high's victim, could ever make room for it
        for name, prio in (("low-a", 0), ("low-b", 600)):
            api_server.create(vgpu_pod(name, mem=6144, prio=prio, grace=6))
        assert sim.wait_idle(15, expect_bound=2)
        first = leader_of(apps)
        assert first is not None
        api_server.create(vgpu_pod("high", mem=8192, prio=1000))

        def hold() -> dict | None:
            raw = (api_server.get("Pod", "default", "high")["metadata"].get("annotations") or {}).get(
                keys.PREEMPTION_HOLD)
            return json.loads(raw) if raw else None

        def terminating() -> list[str]:
            pods = [api_server.get("Pod", "default", n) for n in ("low-a", "low-b")]
            return [p["metadata"]["name"] for p in pods
                    if p is not None and p["metadata"].get("deletionTimestamp")]

        # the leader's preemption is under way: the hold recorded, the victim terminating
        assert _wait(lambda: hold() is not None and terminating(), 10), sim.failures
        held = hold()
        assert terminating() == ["low-a"]
        victim = "low-a"
        victim_uid = api_server.get("Pod", "default", victim)["metadata"]["uid"]
        assert held["node"] == "gpu-0" and held["victims"] == [victim_uid]
        high_uid = api_server.get("Pod", "default", "high")["metadata"]["uid"]

        first.stop()  # the leader goes while its victim terminates (grace 6 s)
        second = next(a for a in apps if a is not first)
        assert _wait(lambda: second.gate.wait_ready(0), 15), "no failover"
        rebuilt = second.extender.holds.get(high_uid)
        assert rebuilt is not None, "the new leader did not rebuild the hold from the annotation"
        assert rebuilt.node == "gpu-0" and rebuilt.victims == (victim_uid,)
        assert api_server.get("Pod", "default", victim) is not None  # still terminating at the handover

        # a rival of lower priority arrives while the victim terminates. Without the rebuilt hold it would
        # preempt low-a too (already going: no call) and hold the room low-a frees, get bound there, and high
        # would then evict the rival: a second eviction for one preemption. With it, the rival never fits.
        api_server.create(vgpu_pod("rival", mem=8192, prio=500))
        assert _wait(lambda: sim.bound.get("default/high") == "gpu-0", 60), sim.failures
        assert _wait(lambda: any(k == "default/rival" for k, _m in sim.failures), 10)
        assert _wait(lambda: api_server.get("Pod", "default", "low-a") is None, 10)
        seen = len(sim.failures)
        assert _wait(lambda: len(sim.failures) > seen, 15)  # the rival has been tried again since
        rival = api_server.get("Pod", "default", "rival")
        assert not rival["spec"].get("nodeName") and not rival["metadata"].get("deletionTimestamp")
        # the rival never preempted (no hold, no "waiting for" reason): the rebuilt hold left it no room
        assert keys.PREEMPTION_HOLD not in (rival["metadata"].get("annotations") or {})
        rival_says = [m for k, m in sim.failures if k == "default/rival"]
        assert rival_says and not any("preempted pod" in m for m in rival_says), rival_says
        assert api_server.get("Pod", "default", "low-b")["metadata"].get("deletionTimestamp") is None
        # one eviction in all, by a replica: high's victim; nobody deleted high, the rival or low-b
        deletes = [r.path.rsplit("/", 1)[1] for r in api_server.requests_matching("DELETE", r"/pods/[^/]+$")]
        assert deletes == ["low-a"], deletes
        assert sim.preemption.preempt_calls == []  # kube-scheduler itself preempted nothing
    assert sampler.samples > 10 and sampler.peak <= 16384, (sampler.samples, sampler.peak)

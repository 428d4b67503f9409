"""Issue 29: GPU preemption for static MIG resources (``nvidia.com/mig-<profile>``, NVIDIA's mixed strategy)
in the simulated cluster. With the MIG resource among the extender's ``managedResources``
(``ignoredByScheduler``), kube-scheduler cannot see it, so its own preemption finds no victim, as for GPU
memory (Project-HAMi/HAMi#1494); ``--preemption extender`` preempts the fewest pods holding MIG instances.
The hold carries the static MIG counts, so no lower-priority pod takes the instances being freed."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.protocol import keys
from hami_agent.protocol.devices import NodeDevice, encode_node_devices
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.test_preemption_limit import _graceful, _wait
from tests.sim.kube_scheduler import MANAGED_RESOURCES, KubeSchedulerSim
from tests.sim.kube_scheduler_allocator import AllocatorStub
from tests.unit.scheduler.helpers import a100_mig_profiles

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PROFILE = "1g.20gb"  # four instances on an A100-SXM4-80GB (placements 0, 2, 4, 6)
MIG_RESOURCE = f"nvidia.com/mig-{PROFILE}"


def a100_mig_node(name: str, dev_id: str, profiles: tuple, resource: str, count: int) -> dict:
    """A Ready node whose one A100-SXM4-80GB is in MIG mode with ``profiles`` (its device count: the largest
    instance count among them), ``count`` of ``resource`` allocatable."""
    dev = NodeDevice(id=dev_id, index=0, count=max(p.instance_count for p in profiles), devmem=81920,
                     devcore=100, type="NVIDIA A100-SXM4-80GB", mode="mig", health=True,
                     mig_profiles=profiles)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {keys.NODE_REGISTER: encode_node_devices([dev])},
                         "labels": {"gpu": "on"}},
            "status": {"allocatable": {"cpu": "64", resource: str(count)}, "capacity": {resource: str(count)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def mig_node(name: str) -> dict:
    """A node whose one A100 is in MIG mode with four 1g.20gb instances (static: the plugin publishes the
    instances that exist)."""
    return a100_mig_node(name, f"GPU-{name}-0", a100_mig_profiles(PROFILE), MIG_RESOURCE, 4)


def gpu_pod(name: str, limits: dict[str, str], prio: int, grace: int = 1) -> dict:
    """A pending pod of the extender's scheduler with one container of ``limits``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": {}},
            "spec": {"schedulerName": "hami-scheduler", "priority": prio,
                     "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


def mig_pod(name: str, instances: int, prio: int, grace: int = 1) -> dict:
    return gpu_pod(name, {MIG_RESOURCE: str(instances)}, prio, grace)


@contextlib.contextmanager
def instances_peak(api) -> Iterator[list[int]]:
    """Samples every 10 ms the MIG instances of the pods bound to the node, terminating ones included (their
    containers may still run): ``[peak, samples]``."""
    out, stop = [0, 0], threading.Event()

    def run() -> None:
        while not stop.is_set():
            used = sum(int(p["spec"]["containers"][0]["resources"]["limits"].get(MIG_RESOURCE, 0))
                       for p in api.list("Pod", "default") if p["spec"].get("nodeName"))
            out[0], out[1] = max(out[0], used), out[1] + 1
            stop.wait(0.01)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join(5)


@contextlib.contextmanager
def cluster(api) -> Iterator[KubeSchedulerSim]:
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    app = SchedulerApp(client, SchedulerConfig(preemption="extender"), register_interval_s=0.2).start()
    assert app.extender.synced.wait(10), "scheduler caches did not sync"
    stub = AllocatorStub(client).start()
    sim = KubeSchedulerSim(client, app.url, initial_backoff_s=0.05, max_backoff_s=0.4,
                           managed_resources=(*MANAGED_RESOURCES, MIG_RESOURCE)).start()
    try:
        yield sim
    finally:
        sim.stop()
        stub.stop()
        app.stop()


def test_static_mig_preemption_takes_the_fewest_pods_and_holds_the_instances(api_server):
    """Four 1g.20gb instances: ``pair`` (priority 10) holds two, ``one-a`` and ``one-b`` (priority 0) one
    each. A priority-1000 pod asking two instances needs one victim (``pair``), not the two cheaper-looking
    priority-0 pods that upstream's reprieve would take. While ``pair`` terminates, a priority-500 rival
    asking one instance finds the held instances counted and preempts a priority-0 pod for its own; the
    preemptor runs on the node, and the node's four instances are never promised to more than four."""
    _graceful(api_server)
    with cluster(api_server) as sim, instances_peak(api_server) as peak:
        api_server.create(mig_node("a100-0"))
        for name, n, prio in (("pair", 2, 10), ("one-a", 1, 0), ("one-b", 1, 0)):
            api_server.create(mig_pod(name, n, prio, grace=2))
        assert sim.wait_idle(15, expect_bound=3), sim.failures
        api_server.create(mig_pod("high", 2, 1000))
        assert _wait(lambda: (api_server.get("Pod", "default", "high")["status"].get("nominatedNodeName")
                              == "a100-0"), 10), sim.failures
        hold = json.loads(api_server.get("Pod", "default", "high")["metadata"]["annotations"][
            keys.PREEMPTION_HOLD])
        pair_uid = api_server.get("Pod", "default", "pair")["metadata"]["uid"]
        assert hold["victims"] == [pair_uid] and hold["mig"] == [[PROFILE, 2]], hold
        api_server.create(mig_pod("rival", 1, 500))
        assert _wait(lambda: sim.bound.get("default/high") == "a100-0", 30), sim.failures
        assert _wait(lambda: sim.bound.get("default/rival") == "a100-0", 30), sim.failures
        assert api_server.get("Pod", "default", "pair") is None
        left = [n for n in ("one-a", "one-b") if api_server.get("Pod", "default", n) is not None]
        assert len(left) == 1, left  # the rival took one priority-0 pod's instance, not high's
        assert sim.preemption.preempt_calls == []  # kube-scheduler itself preempts nothing
    assert peak[1] > 10 and peak[0] <= 4, peak

"""End to end through the simulated API server and the SIMULATED kube-scheduler: decisions,
annotations, reasons in events, bind with the node lock."""

from __future__ import annotations

import time

import pytest

from hami_agent.protocol import decode_pod_devices, keys
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import events_for, gpu_node, gpu_pod, stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def wait_for(fn, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    return fn()


def test_pod_scheduled_annotated_bound_and_lock_released(api_server):
    api_server.create(gpu_node("gpu-1", gpus=2, mem=16384))
    with stack(api_server) as (app, sim):
        api_server.create(gpu_pod("p1", mem=4096, cores=30))
        pod = wait_for(lambda: (p := api_server.get("Pod", "default", "p1"))
                       and p["spec"].get("nodeName") and p)
        assert pod["spec"]["nodeName"] == "gpu-1"
        ann = pod["metadata"]["annotations"]
        assert ann[keys.VGPU_NODE] == "gpu-1"
        assert pod["metadata"]["labels"][keys.VGPU_NODE] == "gpu-1"
        assert ann[keys.DEVICES_ALLOCATED] == ann[keys.DEVICES_TO_ALLOCATE]
        devs = decode_pod_devices(ann[keys.DEVICES_ALLOCATED])
        assert len(devs) == 1 and devs[0][0].usedmem == 4096 and devs[0][0].usedcores == 30
        assert devs[0][0].uuid.startswith("GPU-gpu-1-")
        assert ann[keys.BIND_TIME].isdigit() and int(ann[keys.VGPU_TIME]) > 0
        assert wait_for(lambda: api_server.get("Pod", "default", "p1")["metadata"]["annotations"]
                        .get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS)
        node = wait_for(lambda: (n := api_server.get("Node", None, "gpu-1"))
                        and keys.NODE_LOCK not in n["metadata"]["annotations"] and n)
        assert node, "the simulated allocator released the node lock"
        assert api_server.requests_matching("PATCH", r"/api/v1/nodes/gpu-1$"), "bind took the node lock"
        app.events.flush()
        msgs = {e["reason"]: e["message"] for e in events_for(api_server, "p1")}
        assert msgs["FilteringSucceed"].startswith(
            "find fit node(gpu-1), 0 nodes not fit, 1 nodes fit(gpu-1:")
        assert msgs["BindingSucceed"] == "Successfully binding node [gpu-1] to default/p1"
        # the register loop writes the handshake on its own clock (a pass gathers node events for
        # REGISTER_COALESCE_S first): waited for, not read at once
        assert wait_for(lambda: api_server.get("Node", None, "gpu-1")["metadata"]["annotations"]
                        .get(keys.NODE_HANDSHAKE, "").startswith("Requesting_"))


def test_unschedulable_reasons_in_events(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8192))
    api_server.create(gpu_node("gpu-2", gpus=1, mem=8192, type_="NVIDIA-A100"))
    with stack(api_server) as (app, sim):
        api_server.create(gpu_pod("big", mem=10000, annotations={"nvidia.com/use-gputype": "T4"}))
        assert wait_for(lambda: any(k == "default/big" for k, _ in sim.failures))
        app.events.flush()
        evs = [e for e in events_for(api_server, "big") if e["reason"] == "FilteringFailed"]
        msgs = sorted(e["message"] for e in evs)
        assert msgs == ["1 nodes CardInsufficientMemory(gpu-1)", "1 nodes CardTypeMismatch(gpu-2)"]
        msg = next(m for k, m in sim.failures if k == "default/big")
        # kube-scheduler's PostFilter (DefaultPreemption) adds its own finding: no pod of lower priority on
        # either node (tests/sim/kube_scheduler_preemption.py)
        assert msg == ("0/2 nodes are available: 1 1/1 CardInsufficientMemory, 1 1/1 CardTypeMismatch. "
                       "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.")
        assert not api_server.get("Pod", "default", "big")["spec"].get("nodeName")


def test_binpack_and_spread_node_policies(api_server):
    for n in ("gpu-a", "gpu-b"):
        api_server.create(gpu_node(n, gpus=1, mem=10000))
    with stack(api_server) as (app, sim):
        api_server.create(gpu_pod("first", mem=1000))
        assert sim.wait_idle(10, expect_bound=1)
        first = sim.bound["default/first"]
        # first's admission is over (its lock released, as the extender's node watch shows): else the
        # extender would prefer the other node while first is admitted (scheduler/state/busy.py)
        assert wait_for(lambda: not app.extender.busy.nodes())
        api_server.create(gpu_pod("second", mem=1000))  # binpack (default): same node
        assert sim.wait_idle(10, expect_bound=2)
        assert sim.bound["default/second"] == first
        api_server.create(gpu_pod("third", mem=1000, annotations={"hami.io/node-scheduler-policy": "spread"}))
        assert sim.wait_idle(10, expect_bound=3)
        assert sim.bound["default/third"] != first


def test_bind_failure_releases_lock_and_reports(api_server):
    node = gpu_node("gpu-1", gpus=1)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    node["metadata"]["annotations"][keys.NODE_LOCK] = f"{now},default,holder"
    api_server.create(node)
    api_server.create({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "holder", "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "x"}]},
                       "status": {"phase": "Pending"}})
    # the bind waits up to bind_lock_wait_s for a lock held by a pending pod, then reports the contention
    with stack(api_server, SchedulerConfig(bind_lock_wait_s=1.0), allocator=False) as (app, sim):
        api_server.create(gpu_pod("p1", mem=1000))
        assert wait_for(lambda: any(m.startswith("binding rejected: node gpu-1 has been locked within 5m0s")
                                    for _k, m in sim.failures))
        app.events.flush()
        evs = [e for e in events_for(api_server, "p1") if e["reason"] == "BindingFailed"]
        assert evs and "node lock contention" in evs[0]["message"]
        lock = api_server.get("Node", None, "gpu-1")["metadata"]["annotations"][keys.NODE_LOCK]
        assert lock.endswith(",default,holder")  # the other holder's lock is untouched
        assert not api_server.get("Pod", "default", "p1")["spec"].get("nodeName")
        # retries never double-count the pod in the usage cache
        assert sum(1 for p in app.cache.pods.values() if p.name == "p1") == 1


def test_deleted_pod_frees_its_gpu(api_server):
    api_server.create(gpu_node("gpu-1", gpus=1, mem=8000))
    with stack(api_server) as (app, sim):
        api_server.create(gpu_pod("a", mem=8000))
        assert sim.wait_idle(10, expect_bound=1)
        api_server.create(gpu_pod("b", mem=8000))
        assert wait_for(lambda: any(k == "default/b" for k, _ in sim.failures))
        api_server.delete("Pod", "default", "a")
        assert sim.wait_idle(15, expect_bound=2), sim.failures[-3:]
        assert sim.bound["default/b"] == "gpu-1"
        assert [p.name for p in app.cache.pods.values()] == ["b"]


def test_leader_election_gates_readiness(api_server):
    import urllib.error
    import urllib.request

    api_server.create(gpu_node("gpu-1", gpus=1))
    kw = {"leader_elect": True, "lease_namespace": "default",
          "leader_kwargs": {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.5}}
    with stack(api_server, allocator=False, **kw) as (app, _sim):
        def ready():
            try:
                with urllib.request.urlopen(app.url + "/readyz", timeout=2) as r:
                    return r.status == 200
            except urllib.error.HTTPError:
                return False
        assert wait_for(ready, timeout=10)
        assert app.is_leader()
        lease = api_server.get("Lease", "default", "hami-scheduler")
        assert lease and lease["spec"]["holderIdentity"] == app.elector.identity

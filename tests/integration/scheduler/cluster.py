"""Builders for the scheduler integration tests: simulated GPU nodes and GPU pods as API dicts, and a
running stack (extender in-process + SIMULATED kube-scheduler + SIMULATED allocator stub)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hami_agent.k8s.client import KubeClient
from hami_agent.protocol import NodeDevice, encode_node_devices, keys
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kube_scheduler_allocator import AllocatorStub


def gpu_node(name: str, gpus: int = 2, mem: int = 16384, split: int = 10, type_: str = "NVIDIA-Tesla T4",
             allocatable: int | None = None, numa: tuple[int, ...] | None = None,
             annotations: dict | None = None) -> dict:
    devs = [NodeDevice(id=f"GPU-{name}-{i}", index=i, count=split, devmem=mem, devcore=100, type=type_,
                       numa=(numa[i] if numa else 0), mode="hami-core", health=True) for i in range(gpus)]
    ann = {keys.NODE_REGISTER: encode_node_devices(devs)}
    ann.update(annotations or {})
    alloc = str(gpus * split if allocatable is None else allocatable)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": ann, "labels": {"gpu": "on"}},
            "status": {"allocatable": {"nvidia.com/gpu": alloc, "cpu": "64"},
                       "capacity": {"nvidia.com/gpu": alloc},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_pod(name: str, ns: str = "default", gpus: int = 1, mem: int | None = None,
            cores: int | None = None, annotations: dict | None = None, scheduler: str = "hami-scheduler",
            init: list | None = None) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    spec: dict = {"schedulerName": scheduler,
                  "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": "Pending"}}


@contextlib.contextmanager
def stack(api, config: SchedulerConfig | None = None, workers: int = 1, allocator: bool = True,
          backoff_s: float = 0.05, **app_kw) -> Iterator[tuple[SchedulerApp, KubeSchedulerSim]]:
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    app = SchedulerApp(client, config or SchedulerConfig(), register_interval_s=0.2, **app_kw).start()
    assert app.extender.synced.wait(10), "scheduler caches did not sync"
    stub = AllocatorStub(client).start() if allocator else None
    sim = KubeSchedulerSim(client, app.url, workers=workers, initial_backoff_s=backoff_s,
                           max_backoff_s=backoff_s * 8).start()
    try:
        yield app, sim
    finally:
        sim.stop()
        if stub is not None:
            stub.stop()
        app.stop()


def events_for(api, name: str, ns: str = "default") -> list[dict]:
    return [e for e in api.list("Event", ns) if (e.get("involvedObject") or {}).get("name") == name]


def check_cluster(api, apps=(), allocations=None, timeout_s: float = 15.0, **kw):
    """Run the invariant checker over the API server's nodes and pods (plus each running app's usage
    cache): retried until it holds or ``timeout_s`` passes (informers and background repairs converge
    asynchronously), then asserted. Returns the report."""
    import time

    from hami_agent.doctor.invariants import check
    from hami_agent.scheduler.state.podinfo import countable_usage

    deadline = time.monotonic() + timeout_s
    while True:
        nodes, pods = api.list("Node"), api.list("Pod")
        reports = [check(nodes, pods, allocations=allocations, cache=app.cache,
                         cache_usage=lambda p, a=app: countable_usage(p, a.config.names,
                                                                      a.config.scheduler_name)[0], **kw)
                   for app in apps] or [check(nodes, pods, allocations=allocations, **kw)]
        bad = [r for r in reports if not r.ok]
        if not bad or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not bad, bad[0].summary()
    return reports[0]

"""A SIMULATED GPU fleet in the test API server for ``doctor cluster``: GPU nodes as the device plugin and
the scheduler leave them (register annotation, handshake, allocatable), running GPU pods with HAMi's
allocation annotations, and a few pending GPU pods with the scheduler's FilteringFailed events."""

from __future__ import annotations

import random
import time
from typing import Any

from hami_agent.protocol import NodeDevice, encode_node_devices, keys

GPUS = 8


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def gpu_uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-{node * 100 + gpu:012x}"


def populate(api: Any, n_nodes: int, n_pods: int, *, pending: int = 20, seed: int = 7) -> None:
    """``n_nodes`` GPU nodes and ``n_pods`` pods: all but ``pending`` bound and running."""
    rng = random.Random(seed)
    handshake = "Requesting_" + time.strftime("%Y-%m-%d %H:%M:%S")
    for n in range(n_nodes):
        devs = [NodeDevice(id=gpu_uuid(n, g), index=g, count=10, devmem=81920, devcore=100,
                           type="NVIDIA-NVIDIA A100-SXM4-80GB", numa=g // 4, mode="hami-core", health=True)
                for g in range(GPUS)]
        alloc = {"nvidia.com/gpu": str(GPUS * 10), "cpu": "96", "memory": "1Ti", "pods": "110"}
        api.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": f"gpu-{n:04d}", "labels": {"gpu": "on"},
                                 "annotations": {keys.NODE_REGISTER: encode_node_devices(devs),
                                                 keys.NODE_HANDSHAKE: handshake}},
                    "status": {"allocatable": alloc, "capacity": dict(alloc),
                               "conditions": [{"type": "Ready", "status": "True"}]}})
    for i in range(n_pods):
        name, ns = f"job-{i:05d}", f"team-{i % 20:02d}"
        mem = rng.choice((2048, 4096, 8192, 16384))
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}
        pod: dict = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": ns, "creationTimestamp": _now()},
                     "spec": {"schedulerName": "hami-scheduler", "containers": [
                         {"name": "main", "image": "cuda", "resources": {"limits": limits}}]},
                     "status": {"phase": "Pending"}}
        if i >= pending:
            n, g = rng.randrange(n_nodes), rng.randrange(GPUS)
            node = f"gpu-{n:04d}"
            devices = f"{gpu_uuid(n, g)},NVIDIA,{mem},10:;"
            pod["metadata"]["annotations"] = {
                keys.VGPU_NODE: node, keys.VGPU_TIME: str(int(time.time())),
                keys.DEVICES_ALLOCATED: devices, keys.DEVICES_TO_ALLOCATE: ";",
                keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS, keys.BIND_TIME: str(int(time.time()))}
            pod["metadata"]["labels"] = {keys.VGPU_NODE: node}
            pod["spec"]["nodeName"] = node
            pod["status"] = {"phase": "Running"}
        created = api.create(pod)
        if i < pending:
            api.create({"apiVersion": "v1", "kind": "Event",
                        "metadata": {"name": f"{name}.ff", "namespace": ns},
                        "involvedObject": {"kind": "Pod", "namespace": ns, "name": name,
                                           "uid": created["metadata"]["uid"], "apiVersion": "v1"},
                        "reason": "FilteringFailed", "type": "Warning", "count": 3,
                        "message": f"{n_nodes} nodes CardInsufficientMemory",
                        "source": {"component": "hami-scheduler"},
                        "firstTimestamp": _now(), "lastTimestamp": _now()})

"""The sample workload of the demo: HAMi-style GPU pods as plain API dicts."""

from __future__ import annotations

NAMESPACE = "default"
SCHEDULER = "hami-scheduler"
IMAGE = "registry.invalid/cuda-sample:simulated"  # never pulled: the sandbox has no container runtime


def _ctr(name: str, limits: dict[str, str | int], env: dict[str, str] | None = None) -> dict:
    c: dict = {"name": name, "image": IMAGE, "resources": {"limits": {k: str(v) for k, v in limits.items()}}}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


def pod(
    name: str,
    containers: list[dict],
    init: list[dict] | None = None,
    node: str | None = None,
    scheduler: str | None = SCHEDULER,
) -> dict:
    spec: dict = {"containers": containers, "restartPolicy": "Never"}
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeName"] = node  # bypasses scheduling, like any pod with spec.nodeName
    elif scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "hami-demo"}},
        "spec": spec,
    }


def sample_workload(mig_node: str) -> list[dict]:
    """Two pods sharing GPUs (gpumem/gpucores), one exclusive GPU, one MIG device, one pod whose init
    container and app container both use a vGPU."""
    return [
        pod(
            "shared-a",
            [_ctr("infer", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10240, "nvidia.com/gpucores": 30})],
        ),
        pod(
            "shared-b",
            [_ctr("infer", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 50})],
        ),
        pod(
            "exclusive",
            [
                _ctr(
                    "train",
                    {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100, "nvidia.com/gpumem-percentage": 100},
                )
            ],
        ),
        # the simulated kube-scheduler has no resource-fit plugin, so the MIG pod names its node (a real
        # kube-scheduler places it by allocatable nvidia.com/mig-3g.48gb)
        pod("mig-3g", [_ctr("infer", {"nvidia.com/mig-3g.48gb": 1})], node=mig_node),
        pod(
            "with-init",
            [_ctr("app", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192, "nvidia.com/gpucores": 20})],
            init=[
                _ctr("warmup", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 10})
            ],
        ),
    ]


def replay_workload(node: str) -> list[dict]:
    """Pods sent to the seed-003 node while NVML hangs: a plain pod (in the seed even these hung) and a
    MIG pod (the seed's stuck pod asked for nvidia.com/mig-3g.48gb)."""
    return [
        pod(
            "during-hang-plain",
            [{"name": "web", "image": IMAGE, "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],
            node=node,
        ),
        pod("during-hang-mig", [_ctr("neal-0729-6", {"nvidia.com/mig-3g.48gb": 1})], node=node),
    ]

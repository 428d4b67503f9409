"""Builders shared by the scheduler unit tests."""

from __future__ import annotations

from hami_agent.scheduler.core.model import ContainerDeviceRequest, DeviceUsage, PodRequest


def dev(i: int, *, mem: int = 8000, cores: int = 100, count: int = 10, used: int = 0, usedmem: int = 0,
        usedcores: int = 0, numa: int = 0, health: bool = True, type_: str = "NVIDIA-A100",
        mode: str = "hami-core", uuid: str | None = None) -> DeviceUsage:
    return DeviceUsage(id=uuid or f"GPU-{i}", index=i, type=type_, count=count, totalmem=mem,
                       totalcore=cores, numa=numa, health=health, mode=mode, used=used, usedmem=usedmem,
                       usedcores=usedcores)


def req(nums: int = 1, mem: int = 0, pct: int = 101, cores: int = 0) -> ContainerDeviceRequest:
    return ContainerDeviceRequest(nums=nums, memreq=mem, mem_percentage=pct, coresreq=cores)


def preq(*containers: ContainerDeviceRequest | None, n_init: int = 0) -> PodRequest:
    return PodRequest(containers=tuple(containers), n_init=n_init)


def gpu_pod(name: str = "p", *, uid: str | None = None, ns: str = "default", gpus: int = 1,
            mem: int | None = None, cores: int | None = None, annotations: dict | None = None,
            init: list[dict] | None = None, pct: int | None = None) -> dict:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    if pct is not None:
        limits["nvidia.com/gpumem-percentage"] = str(pct)
    spec: dict = {"schedulerName": "hami-scheduler",
                  "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": "Pending"}}


class FakePodClient:
    """An in-memory stand-in for the API client's pod calls the extender makes (get, conditional
    metadata patch, binding), with resourceVersion bumps and 409 on a stale precondition, like the API
    server. For HTTP-level unit tests; integration tests use the simulated API server."""

    def __init__(self, quotas=None, fail_patch: str = ""):
        """``fail_patch``: "conflict" (409), "500" (not applied) or "500-after-apply" (applied, answer
        lost)."""
        self.pods: dict[tuple[str, str], dict] = {}
        self.patches: list[tuple] = []
        self.events: list[tuple] = []
        self.quotas = quotas or []
        self.fail_patch = fail_patch
        self._rv = 100

    def add(self, pod: dict) -> dict:
        import copy

        pod = copy.deepcopy(pod)
        md = pod.setdefault("metadata", {})
        md.setdefault("namespace", "default")
        self._rv += 1
        md["resourceVersion"] = str(self._rv)
        self.pods[(md["namespace"], md["name"])] = pod
        return pod

    def get_pod(self, ns, name):
        import copy

        from hami_agent.k8s.errors import NotFoundError

        pod = self.pods.get((ns, name))
        if pod is None:
            raise NotFoundError(404, "NotFound", f'pods "{name}" not found', "get", "pod", f"{ns}/{name}")
        return copy.deepcopy(pod)

    def patch_pod_metadata(self, ns, name, annotations=None, labels=None, resource_version=None, decode=True):
        from hami_agent.k8s.errors import ConflictError, KubeError

        if self.fail_patch == "conflict":
            raise ConflictError(409, "Conflict", "simulated", "patch", "pod", f"{ns}/{name}")
        if self.fail_patch and self.fail_patch != "500-after-apply":
            raise KubeError(500, "InternalError", "simulated", "patch", "pod", f"{ns}/{name}")
        pod = self.pods[(ns, name)]
        md = pod["metadata"]
        if resource_version and resource_version != md["resourceVersion"]:
            raise ConflictError(409, "Conflict", "the object has been modified", "patch", "pod",
                                f"{ns}/{name}")
        self.patches.append((ns, name, annotations, labels))
        for key, new in (("annotations", annotations), ("labels", labels)):
            cur = md.setdefault(key, {})
            for k, v in (new or {}).items():
                if v is None:
                    cur.pop(k, None)
                else:
                    cur[k] = v
        self._rv += 1
        md["resourceVersion"] = str(self._rv)
        if self.fail_patch == "500-after-apply":  # applied, but the answer is an error
            raise KubeError(500, "InternalError", "simulated", "patch", "pod", f"{ns}/{name}")
        import copy

        return copy.deepcopy(pod)  # the API's answer is a copy: later writes do not change it

    def list_resource_quotas(self, ns):
        return self.quotas

    def create_event(self, obj, type_, reason, message, component):
        self.events.append((reason, message))


def a100_mig_profiles(*names: str):
    """The A100-SXM4-80GB GPU-instance profiles as a node in ``mig`` mode publishes them (memory and
    placements: NVIDIA MIG user guide, "A100 MIG profiles"; core = ceil(SMs x 100 / 98 SMs of 7g), as
    HAMi's discoverMigProfiles computes it). ``names`` selects (default: all but +me)."""
    from hami_agent.protocol import MigPlacement, MigProfile

    table = {  # name: (memory MiB, slices, SMs, placement starts, placement size)
        "1g.10gb": (9728, 1, 14, range(7), 1),
        "1g.20gb": (19968, 1, 14, (0, 2, 4, 6), 2),
        "2g.20gb": (19968, 2, 28, (0, 2, 4), 2),
        "3g.40gb": (40192, 3, 42, (0, 4), 4),
        "4g.40gb": (40192, 4, 56, (0,), 4),
        "7g.80gb": (81152, 7, 98, (0,), 8),
    }
    out = []
    for name in names or tuple(table):
        mem, slices, sms, starts, size = table[name]
        out.append(MigProfile(name=name, memory_mb=mem, core=-(-sms * 100 // 98), slice_count=slices,
                              placements=tuple(MigPlacement(s, size) for s in starts),
                              instance_count=len(tuple(starts))))
    return tuple(out)


def mig_dev(i: int, profiles=None, **kw) -> DeviceUsage:
    """A dynamic-MIG A100 80GB as registered: count = the largest instance count, full memory, 100 cores."""
    profs = profiles or a100_mig_profiles()
    d = dev(i, mem=81920, count=max(p.instance_count for p in profs), mode="mig",
            type_="NVIDIA A100-SXM4-80GB", **kw)
    d.mig_profiles = profs
    return d

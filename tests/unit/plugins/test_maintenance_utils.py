"""The node-maintenance engine (plugins/module_utils/_maintenance.py) against a fake API and a fake clock:
pod selection, refusals before any write, the cordon's owner, 429 retries with backoff up to the
deadline, uncordon only what we cordoned, parking a node that failed a gate."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.hami.node.plugins.module_utils import _hami
from ansible_collections.hami.node.plugins.module_utils import _maintenance as m

from tests.clock import ManualClock

pytestmark = pytest.mark.unit

RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}
DS = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "ds-1", "controller": True}


def pod(name: str, gpu: bool = True, owner: dict | None = RS, phase: str = "Running", init_gpu: bool = False,
        volumes: list | None = None, annotations: dict | None = None) -> dict:
    limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}
    spec: dict = {"nodeName": "gpu-1", "containers": [{"name": "c", "resources": {"limits": limits}}]}
    if init_gpu:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"nvidia.com/gpumem": "100"}}}]
    if volumes:
        spec["volumes"] = volumes
    md: dict = {"name": name, "namespace": "ml", "uid": "uid-" + name, "annotations": annotations or {}}
    if owner:
        md["ownerReferences"] = [owner]
    return {"metadata": md, "spec": spec, "status": {"phase": phase}}


class FakeApi:
    def __init__(self, pods: list[dict], node: dict | None = None) -> None:
        self.node = node or {"metadata": {"name": "gpu-1", "resourceVersion": "1", "annotations": {}},
                             "spec": {}, "status": {}}
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.patches: list[dict] = []
        self.evictions: list[str] = []
        self.events: list[tuple] = []
        self.refuse: dict[str, int] = {}  # pod -> how many 429s before it goes
        self.retry_after = 0
        self.errors: dict[str, m.ApiError] = {}
        self.conflicts = 0
        self.linger = 0  # list_pods calls an evicted pod is still seen (Terminating)
        self._gone: dict[str, int] = {}

    def get_node(self, name: str) -> dict:
        return copy.deepcopy(self.node)

    def patch_node(self, name: str, patch: dict) -> dict:
        self.patches.append(copy.deepcopy(patch))
        if self.conflicts:
            self.conflicts -= 1
            raise m.ApiError(409, "Conflict")
        assert patch["metadata"]["resourceVersion"] == self.node["metadata"]["resourceVersion"]
        md = self.node["metadata"]
        for k, v in (patch.get("metadata") or {}).get("annotations", {}).items():
            if v is None:
                md["annotations"].pop(k, None)
            else:
                md["annotations"][k] = v
        for k, v in (patch.get("spec") or {}).items():
            if v is None:
                self.node["spec"].pop(k, None)
            else:
                self.node["spec"][k] = v
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)
        return copy.deepcopy(self.node)

    def list_pods(self, node: str) -> list[dict]:
        out = []
        for name, p in self.pods.items():
            if name in self._gone:
                if self._gone[name] <= 0:
                    continue
                self._gone[name] -= 1
            out.append(copy.deepcopy(p))
        return out

    def evict(self, ns: str, name: str, options: dict | None) -> dict:
        if name in self.errors:
            raise self.errors[name]
        if self.refuse.get(name, 0) > 0:
            self.refuse[name] -= 1
            details = {"causes": [{"reason": "DisruptionBudget", "message": f"budget web needs 2 ({name})"}]}
            if self.retry_after:
                details["retryAfterSeconds"] = self.retry_after
            raise m.ApiError(429, "TooManyRequests", {"message": "Cannot evict pod", "details": details})
        self.evictions.append(f"{ns}/{name}")
        self._gone[name] = self.linger
        return {"status": "Success"}

    def create_node_event(self, node: str, type_: str, reason: str, message: str) -> None:
        self.events.append((node, type_, reason, message))


def engine(api: FakeApi, check_mode: bool = False) -> tuple[m.Maintenance, ManualClock]:
    clock = ManualClock(start=0.0)
    return m.Maintenance(api, "gpu-1", clock, clock.sleep, check_mode), clock


def drain(e: m.Maintenance, **kw) -> dict:
    args = {"reason": "driver 1 -> 2", "mode": "gpu", "gpu_prefixes": ["nvidia.com/"], "force": False,
            "delete_emptydir_data": True, "timeout_s": 600, "backoff_initial_s": 1.0, "backoff_max_s": 30.0}
    args.update(kw)
    return e.drain(**args)


def test_gpu_mode_selects_gpu_pods_and_leaves_the_rest() -> None:
    pods = [pod("train"), pod("warm", gpu=False, init_gpu=True), pod("web", gpu=False),
            pod("dcgm", owner=DS), pod("done", phase="Succeeded"),
            pod("static", owner=None, annotations={m.MIRROR_ANNOTATION: "x"})]
    evict, skipped = m.classify(pods, "gpu", ["nvidia.com/"])
    assert [p["metadata"]["name"] for p in evict] == ["train", "warm"]
    assert skipped == {"ml/web": "uses no GPU", "ml/dcgm": "DaemonSet pod", "ml/done": "finished (Succeeded)",
                       "ml/static": "mirror pod of a static manifest"}
    evict_all, _ = m.classify(pods, "all", ["nvidia.com/"])
    assert [p["metadata"]["name"] for p in evict_all] == ["train", "warm", "web"]


def test_a_refusal_writes_nothing() -> None:
    api = FakeApi([pod("bare", owner=None), pod("scratch", volumes=[{"name": "s", "emptyDir": {}}])])
    e, _ = engine(api)
    with pytest.raises(m.MaintenanceError) as ei:
        drain(e, delete_emptydir_data=False)
    assert "ml/bare" in ei.value.msg and "force=true" in ei.value.msg
    assert "ml/scratch" in ei.value.msg and "delete_emptydir_data" in ei.value.msg
    assert api.patches == [] and api.evictions == []
    # with force, the unmanaged pod goes (and emptyDir is allowed by default)
    out = drain(e, force=True)
    assert sorted(out["evicted"]) == ["ml/bare", "ml/scratch"]


def test_cordon_and_its_owner_are_written_in_one_patch_with_the_resource_version() -> None:
    api = FakeApi([pod("train")])
    e, _ = engine(api)
    out = drain(e)
    assert out["cordoned_by"] == "hami.node" and out["evicted"] == ["ml/train"]
    first = api.patches[0]
    assert first["spec"] == {"unschedulable": True}
    assert first["metadata"]["annotations"][m.CORDONED_BY] == "hami.node"
    assert first["metadata"]["resourceVersion"] == "1"
    assert len(api.patches) == 1


def test_conflicts_are_re_read_and_retried() -> None:
    api = FakeApi([])
    api.conflicts = 2
    e, _ = engine(api)
    assert e.cordon("x") == ("hami.node", True)
    assert len(api.patches) == 3 and api.node["spec"]["unschedulable"] is True


def test_operator_cordon_is_remembered_and_never_lifted() -> None:
    api = FakeApi([pod("train")])
    api.node["spec"]["unschedulable"] = True
    e, _ = engine(api)
    out = drain(e)
    assert out["cordoned_by"] == "operator" and out["evicted"] == ["ml/train"]
    assert api.patches == []  # no cordon of ours, no annotation
    assert e.uncordon() == (False, False)
    assert api.node["spec"]["unschedulable"] is True


def test_a_rerun_after_a_crash_knows_the_cordon_is_ours() -> None:
    api = FakeApi([])
    api.node["spec"]["unschedulable"] = True
    api.node["metadata"]["annotations"] = {m.CORDONED_BY: "hami.node", m.FAILED_GATE: "nvml", m.RUNBOOK: "rb"}
    e, _ = engine(api)
    assert e.cordon("x") == ("hami.node", False)
    assert e.uncordon() == (True, True)
    assert "unschedulable" not in api.node["spec"] and api.node["metadata"]["annotations"] == {}


def test_budget_refusals_are_retried_with_backoff_until_they_pass() -> None:
    api = FakeApi([pod("a"), pod("b")])
    api.refuse = {"a": 3}
    e, clock = engine(api)
    out = drain(e)
    assert sorted(out["evicted"]) == ["ml/a", "ml/b"]
    assert api.evictions[0] == "ml/b"  # a refused pod does not hold up the others
    assert out["budget_refusals"] == 3
    # exponential: about 1, 2, 4 s (+ up to 10% jitter)
    assert [round(s) for s in clock.sleeps] == [1, 2, 4]


def test_a_servers_retry_after_is_honoured() -> None:
    api = FakeApi([pod("a")])
    api.refuse = {"a": 1}
    api.retry_after = 10
    e, clock = engine(api)
    drain(e)
    assert 10 <= clock.sleeps[0] <= 11


def test_budget_deadline_fails_with_the_cause_and_the_node_stays_cordoned() -> None:
    api = FakeApi([pod("a")])
    api.refuse = {"a": 10**6}
    e, clock = engine(api)
    with pytest.raises(m.MaintenanceError) as ei:
        drain(e, timeout_s=100)
    assert "ml/a still refused" in ei.value.msg and "budget web needs 2 (a)" in ei.value.msg
    assert "stays cordoned" in ei.value.msg
    assert clock.t <= 100 and max(clock.sleeps) <= 30 * 1.1
    assert api.node["spec"]["unschedulable"] is True


def test_forbidden_eviction_names_the_rbac_fix() -> None:
    api = FakeApi([pod("a")])
    api.errors = {"a": m.ApiError(403, "Forbidden", {"message": "pods \"a\" is forbidden"})}
    e, _ = engine(api)
    with pytest.raises(m.MaintenanceError, match="create on pods/eviction"):
        drain(e)


def test_the_drain_waits_until_evicted_pods_are_gone() -> None:
    api = FakeApi([pod("a")])
    api.linger = 3
    e, clock = engine(api)
    drain(e)
    assert clock.sleeps == [0.5, 1.0, 2.0]
    api2 = FakeApi([pod("a")])
    api2.linger = 10**6
    e2, _ = engine(api2)
    with pytest.raises(m.MaintenanceError, match="still there"):
        drain(e2, timeout_s=20)


def test_check_mode_plans_without_writing() -> None:
    api = FakeApi([pod("a")])
    e, _ = engine(api, check_mode=True)
    out = drain(e)
    assert out["evicted"] == ["ml/a"] and out["cordoned"] is True
    assert api.patches == [] and api.evictions == []


def test_park_keeps_the_node_cordoned_and_says_why() -> None:
    api = FakeApi([])
    e, _ = engine(api)
    assert e.park("nvml", "docs/runbooks/rollout_gates.md#nvml", "NVML did not answer within 15s")
    ann = api.node["metadata"]["annotations"]
    assert api.node["spec"]["unschedulable"] is True  # it had been uncordoned: cordoned again, as ours
    assert ann[m.FAILED_GATE] == "nvml" and ann[m.RUNBOOK].endswith("#nvml")
    assert ann[m.CORDONED_BY] == "hami.node"
    (node, type_, reason, msg), = api.events
    assert (node, type_, reason) == ("gpu-1", "Warning", "HamiMaintenanceGateFailed")
    assert "gate nvml failed" in msg and "rollout_gates.md#nvml" in msg


def test_api_gates() -> None:
    node = {"metadata": {"name": "gpu-1", "annotations": {_hami.NODE_REGISTER: (
        '[{"id":"GPU-a","index":0,"count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true},'
        '{"id":"GPU-b","index":1,"count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":false}]')}},
        "status": {"allocatable": {"nvidia.com/gpu": "10"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}
    gates = m.check_gates(node, ["GPU-a"], "nvidia.com/gpu", _hami.decode_register)
    assert gates["node_ready"][0] and gates["device_plugin"][0]
    gates = m.check_gates(node, ["GPU-a", "GPU-b", "GPU-c"], "nvidia.com/gpu", _hami.decode_register)
    assert not gates["device_plugin"][0]
    assert "missing GPU-c" in gates["device_plugin"][1] and "unhealthy GPU-b" in gates["device_plugin"][1]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    assert not m.check_gates(node, None, "nvidia.com/gpu", _hami.decode_register)["device_plugin"][0]

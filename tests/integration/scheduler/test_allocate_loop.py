"""Issue 16 finding 4 end to end, with the device plugin's real Allocate in the loop: a binding whose
answer is lost must not let the next pod take the node lock before the first pod's Allocate, or
Allocate (which finds its pod through the lock: the kubelet's request carries no pod identity) hands
each pod the other's devices and limits. The "kubelet" here admits bound pods in binding order and
calls the real ``Allocator`` against the simulated API server; the invariant checker compares what
Allocate handed out with each pod's annotation."""

from __future__ import annotations

import pytest

from hami_agent.deviceplugin.allocator import AllocationError, Allocator, PreferredRequest
from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.podsource import K8sPodSource
from hami_agent.deviceplugin.settings import PluginSettings
from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.informer import Informer
from hami_agent.protocol import NodeDevice, encode_node_devices, keys
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.cluster import check_cluster, gpu_pod
from tests.integration.scheduler.test_trust import bind, create, extender, filter_, wait_for
from tests.unit.deviceplugin.fakes import FakeSnapshot, full_gpus, gpu_uuid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

NODE = "gpu-1"
SPLIT = 4


class Kubelet:
    """Admits the pods bound to NODE in binding order, one container request per GPU container, through
    the real Allocator; records what each pod's containers were handed (``allocations``). Devices are
    chosen as the kubelet's device manager does for a plugin that offers GetPreferredAllocation
    (``devicesToAllocate`` in kubernetes ``pkg/kubelet/cm/devicemanager/manager.go``): the plugin's
    preference among the free devices, topped up from the free ones if it names too few."""

    def __init__(self, api, allocator: Allocator, plan) -> None:
        self.api = api
        self.allocator = allocator
        self.plan = plan
        self.admitted: list[str] = []
        self.allocations: dict[str, dict[str, dict[str, str]]] = {}
        self.failures: dict[str, str] = {}
        self._free = [d.id for d in plan.devices]

    def admit_bound(self) -> None:
        bound = [p for p in self.api.list("Pod", "default") if (p["spec"].get("nodeName") == NODE
                                                               and p["metadata"]["uid"] not in self.admitted)]
        bound.sort(key=lambda p: int(p["metadata"]["resourceVersion"]))  # ~ binding order
        for p in bound:
            uid = p["metadata"]["uid"]
            self.admitted.append(uid)
            for c in p["spec"]["containers"]:
                n = int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                if not n:
                    continue
                ids = self._choose(n)
                try:
                    (resp,) = self.allocator.allocate(self.plan, [ids])
                except AllocationError as exc:
                    self.failures[uid] = str(exc)
                    continue
                self.allocations.setdefault(uid, {})[c["name"]] = dict(resp.envs)

    def _choose(self, n: int) -> list[str]:
        (hint,) = self.allocator.preferred(self.plan, [PreferredRequest(tuple(self._free), (), n)])
        ids = [i for i in dict.fromkeys(hint) if i in self._free][:n]
        ids += [i for i in self._free if i not in ids][: n - len(ids)]
        self._free = [i for i in self._free if i not in ids]
        return ids


@pytest.fixture
def plugin(api_server, tmp_path):
    devs = [NodeDevice(id=gpu_uuid(i), index=i, count=SPLIT, devmem=97871, devcore=100,
                       type="NVIDIA-NVIDIA H20", numa=0, mode="hami-core", health=True) for i in range(2)]
    ann = {keys.NODE_REGISTER: encode_node_devices(devs)}
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": ann},
                       "status": {"allocatable": {"nvidia.com/gpu": str(2 * SPLIT)}}})
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=5)
    fast = client.with_options(timeout_s=1.0, attempts=1)
    pods = Informer(client, "pods", field_selector=f"spec.nodeName={NODE}").start()
    nodes = Informer(client, "nodes", field_selector=f"metadata.name={NODE}").start()
    assert pods.wait_synced(5) and nodes.wait_synced(5)
    s = PluginSettings(node_name=NODE, hook_path=str(tmp_path / "hook"), vgpu_lock_dir=str(tmp_path / "lock"),
                       device_split_count=SPLIT, rpc_deadline_s=2.0, api_timeout_s=1.0)
    plan = plan_resources(FakeSnapshot(gpus=full_gpus(2)), s)["nvidia.com/gpu"]
    yield Kubelet(api_server, Allocator(s, K8sPodSource(NODE, fast, pods, nodes)), plan)
    pods.stop()
    nodes.stop()


def test_lost_binding_answer_never_swaps_two_pods_devices(api_server, plugin):
    kubelet = plugin
    a = create(api_server, gpu_pod("a", mem=1000, cores=10))
    b = create(api_server, gpu_pod("b", mem=30000, cores=60))
    with extender(api_server, SchedulerConfig(api_timeout_s=0.5), timeout_s=0.5) as (app, ext):
        assert filter_(ext, a, (NODE,))["NodeNames"] == [NODE]
        # a's binding is applied 0.8 s later, after the extender's client gave up at 0.5 s
        api_server.inject_fault(None, method="POST", path_regex=r"/pods/a/binding$", times=1, delay_s=0.8)
        bind(ext, a)
        assert wait_for(lambda: api_server.get("Pod", "default", "a")["spec"].get("nodeName") == NODE, 10)
        assert filter_(ext, b, (NODE,))["NodeNames"] == [NODE]
        bind(ext, b)  # must not take the node's lock while a's Allocate is pending
        kubelet.admit_bound()
        if not api_server.get("Pod", "default", "b")["spec"].get("nodeName"):
            assert bind(ext, b)["Error"] == ""  # kube-scheduler's retry, after a's Allocate
            kubelet.admit_bound()
        assert not kubelet.failures, kubelet.failures
        assert set(kubelet.allocations) == {a["metadata"]["uid"], b["metadata"]["uid"]}
        check_cluster(api_server, [app], allocations=kubelet.allocations)
        envs = kubelet.allocations[a["metadata"]["uid"]]["main"]
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m" and envs["CUDA_DEVICE_SM_LIMIT"] == "10"

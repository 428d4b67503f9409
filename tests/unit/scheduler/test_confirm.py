"""Before /filter refuses for capacity, the few pods in the way are read back (``state/confirm.py``):
a pod the API no longer has (or that finished) stops counting; one that still exists keeps counting, in
any state; the reads are bounded and made only on a refusal."""

from __future__ import annotations

import pytest

from hami_agent.k8s.errors import KubeError, NotFoundError
from hami_agent.scheduler.core.fit import PodContext
from hami_agent.scheduler.core.model import DeviceAmount, PodUsage
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.state.confirm import GoneCheck
from hami_agent.scheduler.state.podinfo import signature
from hami_agent.scheduler.verbs.extender import Extender
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod, preq, req

pytestmark = pytest.mark.unit

WHOLE = preq(req(nums=1, mem=8000))  # a whole 8,000 MiB GPU
CTX = PodContext()


class ApiPods:
    """The API's pods by (namespace, name), counting GETs; ``error`` makes every GET fail."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict] = {}
        self.gets: list[tuple[str, str]] = []
        self.error: KubeError | None = None

    def put(self, usage: PodUsage, *, uid: str | None = None, phase: str = "Running",
            terminating: bool = False) -> None:
        md: dict = {"namespace": usage.namespace, "name": usage.name, "uid": uid or usage.uid}
        if terminating:
            md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self.pods[(usage.namespace, usage.name)] = {"metadata": md, "status": {"phase": phase}}

    def get_pod(self, ns: str, name: str) -> dict:
        self.gets.append((ns, name))
        if self.error is not None:
            raise self.error
        pod = self.pods.get((ns, name))
        if pod is None:
            raise NotFoundError(404, "NotFound", f'pods "{name}" not found', "get", "pod", f"{ns}/{name}")
        return pod


def usage(name: str, node: str = "n1", gpu: str = "GPU-0", mem: int = 8000) -> PodUsage:
    return PodUsage(f"uid-{name}", "default", name, node, {gpu: DeviceAmount(1, mem, 0)})


def full_node(cache: UsageCache, node: str = "n1", pods: int = 1) -> list[PodUsage]:
    """A one-GPU node (8,000 MiB, split ``pods``) filled by ``pods`` pods, counted from the informer."""
    cache.set_node(node, [dev(0, mem=8000, count=max(pods, 1), uuid=f"{node}-GPU-0")])
    out = [usage(f"{node}-p{i}", node, f"{node}-GPU-0", 8000 // pods) for i in range(pods)]
    for u in out:
        cache.observe(u.uid, u, None)
    return out


def used(cache: UsageCache, node: str = "n1") -> int:
    return cache.nodes[node].devices[0].usedmem


def test_a_deleted_pod_stops_counting_and_a_present_one_does_not() -> None:
    cache, api = UsageCache(), ApiPods()
    (gone,) = full_node(cache, "n1")
    (alive,) = full_node(cache, "n2")
    api.put(alive)  # n1's pod is not in the API any more
    check = GoneCheck(cache, api)
    assert check.release(["n1", "n2"], WHOLE, CTX, "uid-new") == ["n1"]
    assert used(cache, "n1") == 0 and used(cache, "n2") == 8000
    assert sorted(api.gets) == [("default", gone.name), ("default", alive.name)]
    assert check.released == 1 and cache.pods.get(gone.uid) is None


@pytest.mark.parametrize(("how", "freed"), [
    ({"phase": "Succeeded"}, True),
    ({"phase": "Failed"}, True),
    ({"uid": "uid-someone-else"}, True),  # the name now belongs to a new pod: ours is gone
    ({"phase": "Running", "terminating": True}, False),  # its containers may still run
    ({"phase": "Pending"}, False),
])
def test_only_a_finished_or_replaced_pod_is_gone(how: dict, freed: bool) -> None:
    cache, api = UsageCache(), ApiPods()
    (pod,) = full_node(cache)
    api.put(pod, **how)
    assert GoneCheck(cache, api).release(["n1"], WHOLE, CTX, "uid-new") == (["n1"] if freed else [])
    assert used(cache) == (0 if freed else 8000)


def test_no_read_when_the_pod_would_not_fit_even_without_them() -> None:
    cache, api = UsageCache(), ApiPods()
    full_node(cache)
    too_big = preq(req(nums=1, mem=16000))  # more than the GPU has
    two = preq(req(nums=2, mem=1000))  # more GPUs than the node has
    for request in (too_big, two):
        assert GoneCheck(cache, api).release(["n1"], request, CTX, "uid-new") == []
    assert api.gets == [] and used(cache) == 8000


def test_no_read_on_a_node_with_more_pods_in_the_way_than_one_refusal_may_read() -> None:
    cache, api = UsageCache(), ApiPods()
    full_node(cache, "n1", pods=5)  # gone from the API, but 5 > 4 GETs
    assert GoneCheck(cache, api, max_gets=4).release(["n1"], WHOLE, CTX, "uid-new") == []
    assert api.gets == [] and used(cache) == 8000
    # the nodes with the fewest pods in the way are read first, within the bound
    full_node(cache, "n2", pods=3)
    full_node(cache, "n3", pods=2)
    check = GoneCheck(cache, api, max_gets=4)
    assert check.release(["n1", "n2", "n3"], WHOLE, CTX, "uid-new") == ["n3"]
    assert len(api.gets) == 2 and used(cache, "n2") == 8000 - 8000 % 3 and used(cache, "n3") == 0


def test_up_to_ten_pods_in_the_way_are_read_back() -> None:
    """Eight pods sharing one GPU (split 10), all gone from the API: one refusal reads them all."""
    cache, api = UsageCache(), ApiPods()
    full_node(cache, "n1", pods=8)
    check = GoneCheck(cache, api)
    assert check.release(["n1"], WHOLE, CTX, "uid-new") == ["n1"]
    assert len(api.gets) == 8 and used(cache) == 0


def test_a_busy_node_is_read_back_gpu_by_gpu() -> None:
    """More pods on the node than one refusal may read (4 GPUs x 3 pods, 4 GETs): for a one-GPU pod the
    pods of one GPU are read, fewest first; a GPU whose pods are gone frees the node."""
    cache, api = UsageCache(), ApiPods()
    cache.set_node("n1", [dev(i, mem=9000, count=10, uuid=f"GPU-{i}") for i in range(4)])
    pods = {i: [usage(f"g{i}-p{k}", "n1", f"GPU-{i}", 3000) for k in range(3)] for i in range(4)}
    pods[2] = pods[2][:1]  # GPU-2 holds one pod: read first
    for group in pods.values():
        for u in group:
            cache.observe(u.uid, u, None)
    for i in (0, 1, 3):
        for u in pods[i]:
            api.put(u)  # GPU-2's pod is gone from the API, every other pod is there
    check = GoneCheck(cache, api, max_gets=4)
    assert check.release(["n1"], WHOLE, CTX, "uid-new") == ["n1"]
    assert api.gets[0] == ("default", "g2-p0") and len(api.gets) <= 4
    assert cache.pods.get(pods[2][0].uid) is None and check.released == 1
    # a pod asking two GPUs is not helped by one GPU's pods: no read
    api.gets.clear()
    assert GoneCheck(cache, api, max_gets=4).release(["n1"], preq(req(nums=2, mem=9000)), CTX, "x") == []
    assert api.gets == []


def test_the_gpu_by_gpu_pass_walks_a_bounded_number_of_nodes() -> None:
    """A refusal over many busy nodes walks the pods of ``max_fits`` of them at most (under the lock)."""
    cache, api = UsageCache(), ApiPods()
    for n in range(10):
        full_node(cache, f"n{n}", pods=5)  # 5 pods on one GPU: more than 4 GETs, node and GPU alike
    walked: list[str] = []
    real = cache.few_settled_pods_per_gpu

    def counting(node: str, at_most: int, skip: str = "") -> list:
        walked.append(node)
        return real(node, at_most, skip)

    cache.few_settled_pods_per_gpu = counting  # type: ignore[method-assign]
    names = [f"n{n}" for n in range(10)]
    assert GoneCheck(cache, api, max_gets=4, max_fits=3).release(names, WHOLE, CTX, "uid-new") == []
    assert walked == ["n0", "n1", "n2"] and api.gets == []


def test_assumptions_are_never_suspects() -> None:
    """A pod /filter just placed (its annotation write not seen by the informer yet) is not in the API's
    answer as the cache counts it: it must keep its GPU."""
    cache, api = UsageCache(), ApiPods()
    cache.set_node("n1", [dev(0, mem=8000, count=1)])
    mine = usage("mine")
    cache.assume(mine.uid, mine, ("n1", "GPU-0,NVIDIA,8000,0:;", "1"))
    assert GoneCheck(cache, api).release(["n1"], WHOLE, CTX, "uid-new") == []
    assert api.gets == [] and used(cache) == 8000


def test_an_api_error_refuses_as_before() -> None:
    cache, api = UsageCache(), ApiPods()
    full_node(cache, "n1", pods=2)
    api.error = KubeError(500, "InternalError", "boom", "get", "pod", "default/x")
    assert GoneCheck(cache, api).release(["n1"], WHOLE, CTX, "uid-new") == []
    assert len(api.gets) == 1 and used(cache) == 8000  # stopped at the first failure


def test_the_reads_stop_when_the_budget_is_spent() -> None:
    """kube-scheduler's scheduling cycle waits for /filter: a slow API ends the check at its budget."""
    import time

    cache, api = UsageCache(), ApiPods()
    full_node(cache, "n1", pods=4)  # all gone from the API, but each read is slow
    real = api.get_pod

    def slow(ns: str, name: str) -> dict:
        time.sleep(0.3)
        return real(ns, name)

    api.get_pod = slow  # type: ignore[method-assign]
    check = GoneCheck(cache, api, budget_s=0.5)
    check.release(["n1"], WHOLE, CTX, "uid-new")
    assert 1 <= len(api.gets) < 4
    assert check.released == len(api.gets)  # what was read back counts; the rest stays counted


def test_the_rate_limit_bounds_reads_across_refusals() -> None:
    cache, api = UsageCache(), ApiPods()
    (pod,) = full_node(cache)
    api.put(pod)  # present: every refusal would read it again
    check = GoneCheck(cache, api, qps=0.001, burst=3)
    for _ in range(10):
        assert check.release(["n1"], WHOLE, CTX, "uid-new") == []
    assert len(api.gets) == 3


def test_a_pod_the_informer_changed_meanwhile_is_left_to_the_informer() -> None:
    cache = UsageCache()
    (pod,) = full_node(cache)
    newer = usage(pod.name, "n1", "n1-GPU-0", 4000)
    cache.observe(pod.uid, newer, None)  # the informer moved on after the suspect was read
    assert cache.forget_gone(pod.uid, pod) is None
    assert used(cache) == 4000
    assert cache.forget_gone(pod.uid, cache.pods[pod.uid]) is not None and used(cache) == 0


class Recording(FakePodClient):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def get_pod(self, ns, name):
        self.calls.append(f"get {ns}/{name}")
        return super().get_pod(ns, name)


def _filter(ext: Extender, api: Recording, name: str) -> dict:
    pod = api.add(gpu_pod(name, mem=8000))
    api.calls.clear()
    out = ext.filter({"Pod": pod, "NodeNames": ["n1"]})
    return out


def test_filter_reads_back_only_when_it_would_refuse() -> None:
    cache, api = UsageCache(), Recording()
    cache.set_node("n1", [dev(0, mem=8000, count=1, uuid="GPU-0")])
    ext = Extender(cache, client=api)
    ext.gone_check = GoneCheck(cache, api)
    ext.synced.set()
    first = _filter(ext, api, "first")
    assert first["NodeNames"] == ["n1"]
    assert api.calls == ["get default/first"]  # the pod itself (no informer here): no read-back
    # the first pod is confirmed by the informer, then deleted in the API while the cache still counts it
    stored = api.pods[("default", "first")]
    gone = usage("first", gpu="GPU-0")
    gone.uid = stored["metadata"]["uid"]
    cache.observe(gone.uid, gone, signature(stored))  # the informer confirms /filter's assumption
    # a pod that fits nowhere while "first" still exists: refused after one read-back
    refused = _filter(ext, api, "second")
    assert refused["NodeNames"] is None and refused["FailedNodes"]
    assert api.calls == ["get default/second", "get default/first"]
    del api.pods[("default", "first")]
    placed = _filter(ext, api, "third")
    assert placed["NodeNames"] == ["n1"] and ext.gone_check.released == 1
    assert api.calls == ["get default/third", "get default/first"]
    assert cache.nodes["n1"].devices[0].usedmem == 8000  # third's reservation, not first's

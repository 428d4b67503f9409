"""The pod-request memo of the extender's pod informer (issue 31): answers from memory only while the
pod's containers are equal to those it parsed, checks the pod's shape on every event, and never
answers a pod with another pod's requests."""

from __future__ import annotations

import copy

import pytest

from hami_agent.protocol import keys
from hami_agent.scheduler.core.requests import RequestError, RequestMemo, pod_request
from hami_agent.scheduler.state.podinfo import countable_usage
from tests.unit.scheduler.helpers import gpu_pod

OURS = "hami-scheduler"


def assigned(name: str = "p", *, mem: int = 1000, gpus: int = 1, uid: str | None = None) -> dict:
    pod = gpu_pod(name, uid=uid, gpus=gpus, mem=mem, annotations={
        keys.VGPU_NODE: "n1", keys.DEVICES_ALLOCATED: f"GPU-0,NVIDIA,{mem},0:;", keys.VGPU_TIME: "1"})
    pod["spec"]["nodeName"] = "n1"
    pod["status"]["phase"] = "Running"
    return pod


def test_a_later_event_with_the_same_containers_is_answered_from_memory():
    memo = RequestMemo()
    pod = assigned()
    first = memo.request("u1", pod)
    later = copy.deepcopy(pod)  # a watch event: new objects, equal containers
    later["metadata"]["annotations"][keys.BIND_PHASE] = "success"
    later["status"]["phase"] = "Running"
    assert memo.request("u1", later) is first
    assert (memo.misses, memo.hits) == (1, 1)
    assert first == pod_request(pod)


def test_changed_containers_are_parsed_again():
    memo = RequestMemo()
    pod = assigned(mem=1000)
    assert memo.request("u1", pod).containers[0].memreq == 1000
    resized = copy.deepcopy(pod)
    resized["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "3000"
    assert memo.request("u1", resized).containers[0].memreq == 3000
    with_init = copy.deepcopy(resized)
    with_init["spec"]["initContainers"] = [{"name": "init", "image": "x", "resources": {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500"}}}]
    req = memo.request("u1", with_init)
    assert req.n_init == 1 and req.containers[0].memreq == 500
    assert memo.misses == 3 and memo.hits == 0


def test_the_uid_keys_the_memo_never_the_containers_alone():
    memo = RequestMemo()
    a, b = assigned("a", uid="ua", mem=1000), assigned("b", uid="ub", mem=2000)
    assert memo.request("ua", a).containers[0].memreq == 1000
    assert memo.request("ub", b).containers[0].memreq == 2000
    assert memo.request("ua", a).containers[0].memreq == 1000


def test_a_bad_shape_is_refused_on_every_event_even_with_the_same_containers():
    memo = RequestMemo()
    pod = assigned()
    memo.request("u1", pod)
    forged = copy.deepcopy(pod)
    forged["metadata"]["annotations"]["x"] = 5  # annotations must be strings
    with pytest.raises(RequestError, match=r"metadata\.annotations"):
        memo.request("u1", forged)
    assert memo.request("u1", pod) == pod_request(pod)  # parsed again: the bad event dropped the entry
    assert memo.misses == 2


def test_an_invalid_request_is_remembered_and_raised_each_time():
    memo = RequestMemo()
    pod = assigned()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "1.5"
    for _ in range(2):
        with pytest.raises(RequestError, match=r"spec\.containers\[0\]\.resources"):
            memo.request("u1", pod)
    assert (memo.misses, memo.hits) == (1, 1)


def test_forget_and_the_bound():
    memo = RequestMemo(limit=2)
    for i in range(3):
        memo.request(f"u{i}", assigned(f"p{i}", uid=f"u{i}"))
    assert len(memo) == 1  # full at two: it started again empty
    memo.forget("u2")
    assert len(memo) == 0


def test_countable_usage_with_and_without_the_memo_agree():
    memo = RequestMemo()
    pods = [assigned(), assigned(gpus=0), assigned(mem=3000)]
    pods[2]["spec"]["schedulerName"] = "other"  # bound: still counts
    for pod in pods + pods:
        plain = countable_usage(pod, scheduler_name=OURS)
        assert countable_usage(pod, scheduler_name=OURS, memo=memo) == plain


def test_the_sync_forgets_a_pod_that_finished_or_was_deleted():
    from hami_agent.scheduler.state.cache import UsageCache
    from hami_agent.scheduler.state.sync import ClusterSync

    cache = UsageCache()
    sync = ClusterSync(None, cache)
    a, b = assigned("a", uid="ua"), assigned("b", uid="ub")
    sync.on_pod(a)
    sync.on_pod(b)
    assert len(sync._requests) == 2 and cache.settled_pods_on("n1")  # noqa: SLF001
    done = copy.deepcopy(a)
    done["status"]["phase"] = "Succeeded"
    sync.on_pod(done)
    sync.on_pod_delete(b)
    assert len(sync._requests) == 0 and not cache.settled_pods_on("n1")  # noqa: SLF001

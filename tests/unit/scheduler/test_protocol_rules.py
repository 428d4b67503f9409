"""The scheduler applies the protocol's HAMi rules, not its own copies (Project-HAMi/HAMi pkg/device/nvidia/).

One regression test per place where the scheduler's former private copy disagreed with the protocol
(and with HAMi), plus equivalence checks that the scheduler's per-pod adapters (PodContext, the
hashable ContainerDeviceRequest) decide exactly as the protocol's functions do.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_agent.protocol import (
    ProtocolError,
    check_type,
    check_uuid,
    container_requests,
    keys,
    mode_matches,
    parse_reason,
)
from hami_agent.scheduler.core.fit import _type_ok, _uuid_ok, parse_weights, pod_context
from hami_agent.scheduler.core.model import ContainerDeviceRequest
from hami_agent.scheduler.core.nodes import allocatable_gpus, node_extras
from hami_agent.scheduler.core.requests import RequestError, pod_request
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.unit.scheduler.helpers import dev, gpu_pod, req

pytestmark = pytest.mark.unit


# ----------------------------------------------------------- quantities: Quantity.AsInt64, not a subset
def test_mig_counts_accept_every_integer_quantity_form():
    # The scheduler's own parser only knew "<digits><suffix>"; "2000m" (= 2) and "1e1" (= 10) are
    # valid Kubernetes quantities with integer values and must count like "2" and "10".
    p = gpu_pod("p")
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "2000m"
    p["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/mig-3g.40gb": "1e1"}
    assert pod_request(p).mig == (("1g.10gb", 2), ("3g.40gb", 10))
    for bad in ("1500m", "-1", "two"):
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = bad
        with pytest.raises(RequestError, match="nvidia.com/mig-1g.10gb"):
            pod_request(p)


def test_allocatable_uses_the_protocol_quantity_rules():
    def node(v):
        return {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": v}}}
    assert allocatable_gpus(node("8")) == 8
    assert allocatable_gpus(node("8000m")) == 8  # was 0: not understood
    assert allocatable_gpus(node("1.5")) == 0 and allocatable_gpus(node("x")) == 0


def test_webhook_priority_env_from_any_integer_quantity():
    pod = gpu_pod("p")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = "1e0"
    resp = Webhook(SchedulerConfig()).admit({"operation": "CREATE", "namespace": "default", "object": pod})
    ops = json.loads(base64.b64decode(resp["patch"]))
    env = [op["value"] for op in ops if op["path"] == "/spec/containers/0/env"]
    assert env == [[{"name": "CUDA_TASK_PRIORITY", "value": "1"}]]  # was: no env at all


class _QuotaClient:
    def __init__(self, hard):
        self.hard = hard

    def list_resource_quotas(self, ns):
        return [{"spec": {"hard": self.hard}}]


def test_quota_limits_use_the_protocol_quantity_rules():
    ext = Extender(UsageCache(), SchedulerConfig(), _QuotaClient({"limits.nvidia.com/gpumem": "2e3",
                                                                   "limits.nvidia.com/gpucores": "50"}))
    assert ext._quota_limits("default") == (2000, 50)  # "2e3" used to void the whole quota lookup
    ext = Extender(UsageCache(), SchedulerConfig(), _QuotaClient({"limits.nvidia.com/gpumem": "0.5"}))
    assert ext._quota_limits("default") is None  # fractional: not a usable limit (as before)


# ------------------------------------------------------------ hami.io/gpu-scheduler-policy (HAMi: exact)
@pytest.mark.parametrize("value", ["BINPACK", "Binpack,numa", "binpack,,numa", "binpack,"])
def test_gpu_policy_is_case_sensitive_and_rejects_blank_entries(value):
    # HAMi's ValidGPUSchedulerPolicy compares the trimmed tokens exactly: any unknown token (an
    # upper-case name, an empty one) sends the pod to the default policy. The scheduler used to lower-
    # case and drop blanks, so "BINPACK" was binpack here and spread in HAMi.
    assert pod_context({keys.GPU_SCHEDULER_POLICY: value}).gpu_policy == ("spread",)
    assert pod_context({keys.GPU_SCHEDULER_POLICY: value}, gpu_policy="binpack").gpu_policy == ("binpack",)


def test_gpu_policy_tokens_are_trimmed():
    assert pod_context({keys.GPU_SCHEDULER_POLICY: " binpack , numa "}).gpu_policy == ("binpack", "numa")
    assert pod_context({}, gpu_policy="no-such-policy").gpu_policy == ("spread",)
    assert pod_context({keys.NODE_SCHEDULER_POLICY: "Spread"}).node_policy == "binpack"


# ------------------------------------------------------- hami.io/device-scoring-weights (HAMi: ParseInt)
def test_scoring_weights_follow_go_parseint():
    assert parse_weights("slot=+2,core=1,memory=0") == (2, 1, 0)  # Go accepts a "+" sign
    assert parse_weights(None) == (1, 1, 1)
    # int() used to accept these; HAMi does not
    for bad in ("slot=1_0,core=1,memory=1", "slot=\u0661,core=1,memory=1",
                "slot=1,core=1,memory=1,slot=2", "slot=99999999999999999999,core=1,memory=1"):
        with pytest.raises(ProtocolError, match="device-scoring-weights"):
            parse_weights(bad)


def test_invalid_scoring_weights_fail_the_filter_instead_of_defaulting():
    # HAMi's calcScore returns the parse error: the pod is not scheduled until the annotation is fixed.
    # The scheduler used to log at -v=3 and score with 1,1,1.
    cache = UsageCache()
    cache.set_node("n1", [dev(0)])
    pod = gpu_pod("p", mem=1000, annotations={keys.DEVICE_SCORING_WEIGHTS: "slot=1,core=1"})
    ext = Extender(cache, SchedulerConfig(), cached_pods=lambda _ns, _name: pod)
    ext.synced.set()
    out = ext.filter({"Pod": pod, "NodeNames": ["n1"]})
    # HAMi's text: Filter wraps calcScore's error (pkg/scheduler/scheduler.go Filter)
    assert out["NodeNames"] is None and out["Error"] == (
        'calcScore failed invalid hami.io/device-scoring-weights annotation "slot=1,core=1": expected slot, '
        "core, and memory weights for pod p")
    assert cache.pods == {}  # nothing reserved
    pod["metadata"]["annotations"][keys.DEVICE_SCORING_WEIGHTS] = "slot=1,core=1,memory=3"
    assert ext.filter({"Pod": pod, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]


# ---------------------------------------------------------------- hami.io/node-nvidia-score (Go int map)
def test_pair_scores_with_non_integer_values_are_ignored_like_hami():
    # Go's json.Unmarshal into map[string]int fails on "50", 5.5 or true, and HAMi then has no pair
    # scores for the node. The scheduler used to coerce them with int().
    def node(score):
        raw = json.dumps([{"uuid": "GPU-a", "score": {"GPU-b": score}}])
        return {"metadata": {"name": "n", "annotations": {keys.NODE_SCORE: raw}}}
    assert node_extras(node(50)).pair_scores == {"GPU-a": {"GPU-b": 50}}
    for bad in ("50", 5.5, True):
        assert node_extras(node(bad)).pair_scores == {}


def test_device_cordon_uses_the_protocol_parser():
    n = {"metadata": {"name": "n", "annotations": {keys.DEVICE_CORDON: " GPU-a ,,GPU-b"}}}
    assert node_extras(n).cordoned == frozenset({"GPU-a", "GPU-b"})


# ------------------------------------------------------------------- adapters decide as the protocol does
_TYPES = st.sampled_from(["NVIDIA-NVIDIA A100-SXM4-80GB", "NVIDIA-H100", "NVIDIA-T4", "nvidia-a10", "A100"])
_TOKENS = st.sampled_from(["a100", "A100", "H100", " t4 ", "", "A10", "nvidia", "x"])
_UUIDS = st.sampled_from(["GPU-a", "GPU-b", "GPU-ab", " GPU-a", ""])
_MODES = st.sampled_from(["", "hami-core", "mig", "mps"])
_MODE_VALUES = st.sampled_from(["", "hami-core", "mig", "mps", "hami-core,mig", "MIG"])


@settings(max_examples=300, deadline=None)
@given(dtype=_TYPES, use=st.lists(_TOKENS, max_size=3), nouse=st.lists(_TOKENS, max_size=3),
       uuid=_UUIDS, use_u=st.lists(_UUIDS, max_size=3), nouse_u=st.lists(_UUIDS, max_size=3),
       mode=_MODES, wanted=_MODE_VALUES)
def test_pod_context_matches_the_protocol_checks(dtype, use, nouse, uuid, use_u, nouse_u, mode, wanted):
    ann = {}
    for key, items in ((keys.USE_GPUTYPE, use), (keys.NOUSE_GPUTYPE, nouse), (keys.USE_GPUUUID, use_u),
                       (keys.NOUSE_GPUUUID, nouse_u)):
        if items:
            ann[key] = ",".join(items)
    if wanted:
        ann[keys.VGPU_MODE] = wanted
    ctx = pod_context(ann)
    d = dev(0, type_=dtype, mode=mode, uuid=uuid or "GPU-z")
    assert _type_ok(d, req(), ctx) == (check_type(ann, dtype) and mode_matches(ann, mode))
    assert _uuid_ok(d, ctx) == check_uuid(ann, d.id)


@settings(max_examples=200, deadline=None)
@given(nums=st.integers(0, 4), mem=st.one_of(st.none(), st.integers(0, 90000)),
       pct=st.one_of(st.none(), st.integers(-5, 150)), cores=st.one_of(st.none(), st.integers(0, 150)),
       total=st.integers(1, 100000), default_mem=st.sampled_from([0, 2048]))
def test_pod_request_is_the_protocol_request(nums, mem, pct, cores, total, default_mem):
    from hami_agent.protocol import RequestConfig

    limits = {"nvidia.com/gpu": str(nums)}
    for name, v in (("nvidia.com/gpumem", mem), ("nvidia.com/gpumem-percentage", pct),
                    ("nvidia.com/gpucores", cores)):
        if v is not None:
            limits[name] = str(v)
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
    cfg = RequestConfig(default_memory=default_mem)
    (proto,) = container_requests(pod, cfg)
    (mine,) = pod_request(pod, cfg).containers
    if proto.nums <= 0:
        assert mine is None
        return
    assert isinstance(mine, ContainerDeviceRequest)
    assert (mine.nums, mine.type, mine.memreq, mine.mem_percentage, mine.coresreq) == \
        (proto.nums, proto.type, proto.memreq, proto.mem_percentage_req, proto.coresreq)
    assert mine.memory_for(total) == proto.memory_for(total)


def test_failed_events_read_reasons_with_the_protocol_parser():
    from hami_agent.scheduler.verbs.events import filtering_failed_messages

    reason = "10/12 CardInsufficientMemory, 2/12 CardTypeMismatch"
    assert set(parse_reason(reason)) == {"CardInsufficientMemory", "CardTypeMismatch"}
    assert filtering_failed_messages({"a": reason, "b": "node unregistered"}) == [
        "1 nodes CardInsufficientMemory(a)", "1 nodes CardTypeMismatch(a)", "1 nodes node unregistered(b)"]

"""Resource requests from pod dicts and the scheduler's pod annotations (Project-HAMi/HAMi
pkg/device/nvidia/device.go)."""

from __future__ import annotations

import pytest

from hami_agent.protocol import (
    PERCENTAGE_UNSET,
    ProtocolError,
    RequestConfig,
    ScoringWeights,
    check_type,
    check_uuid,
    container_requests,
    gpu_scheduler_policy,
    mode_matches,
    node_scheduler_policy,
    numa_bind,
    parse_device_cordon,
    parse_scoring_weights,
    webhook_resource_defaults,
)
from hami_agent.protocol.quantity import parse_quantity, quantity_as_int64

pytestmark = pytest.mark.unit


def pod(*containers, init=()):
    return {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"initContainers": list(init), "containers": list(containers)}}


def ctr(name="c", limits=None, requests=None):
    res = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "resources": res}


def test_plain_gpu_means_whole_card_memory():
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": "1"})))
    assert (r.nums, r.type, r.memreq, r.mem_percentage_req, r.coresreq) == (1, "NVIDIA", 0, 100, 0)
    assert r.memory_for(81920) == 81920


def test_memory_and_cores_from_limits_before_requests():
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 2, "nvidia.com/gpumem": "3000"},
                                      requests={"nvidia.com/gpumem": "5000", "nvidia.com/gpucores": "30"})))
    assert (r.nums, r.memreq, r.mem_percentage_req, r.coresreq) == (2, 3000, PERCENTAGE_UNSET, 30)
    assert r.memory_for(81920) == 3000


def test_quantity_suffixes_and_percentage():
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20k"})))
    assert r.memreq == 20000
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})))
    assert (r.memreq, r.mem_percentage_req, r.memory_for(8000)) == (0, 50, 4000)


def test_percentage_clamped_and_ignored():
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150})))
    assert r.mem_percentage_req == 100
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0,
                                              "nvidia.com/gpumem": 100})))
    assert (r.mem_percentage_req, r.memreq) == (PERCENTAGE_UNSET, 100)


def test_cores_clamped_to_100():
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpucores": 250})))
    assert r.coresreq == 100


@pytest.mark.parametrize("mem", ["1.5", "-5", "500m", str(2**31), "lots"])
def test_invalid_memory_makes_request_invalid(mem):
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem})))
    assert r.nums == 0
    assert "nvidia.com/gpumem" in r.error and "'c'" in r.error


def test_defaults_from_config_and_memory_factor():
    cfg = RequestConfig(default_memory=2048, default_cores=20, memory_factor=2)
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1})), cfg)
    assert (r.memreq, r.mem_percentage_req, r.coresreq) == (2048, PERCENTAGE_UNSET, 20)
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})), cfg)
    assert r.memreq == 2000


def test_custom_resource_names_and_agent_config_shape():
    class Agent:  # AgentConfig-like: has a .nvidia section
        nvidia = RequestConfig(resource_count_name="hami.io/gpu", resource_memory_name="hami.io/gpumem")

    p = pod(ctr(limits={"hami.io/gpu": 1, "hami.io/gpumem": 1024, "nvidia.com/gpu": 3}))
    (r,) = container_requests(p, Agent())
    assert (r.nums, r.memreq) == (1, 1024)


def test_init_containers_first_and_no_gpu_containers_kept():
    p = pod(ctr("app1"), ctr("app2", limits={"nvidia.com/gpu": 1}),
            init=[ctr("init1", limits={"nvidia.com/gpu": 1, "nvidia.com/gpucores": 10})])
    rs = container_requests(p)
    assert [(r.container, r.init, r.nums) for r in rs] == [("init1", True, 1), ("app1", False, 0),
                                                           ("app2", False, 1)]


def test_priority_read():
    (r,) = container_requests(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/priority": 1})))
    assert r.priority == 1


def test_webhook_exclusive_default_and_gpu_num():
    assert webhook_resource_defaults(ctr(limits={"nvidia.com/gpu": 1})) == {"nvidia.com/gpucores": "100"}
    whole = ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100})
    assert webhook_resource_defaults(whole) == {"nvidia.com/gpucores": "100"}
    assert webhook_resource_defaults(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})) == {}
    assert webhook_resource_defaults(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30})) == {}
    assert webhook_resource_defaults(ctr(limits={"nvidia.com/gpumem": 1000})) == {"nvidia.com/gpu": "1"}
    assert webhook_resource_defaults(ctr(limits={"nvidia.com/gpucores": 20}),
                                     RequestConfig(default_gpu_num=2)) == {"nvidia.com/gpu": "2"}
    assert webhook_resource_defaults(ctr(limits={"cpu": "1"})) == {}


@pytest.mark.parametrize("text, value", [("2", 2), ("20k", 20000), ("1Ki", 1024), ("1e3", 1000),
                                         ("1.5k", 1500), ("500m", None), ("+3", 3)])
def test_quantities(text, value):
    assert quantity_as_int64(text) == value


def test_quantity_rejects_and_quotes():
    with pytest.raises(ProtocolError, match="'12 GB'"):
        parse_quantity("12 GB")


# ---------------------------------------------------------------- annotations

def test_gputype_use_nouse_case_insensitive_substring():
    t = "NVIDIA-NVIDIA A100-SXM4-80GB"
    assert check_type({}, t)
    assert check_type({"nvidia.com/use-gputype": "a100"}, t)
    assert check_type({"nvidia.com/use-gputype": "H100,A100"}, t)
    assert not check_type({"nvidia.com/use-gputype": "H100"}, t)
    assert not check_type({"nvidia.com/nouse-gputype": "A100"}, t)
    assert check_type({"nvidia.com/nouse-gputype": ""}, t)  # empty value: no constraint
    assert check_type({"nvidia.com/use-gputype": ""}, t)


def test_gpuuuid_exact_trimmed():
    assert check_uuid({"nvidia.com/use-gpuuuid": "GPU-a, GPU-b"}, "GPU-b")
    assert not check_uuid({"nvidia.com/use-gpuuuid": "GPU-a"}, "GPU-ab")
    assert not check_uuid({"nvidia.com/nouse-gpuuuid": "GPU-a"}, "GPU-a")
    assert check_uuid(None, "GPU-a")


def test_numa_and_mode():
    # HAMi's assertNuma (pkg/device/nvidia/device.go:482-491) reads the value with strconv.ParseBool
    for yes in ("1", "t", "T", "TRUE", "true", "True"):
        assert numa_bind({"nvidia.com/numa-bind": yes}), yes
    for no in ("0", "false", "yes", " true", "tRUE", ""):
        assert not numa_bind({"nvidia.com/numa-bind": no}), no
    assert mode_matches({"nvidia.com/vgpu-mode": "hami-core"}, "hami-core")
    assert not mode_matches({"nvidia.com/vgpu-mode": "mig"}, "hami-core")
    assert mode_matches({"nvidia.com/vgpu-mode": "mig"}, "")  # empty device mode passes (v2.10)
    assert mode_matches({}, "mig")
    # checkType (device.go:493-503): strings.Contains("", "mig") is false: an empty value matches no mode
    assert not mode_matches({"nvidia.com/vgpu-mode": ""}, "mig")


def test_scheduler_policies():
    assert node_scheduler_policy({}) == "binpack"
    assert node_scheduler_policy({"hami.io/node-scheduler-policy": "spread"}) == "spread"
    assert gpu_scheduler_policy({}) == ("spread",)
    assert gpu_scheduler_policy({"hami.io/gpu-scheduler-policy": "binpack,numa"}) == ("binpack", "numa")
    with pytest.raises(ProtocolError, match="'packed'"):
        node_scheduler_policy({"hami.io/node-scheduler-policy": "packed"})
    with pytest.raises(ProtocolError, match="'fastest'"):
        gpu_scheduler_policy({"hami.io/gpu-scheduler-policy": "binpack,fastest"})


def test_scoring_weights():
    assert parse_scoring_weights(None) == ScoringWeights(1, 1, 1)
    w = parse_scoring_weights("slot=0,core=2,memory=3")
    assert w == ScoringWeights(0, 2, 3) and parse_scoring_weights(w.encode()) == w
    # HAMi's texts (pkg/util/device_scoring_weights.go:57-101), %q-quoted like Go
    key = "invalid hami.io/device-scoring-weights annotation"
    for bad, what in [
            ("", "expected slot, core, and memory weights"),
            ("slot=1,core=1", "expected slot, core, and memory weights"),
            ("slot=0,core=0,memory=0", "at least one weight must be positive"),
            ("slot=-1,core=1,memory=1", '"slot" weight must not be negative'),
            ("slot=1,core=1,slot=2", 'duplicate "slot" weight'),
            ("gpu=1,core=1,memory=1", 'unknown weight "gpu"'),
            ("gpu=x,core=1,memory=1", '"gpu" weight must be an integer'),
            ("slot,core=1,memory=1", "expected key=value entries"),
            ("slot=\t1,core=\n,memory=1", '"core" weight must be an integer')]:
        quoted = '"' + bad.replace("\t", "\\t").replace("\n", "\\n") + '"'
        with pytest.raises(ProtocolError) as err:
            parse_scoring_weights(bad)
        assert str(err.value) == f"{key} {quoted}: {what}"


def test_device_cordon():
    assert parse_device_cordon("GPU-a, GPU-b,,") == frozenset({"GPU-a", "GPU-b"})
    assert parse_device_cordon(None) == frozenset()

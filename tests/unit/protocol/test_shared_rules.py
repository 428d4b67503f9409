"""Protocol helpers shared with the scheduler (Project-HAMi/HAMi pkg/device/nvidia/device.go): the pre-split
matching rules,
resource lookups, static MIG requests, whole-number quantities, and the Go-exact weights parser."""

from __future__ import annotations

import pytest

from hami_agent.config import NvidiaConfig
from hami_agent.protocol import (
    PERCENTAGE_UNSET,
    ProtocolError,
    RequestConfig,
    check_type,
    check_uuid,
    gpu_scheduler_policy,
    keys,
    mode_matches,
    parse_scoring_weights,
)
from hami_agent.protocol.annotations import mode_allowed, split_list, type_allowed, uuid_allowed
from hami_agent.protocol.quantity import quantity_int
from hami_agent.protocol.requests import (
    hami_resource_names,
    has_hami_resources,
    memory_for_request,
    mig_requests,
    resource_int,
    resource_value,
)
from tests.unit.protocol.test_requests import ctr

pytestmark = pytest.mark.unit


def test_split_list_trims_and_drops_blanks():
    assert split_list(" a, b ,,c ,") == ("a", "b", "c")
    assert split_list("") == () and split_list(None) == ()


def test_presplit_rules_equal_the_annotation_checks():
    t = "NVIDIA-NVIDIA A100-SXM4-80GB"
    for use, nouse in [((), ()), (("a100",), ()), (("H100", "A100"), ()), (("h100",), ()), ((), ("A100",)),
                       (("a100",), ("sxm4",))]:
        ann = {keys.USE_GPUTYPE: ",".join(use), keys.NOUSE_GPUTYPE: ",".join(nouse)}
        assert type_allowed(t, use, nouse) == check_type(ann, t)
    assert type_allowed(t, ("a100",)) and not type_allowed(t, ("h100",)) and not type_allowed(t, (), ("A1",))
    assert uuid_allowed("GPU-b", ("GPU-a", "GPU-b")) and not uuid_allowed("GPU-ab", ("GPU-a",))
    assert not uuid_allowed("GPU-a", (), frozenset({"GPU-a"}))
    assert uuid_allowed("GPU-a", ()) == check_uuid({}, "GPU-a")
    assert mode_allowed(None, "mig") and mode_allowed("mig", "") and not mode_allowed("mig", "hami-core")
    assert mode_allowed("hami-core,mig", "mig") == mode_matches({keys.VGPU_MODE: "hami-core,mig"}, "mig")


def test_memory_rule():
    assert memory_for_request(3000, 50, 8000) == 3000  # explicit MiB wins
    assert memory_for_request(0, 50, 8001) == 4000  # integer percentage of the card
    assert memory_for_request(0, PERCENTAGE_UNSET, 8000) == 0


def test_resource_lookup_limits_first_and_integer_values():
    c = ctr(limits={"nvidia.com/gpucores": "30"}, requests={"nvidia.com/gpucores": "50", "nvidia.com/gpu": 1})
    assert resource_value(c, "nvidia.com/gpucores") == (True, "30")
    assert resource_value(c, "nvidia.com/gpumem") == (False, None)
    assert resource_int(c, "nvidia.com/gpucores") == 30 and resource_int(c, "nvidia.com/gpu") == 1
    assert resource_int(ctr(limits={"nvidia.com/priority": "1e1"}), "nvidia.com/priority") == 10
    assert resource_int(ctr(limits={"nvidia.com/priority": "500m"}), "nvidia.com/priority") is None
    assert resource_int(ctr(limits={"nvidia.com/priority": "high"}), "nvidia.com/priority") is None
    assert resource_int(ctr(), "nvidia.com/priority") is None


def test_hami_resource_names_from_either_config_shape():
    custom = NvidiaConfig(resource_count_name="example.com/vgpu")
    defaults = hami_resource_names(None)
    assert defaults == hami_resource_names(RequestConfig()) == hami_resource_names(NvidiaConfig())
    assert hami_resource_names(custom)[0] == "example.com/vgpu"
    assert has_hami_resources(ctr(requests={"nvidia.com/gpumem": "1000"}))
    assert not has_hami_resources(ctr(limits={"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}))
    assert has_hami_resources(ctr(limits={"example.com/vgpu": "1"}), custom)
    assert not has_hami_resources(ctr(limits={"nvidia.com/gpu": "1"}), custom)


def test_mig_requests_sum_app_containers_limits_winning():
    pod = {"spec": {
        "initContainers": [ctr(limits={"nvidia.com/mig-1g.10gb": "5"}, name="init")],
        "containers": [ctr(limits={"nvidia.com/mig-1g.10gb": "1"}, requests={"nvidia.com/mig-1g.10gb": "3",
                                                                             "nvidia.com/mig-2g.20gb": "2"}),
                       ctr(limits={"nvidia.com/mig-1g.10gb": "2000m", "nvidia.com/mig-3g.40gb": "0"},
                           name="d")]}}
    assert mig_requests(pod) == {"1g.10gb": 3, "2g.20gb": 2}
    pod["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] = "1.5"
    with pytest.raises(ProtocolError, match="'d' resource nvidia.com/mig-3g.40gb"):
        mig_requests(pod)
    pod["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] = "-1"
    with pytest.raises(ProtocolError, match="non-negative"):
        mig_requests(pod)


def test_quantity_int():
    assert quantity_int("8") == 8 and quantity_int("2e3") == 2000 and quantity_int(4) == 4
    for bad in ("0.5", "500m", "x", str(2**63)):
        with pytest.raises(ProtocolError):
            quantity_int(bad, "allocatable nvidia.com/gpu")


# HAMi's ParseDeviceScoringWeights uses strconv.ParseInt(value, 10, 64).
@pytest.mark.parametrize("value, want", [("slot=+2,core=0,memory=1", (2, 0, 1)),
                                         (" slot = 1 , core=2 ,memory= 3 ", (1, 2, 3)),
                                         ("slot=9223372036854775807,core=0,memory=0", (2**63 - 1, 0, 0))])
def test_scoring_weights_accepts_what_parseint_accepts(value, want):
    w = parse_scoring_weights(value)
    assert (w.slot, w.core, w.memory) == want


@pytest.mark.parametrize("value", ["slot=1_0,core=1,memory=1", "slot=\u0661,core=1,memory=1",
                                   "slot=9223372036854775808,core=1,memory=1", "slot=1.0,core=1,memory=1",
                                   "slot=1,core=1,memory=1,"])
def test_scoring_weights_rejects_what_parseint_rejects(value):
    with pytest.raises(ProtocolError, match="device-scoring-weights"):
        parse_scoring_weights(value)


@pytest.mark.parametrize("value", ["BINPACK", "binpack,,numa", "binpack,", "Spread"])
def test_gpu_policy_tokens_are_exact(value):
    # HAMi's ValidGPUSchedulerPolicy: trimmed tokens compared exactly; the caller falls back to its default
    with pytest.raises(ProtocolError, match="gpu-scheduler-policy"):
        gpu_scheduler_policy({keys.GPU_SCHEDULER_POLICY: value})

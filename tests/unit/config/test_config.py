"""Agent config: HAMi device-config.yaml, per-node JSON, our agent section (Project-HAMi/HAMi
pkg/device/nvidia/device.go NvidiaConfig)."""

from __future__ import annotations

import json
import logging

import pytest

from hami_agent.config import AgentConfig, ConfigError, build_config, load_config
from hami_agent.protocol import container_requests

pytestmark = pytest.mark.unit

# The shape of HAMi's chart ConfigMap hami-scheduler-device / device-config.yaml (values of the chart).
HAMI_DEVICE_CONFIG = """\
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
  gpuCorePolicy: default
  libCudaLogLevel: 1
  migProfileAllowlist:
    - models: ["H20"]
      profiles: ["1g.12gb", "3g.48gb"]
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - name: 1g.5gb
            memory: 5120
            count: 7
cambricon:
  resourceCountName: cambricon.com/vmlu
"""

NODE_JSON = {"nodeconfig": [
    {"name": "gpu-1", "operatingmode": "mig", "devicesplitcount": 4, "devicememoryscaling": 1.5,
     "devicecorescaling": 1, "migstrategy": "mixed", "filterdevices": {"uuid": ["GPU-x"], "index": [2]},
     "enablegetpreferredallocation": True},
    {"name": "gpu-2", "operatingmode": "mps"},
]}


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_defaults_without_file():
    cfg = load_config(None, "gpu-1")
    assert isinstance(cfg, AgentConfig)
    assert cfg.nvidia.resource_count_name == "nvidia.com/gpu"
    assert cfg.node.device_split_count == 10 and cfg.node.operating_mode == "hami-core"
    assert cfg.agent.register_interval_s == 30 and cfg.agent.register_retry_s == 5
    assert cfg.agent.rpc_deadline_s == 2 and cfg.agent.nvml_call_timeout_s == 5
    assert cfg.agent.mig_apply_lock_path == "/run/hami/mig-apply.lock"  # root-owned, not HAMi's /tmp
    assert cfg.agent.vgpu_dir == "/usr/local/vgpu"
    assert cfg.warnings == ()


def test_hami_chart_device_config_loads_without_warnings(tmp_path):
    cfg = load_config(write(tmp_path, "device-config.yaml", HAMI_DEVICE_CONFIG), "gpu-1")
    assert cfg.warnings == ()
    assert cfg.nvidia.lib_cuda_log_level == "1"
    assert cfg.nvidia.mig_profile_allowlist[0].matches("NVIDIA H20")
    assert cfg.nvidia.known_mig_geometries[0].allowed_geometries[0][0].count == 7


def test_per_node_json_separate_file_overrides_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "device-config.yaml", HAMI_DEVICE_CONFIG), "gpu-1",
                      node_config_path=write(tmp_path, "config.json", json.dumps(NODE_JSON)))
    n = cfg.node
    assert n.matched and n.name == "gpu-1"
    got = (n.operating_mode, n.device_split_count, n.device_memory_scaling, n.mig_strategy)
    assert got == ("mig", 4, 1.5, "mixed")
    assert n.filter_devices.excludes("GPU-x", 0) and n.filter_devices.excludes("GPU-y", 2)
    assert not n.filter_devices.excludes("GPU-y", 0)
    assert n.enable_get_preferred_allocation
    assert any("deviceMemoryScaling is ignored in mig mode" in w for w in cfg.warnings)


def test_other_node_gets_its_own_entry_or_defaults():
    assert build_config([NODE_JSON], "gpu-2").node.operating_mode == "mps"
    other = build_config([NODE_JSON], "gpu-3").node
    assert not other.matched and other.operating_mode == "hami-core"
    assert other.filter_devices.uuids == ()


def test_zero_values_in_node_entry_do_not_override_like_hami_mergo():
    cfg = build_config([{"nvidia": {"deviceSplitCount": 7},
                         "nodeconfig": [{"name": "n", "devicesplitcount": 0}]}], "n")
    assert cfg.node.device_split_count == 7


def test_json_and_yaml_both_accepted_and_keys_case_insensitive(tmp_path):
    doc = {"nvidia": {"devicesplitcount": 3, "ResourceCountName": "hami.io/gpu"}, "agent": {
        "registerIntervalSeconds": 1, "registerRetrySeconds": 0.5, "hookPath": "/opt/hami"}}
    cfg = load_config(write(tmp_path, "c.json", json.dumps(doc)), None)
    assert cfg.nvidia.device_split_count == 3 and cfg.nvidia.resource_count_name == "hami.io/gpu"
    assert (cfg.agent.register_interval_s, cfg.agent.register_retry_s) == (1.0, 0.5)
    assert cfg.agent.vgpu_dir == "/opt/hami/vgpu"


def test_config_drives_request_parsing():
    cfg = build_config([{"nvidia": {"resourceCountName": "hami.io/gpu", "defaultMemory": 1024}}], None)
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"hami.io/gpu": "1"}}}]}}
    (r,) = container_requests(pod, cfg)
    assert (r.nums, r.memreq) == (1, 1024)


def test_unknown_keys_warn_and_are_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="hami_agent.config"):
        cfg = build_config([{"nvidia": {"deviceSplitCnt": 3}, "agnet": {}, "hygon": {"x": 1}}], None)
    assert "unknown config key nvidia.deviceSplitCnt ignored" in cfg.warnings
    assert "unknown config key agnet ignored" in cfg.warnings
    assert not any("hygon" in w for w in cfg.warnings)  # other vendors' sections are silently skipped
    assert "deviceSplitCnt" in caplog.text


@pytest.mark.parametrize("doc, field, value, fix", [
    ({"nvidia": {"deviceSplitCount": 0}}, "nvidia.deviceSplitCount", "0", ">= 1"),
    ({"nvidia": {"deviceMemoryScaling": -1}}, "nvidia.deviceMemoryScaling", "-1", "> 0"),
    ({"nvidia": {"deviceCoreScaling": "big"}}, "nvidia.deviceCoreScaling", "'big'", "> 0"),
    ({"nvidia": {"defaultCores": 120}}, "nvidia.defaultCores", "120", "<= 100"),
    ({"nvidia": {"gpuCorePolicy": "always"}}, "nvidia.gpuCorePolicy", "'always'", "'force'"),
    ({"nvidia": {"resourceCountName": "gpu"}}, "nvidia.resourceCountName", "'gpu'", "nvidia.com/gpu"),
    ({"nvidia": {"libCudaLogLevel": 9}}, "nvidia.libCudaLogLevel", "'9'", "'4'"),
    ({"nvidia": {"overwriteEnv": "maybe"}}, "nvidia.overwriteEnv", "'maybe'", "true or false"),
    ({"nvidia": {"preConfiguredDeviceMemory": True}}, "nvidia.preConfiguredDeviceMemory", "True", "integer"),
    ({"nvidia": []}, "nvidia", "[]", "mapping"),
    ({"agent": {"registerIntervalSeconds": 0}}, "agent.registerIntervalSeconds", "0", "seconds > 0"),
    ({"nodeconfig": [{"name": "n", "operatingmode": "vgpu"}]}, "nodeconfig[0].operatingmode", "'vgpu'",
     "'hami-core'"),
    ({"nodeconfig": [{"name": "n", "migstrategy": "all"}]}, "nodeconfig[0].migstrategy", "'all'", "'mixed'"),
    ({"nodeconfig": [{"operatingmode": "mig"}]}, "nodeconfig[0].name", "None", "node's Kubernetes name"),
    ({"nodeconfig": [{"name": "n", "filterdevices": {"index": ["0"]}}]},
     "nodeconfig[0].filterdevices.index[0]", "'0'", "integer"),
    ({"nodeconfig": [{"name": "n", "filterdevices": {"serial": ["x"]}}]}, "nodeconfig[0].filterdevices",
     "serial", "'uuid' and 'index'"),
    ({"nodeconfig": {"name": "n"}}, "nodeconfig", "{'name': 'n'}", "list"),
])
def test_bad_values_name_field_value_and_fix(doc, field, value, fix):
    with pytest.raises(ConfigError) as err:
        build_config([doc], "n")
    msg = str(err.value)
    assert msg.startswith(field + ":"), msg
    assert value in msg and fix in msg


def test_bad_entry_for_another_node_still_fails():
    with pytest.raises(ConfigError, match="nodeconfig\\[1\\].devicesplitcount"):
        build_config([{"nodeconfig": [{"name": "a"}, {"name": "b", "devicesplitcount": -2}]}], "a")


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"), None)
    with pytest.raises(ConfigError, match="not valid YAML/JSON"):
        load_config(write(tmp_path, "bad.yaml", "nvidia: [unclosed"), None)
    with pytest.raises(ConfigError, match="top-level"):
        load_config(write(tmp_path, "list.yaml", "- 1\n- 2\n"), None)
    assert load_config(write(tmp_path, "empty.yaml", ""), None) == build_config([], None, source=str(
        tmp_path / "empty.yaml"))


def test_duplicate_node_entry_warns_and_first_wins():
    cfg = build_config([{"nodeconfig": [{"name": "n", "devicesplitcount": 2},
                                        {"name": "n", "devicesplitcount": 3}]}], "n")
    assert cfg.node.device_split_count == 2
    assert any("second nodeconfig entry" in w for w in cfg.warnings)


# --------------------------------------------------------------------- dynamic MIG allowlist (HAMi v2.10)
@pytest.mark.parametrize("entry, field, text", [
    ({"models": ["A100"]}, "migProfileAllowlist[0]", "must define models and profiles"),
    ({"profiles": ["1g.10gb"]}, "migProfileAllowlist[0]", "must define models and profiles"),
    ({"models": ["A100"], "profiles": ["1g.10gb", "big"]}, "migProfileAllowlist[0].profiles[1]",
     'invalid MIG profile "big"'),
    ({"models": ["A100"], "profiles": ["g.10gb"]}, "migProfileAllowlist[0].profiles[0]",
     'invalid MIG profile "g.10gb"'),
])
def test_mig_allowlist_is_validated_like_hami(entry, field, text):
    # HAMi's ValidateMigProfileAllowlist (pkg/device/nvidia/mig_profiles.go:28-41) stops its scheduler and
    # device plugin on these; the agent refuses the config, naming the entry. It used to accept them.
    with pytest.raises(ConfigError) as err:
        build_config([{"nvidia": {"migProfileAllowlist": [entry]}}], "n")
    assert field in str(err.value) and text in str(err.value)


def test_operatingmode_mig_is_served_and_legacy_geometries_get_a_migration_hint():
    cfg = build_config([{"nvidia": {"knownMigGeometries": [
        {"models": ["A100"], "allowedGeometries": [[{"name": "1g.10gb", "memory": 9728, "count": 7}],
                                                   [{"name": "3g.40gb", "memory": 40192, "count": 2}]]}]},
        "nodeconfig": [{"name": "n", "operatingmode": "mig"}]}], "n")
    assert cfg.node.operating_mode == "mig"
    assert any("without nvidia.migProfileAllowlist" in w for w in cfg.warnings)
    assert any("['1g.10gb', '3g.40gb']" in w for w in cfg.warnings)

"""The sandbox reads node names, profiles and ports from its inventory (one source of truth)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from sandbox import config

pytestmark = pytest.mark.unit


def test_embedded_inventory_loads_with_distinct_ports() -> None:
    cfg = config.load(Path("/nonexistent-run"))
    names = [n.name for n in cfg.nodes]
    assert names == ["gpu-h20", "gpu-a100", "gpu-a100-2", "gpu-a100-3"]  # 4 nodes: a fleet to roll over
    assert cfg.node("gpu-h20").profile == "h20-mig-mixed"
    assert cfg.node("gpu-h20").initial_driver == "570.158.01"
    assert cfg.node("gpu-a100").initial_driver == ""
    assert cfg.control_node == "hami-control"
    ports = cfg.all_ports()
    assert len(ports) == len(set(ports))
    # the paths the containers bind-mount are per node
    assert cfg.device_plugin_dir("gpu-h20") != cfg.device_plugin_dir("gpu-a100")
    assert cfg.hook_dir("gpu-h20") == cfg.host_root("gpu-h20") / "usr" / "local"


def test_profiles_named_by_the_inventory_exist() -> None:
    cfg = config.load()
    for node in cfg.nodes:
        assert (config.GPUSIM_DIR / "profiles" / f"{node.profile}.json").is_file(), node.profile


def _copy_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(config.INVENTORY, inv)
    return inv


def test_duplicate_port_is_refused_naming_the_ports(tmp_path: Path) -> None:
    inv = _copy_inventory(tmp_path)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["gpu_nodes"]["hosts"]["gpu-a100"]["hami_agent_metrics_port"] = 19394
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    with pytest.raises(config.ConfigError, match=r"port\(s\) \[19394\] used twice"):
        config.load(tmp_path, inventory=inv)


def test_missing_profile_key_names_host_and_key(tmp_path: Path) -> None:
    inv = _copy_inventory(tmp_path)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    del hosts["all"]["children"]["gpu_nodes"]["hosts"]["gpu-h20"]["sandbox_gpusim_profile"]
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    with pytest.raises(config.ConfigError, match="host gpu-h20 needs sandbox_gpusim_profile"):
        config.load(tmp_path, inventory=inv)


def test_run_dir_too_long_for_the_kubelet_socket_is_refused() -> None:
    with pytest.raises(config.ConfigError, match="107-byte unix socket limit"):
        config.load(Path("/tmp/" + "x" * 80))


def test_scheduler_preemption_is_one_setting() -> None:
    """The control node's unit (hami_scheduler_preemption in the inventory), the host-mode extender and the
    RBAC the simulated API server starts with (sandbox/config.py) run the same preemption mode (step g)."""
    group_vars = yaml.safe_load((config.INVENTORY / "group_vars" / "all.yml").read_text())
    expr = group_vars["hami_scheduler_preemption"]
    assert config.PREEMPTION_ENV in expr and "'extender' if" in expr and "else 'off'" in expr
    assert config.SCHEDULER_PREEMPTION == ("extender" if config.PREEMPTION_ON else "off")

"""What roles/hami_agent writes for the DRA driver: the unit's flags parse, the config in each
hami_agent_mode gives the device plugin, the DRA driver and the extender the same partition, and the
DeviceClasses pass the API server's validation with selectors that select the right devices."""

import argparse
import shlex

import pytest
import yaml

from hami_agent.config import build_config
from hami_agent.dra import cmd as dra_cmd
from tests.sim.apiserver_resource import class_strategy
from tests.sim.dra_cel import DEFAULT as CEL
from tests.sim.dra_cluster import device_classes
from tests.unit.roles.test_unit_templates import execstart, render, render_env, role_vars

pytestmark = pytest.mark.unit

DRIVER = "gpu.hami.io"


def agent_vars(**overrides):
    v = role_vars("hami_agent", **{"inventory_hostname": "gpu-1", **overrides})
    v.setdefault("groups", {"gpu_nodes": ["gpu-1"]})
    v.setdefault("hostvars", {})
    return v


def render_config(**overrides):
    env = render_env()
    env.filters["combine"] = lambda a, b: {**a, **b}
    env.filters["union"] = lambda a, b: list(dict.fromkeys([*a, *b]))
    env.filters["to_nice_yaml"] = lambda v, **kw: yaml.safe_dump(v, sort_keys=False)
    from tests.unit.roles.test_unit_templates import ROLES

    text = env.from_string((ROLES / "hami_agent" / "templates" / "device-config.yaml.j2").read_text())
    return yaml.safe_load(text.render(**agent_vars(**overrides)))


def test_the_dra_unit_runs_hami_agent_dra_with_flags_it_accepts():
    unit = render(
        "hami_agent", "hami-dra.service.j2", agent_vars(hami_agent_dra_extra_args=["--rpc-deadline 4"])
    )
    argv = shlex.split(execstart(unit))
    assert argv[0].endswith("/bin/hami-agent") and argv[1] == "dra"
    p = argparse.ArgumentParser()
    p.add_argument("-v", type=int)
    dra_cmd.add_arguments(p)
    args = p.parse_args(argv[2:])
    assert args.driver_name == DRIVER and args.cdi_dir == "/var/run/cdi" and args.rpc_deadline == 4
    assert "LimitNOFILE=" in unit and "KUBECONFIG=/etc/hami/kubeconfig" in unit


def test_config_per_mode():
    assert "dra" not in render_config()  # device-plugin: nothing changes for existing deployments
    cfg = build_config([render_config(hami_agent_mode="dra")], "gpu-1")
    assert cfg.dra.partition_for("gpu-1").all
    both = render_config(hami_agent_mode="both", hami_agent_dra_devices={"index": [4, 5, 6, 7]})
    assert build_config([both], "gpu-1").dra.partition_for("gpu-1").indexes == (4, 5, 6, 7)
    # the control host (scheduler) lists every GPU node's partition from the inventory
    ctl = render_config(
        inventory_hostname="control-1",
        groups={"gpu_nodes": ["gpu-1", "gpu-2", "gpu-3"]},
        hostvars={
            "gpu-1": {"hami_agent_mode": "dra"},
            "gpu-2": {"hami_agent_mode": "both", "hami_agent_dra_devices": {"uuid": ["GPU-x"]}},
            "gpu-3": {},
        },
    )
    dra = build_config([ctl], "control-1").dra
    assert dra.partition_for("gpu-1").all and dra.partition_for("gpu-2").uuids == ("GPU-x",)
    assert dra.partition_for("gpu-3").empty and dra.partition_for("control-1").empty


def test_device_classes_are_valid_and_select_the_right_devices():
    classes = device_classes(DRIVER, extended=True)
    assert [c["metadata"]["name"] for c in classes] == [DRIVER, f"mig.{DRIVER}", f"extended.{DRIVER}"]
    assert classes[2]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    for c in classes:
        class_strategy(None, c, None, False)  # compiles every selector, as kube-apiserver does on create
    gpu = {"attributes": {"type": {"string": "gpu"}}}
    mig = {"attributes": {"type": {"string": "mig"}}}
    sel = {c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"] for c in classes}
    assert CEL.matches(sel[DRIVER], DRIVER, gpu) and not CEL.matches(sel[DRIVER], DRIVER, mig)
    assert CEL.matches(sel[f"mig.{DRIVER}"], DRIVER, mig) and not CEL.matches(
        sel[f"mig.{DRIVER}"], "x.io", mig
    )
    assert len(device_classes(DRIVER)) == 2  # the extended-resource class only when asked for

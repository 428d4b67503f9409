"""One MIG apply lock for the nvidia_mig role, the device plugin and the monitor: the hami_agent units
pass ``nvidia_mig_apply_lock_path`` to both (``--mig-apply-lock``), its default is the agent's own
default in a root-owned directory (not HAMi's shared ``/tmp``), and the role creates that directory
root-owned 0755 so the agent trusts the lock (``hami_agent.miglock``)."""

from __future__ import annotations

import re

import pytest
import yaml

from hami_agent.protocol import keys
from tests.unit.roles.test_unit_templates import ROLES, render, role_vars

pytestmark = pytest.mark.unit

UNITS = ("hami-device-plugin.service.j2", "hami-monitor.service.j2")


def lock_flags(variables: dict) -> list[str]:
    out = []
    for unit in UNITS:
        m = re.search(r"--mig-apply-lock (\S+)", render("hami_agent", unit, variables))
        assert m, f"{unit} does not pass --mig-apply-lock"
        out.append(m.group(1))
    return out


def test_units_use_the_nvidia_mig_roles_lock_by_default():
    default = yaml.safe_load((ROLES / "nvidia_mig" / "defaults" / "main.yml").read_text())
    assert default["nvidia_mig_apply_lock_path"] == keys.MIG_APPLY_LOCK_PATH == "/run/hami/mig-apply.lock"
    assert lock_flags(role_vars("nvidia_mig", "hami_agent")) == [keys.MIG_APPLY_LOCK_PATH] * 2
    # a GPU node without the MIG role in its play still gets the same path
    assert lock_flags(role_vars("hami_agent")) == [keys.MIG_APPLY_LOCK_PATH] * 2


def test_one_variable_moves_all_three():
    variables = role_vars("nvidia_mig", "hami_agent", nvidia_mig_apply_lock_path="/run/site/mig.lock")
    assert lock_flags(variables) == ["/run/site/mig.lock"] * 2


def test_argument_specs_state_the_same_defaults():
    for role, var in (("nvidia_mig", "nvidia_mig_apply_lock_path"),
                      ("hami_agent", "hami_agent_mig_apply_lock_path")):
        spec = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
        assert spec["argument_specs"]["main"]["options"][var]["default"] == keys.MIG_APPLY_LOCK_PATH


def test_the_role_creates_the_lock_directory_root_owned():
    tasks = yaml.safe_load((ROLES / "nvidia_mig" / "tasks" / "main.yml").read_text())
    block = next(t for t in tasks if "block" in t)["block"]
    made = {t["name"]: t.get("ansible.builtin.file") or t.get("ansible.builtin.copy") for t in block
            if "ansible.builtin.file" in t or "ansible.builtin.copy" in t}
    directory = next(v for k, v in made.items() if "directory" in k)
    lock = next(v for k, v in made.items() if "Take the MIG apply lock" in k)
    assert (directory["owner"], directory["group"], directory["mode"]) == ("root", "root", "0755")
    assert (lock["owner"], lock["group"], lock["mode"]) == ("root", "root", "0644")

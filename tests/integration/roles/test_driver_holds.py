"""roles/nvidia_driver/tasks/install.yml: the role's one reading (hami.node.nvidia_driver_facts, one
dpkg-query) has every driver package's selection, and dpkg_selections (one task, holding or releasing as
nvidia_driver_hold says) runs only for the packages whose selection differs (a converged node runs it for
none).

The role's own loop expressions are evaluated by ansible-playbook on localhost against the module's
``selections`` (packages dpkg does not know are missing from it), and the module's query is run against
the real dpkg-query where there is one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
TASKS = yaml.safe_load((ROOT / "roles" / "nvidia_driver" / "tasks" / "install.yml").read_text())
PACKAGES = ["nvidia-driver-570", "nvidia-utils-570", "libnvidia-compute-570", "nvidia-dkms-570"]


def _task(name: str) -> dict:
    return next(t for t in TASKS if t["name"] == name)


def _loops(selections: dict[str, str], tmp_path: Path) -> dict[str, list[str]]:
    """The hold task's loop, as Ansible evaluates it, for the reading's ``selections``: with
    nvidia_driver_hold true ("hold") and false ("release")."""
    task = _task("Hold the driver packages, or release the holds")
    tasks = [{"name": f"loop {name}", "ansible.builtin.debug": {"msg": task["loop"]},
              "vars": {**task["vars"], "nvidia_driver_hold": hold}}
             for name, hold in (("hold", True), ("release", False))]
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {"_nvidia_driver_packages": PACKAGES,
                      "_nvidia_driver_read": {"selections": selections}},
             "tasks": tasks}]
    pb = tmp_path / "loops.yml"
    pb.write_text(yaml.safe_dump(play, width=4096))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(pb)]
    proc = subprocess.run(argv, capture_output=True,
                          text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    done = doc["plays"][0]["tasks"]
    return {name: done[i]["hosts"]["localhost"]["msg"] for i, name in enumerate(("hold", "release"))}


def test_a_converged_node_runs_dpkg_selections_for_no_package(tmp_path: Path) -> None:
    loops = _loops({p: "hold" for p in PACKAGES}, tmp_path)
    assert loops["hold"] == []
    assert loops["release"] == PACKAGES  # hold -> install everywhere, were holds released


def test_only_packages_whose_selection_differs_are_set(tmp_path: Path) -> None:
    # nvidia-dkms-570 is unknown to dpkg: the reading leaves it out, dpkg_selections still gets it (as before)
    selections = {
        "nvidia-driver-570": "hold",
        "nvidia-utils-570": "install",
        "libnvidia-compute-570": "deinstall",
    }
    loops = _loops(selections, tmp_path)
    assert loops["hold"] == ["nvidia-utils-570", "libnvidia-compute-570", "nvidia-dkms-570"]
    assert loops["release"] == ["nvidia-driver-570", "libnvidia-compute-570", "nvidia-dkms-570"]


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg on this machine")
def test_the_modules_query_reads_the_real_dpkg() -> None:
    from tests.unit.plugins.collection_path import install

    install()
    from ansible_collections.hami.node.plugins.modules import nvidia_driver_facts

    fmt = "--showformat=" + nvidia_driver_facts.DPKG_FORMAT
    proc = subprocess.run(
        ["dpkg-query", "--show", fmt, "dpkg", "no-such-package-hami"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert proc.returncode == 1  # a missing package: the module reads the others all the same
    installed, selections = nvidia_driver_facts.parse_dpkg(proc.stdout)
    assert list(installed) == ["dpkg"] and installed["dpkg"][0].isdigit()
    assert list(selections) == ["dpkg"] and selections["dpkg"] in ("install", "hold", "deinstall", "purge")

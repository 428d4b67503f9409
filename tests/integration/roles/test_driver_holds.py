"""roles/nvidia_driver/tasks/install.yml: one dpkg-query reads every driver package's selection, and
dpkg_selections (one task, holding or releasing as nvidia_driver_hold says) runs only for the packages whose
selection differs (a converged node runs it for none).

The role's own loop expressions are evaluated by ansible-playbook on localhost against dpkg-query answers
of the shape the real command prints (``${Package} ${db:Status-Want}``; packages that are not installed are
missing from it), and the query's argv is checked against the real dpkg-query where there is one.
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


def _loops(lines: list[str], tmp_path: Path) -> dict[str, list[str]]:
    """The hold task's loop, as Ansible evaluates it, for dpkg-query output ``lines``: with
    nvidia_driver_hold true ("hold") and false ("release")."""
    task = _task("Hold the driver packages, or release the holds")
    tasks = [{"name": f"loop {name}", "ansible.builtin.debug": {"msg": task["loop"]},
              "vars": {**task["vars"], "nvidia_driver_hold": hold}}
             for name, hold in (("hold", True), ("release", False))]
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {"_nvidia_driver_packages": PACKAGES,
                      "_nvidia_driver_selections": {"stdout_lines": lines, "rc": 1}},
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
    loops = _loops([f"{p} hold" for p in PACKAGES], tmp_path)
    assert loops["hold"] == []
    assert loops["release"] == PACKAGES  # hold -> install everywhere, were holds released


def test_only_packages_whose_selection_differs_are_set(tmp_path: Path) -> None:
    # nvidia-dkms-570 is not installed: dpkg-query leaves it out, dpkg_selections still gets it (as before)
    lines = ["nvidia-driver-570 hold", "nvidia-utils-570 install", "libnvidia-compute-570 deinstall"]
    loops = _loops(lines, tmp_path)
    assert loops["hold"] == ["nvidia-utils-570", "libnvidia-compute-570", "nvidia-dkms-570"]
    assert loops["release"] == ["nvidia-driver-570", "libnvidia-compute-570", "nvidia-dkms-570"]


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg on this machine")
def test_the_query_prints_one_package_and_selection_a_line() -> None:
    fmt = _task("Read the driver packages' dpkg selections")["vars"]["_format"]
    proc = subprocess.run(["dpkg-query", "--show", f"--showformat={fmt}", "dpkg", "no-such-package-hami"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1  # a missing package: the role's failed_when: false
    assert proc.stdout.splitlines() == [f"dpkg {proc.stdout.split()[1]}"]
    assert proc.stdout.split()[1] in ("install", "hold", "deinstall", "purge")

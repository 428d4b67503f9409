"""site.yml rolls disruptive nodes in inventory order, whatever order their plans finish in.

The grouping task is taken verbatim from playbooks/site.yml's plan play and run on local hosts whose plan
results take longer to read the earlier the host is in the inventory (a sleep inside the variable the task
reads), as real nodes do when one answers slower. ``group_by`` filed hosts in the order its per-host results
arrived, so a run's batches (and its canary) changed from run to run; this test fails with it. (The roll
planner keeps the order it is given: tests/unit/plugins/test_rollout_plan.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.plugins.ansible_runner import VENV_BIN, ansible_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[3]


def _grouping_task() -> dict:
    """The grouping task of site.yml's plan play."""
    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    [plan] = [p for p in plays if str(p.get("name", "")).startswith("Plan what would change")]
    [task] = [t for t in plan["tasks"] if t["name"].startswith("Plan | group the nodes")]
    return task


def test_batches_follow_the_inventory_not_the_order_plans_finish(tmp_path: Path) -> None:
    # n1..n6 in inventory order; n1 finishes last. n5 is resuming an earlier maintenance, n3 is quiet.
    hosts = {f"n{i}": {"delay": round(0.2 * (6 - i), 1), "resume": i == 5, "needed": i != 3}
             for i in range(1, 7)}
    # templated lazily, when the grouping task reads it: n1's answer comes last
    slow = {"node_maintenance_resume": "{{ lookup('pipe', 'sleep ' ~ delay ~ '; echo ' ~ resume) | bool }}",
            "node_maintenance_needed": "{{ needed }}"}
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {
        h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **v, **slow}
        for h, v in hosts.items()}}}}}))
    grouping = _grouping_task()
    book = tmp_path / "order.yml"
    book.write_text(yaml.safe_dump([
        {"name": "plan", "hosts": "gpu_nodes", "gather_facts": False, "tasks": [grouping]},
        {"name": "roll", "hosts": "site_rollout_candidates", "gather_facts": False, "serial": 1,
         "tasks": [{"name": "batch", "ansible.builtin.debug": {"msg": "ROLL {{ inventory_hostname }}"}}]},
        {"name": "converge", "hosts": "site_converge", "gather_facts": False, "serial": 1,
         "tasks": [{"name": "converge",
                    "ansible.builtin.debug": {"msg": "CONVERGE {{ inventory_hostname }}"}}]},
    ]))
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), str(book), "-f", "6"],
                          env=ansible_env(tmp_path, stubs=False), capture_output=True, text=True, timeout=100,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]

    def said(word: str) -> list[str]:
        return [ln.split(word + " ")[1].strip('" ') for ln in proc.stdout.splitlines()
                if f'"msg": "{word} ' in ln]

    # the resuming node first, then the rest in inventory order; every node converges, in inventory order
    assert said("ROLL") == ["n5", "n1", "n2", "n4", "n6"], proc.stdout[-3000:]
    assert said("CONVERGE") == ["n1", "n2", "n3", "n4", "n5", "n6"]
    assert "changed=0" in proc.stdout and "changed=1" not in proc.stdout

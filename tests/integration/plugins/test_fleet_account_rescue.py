"""The per-node account against real ansible-playbook runs: a failure that a block's ``rescue`` handles is not
a failed host (Ansible's recap says ``rescued``), one that no rescue handles is, nested blocks and included
tasks included (the callback finds the rescue through the task's parents)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.plugins.ansible_runner import VENV_BIN, ansible_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def account_of(tmp_path, book: str) -> tuple[int, dict]:
    env = ansible_env(tmp_path, stubs=False)
    env["ANSIBLE_CALLBACKS_ENABLED"] = "hami.node.fleet_account"
    env["HAMI_NODE_ACCOUNT_FILE"] = str(tmp_path / "account.json")
    (tmp_path / "playbook.yml").write_text(book)
    # a node of its own name (the account leaves "localhost", the controller, out), reached locally
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", "node-a,", "-c", "local",
           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "playbook.yml")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert (tmp_path / "account.json").exists(), proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.returncode, json.loads((tmp_path / "account.json").read_text())


def test_a_rescued_failure_is_not_a_failed_host(tmp_path):
    (tmp_path / "inner.yml").write_text(
        "- name: Included, fails\n  ansible.builtin.fail:\n    msg: included and rescued\n")
    rc, doc = account_of(tmp_path, f"""
- name: Rescued failures
  hosts: all
  gather_facts: false
  tasks:
    - name: Outer block
      block:
        - name: Nested block without its own rescue
          block:
            - name: Fails inside the nested block
              ansible.builtin.fail:
                msg: nested and rescued
      rescue:
        - name: Handled
          ansible.builtin.debug:
            msg: handled
    - name: Block around an include
      block:
        - name: Include
          ansible.builtin.include_tasks: {tmp_path / "inner.yml"}
      rescue:
        - name: Handled too
          ansible.builtin.debug:
            msg: handled
""")
    assert rc == 0
    assert doc["nodes"]["node-a"]["state"] == "converged", doc["nodes"]
    assert doc["needs_attention"] == []


def test_a_failure_in_a_rescue_is_a_failed_host(tmp_path):
    rc, doc = account_of(tmp_path, """
- name: A rescue that fails
  hosts: all
  gather_facts: false
  tasks:
    - name: Block
      block:
        - name: Fails first
          ansible.builtin.fail:
            msg: first, rescued
      rescue:
        - name: The rescue fails too
          ansible.builtin.fail:
            msg: the rescue gave up
""")
    assert rc == 2
    node = doc["nodes"]["node-a"]
    assert node["state"] == "failed" and node["detail"] == "the rescue gave up", node
    assert doc["needs_attention"] == ["node-a"]

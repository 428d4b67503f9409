"""Know the disruption before making it: each role's read-only plan (tasks_from: plan) on localhost against
gpusim's tools, and site.yml refusing a disruptive change when no kubeconfig can drain the node.

Everything here is read-only on this machine: the plans use check mode, and site.yml runs with --check
and stops at the refusal before any role task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.plugins.ansible_runner import VENV_BIN, ansible_env
from tests.unit.plugins import gpusim_states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
SEED_LAYOUT = ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]


def _module_file(tmp_path: Path, version: str | None) -> Path:
    path = tmp_path / "sys" / "module" / "nvidia" / "version"
    path.parent.mkdir(parents=True, exist_ok=True)
    if version is not None:
        path.write_text(version + "\n")
    return path


def _plans(tmp_path: Path, env: dict, hosts: dict[str, dict]) -> dict[str, dict]:
    """Run every role's plan on local hosts (one per variable set) in one ansible-playbook run."""
    inv = tmp_path / "plans-hosts.yml"
    inv.write_text(json.dumps({"all": {"hosts": {
        h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **v}
        for h, v in hosts.items()}}}))
    book = tmp_path / "plans.yml"
    book.write_text(f"""
- name: Every role's plan, read-only
  hosts: all
  gather_facts: false
  tasks:
    - name: Driver
      ansible.builtin.include_role:
        name: hami.node.nvidia_driver
        tasks_from: plan
    - name: MIG
      ansible.builtin.include_role:
        name: hami.node.nvidia_mig
        tasks_from: plan
    - name: MPS
      ansible.builtin.include_role:
        name: hami.node.nvidia_mps
        tasks_from: plan
    - name: Kubelet
      ansible.builtin.include_role:
        name: hami.node.kubelet
        tasks_from: plan
    - name: Save
      ansible.builtin.copy:
        dest: "{tmp_path}/plans-{{{{ inventory_hostname }}}}.json"
        content: "{{{{ {{'driver': nvidia_driver_disruptions, 'mig': nvidia_mig_disruptions,
                        'mps': nvidia_mps_disruptions, 'kubelet': kubelet_disruptions}} | to_json }}}}"
        mode: "0644"
""")
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), str(book)], env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {h: json.loads((tmp_path / f"plans-{h}.json").read_text()) for h in hosts}


def test_each_role_plans_what_would_disrupt_running_pods(tmp_path: Path) -> None:
    """Three local "nodes" in one run: a pending change of every kind; nothing pending on a node without
    a loaded driver; the same node rebooting for its driver."""
    state = gpusim_states.write(tmp_path / "state.json", gpusim_states.h20_state())
    kubelet_old = tmp_path / "kubelet-old.yaml"
    kubelet_old.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                           "maxPods: 110\n")
    kubelet_done = tmp_path / "kubelet-done.yaml"
    kubelet_done.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                            "logging:\n  verbosity: 4\n")
    before = (state.read_text(), kubelet_old.read_text(), kubelet_done.read_text())
    common = {"nvidia_driver_version": "570.195.03", "nvidia_mps_sysfs_root": str(tmp_path / "sys"),
              "nvidia_mps_service": "hami-test-absent-mps.service",
              "nvidia_mps_pipe_dir": str(tmp_path / "mps"), "nvidia_mps_log_dir": str(tmp_path / "mps-log"),
              "kubelet_layout": "kubespray", "kubelet_verbosity": 4}
    pending = {
        **common, "nvidia_driver_reboot_method": "emulate",
        "nvidia_driver_module_version_file": str(_module_file(tmp_path, "570.172.08")),
        "nvidia_mig_layout": [{"index": 0, "mig_enabled": True, "profiles": SEED_LAYOUT}],
        "kubelet_kubespray_config_path": str(kubelet_old),
    }
    # no module loaded and no reboot: no pod can hold a GPU here, installing the driver disrupts nothing
    quiet = {
        **common, "nvidia_driver_reboot_method": "emulate",
        "nvidia_driver_module_version_file": str(tmp_path / "absent" / "version"),
        "nvidia_mig_layout": [{"index": 3, "mig_enabled": False}],  # as it is already
        "nvidia_mps_state": "stopped", "kubelet_kubespray_config_path": str(kubelet_done),
    }
    plans = _plans(tmp_path, ansible_env(tmp_path, state), {
        "pending": pending, "quiet": quiet, "rebooting": {**quiet, "nvidia_driver_reboot_method": "reboot"}})

    p = plans["pending"]
    (driver,) = p["driver"]
    assert driver["role"] == "nvidia_driver" and not driver["reboot"]
    assert driver["change"].startswith("driver 570.172.08 -> 570.195.03 (a module reload")
    assert "every GPU pod" in driver["why"]
    (mig,) = p["mig"]
    assert "GPU 0: create 3g.48gb,1g.24gb,1g.12gb,1g.12gb" in mig["change"]
    changes = [d["change"] for d in p["mps"]]
    assert any(c.startswith("compute mode EXCLUSIVE_PROCESS") for c in changes)
    assert "start hami-test-absent-mps.service" in changes
    (kub,) = p["kubelet"]
    assert kub["role"] == "kubelet" and "UnexpectedAdmissionError" in kub["why"]

    assert plans["quiet"] == {"driver": [], "mig": [], "mps": [], "kubelet": []}
    # ... but a real reboot stops every pod on the node: that counts, and asks for a full drain
    (driver,) = plans["rebooting"]["driver"]
    assert driver["reboot"] is True and "a reboot stops every pod" in driver["why"]
    assert (state.read_text(), kubelet_old.read_text(), kubelet_done.read_text()) == before  # read-only


def test_site_refuses_a_disruptive_change_without_a_kubeconfig(tmp_path: Path) -> None:
    module = _module_file(tmp_path, "570.172.08")
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"gpu-local": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "nvidia_driver_version": "570.195.03", "nvidia_driver_reboot_method": "emulate",
        "nvidia_driver_module_version_file": str(module), "node_maintenance_kubeconfig": ""}}}}}}))
    env = ansible_env(tmp_path)
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inv), str(ROOT / "playbooks" / "site.yml"), "--check",
         "--tags", "site_nvidia_driver"],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert "DISRUPTIVE: driver 570.172.08 -> 570.195.03" in out
    assert ("refusing to change gpu-local without cordoning and draining it first: driver 570.172.08 -> "
            "570.195.03") in " ".join(out.split())
    assert "node_maintenance_allow_without_kubeconfig=true" in out
    recap = next(ln for ln in out.splitlines() if ln.startswith("gpu-local"))
    assert "changed=0" in recap and "failed=1" in recap
    # nothing after the refusal ran: no role task of the roll
    assert "Install the driver packages" not in out

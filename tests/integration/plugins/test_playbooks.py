"""The modules for real: ansible-playbook on localhost (connection local) against gpusim's simulated tools.

Each playbook runs check mode -> apply -> re-apply (changed=false) with diff, asserting inside the play;
pytest then checks the simulated node's state on disk.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.plugins.ansible_runner import VENV_BIN, ansible_env, run_playbook
from tests.unit.plugins import gpusim_states

pytestmark = pytest.mark.integration

SEED_LAYOUT = '["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]'


@pytest.mark.timeout(240)
def test_nvidia_mig_and_gpu_info_playbook(tmp_path):
    state = gpusim_states.write(tmp_path / "state.json", gpusim_states.h20_state())
    sysfs = tmp_path / "sys" / "module" / "nvidia"
    sysfs.mkdir(parents=True)
    (sysfs / "version").write_text("570.172.08\n")
    book = f"""
- name: MIG layout of seed 003 on a simulated H20 node
  hosts: localhost
  gather_facts: false
  vars:
    layout:
      - {{index: 0, profiles: {SEED_LAYOUT}}}
      - {{index: 1, profiles: {SEED_LAYOUT}}}
      - {{index: 2, profiles: {SEED_LAYOUT}}}
      - {{index: 3, mig_enabled: false}}
  tasks:
    - name: Plan only
      hami.node.nvidia_mig:
        gpus: "{{{{ layout }}}}"
      check_mode: true
      diff: true
      register: planned
    - name: Nothing changed on the node
      ansible.builtin.command: nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader
      register: modes
      changed_when: false
    - name: Check mode reported the plan
      ansible.builtin.assert:
        that:
          - planned is changed
          - "'GPU 0: create 3g.48gb,1g.24gb,1g.12gb,1g.12gb' in planned.actions"
          - planned.diff.before.gpu0.mig_enabled == false
          - planned.diff.after.gpu2.mig_devices['1g.12gb'] == 2
          - "'Enabled' not in modes.stdout"
    - name: Apply
      hami.node.nvidia_mig:
        gpus: "{{{{ layout }}}}"
      diff: true
      register: applied
    - name: Re-apply
      hami.node.nvidia_mig:
        gpus: "{{{{ layout }}}}"
      register: again
    - name: Same layout as a mig-parted config
      hami.node.nvidia_mig:
        config:
          version: v1
          mig-configs:
            seed-003:
              - devices: [0, 1, 2]
                mig-enabled: true
                mig-devices: {{"3g.48gb": 1, "1g.24gb": 1, "1g.12gb": 2}}
              - devices: [3]
                mig-enabled: false
        config_name: seed-003
      register: as_config
    - name: Facts
      hami.node.nvidia_gpu_info:
        sysfs_root: "{tmp_path}/sys"
        packages: false
        timeout: 10
      register: info
    - name: Applied once, idempotent afterwards
      ansible.builtin.assert:
        that:
          - applied is changed
          - applied.reboot_required == false
          - again is not changed
          - as_config is not changed
          - info.gpus | selectattr('mig_enabled') | list | length == 3
          - info.gpus[0].mig_devices | length == 4
          - info.mig_mixed
          - info.known_bad_driver is none
          - ansible_facts.nvidia.gpu_count == 4
"""
    proc = run_playbook(tmp_path, book, ansible_env(tmp_path, state))
    assert proc.returncode == 0
    assert "changed=2" in proc.stdout  # the apply + nothing else (assert/command tasks never change)
    data = gpusim_states.read(state)
    for idx in range(3):
        mig = data["gpus"][idx]["mig"]
        assert mig["current"] == 1 and mig["pending"] == 1
        assert sorted(d["profile"] for d in mig["devices"]) == ["1g.12gb", "1g.12gb", "1g.24gb", "3g.48gb"]
    assert data["gpus"][3]["mig"]["current"] == 0


@pytest.mark.timeout(240)
def test_gpu_info_flags_seed_003_hang(tmp_path):
    """The incident's node: driver 570.158.01, GPUs 0-2 MIG, 3 full -> nvidia-smi hangs; the play does not."""
    data = gpusim_states.h20_state(driver="570.158.01")
    for g in data["gpus"][:3]:
        g["mig"].update(current=1, pending=1)
    state = gpusim_states.write(tmp_path / "state.json", data)
    sysfs = tmp_path / "sys" / "module" / "nvidia"
    sysfs.mkdir(parents=True)
    (sysfs / "version").write_text("570.158.01\n")
    book = f"""
- name: Seed 003 node
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Facts with a short deadline
      hami.node.nvidia_gpu_info:
        sysfs_root: "{tmp_path}/sys"
        packages: false
        timeout: 2
      register: info
    - name: Diagnosed, not hung
      ansible.builtin.assert:
        that:
          - info.nvml_hang_suspected
          - info.known_bad_driver.version == '570.158.01'
          - "'upgrade to 570.172.08' in info.known_bad_driver.reason"
          - info.driver_version_loaded == '570.158.01'
"""
    proc = run_playbook(tmp_path, book, ansible_env(tmp_path, state))
    assert proc.returncode == 0


@pytest.mark.timeout(240)
def test_nvidia_mps_playbook(tmp_path):
    state = gpusim_states.write(tmp_path / "state.json", gpusim_states.h20_state())
    pipe, logd = tmp_path / "mps" / "pipe", tmp_path / "mps" / "log"
    book = f"""
- name: MPS daemon
  hosts: localhost
  gather_facts: false
  vars:
    mps: {{pipe_dir: "{pipe}", log_dir: "{logd}", default_active_thread_percentage: 25,
           pinned_mem_limits: {{"0": 24G, "1": 24G}}}}
  tasks:
    - name: Plan
      hami.node.nvidia_mps: "{{{{ mps }}}}"
      check_mode: true
      register: planned
    - name: Start
      hami.node.nvidia_mps: "{{{{ mps }}}}"
      diff: true
      register: started
    - name: Again
      hami.node.nvidia_mps: "{{{{ mps }}}}"
      register: again
    - name: Stop
      hami.node.nvidia_mps:
        state: stopped
        pipe_dir: "{pipe}"
      register: stopped
    - name: Stop again
      hami.node.nvidia_mps:
        state: stopped
        pipe_dir: "{pipe}"
      register: stopped_again
    - name: Check
      ansible.builtin.assert:
        that:
          - planned is changed and 'start MPS control daemon' in planned.actions
          - started is changed and started.running and started.pid > 0
          - started.default_active_thread_percentage == 25.0
          - started.diff.before.running == false
          - again is not changed
          - stopped is changed and not stopped.running
          - stopped_again is not changed
"""
    proc = run_playbook(tmp_path, book, ansible_env(tmp_path, state))
    assert proc.returncode == 0
    mps = gpusim_states.read(state)["mps"]
    assert mps["running"] is False
    assert (logd / "control.log").exists()
    assert not (pipe / "nvidia-cuda-mps-control.pid").exists()


@pytest.mark.timeout(240)
def test_nvidia_mps_missing_binary_playbook(tmp_path):
    """Seed 003 §5.2: nvidia-cuda-mps-control is not on PATH (stubs left off PATH)."""
    book = """
- name: MPS without the binary
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Start
      hami.node.nvidia_mps: {}
      register: res
      ignore_errors: true
    - name: Diagnosis
      ansible.builtin.assert:
        that:
          - res is failed
          - "'nvidia-compute-utils-' in res.msg"
          - "'executable file not found in $PATH' in res.msg"
"""
    proc = run_playbook(tmp_path, book, ansible_env(tmp_path, None, stubs=False))
    assert proc.returncode == 0


SEED_KUBELET = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: "10s"
# raised while debugging (seed 003)
authentication:
  anonymous:
    enabled: false
maxPods: 110
clusterDNS:
- 10.199.0.3
"""


@pytest.mark.timeout(240)
def test_kubelet_config_playbook(tmp_path):
    cfg = tmp_path / "kubelet-config.yaml"
    cfg.write_text(SEED_KUBELET)
    env_file = tmp_path / "kubelet.env"
    env_file.write_text(
        'KUBE_LOG_LEVEL="--v=2"\nKUBELET_ARGS="--config=/etc/kubernetes/kubelet-config.yaml"\n'
    )
    book = f"""
- name: Kubelet verbosity for seed 003's debugging
  hosts: localhost
  gather_facts: false
  vars:
    kc: {{path: "{cfg}", verbosity: 4, flag_files: ["{env_file}"], flag_policy: manage, backup: true}}
  tasks:
    - name: Plan
      hami.node.kubelet_config: "{{{{ kc }}}}"
      check_mode: true
      diff: true
      register: planned
    - name: Apply
      hami.node.kubelet_config: "{{{{ kc }}}}"
      register: applied
    - name: Again
      hami.node.kubelet_config: "{{{{ kc }}}}"
      register: again
    - name: Check
      ansible.builtin.assert:
        that:
          - planned is changed and planned.diff | length == 2
          - applied is changed and applied.restart_required and applied.backup_file is defined
          - applied.flag_overrides[0].flag == '--v=2' and applied.flag_overrides[0].managed
          - again is not changed and not again.restart_required
          - applied.comments_preserved
"""
    proc = run_playbook(tmp_path, book, ansible_env(tmp_path, None, stubs=False))
    assert proc.returncode == 0
    text = cfg.read_text()
    assert "# raised while debugging (seed 003)" in text and "logging:\n  verbosity: 4" in text
    assert text.startswith(SEED_KUBELET.split("maxPods", maxsplit=1)[0])
    assert env_file.read_text().startswith('KUBE_LOG_LEVEL="--v=4"')


@pytest.mark.timeout(120)
def test_ansible_doc_renders_every_module(tmp_path):
    mods = [
        "nvidia_gpu_info",
        "nvidia_driver_facts",
        "nvidia_mig",
        "nvidia_mps",
        "kubelet_config",
        "hami_node",
    ]
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "--json"] + ["hami.node." + m for m in mods],
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    for m in mods:
        doc = docs["hami.node." + m]
        assert doc["doc"]["short_description"] and doc["examples"].strip() and doc["return"]
        assert doc["doc"]["attributes"]["check_mode"]["support"] == "full"
    plain = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-M", "plugins/modules", "nvidia_mig"],
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=str(gpusim_states.REPO),
    )
    assert plain.returncode == 0 and "mig-parted" in plain.stdout
    assert sys.executable  # the venv interpreter runs the modules

"""The nvidia_driver role refuses known-bad builds through the filter that reads the collection's one list
(plugins/module_utils/known_bad_drivers.py), plus the site-specific ``nvidia_driver_known_bad_versions``."""

from __future__ import annotations

import pytest

from tests.integration.plugins.ansible_runner import ansible_env, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BOOK = """
- name: Preflight of the driver role
  hosts: localhost
  gather_facts: true
  gather_subset: [min]
  tasks:
    - name: Preflight
      ansible.builtin.include_role:
        name: hami.node.nvidia_driver
        tasks_from: preflight
      vars:
        nvidia_driver_version: "{version}"
        nvidia_driver_known_bad_versions: [{{version: "999.1.2", reason: "site says no"}}]
        nvidia_driver_reboot_method: none
"""


@pytest.mark.parametrize(
    ("version", "refused", "why"),
    [
        ("570.158.01", True, "NVML hang with mixed MIG + full GPUs (NVIDIA gpu-operator #1361)"),
        ("570.124.06", True, "upgrade to 570.172.08"),
        ("999.1.2", True, "site says no"),
        ("570.172.08", False, ""),
    ],
)
def test_preflight_refuses_known_bad_builds(tmp_path, version, refused, why):
    proc = run_playbook(tmp_path, BOOK.format(version=version), ansible_env(tmp_path, stubs=False))
    assert (proc.returncode != 0) is refused, proc.stdout[-3000:]
    if refused:
        assert f"refusing NVIDIA driver {version}: " in proc.stdout and why in proc.stdout

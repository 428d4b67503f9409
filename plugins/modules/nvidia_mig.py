#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_mig
short_description: Declarative NVIDIA MIG mode and layout per GPU (mig-parted v1 configs or a per-GPU list)
version_added: 0.1.0
author:
  - hami.node developers
description:
  - Makes the MIG mode and the GPU-instance layout of each listed GPU match the desired state. Each GPU
    instance gets one default compute instance, which is the layout the device plugins advertise as
    C(nvidia.com/mig-<profile>).
  - The desired state comes either from a mig-parted C(version=v1) document (O(config) or O(config_file)
    with O(config_name), the same schema as C(nvidia-mig-parted apply -f -c)) or from a simple per-GPU list
    (O(gpus)).
  - The module is idempotent. It reads the current layout (C(nvidia-smi mig -lgi), C(-lci)) and touches
    only the GPUs that differ, in the same way as C(nvidia-mig-parted assert) followed by C(apply). Check
    mode reports the plan in RV(actions). Diff mode shows the layout before and after.
  - A mode change is pending until the GPU is reset. With O(reset=true) the module stops the systemd
    units in O(gpu_clients), runs C(nvidia-smi -r -i <gpus>) and starts the units again. When the reset
    is not allowed or fails, for example because the GPU is in use or the host is a passthrough VM, the
    module returns RV(reset_required) and RV(reboot_required) and leaves the layout of those GPUs for the
    next run.
  - Profile names are checked against the GPU model's profiles (C(nvidia-smi mig -lgip), or a built-in
    table before MIG is enabled). An unknown name fails with the list of valid ones.
  - Every C(nvidia-smi) call has a deadline (O(timeout)). A hang fails the task with
    RV(nvml_hang_suspected=true) and does not block the play.
options:
  config:
    description:
      - A mig-parted C(version=v1) document, given as a mapping.
      - Mutually exclusive with O(config_file) and O(gpus).
    type: dict
  config_file:
    description:
      - Path on the target of a mig-parted config file, for example C(/etc/nvidia-mig-manager/config.yaml).
      - Reading it needs PyYAML on the target.
    type: path
  config_name:
    description:
      - The entry of C(mig-configs) to apply, for example V(all-disabled) or V(all-balanced).
      - Required with O(config) or O(config_file).
    type: str
  gpus:
    description:
      - The simple form, one item per GPU. GPUs that are not listed are left alone.
    type: list
    elements: dict
    suboptions:
      index:
        description: GPU index as C(nvidia-smi) numbers it.
        type: int
        required: true
      mig_enabled:
        description: Desired MIG mode. Defaults to true.
        type: bool
      profiles:
        description:
          - GPU-instance profiles to create. Repeat a profile for several instances.
          - For example C([3g.48gb, 1g.24gb, 1g.12gb, 1g.12gb]).
        type: list
        elements: str
        default: []
  reset:
    description:
      - Reset GPUs whose MIG mode change is pending (C(nvidia-smi -r)). When V(false), the module only
        reports RV(reset_required).
    type: bool
    default: true
  gpu_clients:
    description:
      - systemd units that hold the GPU. The module stops the active ones before a reset and starts them
        again afterwards, for example C(nvidia-persistenced), C(nvidia-dcgm), C(dcgm-exporter) or
        C(kubelet).
      - C(nvidia_drm) being loaded also blocks a reset (mig-parted issue 181). Unload it in a previous task.
    type: list
    elements: str
    default: []
  allow_known_bad_driver:
    description:
      - By default the module refuses a layout that mixes MIG and full GPUs when the driver is on the
        known-bad list for that layout (R570 builds whose NVML hangs, seed 003; data in
        C(plugins/module_utils/known_bad_drivers.py)).
      - Set to V(true) to apply it anyway.
    type: bool
    default: false
  nvidia_smi_path:
    description: Name or path of C(nvidia-smi).
    type: str
    default: nvidia-smi
  timeout:
    description: Seconds each C(nvidia-smi) call may take before an NVML hang is assumed.
    type: float
    default: 60
extends_documentation_fragment:
  - hami.node.attributes
attributes:
  check_mode:
    support: full
    details: Reports the planned actions and runs no changing command.
  diff_mode:
    support: full
    details: Shows the per-GPU MIG mode and profile counts before and after.
notes:
  - MIG mode persists across reboots, but GPU-instance geometry does not. Run this module, or
    nvidia-mig-manager, at every boot to restore the layout.
  - MIG and MPS on the same GPU are refused by the device plugins. The hami.node.nvidia_mps role checks this.
seealso:
  - module: hami.node.nvidia_gpu_info
  - name: mig-parted config format
    description: NVIDIA's MIG partition editor, whose v1 schema this module accepts.
    link: https://github.com/NVIDIA/mig-parted
"""

EXAMPLES = r"""
- name: The layout of seed 003 (GPUs 0-2 split, 3-7 whole), simple form
  hami.node.nvidia_mig:
    gpus:
      - {index: 0, profiles: [3g.48gb, 1g.24gb, 1g.12gb, 1g.12gb]}
      - {index: 1, profiles: [3g.48gb, 1g.24gb, 1g.12gb, 1g.12gb]}
      - {index: 2, profiles: [3g.48gb, 1g.24gb, 1g.12gb, 1g.12gb]}
    gpu_clients: [nvidia-dcgm, dcgm-exporter]

- name: Apply a named mig-parted config
  hami.node.nvidia_mig:
    config:
      version: v1
      mig-configs:
        all-disabled:
          - devices: all
            mig-enabled: false
        all-balanced:
          - devices: all
            mig-enabled: true
            mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    config_name: all-balanced
  register: mig

- name: Reboot when the mode change could not be applied by a reset
  ansible.builtin.reboot:
  when: mig.reboot_required

- name: Use the mig-manager's file on the node
  hami.node.nvidia_mig:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config_name: all-disabled
    reset: false
"""

RETURN = r"""
actions:
  description: What was done, or in check mode what would be done, one line per step.
  returned: always
  type: list
  elements: str
  sample: ["GPU 0: enable MIG mode", "GPU 0: reset", "GPU 0: create 3g.48gb,1g.24gb,1g.12gb,1g.12gb"]
reset_required:
  description: A MIG mode change is pending on some GPU and was not applied by a reset.
  returned: always
  type: bool
reboot_required:
  description: Same as RV(reset_required). A reboot applies pending MIG modes.
  returned: always
  type: bool
pending_gpus:
  description: Indices of GPUs whose MIG mode change is still pending.
  returned: always
  type: list
  elements: int
layout:
  description: Managed GPUs' MIG mode and profile counts after the run (desired in check mode).
  returned: always
  type: dict
  sample: {gpu0: {mig_enabled: true, mig_devices: {"1g.12gb": 2, "1g.24gb": 1, "3g.48gb": 1}}}
nvml_hang_suspected:
  description: An C(nvidia-smi) call did not answer within O(timeout).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils._mig_manager import MigManager  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="dict"),
            config_file=dict(type="path"),
            config_name=dict(type="str"),
            gpus=dict(
                type="list",
                elements="dict",
                options=dict(
                    index=dict(type="int", required=True),
                    mig_enabled=dict(type="bool"),
                    profiles=dict(type="list", elements="str", default=[]),
                ),
            ),
            reset=dict(type="bool", default=True),
            allow_known_bad_driver=dict(type="bool", default=False),
            gpu_clients=dict(type="list", elements="str", default=[]),
            nvidia_smi_path=dict(type="str", default="nvidia-smi"),
            timeout=dict(type="float", default=60),
        ),
        mutually_exclusive=[("config", "config_file", "gpus")],
        required_one_of=[("config", "config_file", "gpus")],
        required_by={"config": "config_name", "config_file": "config_name"},
        supports_check_mode=True,
    )
    module.exit_json(**MigManager(module).run())


if __name__ == "__main__":
    main()

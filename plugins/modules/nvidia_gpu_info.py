#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_info
short_description: Gather NVIDIA driver, GPU, MIG and MPS facts, with known-bad-driver and NVML-hang checks
version_added: 0.1.0
author:
  - hami.node developers
description:
  - Reports the NVIDIA driver version that is installed (from the package manager) and the one that is
    loaded (from C(/sys/module/nvidia/version)), flags a mismatch, and lists the GPUs with their memory,
    MIG mode (current and pending), MIG devices, compute mode and persistence mode, using C(nvidia-smi)
    with C(LC_ALL=C).
  - Flags drivers on the known-bad list (data in C(plugins/module_utils/known_bad_drivers.py)), such as
    the R570 builds whose NVML hangs on nodes that mix MIG and full GPUs (NVIDIA gpu-operator
    issue 1361).
  - Every C(nvidia-smi) call has a deadline. When it passes, the module does not hang. It returns
    RV(nvml_hang_suspected=true) with the remedy, or fails when O(fail_on_hang=true).
  - Degrades gracefully. With no driver or no C(nvidia-smi), for example in CI containers, it returns
    RV(driver_loaded=false) and does not fail.
  - Sets C(ansible_facts.nvidia) to the full result.
options:
  nvidia_smi_path:
    description:
      - Name or path of C(nvidia-smi). A bare name is looked up on E(PATH) and in the sbin directories.
    type: str
    default: nvidia-smi
  timeout:
    description:
      - Seconds each C(nvidia-smi) call may take before an NVML hang is suspected.
    type: float
    default: 20
  sysfs_root:
    description:
      - Root of the sysfs tree that holds C(module/nvidia/version).
      - Point it at a fake tree in tests and in simulated (gpusim) nodes, for example C(/run/gpusim/sys)
        in the molecule images. When not set, the module reads E(HAMI_SYSFS_ROOT), and then C(/sys).
    type: path
  packages:
    description:
      - Query the package manager (C(dpkg-query) or C(rpm)) for the installed driver version.
    type: bool
    default: true
  fail_on_hang:
    description:
      - Fail instead of returning RV(nvml_hang_suspected=true) when C(nvidia-smi) does not answer in time.
    type: bool
    default: false
extends_documentation_fragment:
  - hami.node.attributes
  - hami.node.attributes.read_only
attributes:
  facts:
    description: Sets C(ansible_facts.nvidia).
    support: full
notes:
  - The module only reads. It never loads modules and never changes GPU state.
seealso:
  - module: hami.node.nvidia_mig
  - module: hami.node.nvidia_mps
"""

EXAMPLES = r"""
- name: Gather GPU facts
  hami.node.nvidia_gpu_info:
  register: gpu

- name: Stop before touching a node whose driver hangs NVML with mixed MIG
  ansible.builtin.assert:
    that:
      - not gpu.known_bad_driver.triggered | default(false)
    fail_msg: "{{ gpu.known_bad_driver.reason }}"
  when: gpu.known_bad_driver is not none

- name: Reboot only when the loaded driver differs from the installed one or MIG mode is pending
  ansible.builtin.reboot:
    test_command: nvidia-smi -L
  when: gpu.reboot_required

- name: Use a fake sysfs (simulated node)
  hami.node.nvidia_gpu_info:
    sysfs_root: /opt/gpusim/sys
    timeout: 5
"""

RETURN = r"""
driver_loaded:
  description: Whether the NVIDIA driver answers (C(nvidia-smi) ran) or at least the kernel module is loaded.
  returned: always
  type: bool
  sample: true
nvidia_smi_found:
  description: Whether C(nvidia-smi) was found.
  returned: always
  type: bool
nvml_hang_suspected:
  description: C(nvidia-smi) did not answer within O(timeout) seconds.
  returned: always
  type: bool
  sample: false
hang_message:
  description: Diagnosis and remedy when RV(nvml_hang_suspected) is true, otherwise null.
  returned: always
  type: str
driver_version:
  description: Driver version as C(nvidia-smi) reports it (that of the user-space library).
  returned: always
  type: str
  sample: 570.172.08
driver_version_loaded:
  description:
    - Version of the loaded kernel module (C(<sysfs_root>/module/nvidia/version)).
    - Null when the module is not loaded.
  returned: always
  type: str
  sample: 570.172.08
driver_version_installed:
  description: Upstream version of the installed driver package, null when not known.
  returned: always
  type: str
  sample: 570.172.08
driver_package:
  description: The package RV(driver_version_installed) was taken from.
  returned: always
  type: str
  sample: libnvidia-compute-570-server
driver_branch:
  description: Major branch of the driver (for example C(570)), used to name C(nvidia-compute-utils-<branch>).
  returned: always
  type: str
  sample: "570"
packages:
  description: Installed NVIDIA packages and their full versions.
  returned: always
  type: dict
  sample: {"nvidia-compute-utils-570-server": "570.172.08-0ubuntu1"}
version_mismatch:
  description: Loaded module version differs from the installed package (reboot or reload needed).
  returned: always
  type: bool
cuda_version:
  description: Highest CUDA version the driver supports, as C(nvidia-smi) prints it.
  returned: always
  type: str
  sample: "12.8"
gpu_count:
  description: Number of GPUs.
  returned: always
  type: int
gpus:
  description: One entry per GPU.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: GPU index., type: int}
    uuid: {description: GPU UUID., type: str}
    name: {description: Product name., type: str}
    memory_total_mib: {description: Framebuffer size in MiB (null when not supported)., type: int}
    memory_used_mib: {description: Used framebuffer in MiB., type: int}
    pci_bus_id: {description: PCI bus id., type: str}
    mig_capable: {description: GPU supports MIG., type: bool}
    mig_enabled: {description: Current MIG mode., type: bool}
    mig_pending: {description: Pending MIG mode (effective after reset or reboot)., type: bool}
    mig_devices: {description: MIG devices (profile, index, uuid)., type: list, elements: dict}
    compute_mode: {description: Default, Exclusive_Process or Prohibited., type: str}
    persistence_mode: {description: Persistence mode., type: bool}
    serial: {description: Board serial number., type: str}
  sample:
    - {index: 0, uuid: GPU-2f815c32-768d-d782-1073-db01d7b90215, name: NVIDIA H20, memory_total_mib: 97871,
       mig_enabled: true, mig_pending: true, compute_mode: Default, persistence_mode: true, mig_devices: []}
mig_mixed:
  description:
    - Some GPUs have MIG enabled and some do not.
    - This is the layout that triggers the known-bad drivers' hang.
  returned: always
  type: bool
mps_control_present:
  description: Whether C(nvidia-cuda-mps-control) is on E(PATH).
  returned: always
  type: bool
mps_control_path:
  description: Path of C(nvidia-cuda-mps-control), or null.
  returned: always
  type: str
known_bad_driver:
  description:
    - Null, or the known-bad entry for the driver (loaded version first, then the C(nvidia-smi) version).
    - The entry has V(version), V(reason), V(reference), V(condition), V(fixed_in) and V(triggered).
      V(triggered) is true when the node's MIG layout sets the bug off.
  returned: always
  type: dict
  sample: {version: 570.158.01,
           reason: "NVML hang with mixed MIG + full GPUs (NVIDIA gpu-operator #1361); upgrade to 570.172.08",
           triggered: true}
reboot_required:
  description: The loaded driver differs from the installed one, or a GPU's MIG mode is pending.
  returned: always
  type: bool
reboot_reasons:
  description: Why RV(reboot_required) is true.
  returned: always
  type: list
  elements: str
ansible_facts:
  description: Facts set by the module.
  returned: always
  type: dict
  contains:
    nvidia:
      description: The whole result (except C(ansible_facts)).
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _driver, _nvidia_smi, known_bad_drivers  # noqa: E402


def gather(module, smi_path, timeout, root, want_packages):
    res = {
        "changed": False,
        "driver_loaded": False,
        "nvidia_smi_found": smi_path is not None,
        "nvml_hang_suspected": False,
        "hang_message": None,
        "driver_version": None,
        "driver_version_loaded": _driver.loaded_version(root),
        "driver_version_installed": None,
        "driver_package": None,
        "driver_branch": None,
        "packages": {},
        "version_mismatch": False,
        "cuda_version": None,
        "gpu_count": 0,
        "gpus": [],
        "mig_mixed": False,
        "mps_control_path": module.get_bin_path("nvidia-cuda-mps-control"),
        "known_bad_driver": None,
        "reboot_required": False,
        "reboot_reasons": [],
    }
    res["mps_control_present"] = res["mps_control_path"] is not None

    def runner(argv, t):
        return _nvidia_smi.run_bounded(argv, t)

    if want_packages:
        try:
            res["packages"] = _driver.query_packages(module, timeout, runner)
        except _nvidia_smi.SmiTimeout as exc:
            module.warn("package query timed out: %s" % exc)
        res["driver_version_installed"], res["driver_package"] = _driver.installed_from_packages(
            res["packages"]
        )

    if smi_path is not None:
        try:
            q = runner(
                [
                    smi_path,
                    "--query-gpu=" + ",".join(_nvidia_smi.QUERY_FIELDS),
                    "--format=csv,noheader,nounits",
                ],
                timeout,
            )
            if q.driver_not_loaded:
                res["smi_error"] = q.out.strip() or q.err.strip()
            elif q.rc != 0:
                module.fail_json(
                    msg="nvidia-smi --query-gpu failed (rc %d): %s" % (q.rc, (q.out + q.err).strip()),
                    **q.as_dict(),
                )
            else:
                res["driver_loaded"] = True
                rows = _nvidia_smi.parse_csv(q.out, _nvidia_smi.QUERY_FIELDS)
                res["gpus"] = _nvidia_smi.gpus_from_query(rows)
                if rows:
                    res["driver_version"] = rows[0].get("driver_version")
                summary = runner([smi_path], timeout)
                res["cuda_version"] = _nvidia_smi.parse_q_versions(summary.out)["cuda_version"]
                devices = {}
                if any(g["mig_enabled"] for g in res["gpus"]):
                    listing = runner([smi_path, "-L"], timeout)
                    devices = {g["uuid"]: g["mig_devices"] for g in _nvidia_smi.parse_list(listing.out)}
                for gpu in res["gpus"]:
                    gpu["mig_devices"] = devices.get(gpu["uuid"], [])
        except _nvidia_smi.SmiTimeout as exc:
            res["nvml_hang_suspected"] = True
            res["hang_message"] = str(exc)
            if module.params["fail_on_hang"]:
                module.fail_json(msg=str(exc), **res)
            module.warn(str(exc))
        except ValueError as exc:
            module.fail_json(msg="Cannot parse nvidia-smi output: %s" % exc)

    if res["driver_version_loaded"]:
        res["driver_loaded"] = True
    version = res["driver_version_loaded"] or res["driver_version"] or res["driver_version_installed"]
    res["driver_branch"] = _driver.branch_of(version)
    res["gpu_count"] = len(res["gpus"])
    capable = [g for g in res["gpus"] if g["mig_capable"]]
    modes = [g["mig_enabled"] for g in res["gpus"]]
    res["mig_mixed"] = len(set(modes)) > 1

    loaded, installed = res["driver_version_loaded"], res["driver_version_installed"]
    if loaded and installed and loaded != installed:
        res["version_mismatch"] = True
        res["reboot_reasons"].append(
            "loaded driver %s differs from installed %s (%s): reboot or reload the nvidia modules"
            % (loaded, installed, res["driver_package"])
        )
    for gpu in capable:
        if gpu["mig_enabled"] != gpu["mig_pending"]:
            res["reboot_reasons"].append(
                "GPU %s MIG mode is pending %s: reset the GPU (nvidia-smi -r -i %s) or reboot"
                % (gpu["index"], "enable" if gpu["mig_pending"] else "disable", gpu["index"])
            )
    res["reboot_required"] = bool(res["reboot_reasons"])

    bad = known_bad_drivers.lookup(loaded) or known_bad_drivers.lookup(res["driver_version"])
    if bad is not None:
        bad["triggered"] = known_bad_drivers.triggered(bad, modes)
        res["known_bad_driver"] = bad
        module.warn(
            "driver %s is known bad: %s%s"
            % (
                bad["version"],
                bad["reason"],
                " (this node's MIG layout triggers it)" if bad["triggered"] else "",
            )
        )
    return res


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_path=dict(type="str", default="nvidia-smi"),
            timeout=dict(type="float", default=20),
            sysfs_root=dict(type="path"),
            packages=dict(type="bool", default=True),
            fail_on_hang=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    smi = module.params["nvidia_smi_path"]
    smi_path = module.get_bin_path(smi) if "/" not in smi else (smi if _is_exec(smi) else None)
    res = gather(
        module,
        smi_path,
        module.params["timeout"],
        _driver.sysfs_root(module.params["sysfs_root"]),
        module.params["packages"],
    )
    facts = dict(res)
    facts.pop("changed", None)
    module.exit_json(ansible_facts={"nvidia": facts}, **res)


def _is_exec(path):
    import os

    return os.path.isfile(path) and os.access(path, os.X_OK)


if __name__ == "__main__":
    main()

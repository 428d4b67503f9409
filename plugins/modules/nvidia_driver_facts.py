#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_driver_facts
short_description: Read the NVIDIA driver's state for the nvidia_driver role in one call, NVML bounded
version_added: 0.1.0
author:
  - hami.node developers
description:
  - Reads in one module run what the C(hami.node.nvidia_driver) role decides from. These are the installed
    version and the dpkg selection (C(hold), C(install)) of the named driver packages, in one
    C(dpkg-query) call. They are also the loaded module's version (one file), whether the MPS control
    binary exists, and optionally the NVML probe and C(nvidia-smi)'s driver version.
  - The NVML probe and C(nvidia-smi) run at the same time, each in its own process group. At the deadline
    the group is killed and a child stuck in the driver is abandoned. A hung NVML (NVIDIA gpu-operator
    issue 1361) is reported as RV(nvml.hung=true) and never hangs the module.
  - Returns the facts the role sets with the same names and values, for the role to set
    (RV(installed_version), RV(loaded_version), RV(known_bad_installed), RV(known_bad_loaded), RV(nvml)).
  - Only reads. It never fails because a package, the module file, C(nvidia-smi) or NVML is missing.
    It reports them instead.
options:
  packages:
    description:
      - The driver packages to query, by exact name (not patterns). A package that is not installed has
        no entry in RV(packages) and none in RV(selections) unless dpkg still knows it.
    type: list
    elements: str
    required: true
  main_package:
    description:
      - The package whose upstream version (before the first C(-)) is RV(installed_version).
      - Defaults to the first of O(packages).
    type: str
  module_version_file:
    description: The file that holds the loaded nvidia module's version (gpusim nodes use an emulated one).
    type: path
    default: /sys/module/nvidia/version
  mps_control_path:
    description: The MPS control binary whose presence RV(mps_control_exists) reports. Not checked when unset.
    type: path
  nvml_probe:
    description:
      - Source of the NVML probe (the role's C(files/nvml_probe.py)), run as C(python -c) with the module's
        interpreter. It prints one JSON line and exits 0 (ok), 1 (NVML error) or 2 (no library).
      - Not probed when unset. RV(nvml) is null then.
    type: str
  nvidia_smi:
    description: Also ask C(nvidia-smi --query-gpu=driver_version) (RV(nvidia_smi)).
    type: bool
    default: false
  timeout:
    description: Seconds the NVML probe, C(nvidia-smi) and C(dpkg-query) may each take.
    type: float
    default: 30
  known_bad_extra:
    description:
      - Site-specific known-bad builds, each a dict with C(version) and C(reason). They add to the
        collection's list (C(plugins/module_utils/known_bad_drivers.py)).
    type: list
    elements: dict
    default: []
extends_documentation_fragment:
  - hami.node.attributes
  - hami.node.attributes.read_only
notes:
  - The role keeps one copy of the NVML probe (C(files/nvml_probe.py)) and passes its source in O(nvml_probe).
seealso:
  - module: hami.node.nvidia_gpu_info
"""

EXAMPLES = r"""
- name: Read the driver state, NVML within 30 s
  hami.node.nvidia_driver_facts:
    packages: [nvidia-driver-570, nvidia-utils-570, libnvidia-compute-570]
    module_version_file: /sys/module/nvidia/version
    mps_control_path: /usr/bin/nvidia-cuda-mps-control
    nvml_probe: "{{ lookup('ansible.builtin.file', 'nvml_probe.py') }}"
    nvidia_smi: true
    timeout: 30
  register: driver

- name: Stop on a hung NVML
  ansible.builtin.assert:
    that: not driver.nvml.hung
    fail_msg: "{{ driver.nvml.error }}"
"""

RETURN = r"""
packages:
  description: The installed ones of O(packages) and their full versions.
  returned: always
  type: dict
  sample: {"nvidia-driver-570": "570.172.08-0ubuntu1"}
selections:
  description: The dpkg selection (C(install), C(hold), C(deinstall), C(purge)) of each of O(packages) known.
  returned: always
  type: dict
  sample: {"nvidia-driver-570": "hold"}
installed_version:
  description: Upstream version of O(main_package), or an empty string when it is not installed.
  returned: always
  type: str
  sample: 570.172.08
loaded_version:
  description: Content of O(module_version_file), or an empty string when the module is not loaded.
  returned: always
  type: str
  sample: 570.172.08
known_bad_installed:
  description: RV(installed_version) is a known-bad build (the collection's list or O(known_bad_extra)).
  returned: always
  type: bool
known_bad_loaded:
  description: RV(loaded_version) is a known-bad build.
  returned: always
  type: bool
mps_control_exists:
  description: O(mps_control_path) exists (null when it is not set).
  returned: always
  type: bool
nvml:
  description: The NVML probe's answer, null when O(nvml_probe) is not set.
  returned: always
  type: dict
  contains:
    ok: {description: The probe exited 0., type: bool}
    hung: {description: It did not answer within O(timeout)., type: bool}
    rc: {description: Its exit status (124 when it hung)., type: int}
    driver_version: {description: The driver version NVML reports, or null., type: str}
    device_count: {description: The GPUs NVML counts, or null., type: int}
    error: {description: Why it failed (C(nvml Init hang ...) when hung), else its stderr., type: str}
nvidia_smi:
  description: C(nvidia-smi)'s answer, null unless O(nvidia_smi).
  returned: always
  type: dict
  contains:
    rc: {description: Exit status (124 when it hung, 127 when not found)., type: int}
    stdout_lines: {description: One driver version per GPU., type: list, elements: str}
    stdout: {description: Its output., type: str}
    stderr: {description: Its error output., type: str}
"""

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _nvidia_smi, known_bad_drivers  # noqa: E402

HUNG_RC = 124  # what `timeout` exits with: the role's checks test rc in [124, 137]
NOT_FOUND_RC = 127
DPKG_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\t${db:Status-Want}\n"


def seconds(value):
    """30.0 -> '30', 2.5 -> '2.5': the role's messages print the timeout as the user wrote it."""
    return str(int(value)) if float(value).is_integer() else str(value)


def parse_dpkg(text):
    """dpkg-query lines -> ({package: version} of installed ones, {package: selection})."""
    installed, selections = {}, {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        name, version, abbrev, want = parts[:4]
        if want:
            selections[name] = want
        # second letter of the status: n(ot-installed) and c(onfig-files) have no installed version
        if version and len(abbrev) > 1 and abbrev[1] not in "nc":
            installed[name] = version
    return installed, selections


def read_packages(module, packages, timeout):
    dpkg = module.get_bin_path("dpkg-query")
    if not dpkg or not packages:
        return {}, {}
    try:
        # rc 1 only means that dpkg does not know one of the packages: the others are still listed
        res = _nvidia_smi.run_bounded(
            [dpkg, "--show", "--showformat=" + DPKG_FORMAT] + list(packages), timeout
        )
    except _nvidia_smi.SmiTimeout as exc:
        module.warn("dpkg-query timed out: %s" % exc)
        return {}, {}
    return parse_dpkg(res.out)


def read_loaded(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def run(argv, timeout):
    """(rc, stdout, stderr) within the deadline: rc 124 when it hung, 127 when the program is missing."""
    try:
        res = _nvidia_smi.run_bounded(argv, timeout)
    except _nvidia_smi.SmiTimeout:
        return HUNG_RC, "", ""
    except OSError as exc:
        return NOT_FOUND_RC, "", "%s: %s" % (argv[0], exc)
    # killed by a signal: the status a shell (and `timeout`) reports, 128 + the signal
    return (res.rc if res.rc >= 0 else 128 - res.rc), res.out.strip(), res.err.strip()


def nvml_result(rc, out, err, timeout):
    """The role's nvidia_driver_nvml from the probe's exit status and output."""
    hung = rc in (HUNG_RC, 137)
    answer = {}
    if out.startswith("{"):
        try:
            answer = json.loads(out.splitlines()[0])
        except ValueError:
            answer = {}
    if hung:
        error = "nvml Init hang: NVML did not answer within %ss" % seconds(timeout)
    else:
        error = answer.get("error", err)
    return {
        "ok": rc == 0,
        "hung": hung,
        "rc": rc,
        "driver_version": answer.get("driver_version"),
        "device_count": answer.get("device_count"),
        "error": error,
    }


def smi_result(rc, out, err):
    return {"rc": rc, "stdout": out, "stderr": err, "stdout_lines": out.splitlines()}


def known_bad(module, version):
    try:
        return known_bad_drivers.lookup_extra(version, module.params["known_bad_extra"]) is not None
    except ValueError as exc:
        module.fail_json(msg="known_bad_extra (nvidia_driver_known_bad_versions): %s" % exc)


def probes(module, timeout):
    """The NVML probe and nvidia-smi side by side: a hung NVML costs one timeout, not two."""
    jobs = {}
    if module.params["nvml_probe"]:
        jobs["nvml"] = [sys.executable or "python3", "-c", module.params["nvml_probe"]]
    if module.params["nvidia_smi"]:
        smi = module.get_bin_path("nvidia-smi")
        if smi:
            jobs["smi"] = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
    if not jobs:
        return {}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(run, argv, timeout) for name, argv in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def gather(module):
    p = module.params
    timeout = p["timeout"]
    packages = p["packages"]
    installed, selections = read_packages(module, packages, timeout)
    main = p["main_package"] or (packages[0] if packages else "")
    installed_version = installed[main].split("-")[0] if main in installed else ""
    loaded_version = read_loaded(p["module_version_file"])
    answers = probes(module, timeout)
    res = {
        "changed": False,
        "packages": installed,
        "selections": selections,
        "installed_version": installed_version,
        "loaded_version": loaded_version,
        "known_bad_installed": known_bad(module, installed_version),
        "known_bad_loaded": known_bad(module, loaded_version),
        "mps_control_exists": os.path.exists(p["mps_control_path"]) if p["mps_control_path"] else None,
        "nvml": nvml_result(*answers["nvml"], timeout=timeout) if "nvml" in answers else None,
        "nvidia_smi": None,
    }
    if p["nvidia_smi"]:
        res["nvidia_smi"] = smi_result(
            *answers.get("smi", (NOT_FOUND_RC, "", "nvidia-smi: command not found"))
        )
    return res


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type="list", elements="str", required=True),
            main_package=dict(type="str"),
            module_version_file=dict(type="path", default="/sys/module/nvidia/version"),
            mps_control_path=dict(type="path"),
            nvml_probe=dict(type="str"),
            nvidia_smi=dict(type="bool", default=False),
            timeout=dict(type="float", default=30),
            known_bad_extra=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    if module.params["timeout"] <= 0:
        module.fail_json(
            msg="timeout must be a positive number of seconds (nvidia_driver_verify_timeout), got %s"
            % module.params["timeout"]
        )
    module.exit_json(**gather(module))


if __name__ == "__main__":
    main()

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
attributes:
  check_mode:
    description: Reports the planned actions and runs no changing command.
    support: full
  diff_mode:
    description: Shows the per-GPU MIG mode and profile counts before and after.
    support: full
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

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _mig, _nvidia_smi, known_bad_drivers  # noqa: E402

try:  # noqa: E402
    import yaml

    HAS_YAML = True
except ImportError:
    HAS_YAML = False

MIG_QUERY = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "pci.bus_id",
    "pci.device_id",
    "mig.mode.current",
    "mig.mode.pending",
    "driver_version",
)


class MigManager:
    def __init__(self, module):
        self.module = module
        p = module.params
        self.timeout = p["timeout"]
        smi = p["nvidia_smi_path"]
        self.smi = smi if "/" in smi else module.get_bin_path(smi)
        if not self.smi or not os.access(self.smi, os.X_OK):
            module.fail_json(
                msg="nvidia-smi not found (%s): install the driver utilities "
                "(nvidia-utils-<branch>) or set nvidia_smi_path" % smi
            )
        self.actions = []
        self.result = {
            "changed": False,
            "actions": self.actions,
            "reset_required": False,
            "reboot_required": False,
            "pending_gpus": [],
            "layout": {},
            "nvml_hang_suspected": False,
        }

    def smi_run(self, args, ok_not_found=False):
        try:
            res = _nvidia_smi.run_bounded([self.smi] + args, self.timeout)
        except _nvidia_smi.SmiTimeout as exc:
            self.result["nvml_hang_suspected"] = True
            self.module.fail_json(msg=str(exc), **self.result)
        if res.driver_not_loaded:
            self.module.fail_json(
                msg="NVIDIA driver not loaded (nvidia-smi: %s); install/load the driver first"
                % res.out.strip(),
                **self.result,
            )
        if res.rc != 0 and not (ok_not_found and _nvidia_smi.no_instances(res)):
            return res
        return res

    def must(self, args, what, ok_not_found=False):
        res = self.smi_run(args, ok_not_found)
        if res.rc != 0 and not (ok_not_found and _nvidia_smi.no_instances(res)):
            msg = "%s failed (rc %d): %s" % (what, res.rc, (res.out + res.err).strip())
            if "In use by another client" in res.out + res.err:
                msg += (
                    ". The GPU is held by another client: stop GPU users first (list them in gpu_clients, "
                    "e.g. nvidia-persistenced, nvidia-dcgm, dcgm-exporter, kubelet; unload nvidia_drm), "
                    "or reboot."
                )
            self.module.fail_json(msg=msg, **dict(self.result, **res.as_dict()))
        return res

    def read_current(self):
        q = self.must(
            ["--query-gpu=" + ",".join(MIG_QUERY), "--format=csv,noheader,nounits"], "nvidia-smi --query-gpu"
        )
        rows = _nvidia_smi.parse_csv(q.out, MIG_QUERY)
        gpus = _nvidia_smi.gpus_from_query(rows)
        for gpu, row in zip(gpus, rows):  # noqa: B905 - same length by construction
            gpu["pci_device_id"] = row.get("pci.device_id")
            gpu["driver_version"] = row.get("driver_version")
        lgi, lci, lgip = [], [], {}
        if any(g["mig_enabled"] for g in gpus):
            lgi = _nvidia_smi.parse_lgi(
                self.must(["mig", "-lgi"], "nvidia-smi mig -lgi", ok_not_found=True).out
            )
            lci = _nvidia_smi.parse_lci(
                self.must(["mig", "-lci"], "nvidia-smi mig -lci", ok_not_found=True).out
            )
            for p in _nvidia_smi.parse_lgip(
                self.must(["mig", "-lgip"], "nvidia-smi mig -lgip", ok_not_found=True).out
            ):
                lgip.setdefault(p["gpu"], {})[p["name"]] = p["total"]
        return gpus, _mig.current_per_gpu(gpus, lgi, lci), lgip

    def specs(self):
        p = self.module.params
        try:
            if p["gpus"] is not None:
                return _mig.parse_gpu_list(p["gpus"])
            config = p["config"]
            if p["config_file"]:
                if not HAS_YAML:
                    self.module.fail_json(
                        msg=missing_required_lib("PyYAML (python3-yaml)", reason="to read config_file")
                    )
                try:
                    with open(p["config_file"], encoding="utf-8") as fh:
                        config = yaml.safe_load(fh)
                except (OSError, yaml.YAMLError) as exc:
                    self.module.fail_json(msg="cannot read config_file %s: %s" % (p["config_file"], exc))
            return _mig.parse_mig_parted(config, p["config_name"])
        except _mig.MigConfigError as exc:
            self.module.fail_json(msg=str(exc))

    def run(self):
        specs = self.specs()
        gpus, cur, lgip = self.read_current()
        try:
            want = _mig.desired_per_gpu(specs, gpus)
            _mig.validate_profiles(want, gpus, lgip)
        except _mig.MigConfigError as exc:
            self.module.fail_json(msg=str(exc))
        self.guard_known_bad(gpus, cur, want)
        before = _mig.view({i: cur[i] for i in want})
        after = _mig.view(want)
        steps = _mig.plan(want, cur)
        if not self.module.params["reset"]:
            # Mode already pending and resets not allowed: nothing this run can change (stay idempotent).
            waiting = [
                e["gpu"]
                for e in steps
                if "reset" in e["steps"] and not {"set_mode", "clear"} & set(e["steps"])
            ]
            if waiting:
                self._pending(waiting)
                self.module.warn("MIG mode change pending on GPUs %s: reset them or reboot" % waiting)
                steps = [e for e in steps if e["gpu"] not in waiting]
        self.result["layout"] = after
        if self.module._diff:
            self.result["diff"] = {"before": before, "after": after}
        if not steps:
            return self.result
        self.result["changed"] = True
        if self.module.check_mode:
            for entry in steps:
                self.describe(entry, want[entry["gpu"]])
            resets = [e["gpu"] for e in steps if "reset" in e["steps"]]
            if resets and not self.module.params["reset"]:
                self._pending(resets)
            return self.result
        self.apply(steps, want)
        return self.result

    def guard_known_bad(self, gpus, cur, want):
        """Refuse to create the layout that hangs NVML on known-bad drivers (seed 003), unless allowed."""
        driver = next((g.get("driver_version") for g in gpus if g.get("driver_version")), None)
        entry = known_bad_drivers.lookup(driver)
        modes = [want[i]["enabled"] if i in want else cur[i]["enabled"] for i in sorted(cur)]
        if not known_bad_drivers.triggered(entry, modes) or self.module.params["allow_known_bad_driver"]:
            return
        self.module.fail_json(
            msg="refusing this MIG layout: driver %s is known bad for it: %s. Upgrade the driver first, or "
            "make all GPUs MIG (or none); allow_known_bad_driver=true overrides." % (driver, entry["reason"]),
            known_bad_driver=entry,
        )

    def describe(self, entry, w):
        idx = entry["gpu"]
        for step in entry["steps"]:
            if step == "clear":
                self.actions.append("GPU %d: destroy compute and GPU instances" % idx)
            elif step == "set_mode":
                self.actions.append("GPU %d: %s MIG mode" % (idx, "enable" if w["enabled"] else "disable"))
            elif step == "reset":
                self.actions.append(
                    "GPU %d: reset" % idx
                    if self.module.params["reset"]
                    else "GPU %d: reset required (reset=false)" % idx
                )
            elif step == "create":
                self.actions.append(
                    "GPU %d: create %s" % (idx, ",".join(_mig.creation_order(w["mig_devices"])))
                )

    def _pending(self, idxs):
        self.result["pending_gpus"] = sorted(set(self.result["pending_gpus"]) | set(idxs))
        self.result["reset_required"] = self.result["reboot_required"] = bool(self.result["pending_gpus"])

    def apply(self, steps, want):
        # Phase 1: clear and set modes; Phase 2: one reset for all; Phase 3: create layouts.
        for entry in steps:
            idx, w = entry["gpu"], want[entry["gpu"]]
            if "clear" in entry["steps"]:
                self.must(
                    ["mig", "-dci", "-i", str(idx)], "nvidia-smi mig -dci -i %d" % idx, ok_not_found=True
                )
                self.must(
                    ["mig", "-dgi", "-i", str(idx)], "nvidia-smi mig -dgi -i %d" % idx, ok_not_found=True
                )
                self.actions.append("GPU %d: destroy compute and GPU instances" % idx)
            if "set_mode" in entry["steps"]:
                self.must(
                    ["-i", str(idx), "-mig", "1" if w["enabled"] else "0"], "nvidia-smi -i %d -mig" % idx
                )
                self.actions.append("GPU %d: %s MIG mode" % (idx, "enable" if w["enabled"] else "disable"))
        resets = [e["gpu"] for e in steps if "reset" in e["steps"]]
        if resets:
            self.reset(resets)
        gpus, cur, _ = self.read_current()
        for entry in steps:
            idx, w = entry["gpu"], want[entry["gpu"]]
            if cur[idx]["enabled"] != w["enabled"]:
                self._pending([idx])
                continue
            if "create" in entry["steps"] or (w["enabled"] and cur[idx]["mig_devices"] != w["mig_devices"]):
                if cur[idx]["mig_devices"]:
                    self.must(["mig", "-dci", "-i", str(idx)], "nvidia-smi mig -dci", ok_not_found=True)
                    self.must(["mig", "-dgi", "-i", str(idx)], "nvidia-smi mig -dgi", ok_not_found=True)
                order = _mig.creation_order(w["mig_devices"])
                if order:
                    self.must(
                        ["mig", "-cgi", ",".join(order), "-C", "-i", str(idx)],
                        "nvidia-smi mig -cgi %s -C -i %d" % (",".join(order), idx),
                    )
                    self.actions.append("GPU %d: create %s" % (idx, ",".join(order)))
        # Verify: what we could apply must now match (the assert step of mig-parted).
        gpus, cur, _ = self.read_current()
        done = {i: cur[i] for i in want}
        self.result["layout"] = _mig.view(done)
        if self.module._diff:
            self.result["diff"]["after"] = self.result["layout"]
        leftover = [e for e in _mig.plan(want, cur) if e["gpu"] not in self.result["pending_gpus"]]
        if leftover:
            self.module.fail_json(
                msg="MIG layout still differs after apply on GPUs %s" % [e["gpu"] for e in leftover],
                **self.result,
            )

    def reset(self, idxs):
        if not self.module.params["reset"]:
            self._pending(idxs)
            for idx in idxs:
                self.actions.append("GPU %d: reset required (reset=false)" % idx)
            self.module.warn(
                "MIG mode change pending on GPUs %s: reset them (nvidia-smi -r -i ...) or reboot" % idxs
            )
            return
        stopped = self.stop_clients()
        try:
            res = self.smi_run(["-r", "-i", ",".join(str(i) for i in idxs)])
            if res.rc != 0:
                self._pending(idxs)
                self.module.warn(
                    "GPU reset failed (%s); MIG mode stays pending until reboot. Stop GPU clients "
                    "(gpu_clients) or reboot the node." % (res.out + res.err).strip()
                )
            else:
                for idx in idxs:
                    self.actions.append("GPU %d: reset" % idx)
        finally:
            self.start_clients(stopped)

    def _systemctl(self, args):
        systemctl = self.module.get_bin_path("systemctl")
        if systemctl is None:
            return None
        try:
            return _nvidia_smi.run_bounded([systemctl] + args, 120)
        except _nvidia_smi.SmiTimeout:
            self.module.fail_json(msg="systemctl %s did not finish in 120s" % " ".join(args), **self.result)

    def stop_clients(self):
        stopped = []
        for unit in self.module.params["gpu_clients"]:
            active = self._systemctl(["is-active", "--quiet", unit])
            if active is None or active.rc != 0:
                continue
            res = self._systemctl(["stop", unit])
            if res.rc != 0:
                self.start_clients(stopped)
                self.module.fail_json(
                    msg="cannot stop GPU client %s: %s" % (unit, res.err.strip()), **self.result
                )
            stopped.append(unit)
            self.actions.append("stop %s" % unit)
        return stopped

    def start_clients(self, units):
        for unit in reversed(units):
            res = self._systemctl(["start", unit])
            if res is not None and res.rc != 0:
                self.module.warn("could not restart %s after the GPU reset: %s" % (unit, res.err.strip()))
            else:
                self.actions.append("start %s" % unit)


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

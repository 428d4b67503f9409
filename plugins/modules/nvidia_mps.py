#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_mps
short_description: Ensure the NVIDIA MPS control daemon state and its default limits
version_added: 0.1.0
author:
  - hami.node developers
description:
  - Starts or stops the CUDA MPS control daemon (C(nvidia-cuda-mps-control -d), stopped with C(quit)),
    with its pipe and log directories (E(CUDA_MPS_PIPE_DIRECTORY), E(CUDA_MPS_LOG_DIRECTORY)).
  - Sets the default active thread percentage and the per-device pinned memory limit that new MPS
    servers get. The module sends C(set_default_active_thread_percentage) and
    C(set_default_device_pinned_mem_limit) to the daemon, but only when the current value, read back
    with C(get_...), differs.
  - When C(nvidia-cuda-mps-control) is missing, the module fails with the diagnosis from the incident
    report (seed 003 section 5.2). That is install C(nvidia-compute-utils-<branch>) for the loaded
    driver branch.
  - Daemon liveness is the PID in C(<pipe_dir>/nvidia-cuda-mps-control.pid).
  - Use a systemd unit (role C(hami.node.nvidia_mps)) for a daemon that survives reboots. This module
    is for the one-off start, the limits and the checks.
options:
  state:
    description: Whether the control daemon should run.
    type: str
    choices: [started, stopped]
    default: started
  pipe_dir:
    description: E(CUDA_MPS_PIPE_DIRECTORY). Clients must use the same value.
    type: path
    default: /tmp/nvidia-mps
  log_dir:
    description: E(CUDA_MPS_LOG_DIRECTORY). The daemon writes C(control.log) and C(server.log) there.
    type: path
    default: /var/log/nvidia-mps
  default_active_thread_percentage:
    description:
      - Default share of SMs for new MPS servers, from 1 to 100. With N replicas per GPU this is
        commonly 100/N. When not set, the value is left alone.
    type: float
  pinned_mem_limits:
    description:
      - Default pinned device memory limit per device. Keys are device indices or UUIDs, values are sizes
        such as V(8G) or V(8192M).
    type: dict
    default: {}
  control_path:
    description: Name or path of C(nvidia-cuda-mps-control). A bare name is looked up on E(PATH).
    type: str
    default: nvidia-cuda-mps-control
  sysfs_root:
    description:
      - Root of sysfs used to read the loaded driver version. The branch is named in the error when the
        binary is missing. Defaults to E(HAMI_SYSFS_ROOT), and then C(/sys).
    type: path
  timeout:
    description: Seconds each control command, and the daemon start or stop, may take.
    type: float
    default: 30
extends_documentation_fragment:
  - hami.node.attributes
attributes:
  check_mode:
    support: full
    details: Reports what would change and runs no changing command.
  diff_mode:
    support: full
    details: Shows the daemon state and limits before and after.
notes:
  - MPS and MIG do not mix on one GPU.
  - Neither the NVIDIA nor the HAMi device plugin shares MIG devices through MPS.
  - NVIDIA's device plugin also sets the GPUs to C(EXCLUSIVE_PROCESS) compute mode (C(nvidia-smi -c 3)).
    The role does that, this module does not.
seealso:
  - module: hami.node.nvidia_gpu_info
"""

EXAMPLES = r"""
- name: MPS daemon for 4 replicas per GPU
  hami.node.nvidia_mps:
    pipe_dir: /run/nvidia/mps/pipe
    log_dir: /run/nvidia/mps/log
    default_active_thread_percentage: 25
    pinned_mem_limits:
      "0": 24G
      "1": 24G

- name: Stop it
  hami.node.nvidia_mps:
    state: stopped
    pipe_dir: /run/nvidia/mps/pipe
"""

RETURN = r"""
running:
  description: Whether the control daemon runs after the task (or would, in check mode).
  returned: always
  type: bool
pid:
  description: PID of the control daemon, null when it is not running.
  returned: always
  type: int
control_path:
  description: Path of C(nvidia-cuda-mps-control) used.
  returned: success
  type: str
default_active_thread_percentage:
  description: The daemon's default active thread percentage after the task.
  returned: when running
  type: float
  sample: 25.0
pinned_mem_limits:
  description: The limits this task manages, as the daemon reports them after the task.
  returned: when running
  type: dict
actions:
  description: What was done (or would be done in check mode).
  returned: always
  type: list
  elements: str
"""

import os  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _driver, _mps, _nvidia_smi  # noqa: E402


class Mps:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.actions = []
        self.env = dict(os.environ)
        self.env["CUDA_MPS_PIPE_DIRECTORY"] = self.p["pipe_dir"]
        self.env["CUDA_MPS_LOG_DIRECTORY"] = self.p["log_dir"]
        self.result = {"changed": False, "actions": self.actions, "running": False, "pid": None}
        path = self.p["control_path"]
        self.binary = (
            module.get_bin_path(path) if "/" not in path else (path if os.access(path, os.X_OK) else None)
        )
        self.result["control_path"] = self.binary

    def control(self, line, check=True):
        try:
            res = _nvidia_smi.run_bounded([self.binary], self.p["timeout"], env=self.env, data=line + "\n")
        except _nvidia_smi.SmiTimeout:
            self.module.fail_json(
                msg="nvidia-cuda-mps-control did not answer %r within %ss (daemon stuck? check "
                "%s/control.log)" % (line, self.p["timeout"], self.p["log_dir"]),
                **self.result,
            )
        if check and res.rc != 0:
            self.module.fail_json(
                msg="MPS command %r failed (rc %d): %s" % (line, res.rc, (res.out + res.err).strip()),
                **dict(self.result, **res.as_dict()),
            )
        return res

    def wait_for(self, want_running):
        deadline = time.monotonic() + self.p["timeout"]
        while time.monotonic() < deadline:
            pid = _mps.daemon_pid(self.p["pipe_dir"])
            if (pid is not None) == want_running:
                return pid
            time.sleep(0.2)
        self.module.fail_json(
            msg="MPS control daemon did not %s within %ss; see %s/control.log"
            % ("start" if want_running else "stop", self.p["timeout"], self.p["log_dir"]),
            **self.result,
        )

    def read_settings(self):
        pct = _mps.parse_percentage(self.control("get_default_active_thread_percentage").out)
        limits = {}
        for dev in self.p["pinned_mem_limits"]:
            limits[str(dev)] = self.control("get_default_device_pinned_mem_limit %s" % dev).out.strip()
        return pct, limits

    def run(self):
        p = self.p
        pid = _mps.daemon_pid(p["pipe_dir"])
        before = {"running": pid is not None}
        if self.binary is None:
            if p["state"] == "stopped" and pid is None:
                return self.finish(before, before)
            branch = _driver.branch_of(
                _driver.loaded_version(_driver.sysfs_root(p["sysfs_root"])) or self.smi_driver_version()
            )
            self.module.fail_json(msg=_mps.missing_binary_message(branch), **self.result)
        pct = p["default_active_thread_percentage"]
        if pct is not None and not 0 < pct <= 100:
            self.module.fail_json(msg="default_active_thread_percentage must be in (0, 100], got %s" % pct)

        if p["state"] == "stopped":
            if pid is not None:
                self.result["changed"] = True
                self.actions.append("stop MPS control daemon (pid %d)" % pid)
                if not self.module.check_mode:
                    self.control("quit")
                    self.wait_for(False)
            return self.finish(before, {"running": False})

        if pid is not None:
            cur_pct, cur_limits = self.read_settings()
        else:
            cur_pct, cur_limits = None, {}
        before.update({"default_active_thread_percentage": cur_pct, "pinned_mem_limits": cur_limits})
        for d in (p["pipe_dir"], p["log_dir"]):
            if not os.path.isdir(d):
                self.actions.append("create directory %s" % d)
                self.result["changed"] = True
                if not self.module.check_mode:
                    os.makedirs(d, mode=0o755, exist_ok=True)
        if pid is None:
            self.actions.append("start MPS control daemon")
            self.result["changed"] = True
            if not self.module.check_mode:
                res = _nvidia_smi.run_bounded([self.binary, "-d"], p["timeout"], env=self.env)
                if res.rc != 0:
                    self.module.fail_json(
                        msg="nvidia-cuda-mps-control -d failed (rc %d): %s"
                        % (res.rc, (res.out + res.err).strip()),
                        **self.result,
                    )
                pid = self.wait_for(True)
        sets = []
        if pct is not None and (cur_pct is None or abs(cur_pct - pct) > 1e-6):
            sets.append("set_default_active_thread_percentage %g" % pct)
        for dev, value in sorted(p["pinned_mem_limits"].items()):
            if not _mps.same_limit(cur_limits.get(str(dev), ""), value):
                sets.append("set_default_device_pinned_mem_limit %s %s" % (dev, value))
        for line in sets:
            self.actions.append(line)
            self.result["changed"] = True
            if not self.module.check_mode:
                self.control(line)
        after = {
            "running": True,
            "default_active_thread_percentage": pct if pct is not None else cur_pct,
            "pinned_mem_limits": dict(cur_limits, **{str(k): v for k, v in p["pinned_mem_limits"].items()}),
        }
        if not self.module.check_mode:
            after["default_active_thread_percentage"], after["pinned_mem_limits"] = self.read_settings()
        self.result["pid"] = pid
        self.result.update({k: after[k] for k in ("default_active_thread_percentage", "pinned_mem_limits")})
        return self.finish(before, after)

    def smi_driver_version(self):
        """Driver version from nvidia-smi when sysfs has none (e.g. in a container); None on any problem."""
        smi = self.module.get_bin_path("nvidia-smi")
        if smi is None:
            return None
        try:
            res = _nvidia_smi.run_bounded([smi, "--query-gpu=driver_version", "--format=csv,noheader"], 10)
        except _nvidia_smi.SmiTimeout:
            return None
        lines = res.out.strip().splitlines()
        return lines[0].strip() if res.rc == 0 and lines else None

    def finish(self, before, after):
        self.result["running"] = after["running"]
        if not after["running"]:
            self.result["pid"] = None
        if self.module._diff:
            self.result["diff"] = {"before": before, "after": after}
        return self.result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            pipe_dir=dict(type="path", default="/tmp/nvidia-mps"),
            log_dir=dict(type="path", default="/var/log/nvidia-mps"),
            default_active_thread_percentage=dict(type="float"),
            pinned_mem_limits=dict(type="dict", default={}),
            control_path=dict(type="str", default="nvidia-cuda-mps-control"),
            sysfs_root=dict(type="path"),
            timeout=dict(type="float", default=30),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**Mps(module).run())


if __name__ == "__main__":
    main()

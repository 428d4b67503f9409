# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""The nvidia_mig module's engine: read the node's MIG state with nvidia-smi, plan with ``_mig``, apply
(destroy, set mode, one reset for all GPUs, create) and verify, like NVIDIA's mig-parted ``apply``.

PRIVATE to the hami.node collection. The module (plugins/modules/nvidia_mig.py) keeps its documentation,
argument spec and ``main``."""

from __future__ import annotations

import os

from ansible.module_utils.basic import missing_required_lib
from ansible_collections.hami.node.plugins.module_utils import _mig, _nvidia_smi, known_bad_drivers

try:
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

    def smi_run(self, args):
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
        return res

    def must(self, args, what, ok_not_found=False):
        res = self.smi_run(args)
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

"""tools/site_slices.py over real site.yml runs: two slices converge the fleet with the roll deferred, one
final run rolls the deferred nodes; a sick node never stops the others and the merged account is right.

SIMULATED as test_site_fleet.py (its Fleet: local hosts running the real kubelet role, the simulated API
server with a pod runner, stub systemctl and NVML probe); the runner, its ansible-playbook processes, the
plays and the account callback are the product's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.rollout.harness import cluster
from tests.integration.site.test_site_fleet import ROOT, Fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_two_slices_one_sick_node_the_others_converge_and_roll(tmp_path: Path) -> None:
    names = [f"n{i:02d}" for i in range(1, 7)]
    with cluster(names) as c:
        f = Fleet(tmp_path, c.api.kubeconfig_path)
        wanted = {"kubelet_settings": {"maxPods": 111}}  # a disruptive change: the kubelet restarts
        f.host("n01")
        f.host("n02", config="apiVersion: [unclosed\n")  # sick: its plan fails
        f.host("n03", **wanted)  # rolls, in the final run
        f.host("n04")
        f.host("n05", kubelet_settings={"maxPods": 99}, kubelet_restart=False)  # disrupts nothing: slice
        f.host("n06", **wanted)  # rolls, in the final run
        inv = f.inventory()
        run_dir = tmp_path / "slices"
        cmd = [sys.executable, str(ROOT / "tools" / "site_slices.py"), "--slices", "2", "-i", str(inv),
               "--run-dir", str(run_dir), "--slice-timeout", "400", "--final-timeout", "400",
               "-e", f"site_rollout_report_dir={f.report}", "-e", "site_serial=2"]
        proc = subprocess.run(cmd, env=f.env(), capture_output=True, text=True, timeout=560, check=False,
                              cwd=tmp_path)
        out = proc.stdout + proc.stderr
        logs = "".join(p.read_text()[-3000:] for p in sorted(run_dir.glob("*.log")))
        assert proc.returncode == 2, out[-4000:] + logs
        doc = json.loads((f.report / "_account.json").read_text())
        got = {h: (v["state"], v["slice"]) for h, v in doc["nodes"].items()}
        assert got == {"n01": ("converged", 1), "n02": ("failed", 2), "n03": ("rolled", 1),
                       "n04": ("converged", 2), "n05": ("changed", 1), "n06": ("rolled", 2)}, out + logs
        assert doc["nodes"]["n02"]["play"] == "plan"
        assert doc["needs_attention"] == ["n02"]
        assert (f.report / "_needs-attention.txt").read_text() == "n02\n"
        assert [s["slice"] for s in doc["slices"]] == [1, 2, "final"]
        # each slice deferred its pending roll; the final run ran only the deferred nodes and rolled both
        slice1 = json.loads((run_dir / "account-1.json").read_text())
        assert slice1["nodes"]["n03"]["state"] == "pending roll"
        assert "roll deferred to the final phase" in slice1["nodes"]["n03"]["detail"]
        assert (run_dir / "final.limit").read_text().split() == ["n03", "n06"]
        assert "n02" in json.loads((run_dir / "final.vars.json").read_text())["site_slices_failed"]
        restarted = sorted(line.split()[1] for line in f.restarts.read_text().splitlines())
        assert restarted == ["kubelet-n03.service", "kubelet-n06.service"]
        assert "maxPods: 111" in f.config("n03") and "maxPods: 99" in f.config("n05")
        assert not any(c.api.get("Node", None, n)["spec"].get("unschedulable") for n in names)
        assert "summary: failed 1, rolled 2, changed 1, converged 2; 1 node(s) need attention" in proc.stdout

"""playbooks/site.yml over a fleet where nodes are sick in every play: the others converge and roll, the
run ends with the right per-node account and a non-zero exit, and a rerun of only the nodes that needed
attention finishes them.

SIMULATED: the nodes are local hosts (connection ``flaky_local``, this test's plugin: ``local`` that goes
unreachable inside a chosen play) running the real kubelet role against their own kubelet configuration
file; the other node roles are switched off (they need a node's root: the sandbox and molecule cover
them). The cluster is the simulated API server with a ReplicaSet controller and a pod runner
(tests/integration/rollout/harness.py); ``systemctl`` is a stub that records restarts; the gates' NVML probe
is a per-node stub of ``hami-agent devices --json``. Everything else - the plays, the roll planner and
admission (hami.node.k8s_rollout), the maintenance window (hami.node.k8s_node_maintenance), the account
callback - is the product's own code.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.plugins.ansible_runner import VENV_BIN, ansible_env
from tests.integration.rollout.harness import GPU_RESOURCE, cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
KUBELET_CONFIG = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

SYSTEMCTL = """#!/bin/sh
# stub systemctl (tests): every unit is loaded and active; restarts are recorded
case "$1" in
  show) printf 'Id=%s\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\n' "$2" ;;
  is-active) echo active ;;
  is-enabled) echo enabled ;;
  restart|start|stop|reload) echo "$1 $2" >> "$HAMI_TEST_SYSTEMCTL_LOG" ;;
esac
exit 0
"""

AGENT = """#!/bin/sh
# stub of `hami-agent devices --json` (tests): this node's answer and exit code
cat "$(dirname "$0")/devices.json"
exit "$(cat "$(dirname "$0")/devices.rc")"
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class Fleet:
    """The hosts, their files, the inventory and the runs."""

    def __init__(self, tmp: Path, kubeconfig: str) -> None:
        self.tmp = tmp
        self.kubeconfig = kubeconfig
        self.hosts: dict[str, dict] = {}
        self.bin = tmp / "bin"
        self.bin.mkdir()
        _exe(self.bin / "systemctl", SYSTEMCTL)
        self.restarts = tmp / "systemctl.log"
        self.report = tmp / "report"
        self.runs = 0

    def host(self, name: str, config: str | None = KUBELET_CONFIG, healthy: bool = True, **hostvars) -> None:
        d = self.tmp / name
        d.mkdir()
        if config is not None:
            (d / "kubelet-config.yaml").write_text(config)
        _exe(d / "hami-agent", AGENT)
        self.set_health(name, healthy)
        self.hosts[name] = {
            "ansible_connection": "flaky_local",
            "ansible_python_interpreter": sys.executable,
            "kubelet_kubespray_config_path": str(d / "kubelet-config.yaml"),
            "kubelet_kubeadm_config_path": str(d / "absent.yaml"),
            "kubelet_service": f"kubelet-{name}.service",
            "kubelet_backup": False,
            "node_maintenance_agent_bin": str(d / "hami-agent"),
            **hostvars,
        }

    def set_health(self, name: str, healthy: bool) -> None:
        d = self.tmp / name
        gpu = {"uuid": f"GPU-{name}", "index": 0, "healthy": healthy, "mig_enabled": False}
        (d / "devices.json").write_text(json.dumps({"driver_version": "570.172.08", "gpus": [gpu],
                                                    "problems": [] if healthy else ["GPU 0 lost"]}))
        (d / "devices.rc").write_text("0" if healthy else "1")

    def config(self, name: str) -> str:
        return (self.tmp / name / "kubelet-config.yaml").read_text()

    def run(self, *extra: str, timeout: int = 420) -> subprocess.CompletedProcess:
        cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory()),
               str(ROOT / "playbooks" / "site.yml"), "-e", f"site_rollout_report_dir={self.report}", *extra]
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=self.tmp)
        self.runs += 1
        (self.tmp / f"run{self.runs}.log").write_text(proc.stdout + proc.stderr)
        return proc

    def inventory(self) -> Path:
        inv = self.tmp / "hosts.yml"
        inv.write_text(yaml.safe_dump({"all": {
            "vars": {
                "site_nvidia_driver": False, "site_nvidia_mig": False, "site_nvidia_mps": False,
                "site_hami_core": False, "site_hami_agent": False, "site_hami_scheduler": False,
                "node_maintenance_kubeconfig": self.kubeconfig,
                "node_maintenance_gate_timeout": 20, "node_maintenance_nvml_timeout": 5,
                "node_maintenance_nvml_attempts": 1, "node_maintenance_drain_timeout": 60,
                "node_maintenance_backoff_max": 2, "node_maintenance_api_timeout": 5,
                "node_maintenance_check_register": False,
            },
            "children": {"gpu_nodes": {"hosts": self.hosts}, "hami_scheduler": {"hosts": {}}}}}))
        return inv

    def env(self) -> dict:
        env = ansible_env(self.tmp, stubs=False)
        env.update({
            "PATH": f"{self.bin}:{env['PATH']}",
            "HAMI_TEST_SYSTEMCTL_LOG": str(self.restarts),
            "ANSIBLE_CONNECTION_PLUGINS": str(HERE / "connection_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "hami.node.fleet_account",
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_FORKS": "20",
            "HAMI_NODE_ACCOUNT_DIR": str(self.tmp / "runs"),
        })
        return env

    def account(self) -> dict:
        return json.loads((self.report / "_account.json").read_text())


def _bare_gpu_pod(node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"bare-{node}", "namespace": "ml"},
            "spec": {"nodeName": node, "schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}


def _states(doc: dict) -> dict[str, str]:
    return {h: v["state"] for h, v in doc["nodes"].items()}


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman (make setup installs it) reports n01 down")
def test_one_sick_node_in_each_play_never_stops_the_others(tmp_path: Path) -> None:
    names = [f"n{i:02d}" for i in range(1, 14)]
    with cluster(names) as c:
        f = Fleet(tmp_path, c.api.kubeconfig_path)
        wanted = {"kubelet_settings": {"maxPods": 111}}  # a disruptive change: the kubelet restarts
        # unreachable from the start: the sandbox's podman connection to a container that is not there
        f.host("n01", ansible_connection="hami.node.podman_pipelined", ansible_host="hami-test-no-such-node")
        f.host("n02", config="apiVersion: [unclosed\n")               # its plan fails
        f.host("n03", config=None)                                    # its convergence fails (no kubelet)
        f.host("n04", hami_test_down_play="all at once")              # unreachable while converging
        f.host("n05", **wanted)                                       # rolls
        f.host("n06", **wanted)                                       # its drain would refuse: a bare pod
        f.host("n07", hami_test_down_play="disruptive changes in batches", **wanted)  # down in its window
        f.host("n08", healthy=False, **wanted)                        # fails its NVML gate: parked
        f.host("n09", **wanted)                                       # the roll stops before it
        f.host("n10")                                                 # nothing to do
        f.host("n11", kubelet_settings={"maxPods": 99}, kubelet_restart=False)  # disrupts nothing
        c.api.create(_bare_gpu_pod("n06"))
        assert c.wait(lambda: c.api.get("Pod", "ml", "bare-n06")["status"].get("phase") == "Running")

        proc = f.run("-e", "site_serial=2")
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-4000:]
        doc = f.account()
        assert _states(doc) == {
            "n01": "unreachable", "n02": "failed", "n03": "failed", "n04": "unreachable", "n05": "rolled",
            "n06": "refused", "n07": "unreachable", "n08": "parked", "n09": "skipped", "n10": "converged",
            "n11": "changed"}, out[-6000:]
        nodes = doc["nodes"]
        assert nodes["n02"]["play"] == "plan" and "kubelet" in nodes["n02"]["task"].lower()
        assert nodes["n03"]["play"] == "converge" and "no kubelet configuration" in nodes["n03"]["detail"]
        assert "all at once" in nodes["n04"]["play"] and "went down" in nodes["n04"]["detail"]
        assert "bare-n06" in nodes["n06"]["detail"] and "nothing was written" in nodes["n06"]["detail"]
        assert "disruptive changes in batches" in nodes["n07"]["play"]
        assert nodes["n08"]["gate"] == "nvml" and nodes["n08"]["batch"] == 2
        assert "site_rollout_max_parked=0" in nodes["n09"]["detail"]
        assert doc["needs_attention"] == ["n01", "n02", "n03", "n04", "n06", "n07", "n08", "n09"]
        assert (f.report / "_needs-attention.txt").read_text().split() == doc["needs_attention"]
        assert "HAMI.NODE ACCOUNT" in proc.stdout and "8 node(s) need attention" in proc.stdout

        # the cluster as the account says: n05 rolled and uncordoned; the refused n06 untouched (its pod
        # runs, it was never cordoned: a refusal writes nothing); n08 parked at its gate; n09 untouched
        def node(n: str) -> dict:
            return c.api.get("Node", None, n)

        assert not node("n05")["spec"].get("unschedulable")
        assert not node("n06")["spec"].get("unschedulable")
        assert c.api.get("Pod", "ml", "bare-n06")["metadata"].get("deletionTimestamp") is None
        assert node("n08")["metadata"]["annotations"]["hami.io/maintenance-failed-gate"] == "nvml"
        assert node("n08")["spec"]["unschedulable"] is True
        assert not node("n09")["spec"].get("unschedulable")
        # the disruptive change ran only inside windows: the kubelet restarted on n05 and n08, on no other
        restarted = sorted(line.split()[1] for line in f.restarts.read_text().splitlines())
        assert restarted == ["kubelet-n05.service", "kubelet-n08.service"]
        assert "maxPods: 111" in f.config("n05") and "maxPods" not in f.config("n06")
        assert "maxPods: 99" in f.config("n11") and "maxPods" not in f.config("n09")
        # the plan read the cluster's nodes in one LIST, not a GET per node: only windows read single nodes
        got = {r.path.rsplit("/", 1)[1] for r in c.api.requests_matching("GET", r"^/api/v1/nodes/n\d+$")}
        assert got <= {"n05", "n07", "n08"}, got

        # fix what can be fixed, rerun only the nodes that needed attention
        (tmp_path / "n02" / "kubelet-config.yaml").write_text(KUBELET_CONFIG)
        (tmp_path / "n03" / "kubelet-config.yaml").write_text(KUBELET_CONFIG)
        f.set_health("n08", True)
        c.api.delete("pods", "ml", "bare-n06")
        assert c.wait(lambda: not [p for p in c.api.list("pods") if p["metadata"]["name"] == "bare-n06"])
        rerun = f.run("-e", "site_serial=2", "-e", "hami_test_down_play=no-such-play",
                      "--limit", f"@{f.report / '_needs-attention.txt'}")
        out = rerun.stdout + rerun.stderr
        doc = f.account()
        assert _states(doc) == {"n01": "unreachable", "n02": "converged", "n03": "converged",
                                "n04": "converged", "n06": "rolled", "n07": "rolled", "n08": "rolled",
                                "n09": "rolled"}, out[-6000:]
        assert rerun.returncode != 0 and doc["needs_attention"] == ["n01"]
        assert not any(node(n)["spec"].get("unschedulable") for n in names if n != "n01")

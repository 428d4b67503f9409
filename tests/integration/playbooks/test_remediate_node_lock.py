"""playbooks/remediate_node_lock.yml against the simulated API server (real ansible-playbook, local
connection, hami.node.hami_node + kubernetes.core on the controller)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.sim.apiserver import ApiServer

# Two playbook runs of ~20 module executions each (every hami_node/k8s_info item is a new Python process
# importing the kubernetes client): ~40 s of CPU in all. Wall time follows the machine's load: 60 s on a
# quiet 2-core box, 225 s measured with other suites sharing it (240 s was not enough there). The
# deadlines only catch a hang, so they are generous.
RUN_TIMEOUT_S = 280
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 40)]

ROOT = Path(__file__).resolve().parents[3]
LOCK = "hami.io/mutex.lock"


def _lock_value(age_s: float, ns: str, pod: str) -> str:
    when = datetime.now(timezone.utc) - timedelta(seconds=age_s)
    return f"{when.strftime('%Y-%m-%dT%H:%M:%SZ')},{ns},{pod}"


def _node(name: str, lock: str | None) -> dict:
    ann = {LOCK: lock} if lock else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann}}


def _pod(ns: str, name: str, phase: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": ns, "name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": phase}}


def _run(tmp_path: Path, server: ApiServer, nodes: list[str]) -> subprocess.CompletedProcess[str]:
    coll = tmp_path / "coll" / "ansible_collections" / "hami"
    coll.mkdir(parents=True, exist_ok=True)
    if not (coll / "node").exists():
        (coll / "node").symlink_to(ROOT)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "coll"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    extra = {"remediate_kubeconfig": str(server.kubeconfig_path), "remediate_nodes": nodes,
             "ansible_python_interpreter": sys.executable}
    return subprocess.run(
        ["ansible-playbook", str(ROOT / "playbooks" / "remediate_node_lock.yml"), "-e", json.dumps(extra)],
        cwd=tmp_path, env=env, text=True, capture_output=True, timeout=RUN_TIMEOUT_S, check=False,
    )


def _changed(out: str) -> int:
    line = next(ln for ln in out.splitlines() if ln.startswith("localhost") and "changed=" in ln)
    return int(line.split("changed=")[1].split()[0])


def test_removes_stale_and_orphaned_locks_and_keeps_live_ones(tmp_path: Path, api_server: ApiServer) -> None:
    api_server.create(_pod("default", "live-pod", "Pending"))
    api_server.create(_pod("default", "done-pod", "Succeeded"))
    api_server.create(_node("gpu-stale", _lock_value(900, "default", "live-pod")))    # older than 5 min
    api_server.create(_node("gpu-orphan", _lock_value(10, "default", "gone-pod")))    # owner deleted
    api_server.create(_node("gpu-done", _lock_value(10, "default", "done-pod")))      # owner finished
    api_server.create(_node("gpu-live", _lock_value(10, "default", "live-pod")))      # in use: keep
    api_server.create(_node("gpu-free", None))
    nodes = ["gpu-stale", "gpu-orphan", "gpu-done", "gpu-live", "gpu-free"]

    first = _run(tmp_path, api_server, nodes)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    ann = {n: (api_server.get("Node", None, n)["metadata"].get("annotations") or {}) for n in nodes}
    assert LOCK not in ann["gpu-stale"] and LOCK not in ann["gpu-orphan"] and LOCK not in ann["gpu-done"]
    assert ann["gpu-live"][LOCK].endswith(",default,live-pod")
    # one looped task made the three changes (the recap counts tasks, not items)
    assert _changed(first.stdout) == 1
    assert first.stdout.count("changed: [localhost] => (item=") == 3

    second = _run(tmp_path, api_server, nodes)
    assert second.returncode == 0, second.stdout[-4000:]
    assert _changed(second.stdout) == 0

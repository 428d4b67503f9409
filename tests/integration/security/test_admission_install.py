"""Safe as installed (issue 27 item 1): the hami_rbac role's admission entry point (tasks_from: admission)
and playbooks/site.yml, run by the real ansible-playbook with a local connection against the simulated API
server (kubernetes.core on the controller).

Before, the rule that refuses forged allocations shipped only with the hami_rbac role, which site.yml ran
only with site_hami_rbac: true and hami_rbac_kubeconfig set: from inventories/example the cluster stayed open,
and a pod owner who rewrote its own hami.io/vgpu-devices-to-allocate after scheduling was handed the other
GPU.
Now, with any kubeconfig the inventory has for the cluster, the default site run installs the policies on a
cluster that serves ValidatingAdmissionPolicy, the guard webhook on one that does not, removes the webhook
once the policies can run, and fails loudly when it can do neither."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hami_agent.protocol import keys
from tests.sim.apiserver import ApiServer
from tests.sim.fixtures import api_server  # noqa: F401
from tests.unit.roles.test_unit_templates import render_env, role_vars

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ["hami-allocation-keys", "hami-scheduled-gpu-pods"]
OLD_CLUSTER = {"validatingadmissionpolicies", "validatingadmissionpolicybindings"}
if not (Path(sys.executable).parent / "ansible-playbook").exists():
    pytest.skip("ansible-playbook is installed with the dev extra", allow_module_level=True)


def _env(tmp_path: Path) -> dict:
    coll = tmp_path / "coll" / "ansible_collections" / "hami"
    coll.mkdir(parents=True, exist_ok=True)
    if not (coll / "node").exists():
        (coll / "node").symlink_to(ROOT)
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "coll"), ANSIBLE_FORCE_COLOR="0",
                ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false",
                ANSIBLE_INVENTORY_UNPARSED_WARNING="false", ANSIBLE_RETRY_FILES_ENABLED="false",
                PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))


def entry_point(tmp_path: Path, tasks_from: str = "admission", **extra) -> tuple[subprocess.CompletedProcess,
                                                                                   dict | None]:
    """Run ``include_role hami.node.hami_rbac tasks_from=<tasks_from>`` on localhost; (process, posture)."""
    out = tmp_path / "posture.json"
    out.unlink(missing_ok=True)
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{"ansible.builtin.include_role": {"name": "hami.node.hami_rbac", "tasks_from": tasks_from}},
                  {"ansible.builtin.copy": {"content": "{{ hami_rbac_admission_posture | to_json }}",
                                            "dest": str(out), "mode": "0600"}}]}]))
    variables = {"ansible_python_interpreter": sys.executable,
                 "hami_rbac_manifest_dir": str(tmp_path / "rbac"),
                 "hami_rbac_guard_webhook_manifest": str(tmp_path / "hami-allocation-guard.yaml"), **extra}
    proc = subprocess.run(["ansible-playbook", str(play), "-e", json.dumps(variables)], cwd=tmp_path,
                          env=_env(tmp_path), text=True, capture_output=True, timeout=280, check=False)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def guard_manifest(tmp_path: Path) -> Path:
    """What the hami_scheduler role renders (templates/guard-webhook.yaml.j2) into its manifest dir."""
    env = render_env()
    env.filters["to_json"] = json.dumps
    text = env.from_string((ROOT / "roles/hami_scheduler/templates/guard-webhook.yaml.j2").read_text())
    path = tmp_path / "hami-allocation-guard.yaml"
    path.write_text(text.render(**role_vars("hami_scheduler")))
    return path


def recap(proc: subprocess.CompletedProcess) -> dict[str, int]:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("localhost") and "ok=" in ln)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def bindings(api: ApiServer) -> list[str]:
    return sorted(b["metadata"]["name"] for b in api.list("validatingadmissionpolicybindings"))


def http(api: ApiServer, method: str, path: str, body: dict, ctype: str = "application/merge-patch+json"):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(api.url + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": ctype, "Authorization": "Bearer simulated-token"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_policies_are_installed_by_default_and_a_rewritten_allocation_is_refused(api_server, tmp_path):  # noqa: F811
    small, big = "GPU-a,NVIDIA,8192,25:;", "GPU-b,NVIDIA,81920,100:;"
    api_server.create({"apiVersion": "v1", "kind": "Pod",  # as the scheduler left it: one GPU, 8 GiB, 25 %
                       "metadata": {"name": "job", "namespace": "default",
                                    "annotations": {keys.VGPU_NODE: "gpu-0", keys.DEVICES_TO_ALLOCATE: small,
                                                    keys.DEVICES_ALLOCATED: small}},
                       "spec": {"nodeName": "gpu-0", "schedulerName": "hami-scheduler",
                                "containers": [{"name": "c", "image": "x",
                                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    rewrite = {"metadata": {"annotations": {keys.DEVICES_TO_ALLOCATE: big}}}
    # the hole (issue 27 item 1, measured: Allocate then answered 81920m / SM 100 on the rewritten GPU)
    assert http(api_server, "PATCH", "/api/v1/namespaces/default/pods/job", rewrite)[0] == 200
    http(api_server, "PATCH", "/api/v1/namespaces/default/pods/job",
         {"metadata": {"annotations": {keys.DEVICES_TO_ALLOCATE: small}}})  # (the admin sim: no policy yet)

    proc, posture = entry_point(tmp_path, node_maintenance_kubeconfig=api_server.kubeconfig_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert posture["guard"] == "policy" and posture["installed"] is True and posture["served"] is True
    assert posture["kubeconfig"] == api_server.kubeconfig_path
    assert bindings(api_server) == POLICIES
    assert sorted(p["metadata"]["name"] for p in api_server.list("validatingadmissionpolicies")) == POLICIES
    code, body = http(api_server, "PATCH", "/api/v1/namespaces/default/pods/job", rewrite)
    assert code == 403 and "hami-allocation-keys" in body["message"], body
    ann = api_server.get("Pod", "default", "job")["metadata"]["annotations"]
    assert ann[keys.DEVICES_TO_ALLOCATE] == small
    # the manifests are what the role renders, 0600 in a 0700 directory
    assert oct((tmp_path / "rbac").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "rbac" / "hami-admission-policy.yaml").stat().st_mode & 0o777) == "0o600"

    again, posture = entry_point(tmp_path, node_maintenance_kubeconfig=api_server.kubeconfig_path)
    assert again.returncode == 0 and posture["installed"] is True
    assert recap(again)["changed"] == 1, again.stdout[-3000:]  # idempotent: only the test's own copy task


def test_an_older_cluster_gets_the_guard_webhook_and_loses_it_once_the_policies_can_run(api_server, tmp_path):  # noqa: F811
    api_server.unserved = set(OLD_CLUSTER)
    api_server.version = (1, 29)
    guard_manifest(tmp_path)
    proc, posture = entry_point(tmp_path, hami_rbac_kubeconfig=api_server.kubeconfig_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert posture["guard"] == "webhook" and posture["installed"] is True and posture["served"] is False
    assert "v1.29.0-hami-sim" in posture["why"] and "does not serve" in posture["why"]
    (hook,) = api_server.list("validatingwebhookconfigurations")
    assert hook["metadata"]["name"] == "hami-allocation-guard"
    assert hook["webhooks"][0]["failurePolicy"] == "Fail"
    assert hook["webhooks"][0]["clientConfig"]["url"].endswith("/validate")
    # the cluster is upgraded: the policies run inside kube-apiserver, the webhook hop goes
    api_server.unserved = set()
    api_server.version = (1, 31)
    proc, posture = entry_point(tmp_path, hami_rbac_kubeconfig=api_server.kubeconfig_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert posture["guard"] == "policy" and posture["installed"] is True
    assert api_server.list("validatingwebhookconfigurations") == [] and bindings(api_server) == POLICIES


def test_no_way_to_guard_the_cluster_fails_loudly_unless_accepted(tmp_path):
    missing = str(tmp_path / "no-such-kubeconfig")
    proc, posture = entry_point(tmp_path, node_maintenance_kubeconfig=missing)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "ALLOCATION GUARD MISSING" in out and "no kubeconfig for the cluster on the controller" in out
    assert missing in out and "hami_rbac_admission_required=false" in out
    proc, posture = entry_point(tmp_path, node_maintenance_kubeconfig=missing,
                                hami_rbac_admission_required=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert posture["guard"] == "none" and posture["installed"] is False
    assert "ALLOCATION GUARD MISSING" in proc.stdout  # still said, loudly


def test_the_check_alone_changes_nothing_and_the_dra_policy_comes_with_dra(api_server, tmp_path):  # noqa: F811
    proc, posture = entry_point(tmp_path, "admission_check",
                                node_maintenance_kubeconfig=api_server.kubeconfig_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert posture["guard"] == "policy" and posture["installed"] is False and bindings(api_server) == []
    proc, posture = entry_point(tmp_path, node_maintenance_kubeconfig=api_server.kubeconfig_path,
                                hami_agent_mode="both")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert bindings(api_server) == sorted([*POLICIES, "hami-dra-resourceslices"])
    assert posture["policies"] == [*POLICIES, "hami-dra-resourceslices"] and posture["installed"] is True


def test_site_yml_installs_the_guard_in_its_default_run(api_server, tmp_path):  # noqa: F811
    """No opt-in: the play after the scheduler play runs with the inventory's kubeconfig (here a GPU node's
    node_maintenance_kubeconfig, as in inventories/example; the scheduler host has none of its own)."""
    inv = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv.write_text(json.dumps({"all": {"children": {
        "hami_scheduler": {"hosts": {"control-1": local}},
        "gpu_nodes": {"hosts": {"gpu-1": {**local,
                                          "node_maintenance_kubeconfig": api_server.kubeconfig_path}}}},
        "vars": {"hami_rbac_manifest_dir": str(tmp_path / "rbac"),
                 "hami_rbac_guard_webhook_manifest": str(tmp_path / "guard.yaml")}}}))
    proc = subprocess.run(["ansible-playbook", "-i", str(inv), str(ROOT / "playbooks" / "site.yml"),
                           "--tags", "site_hami_admission"], cwd=tmp_path, env=_env(tmp_path), text=True,
                          capture_output=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert bindings(api_server) == POLICIES
    assert "allocation guard: ValidatingAdmissionPolicies hami-allocation-keys, hami-scheduled-gpu-pods" in (
        " ".join(proc.stdout.split()))

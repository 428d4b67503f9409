"""Every component with its own credential, against an API server that authenticates, enforces the RBAC
the hami_rbac role renders and the role's admission policy (issue 14, deliverables 4 and 8):

* the agent's real write paths still work: the extender's /filter annotation patch and /bind (node lock,
  bind-phase, pods/binding), leader election, events, the webhook's namespace and quota reads; the device
  plugin process's register loop and Allocate write-back (driven by the SIMULATED kubelet over gRPC, NVML
  from gpusim); the monitor's pod list; ``doctor cluster`` as an operator;
* a tenant's phantom allocation is refused at admission, so the node keeps its capacity for real pods;
* RBAC granted = used: every call each identity made was granted (nothing answered 403), and every
  (verb, resource) the role grants was used by some call, except the commented ``RARE`` paths.

The recorder is the simulator's audit log (``ApiServer.audit``: user + RBAC attributes + answer)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from hami_agent.k8s.client import KubeClient, RetryPolicy
from hami_agent.protocol import keys
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.gpusim import gpusim_state as gs
from tests.gpusim.fixtures import gpusim_factory, gpusim_lib  # noqa: F401
from tests.integration.security.conftest import NODES, OPERATORS, SA_NS, TENANT_NS, SecureCluster
from tests.sim.apiserver_rbac import granted_pairs, used_pairs
from tests.sim.kube_scheduler import KubeSchedulerSim
from tests.sim.kubelet import SimulatedKubelet
from tests.sim.rbac_rare import RARE_PATHS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODE = NODES[0]
GPU = "nvidia.com/gpu"
PODS = f"/api/v1/namespaces/{TENANT_NS}/pods"
SCHED_USER = f"system:serviceaccount:{SA_NS}:hami-scheduler"
PLUGIN_USER = f"system:serviceaccount:{SA_NS}:hami-device-plugin-{NODE}"

# Grants a short test cannot reach, each with the code path that needs it (tests/sim/rbac_rare.py, shared
# with the demo's check). Nothing else may be unused.
RARE: dict[str, dict[tuple[str, str, str], str]] = {
    SCHED_USER: dict(RARE_PATHS["scheduler"]),
    PLUGIN_USER: dict(RARE_PATHS["plugin"]),
    OPERATORS: {},
}


def wait(pred, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def gpu_pod(name: str, gpus: int = 1, mem: int = 4096) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TENANT_NS},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {
                         GPU: str(gpus), "nvidia.com/gpumem": str(mem)}}}]}}


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hami_agent", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def kubelet():
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="dp-", dir="/tmp")
    k = SimulatedKubelet(d, verbosity=2).start()
    yield k
    k.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def plugin(cluster: SecureCluster, kubelet, gpusim_factory, tmp_path):  # noqa: F811
    """``hami-agent device-plugin`` as a process with the node's own credential."""
    node = gpusim_factory("a100-80gb-x8", driver=gs.FIXED_DRIVER)
    env = node.env()
    env["HOOK_PATH"] = str(tmp_path / "usr-local")
    log = tmp_path / "plugin.log"
    cmd = [sys.executable, "-m", "hami_agent", "device-plugin", "-v", "4", "--node-name", NODE,
           "--kubeconfig", cluster.kubeconfig(f"plugin-{NODE}"), "--device-plugin-dir", kubelet.root,
           "--metrics-bind", "none", "--device-split-count", "4",
           "--vgpu-lock-dir", str(tmp_path / "vgpulock"), "--mig-apply-lock", str(tmp_path / "mig.lock"),
           "--nvml-refresh-interval", "1", "--poll-interval", "0.1"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_every_component_with_its_own_token_works_and_uses_exactly_its_grants(  # noqa: PLR0915
        cluster: SecureCluster, kubelet, plugin, tmp_path):
    api = cluster.api
    for n in NODES:  # what the kubelet reports; the register annotation comes from the plugin
        api.patch("nodes", None, n, {"status": {"allocatable": {GPU: "32", "cpu": "64"},
                                                "capacity": {GPU: "32"},
                                                "conditions": [{"type": "Ready", "status": "True"}]}},
                  subresource="status")
    proc, log = plugin
    assert kubelet.wait_registered(GPU, 30, min_devices=32), log.read_text()[-3000:]
    assert wait(lambda: keys.NODE_REGISTER in (api.get("nodes", None, NODE)["metadata"].get("annotations")
                                                or {}), 20), log.read_text()[-3000:]

    sched_client = KubeClient.from_kubeconfig(cluster.kubeconfig("scheduler"), timeout_s=5,
                                              retry=RetryPolicy(attempts=3, base_s=0.05, cap_s=0.2))
    fast_lease = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.3}
    app = SchedulerApp(sched_client, SchedulerConfig(), register_interval_s=0.3, leader_elect=True,
                       lease_namespace=SA_NS, leader_kwargs=fast_lease)
    app.start()
    admin = KubeClient.from_kubeconfig(api.kubeconfig_path, timeout_s=5)  # kube-scheduler's own identity
    sim = None
    try:
        assert wait(app.ready, 20), "scheduler never became leader and synced"
        assert app.extender.synced.wait(10)
        sim = KubeSchedulerSim(admin, app.url, initial_backoff_s=0.2, max_backoff_s=0.4).start()

        # the webhook, as the API server would call it for the tenant's pod (namespace + quota reads)
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u1", "operation": "CREATE", "namespace": TENANT_NS,
                              "object": gpu_pod("w")}}
        req = urllib.request.Request(app.url + "/webhook", data=json.dumps(review).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            resp = json.loads(r.read())["response"]
        assert resp["allowed"] is True, resp

        # a tenant's phantom allocation on gpu-0 is refused (it would have eaten the node's memory)
        phantom = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "phantom", "namespace": TENANT_NS,
                                "labels": {keys.VGPU_NODE: NODE},
                                "annotations": {keys.VGPU_NODE: NODE,
                                                keys.DEVICES_ALLOCATED: "GPU-x,NVIDIA,81920,100:;" * 4}},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        code, body = cluster.call("tenant", "POST", PODS, phantom)
        assert code == 403 and "hami-allocation-keys" in body["message"], body

        # a real pod: /filter patch, /bind (lock, bind-phase, binding) by the scheduler's identity ...
        assert cluster.call("tenant", "POST", PODS, gpu_pod("job", mem=8192))[0] == 201
        assert wait(lambda: (api.get("Pod", TENANT_NS, "job")["spec"].get("nodeName") == NODE), 30), (
            api.get("Pod", TENANT_NS, "job"))
        pod = api.get("Pod", TENANT_NS, "job")
        assert pod["metadata"]["annotations"][keys.BIND_PHASE] == "allocating"
        assert pod["metadata"]["labels"][keys.VGPU_NODE] == NODE
        # ... and Allocate's write-back plus the node lock release by the node's identity
        res = kubelet.admit(pod, timeout=15)
        assert res is not None and res.admitted, (res, log.read_text()[-3000:])
        assert res.allocations["main"][GPU]["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
        ann = api.get("Pod", TENANT_NS, "job")["metadata"]["annotations"]
        assert ann[keys.BIND_PHASE] == "success", ann
        # the release runs right after Allocate answers, off the kubelet's path
        assert wait(lambda: keys.NODE_LOCK not in (api.get("nodes", None, NODE)["metadata"].get("annotations")
                                                   or {}), 10), log.read_text()[-4000:]

        # an unschedulable pod: FilteringFailed events, repeated (the correlator patches the count)
        assert cluster.call("tenant", "POST", f"/api/v1/namespaces/{TENANT_NS}/pods",
                            gpu_pod("huge", gpus=1, mem=10 ** 6))[0] == 201
        # kube-scheduler parks the refused pod until a cluster event: a node label change retries it
        assert wait(lambda: any(k.endswith("/huge") for k, _m in sim.failures), 30)

        def patched_events() -> bool:
            api.patch("nodes", None, NODES[1], {"metadata": {"labels": {"retry": str(time.monotonic())}}})
            return any(r.user.username == SCHED_USER and r.attrs and r.attrs.verb == "patch"
                       and r.attrs.resource == "events" for r in list(api.audit))

        assert wait(patched_events, 30, step=1.5)
        # leader election renews (lease update) at least once
        assert wait(lambda: any(r.user.username == SCHED_USER and r.attrs and r.attrs.verb == "update"
                                and r.attrs.resource == "leases" for r in list(api.audit)), 10)
    finally:
        if sim is not None:
            sim.stop()
        app.stop()
        admin.close()
        sched_client.close()

    # the monitor with the node's credential: its pod list for container names
    shr = tmp_path / "containers"
    shr.mkdir()
    out = run_cli("monitor", "--once", "--dir", str(shr), "--node-name", NODE, "--no-host-metrics",
                  "--kubeconfig", cluster.kubeconfig(f"plugin-{NODE}"))
    assert out.returncode == 0, out.stdout + out.stderr
    # doctor cluster as an operator in hami_rbac_doctor_groups
    out = run_cli("doctor", "cluster", "--kubeconfig", cluster.kubeconfig("operator"), "--no-local",
                  "--no-nvml", "--no-journal", "--json")
    assert "forbidden" not in (out.stdout + out.stderr).lower(), out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["children"], report  # it saw the nodes and the pending pod
    # doctor pod reads the pod and its node with GETs (doctor cluster reads everything with lists)
    out = run_cli("doctor", "pod", f"{TENANT_NS}/job", "--kubeconfig", cluster.kubeconfig("operator"),
                  "--node-name", NODE, "--no-local", "--no-nvml", "--no-journal", "--json")
    assert "forbidden" not in (out.stdout + out.stderr).lower(), out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads(out.stdout)["facts"].get("pod.found") is True, out.stdout[-2000:]

    proc.terminate()
    proc.wait(15)

    docs = [o for k in ("clusterroles", "clusterrolebindings", "roles", "rolebindings") for o in api.list(k)]
    identities = {SCHED_USER: cluster.tokens.lookup(cluster.token("scheduler")),
                  PLUGIN_USER: cluster.tokens.lookup(cluster.token(f"plugin-{NODE}")),
                  OPERATORS: cluster.tokens.lookup(cluster.token("operator"))}
    problems = []
    for name, user in identities.items():
        records = [r for r in api.audit if r.user.username == user.username and r.attrs is not None]
        refused = [(r.code, r.attrs.key()) for r in records if r.code in (401, 403)]
        if refused:
            problems.append(f"{name}: refused calls {refused}")
        grants = granted_pairs(docs, user)
        used = used_pairs(records)
        if used - grants:
            problems.append(f"{name}: used but not granted {sorted(used - grants)}")
        unused = grants - used - set(RARE[name])
        if unused:
            problems.append(f"{name}: granted but never used (least privilege; exercise it or add it to RARE "
                            f"with the code path): {sorted(unused)}")
        stale = set(RARE[name]) - grants
        if stale:
            problems.append(f"{name}: RARE lists grants the role no longer has: {sorted(stale)}")
    assert not problems, "\n".join(problems)

"""The Grafana dashboard shipped in the collection (dashboards/hami-node.json) queries only metrics the
agent really exports (issue 21, item 3).

Starts the real pieces against the simulators: the ``hami-agent device-plugin`` process on a gpusim node
with the simulated kubelet (one pod admitted, so Allocate ran), the ``hami-agent monitor`` process over
a HAMi-core shared region and gpusim's NVML, and the scheduler extender in-process behind the simulated
kube-scheduler (one pod placed, one refused). Then it scrapes each one's live ``/metrics`` and checks
that every metric name in every panel's query has samples there.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_agent.protocol import keys
from tests.integration.scheduler.cluster import gpu_node, gpu_pod, stack
from tests.shrreg.helpers import stop
from tests.sim.kubelet import SimulatedKubelet
from tests.sim.ports import free_port
from tests.unit.deviceplugin.fakes import ctr, hami_pod
from tests.unit.shrreg.builder import MIB, build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DASHBOARD = Path(__file__).resolve().parents[3] / "dashboards" / "hami-node.json"
NODE = "gpu-1"
GPU = "nvidia.com/gpu"
POD_UID = "0b6e5f7c-1111-2222-3333-444455556666"
# PromQL words that are not metric names
PROMQL = {"sum", "avg", "max", "min", "count", "by", "without", "rate", "irate", "increase",
          "histogram_quantile", "label_values", "on", "ignoring", "group_left", "group_right", "and", "or",
          "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names
    (inside ``{...}``, ``by (...)``) or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)      # string literals
    text = re.sub(r"\{[^}]*\}", "", text)                 # label matchers
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)                # range selectors
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = m.group(0), text[m.end():].lstrip()
        if word in PROMQL or rest.startswith("("):
            continue
        names.add(word)
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["definition"]) for v in dash["templating"]["list"]
            if "definition" in v]
    return out


def test_metric_names_are_read_from_queries():
    assert metric_names('histogram_quantile(0.99, sum by (le, method) (rate(x_bucket{verb="f"}[5m])))') \
        == {"x_bucket"}
    assert metric_names("100 * sum by (n) (a{n=~\"$node\"}) / sum by (n) (b)") == {"a", "b"}
    assert metric_names("label_values(GPUDeviceMemoryLimit, nodeid)") == {"GPUDeviceMemoryLimit", "nodeid"}


def scrape(url: str) -> set[str]:
    """Names of the samples a live /metrics endpoint serves (label names of its families too, for
    ``label_values(metric, label)``)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = resp.read().decode()
    names: set[str] = set()
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            names.add(s.name)
            names.update(s.labels)
    return names


def wait_for(pred, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    return pred()


def _device_plugin_names(node, api_server, tmp_path: Path) -> set[str]:
    sock_dir = tempfile.mkdtemp(prefix="dp-", dir="/tmp")  # unix socket paths must stay short
    kubelet = SimulatedKubelet(sock_dir).start()
    port = free_port()
    log = tmp_path / "plugin.log"
    env = node.env()
    env["HOOK_PATH"] = str(tmp_path / "usr-local")
    api_server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {}}})
    cmd = [sys.executable, "-m", "hami_agent", "device-plugin", "--node-name", NODE,
           "--kubeconfig", api_server.kubeconfig_path, "--device-plugin-dir", sock_dir,
           "--metrics-bind", f"127.0.0.1:{port}", "--device-split-count", "4",
           "--vgpu-lock-dir", str(tmp_path / "vgpulock"), "--mig-apply-lock", str(tmp_path / "mig.lock")]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        assert kubelet.wait_registered(GPU, 60, min_devices=4), log.read_text()[-3000:]
        uuid = node.state()["gpus"][0]["uuid"]
        # Allocate checks against the registered capacity: wait for the node registration loop
        assert wait_for(lambda: uuid in (api_server.get("nodes", None, NODE)["metadata"].get("annotations")
                                         or {}).get(keys.NODE_REGISTER, ""), 60), log.read_text()[-3000:]
        api_server.create(hami_pod("train-0", NODE, [ctr("train", 1)], f"{uuid},NVIDIA,20000,50:;"))
        lock = {keys.NODE_LOCK: "2026-11-21T12:00:00Z,default,train-0"}
        api_server.patch("nodes", None, NODE, {"metadata": {"annotations": lock}})
        res = kubelet.admit(api_server.get("pods", "default", "train-0"), timeout=20)
        assert res is not None and res.admitted, (res, log.read_text()[-3000:])
        # a pod no node lock names is refused (an RPC error for the errors panel)
        api_server.create(hami_pod("stray-0", NODE, [ctr("stray", 1)], f"{uuid},NVIDIA,1000,10:;"))
        res = kubelet.admit(api_server.get("pods", "default", "stray-0"), timeout=20)
        assert res is not None and not res.admitted, res
        return scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop(proc)
        kubelet.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _monitor_names(node, api_server, tmp_path: Path) -> set[str]:
    region = tmp_path / "containers" / f"{POD_UID}_train" / "abc.cache"
    region.parent.mkdir(parents=True)
    region.write_bytes(build("v1.2", ndev=1, limit_mib=20000, sm_limit=50,
                             slots=[(101, 5101, 1, [512 * MIB])]))
    api_server.create({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "train-0", "namespace": "ml", "uid": POD_UID},
                       "spec": {"nodeName": NODE, "containers": [{"name": "train", "image": "cuda"}]}})
    port = free_port()
    cmd = [sys.executable, "-m", "hami_agent", "monitor", "--dir", str(tmp_path / "containers"),
           "--node-name", NODE, "--kubeconfig", api_server.kubeconfig_path,
           "--metrics-bind", f"127.0.0.1:{port}", "--mig-apply-lock", str(tmp_path / "mig.lock")]
    log = tmp_path / "monitor.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=node.env(), stdout=fh, stderr=subprocess.STDOUT)
    try:
        def ready() -> set[str] | None:
            try:
                names = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
            want = {"hami_vgpu_memory_used_bytes", "hami_host_gpu_memory_used_bytes"}
            return names if want <= names else None
        names = wait_for(ready)
        assert names, log.read_text()[-3000:]
        return names
    finally:
        stop(proc)


def _extender_names(api_server) -> set[str]:
    api_server.create(gpu_node("sched-1", gpus=1, mem=16384))
    with stack(api_server) as (app, _sim):
        api_server.create(gpu_pod("fits", mem=4096, cores=30))
        api_server.create(gpu_pod("too-big", mem=500000))  # no GPU has that much: refused with a reason
        assert wait_for(lambda: ((api_server.get("Pod", "default", "fits") or {}).get("spec") or {})
                        .get("nodeName"))
        url = f"{app.url}/metrics"

        def counted() -> set[str] | None:
            names = scrape(url)
            return names if "hami_scheduler_filter_node_failures_total" in names else None
        names = wait_for(counted)
        assert names, "the refused pod was never counted by reason"
        return names


def test_every_dashboard_query_names_metrics_the_live_agent_serves(gpusim_factory, api_server, tmp_path):
    node = gpusim_factory("h100-80gb-x4")

    def whole_gpus(state):  # shared through HAMi-core, with utilisation to report (N/A under MIG)
        for gpu in state["gpus"]:
            gpu["mig"]["current"] = 0
            gpu["utilization_gpu"] = 37

    node.update(whole_gpus)
    served = {
        "device plugin": _device_plugin_names(node, api_server, tmp_path),
        "monitor": _monitor_names(node, api_server, tmp_path),
        "extender": _extender_names(api_server),
    }
    every = set().union(*served.values())
    queries = dashboard_queries()
    assert len(queries) >= 15
    missing = {(title, name) for title, expr in queries for name in metric_names(expr) if name not in every}
    assert not missing, f"dashboard queries name metrics no component serves: {sorted(missing)}"
    # the panels the issue asks for are there, each fed by the component that owns it
    used = {name for _, expr in queries for name in metric_names(expr)}
    for component, must in {
        "device plugin": {"hami_device_plugin_devices", "hami_device_plugin_nvml_stuck",
                          "hami_device_plugin_rpc_duration_seconds_bucket"},
        "monitor": {"hami_vgpu_memory_used_bytes", "hami_vgpu_core_limit_percent",
                    "hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio"},
        "extender": {"GPUDeviceMemoryAllocated", "GPUDeviceCoreAllocated",
                     "hami_scheduler_request_duration_seconds_bucket",
                     "hami_scheduler_filter_node_failures_total"},
    }.items():
        assert must <= used, (component, must - used)
        assert must <= served[component], (component, must - served[component])

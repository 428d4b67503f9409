"""hami-agent monitor as a process: HTTP /metrics from C-written regions, live changes, pod names, SIGTERM."""

import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.shrreg.helpers import MIB, Mk, uuid_for
from tests.sim.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

UID = "7d0c0f3e-5555-4000-8000-000000000001"


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def wait_for(pred, timeout=15.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"condition not met; last={last!r}")


def start(args, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "hami_agent", "monitor", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_serves_metrics_and_follows_changes(mkregion, region_dir, procs):
    a = Mk(region_dir / f"{UID}_main" / "a.cache", "v1.2").create(ndev=1, limit_mib=8192)
    live = a.spawn("live", 30, used_bytes=300 * MIB)
    procs.append(live)
    port = free_port()
    proc = start(
        [
            "--metrics-bind",
            f"127.0.0.1:{port}",
            "--dir",
            str(region_dir),
            "--interval",
            "0.2",
            "--no-host-metrics",
        ]
    )
    procs.append(proc)

    def has_main():
        s = scrape(port)
        return s if s.get("hami_vgpu_memory_used_bytes") else None

    s = wait_for(has_main)
    labels, value = s["hami_vgpu_memory_used_bytes"][0]
    assert value == 300 * MIB and labels["container"] == "main" and labels["device_uuid"] == uuid_for(0)
    assert s["vGPU_device_memory_limit_in_bytes"][0][1] == 8192 * MIB

    # a new container appears (first half-written, then initialised), the first one vanishes
    half = region_dir / f"{UID}_side" / "b.cache"
    half.parent.mkdir()
    half.write_bytes(bytes(2008953))
    wait_for(lambda: scrape(port).get("hami_shrreg_regions_skipped"))
    half.unlink()
    Mk(half, "v1.1").create(ndev=1)
    wait_for(lambda: len(scrape(port).get("hami_vgpu_memory_used_bytes", [])) == 2)
    (region_dir / f"{UID}_main" / "a.cache").unlink()

    def only_side():
        s = scrape(port)
        return s if len(s.get("hami_vgpu_memory_used_bytes", [])) == 1 else None

    s = wait_for(only_side)
    assert s["hami_vgpu_memory_used_bytes"][0][0]["container"] == "side"

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert "vGPU monitor stopped" in proc.stderr.read()


def test_pod_names_from_api_server(mkregion, region_dir, api_server):
    api_server.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": UID},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "x"}]},
        }
    )
    Mk(region_dir / f"{UID}_main" / "a.cache", "v1.2").create(ndev=1)
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_agent",
            "monitor",
            "--once",
            "--dir",
            str(region_dir),
            "--kubeconfig",
            api_server.kubeconfig_path,
            "--node-name",
            "gpu-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cp.returncode == 0, cp.stderr
    assert 'namespace="ml"' in cp.stdout and 'pod="trainer-0"' in cp.stdout
    assert 'podnamespace="ml"' in cp.stdout and 'podname="trainer-0"' in cp.stdout


def test_once_json_and_bad_bind(mkregion, region_dir):
    Mk(region_dir / f"{UID}_main" / "a.cache", "v0b").create(ndev=1)
    cp = subprocess.run(
        [sys.executable, "-m", "hami_agent", "monitor", "--once", "--json", "--dir", str(region_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cp.returncode == 0, cp.stderr
    import json

    doc = json.loads(cp.stdout)
    assert doc["regions"][0]["region"]["layout"] == "v0b" and doc["regions"][0]["container"] == "main"
    cp = subprocess.run(
        [sys.executable, "-m", "hami_agent", "monitor", "--metrics-bind", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cp.returncode == 2 and "--metrics-bind" in cp.stderr


def test_host_metrics_from_simulated_nvml(mkregion, region_dir, gpusim_factory):
    node = gpusim_factory("h100-80gb-x4")

    def full_gpu_busy(state):
        state["gpus"][0]["mig"]["current"] = 0  # utilisation is N/A on MIG-enabled GPUs
        state["gpus"][0]["utilization_gpu"] = 37

    node.update(full_gpu_busy)
    gpu0 = node.state()["gpus"][0]
    Mk(region_dir / f"{UID}_main" / "a.cache", "v1.2").create(ndev=1)
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_agent",
            "monitor",
            "--once",
            "--dir",
            str(region_dir),
            "--node-name",
            "gpu-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cp.returncode == 0, cp.stderr
    fams = {
        s.name: s
        for fam in text_string_to_metric_families(cp.stdout)
        for s in fam.samples
        if s.labels.get("device_uuid") == gpu0["uuid"] or s.labels.get("deviceuuid") == gpu0["uuid"]
    }
    assert fams["HostGPUMemoryUsage"].labels == {
        "nodeid": "gpu-1",
        "deviceidx": "0",
        "deviceuuid": gpu0["uuid"],
        "devicetype": "NVIDIA-" + gpu0["name"],
        "zone": "vGPU",
    }
    assert fams["HostCoreUtilization"].value == 37 and fams["hami_host_gpu_utilization_ratio"].value == 37
    assert "hami_host_gpu_memory_used_bytes" in fams
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_agent",
            "monitor",
            "--once",
            "--no-host-metrics",
            "--dir",
            str(region_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "HostGPUMemoryUsage" not in cp.stdout


def test_running_monitor_watches_its_pods_instead_of_listing(api_server):
    """A running monitor reads pod names from a watch of its node's pods: one list from the watch cache
    at start, then nothing but the watch, however many scans (it used to list every 30 s, a quorum read)."""
    import time

    from hami_agent.k8s import KubeClient
    from hami_agent.monitor.cmd import PodNames

    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, component="monitor")
    names = PodNames(client, "gpu-1", watch=True)
    try:
        assert names() == {}
        api_server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "ml",
                                                                            "uid": "uid-late"},
                           "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "x"}]}})
        deadline = time.monotonic() + 5
        while "uid-late" not in names() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert names()["uid-late"].name == "late"
        for _ in range(50):
            names()
        tally = api_server.accounting.by(agent_contains=" monitor")
        assert tally["list"].requests == 1 and "list-etcd" not in tally and "get" not in tally
        lists = [r for r in api_server.requests if r.path == "/api/v1/pods" and "watch" not in r.query]
        assert lists[0].query["resourceVersion"] == "0"
    finally:
        names.close()
        client.close()

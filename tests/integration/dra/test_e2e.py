"""Issue 20's proof, end to end without containers: the real ``hami-agent dra`` process on gpusim, the
kubelet simulator with DRA (plugin watcher, NodePrepareResources before containers, NodeUnprepareResources
when the pod goes), the API server simulator (resource.k8s.io/v1) and the kube-scheduler simulator's
structured-parameters allocator (CEL, consumable capacity, taints)."""

from __future__ import annotations

import time

import pytest

from hami_agent.dra import cdi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DRIVER = "gpu.hami.io"
UNHEALTHY = {"key": f"{DRIVER}/unhealthy", "operator": "Exists"}


def node_up(c, name, gpusim, profile="a100-80gb-x8", devices="all", **kw):
    g = gpusim(profile, driver="570.172.08", name=name)
    n = c.add_node(name, g.state_path, g.lib_path, config={"dra": {"devices": devices}}, **kw)
    assert c.wait(lambda: n.kubelet.dra.registered(DRIVER), 30), open(n.driver_log).read()[-3000:]
    return g, n


def running(c, name, timeout=30.0, ns="default"):
    return c.wait(lambda: c.pod_phase(ns, name) == "Running", timeout)


def env_of(c, node, pod, container="c0"):
    r = c.result(node.name, "default", pod)
    assert r is not None and r.admitted, r
    return node.cdi_env(r, container)["env"]


def test_a_claim_for_20gib_and_30_percent_lands_with_hami_core_limits(cluster, gpusim):
    api, c = cluster
    _g, n = node_up(c, "gpu-a", gpusim)
    devices = c.wait(lambda: len(c.devices("gpu-a")) == 8 and c.devices("gpu-a"), 30)
    assert devices["gpu-0"]["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert devices["gpu-0"]["capacity"]["memory"]["value"] == "81920Mi"
    c.start_scheduler()
    c.submit(c.claim("small", memory="20Gi", cores="30"), c.pod("p1", claim="small"))
    assert running(c, "p1"), c.scheduler.failures
    env = env_of(c, n, "p1")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m" and env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-") and "CUDA_DEVICE_MEMORY_SHARED_CACHE" in env
    result = api.get("resourceclaims", "default", "small")["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"] == {"cores": "30", "memory": "20Gi"}
    assert n.kubelet.dra.calls[0][0] == "NodePrepareResources"
    # the optional health stream reaches the kubelet
    assert c.wait(lambda: n.kubelet.dra.health.get((DRIVER, "gpu-a", "gpu-0")) == "HEALTHY", 10)
    uid = api.get("resourceclaims", "default", "small")["metadata"]["uid"]
    api.delete("pods", "default", "p1")
    assert c.wait(lambda: not n.kubelet.dra.claims, 15)  # NodeUnprepareResources when the pod went
    assert ("NodeUnprepareResources", DRIVER, [uid]) in n.kubelet.dra.calls
    assert c.wait(lambda: not list(n.cdi_dir.glob("*.json")), 5)


def test_two_claims_share_one_gpu_and_a_third_that_does_not_fit_stays_pending(cluster, gpusim):
    api, c = cluster
    _g, n = node_up(c, "gpu-a", gpusim, devices={"index": [3]})  # one GPU for DRA, seven for the plugin
    assert list(c.wait(lambda: c.devices("gpu-a"), 30)) == ["gpu-3"]
    c.start_scheduler()
    c.submit(c.claim("c40", memory="40Gi", cores="50"), c.pod("p40", claim="c40"))
    c.submit(c.claim("c30", memory="30Gi", cores="40"), c.pod("p30", claim="c30"))
    assert running(c, "p40") and running(c, "p30"), c.scheduler.failures
    e40, e30 = env_of(c, n, "p40"), env_of(c, n, "p30")
    assert e40["NVIDIA_VISIBLE_DEVICES"] == e30["NVIDIA_VISIBLE_DEVICES"]  # the same GPU, shared
    assert (e40["CUDA_DEVICE_MEMORY_LIMIT_0"], e30["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("40960m", "30720m")
    assert (e40["CUDA_DEVICE_SM_LIMIT"], e30["CUDA_DEVICE_SM_LIMIT"]) == ("50", "40")
    c.submit(c.claim("c20", memory="20Gi", cores="10"), c.pod("p20", claim="c20"))  # 80-70 < 20 GiB
    assert c.wait(
        lambda: any(
            k == "default/p20" and "cannot allocate all claims" in m for k, m in c.scheduler.failures
        ),
        15,
    )
    time.sleep(1.0)
    assert c.pod_phase("default", "p20") == "Pending"
    assert not (api.get("resourceclaims", "default", "c20").get("status") or {}).get("allocation")
    events = [e for e in api.list("events") if e.get("reason") == "FailedScheduling"]
    assert any("0/1 nodes are available: 1 cannot allocate all claims." in e["message"] for e in events)
    api.delete("pods", "default", "p40")  # its claim is released and unprepared: now 20 GiB fit
    assert running(c, "p20", 30), c.scheduler.failures[-3:]
    assert env_of(c, n, "p20")["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"


def test_a_mig_claim(cluster, gpusim):
    _api, c = cluster
    _g, n = node_up(c, "gpu-h20", gpusim, profile="h20-mig-mixed")
    devs = c.wait(lambda: len(c.devices("gpu-h20")) == 17 and c.devices("gpu-h20"), 30)  # 12 MIG + 5 GPUs
    assert "gpu-0" not in devs and devs["gpu-0-mig-3-0"]["attributes"]["profile"] == {"string": "1g.24gb"}
    c.start_scheduler()
    mig = c.claim(
        "mig", klass=f"mig.{DRIVER}", selectors=[f'device.attributes["{DRIVER}"].profile == "1g.24gb"']
    )
    c.submit(mig, c.pod("pm", claim="mig"))
    assert running(c, "pm"), c.scheduler.failures
    env = env_of(c, n, "pm")
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-") and "CUDA_DEVICE_MEMORY_LIMIT_0" not in env
    uuid = env["NVIDIA_VISIBLE_DEVICES"]
    assert any(
        d["attributes"]["uuid"]["string"] == uuid and d["attributes"]["profile"]["string"] == "1g.24gb"
        for d in devs.values()
    )


def test_an_unhealthy_gpu_is_tainted_and_avoided_then_recovered(cluster, gpusim):
    api, c = cluster
    g, n = node_up(c, "gpu-a", gpusim, devices={"index": [0, 1]})
    c.wait(lambda: len(c.devices("gpu-a")) == 2, 30)
    g.set_lost(0)
    tainted = c.wait(lambda: c.devices("gpu-a")["gpu-0"].get("taints"), 20)
    assert tainted[0]["key"] == f"{DRIVER}/unhealthy" and tainted[0]["value"] == "gpu-lost"
    assert tainted[0]["effect"] == "NoSchedule" and "timeAdded" in tainted[0]
    assert c.wait(lambda: n.kubelet.dra.health.get((DRIVER, "gpu-a", "gpu-0")) == "UNHEALTHY", 10)
    c.start_scheduler()
    c.submit(c.claim("w1"), c.pod("w1", claim="w1"))  # whole GPUs: only gpu-1 is usable
    assert running(c, "w1")
    assert (
        api.get("resourceclaims", "default", "w1")["status"]["allocation"]["devices"]["results"][0]["device"]
        == "gpu-1"
    )
    c.submit(c.claim("w2"), c.pod("w2", claim="w2"))
    assert c.wait(lambda: any(k == "default/w2" for k, _m in c.scheduler.failures), 10)
    assert c.pod_phase("default", "w2") == "Pending"
    g.set_lost(0, False)  # the GPU answers again: the taint goes after the quiet period (1 s here)
    assert c.wait(lambda: not c.devices("gpu-a")["gpu-0"].get("taints"), 20)
    assert running(c, "w2", 30)
    assert (
        api.get("resourceclaims", "default", "w2")["status"]["allocation"]["devices"]["results"][0]["device"]
        == "gpu-0"
    )


def test_kubelet_and_driver_restart_with_prepared_claims(cluster, gpusim):
    api, c = cluster
    _g, n = node_up(c, "gpu-a", gpusim)
    c.wait(lambda: len(c.devices("gpu-a")) == 8, 30)
    c.start_scheduler()
    c.submit(c.claim("keep", memory="10Gi", cores="20"), c.pod("keep", claim="keep"))
    assert running(c, "keep")
    ids_before = c.result("gpu-a", "default", "keep").dra["c0"]
    spec_before = {p.name: p.read_bytes() for p in n.cdi_dir.glob("*.json")}
    prepares = sum(1 for m, *_ in n.kubelet.dra.calls if m == "NodePrepareResources")
    n.kubelet.restart()  # new kubelet process: wipes the node's slices, reads its checkpoint back
    dra = n.kubelet.dra
    assert dra.wiped.wait(10)
    assert c.wait(lambda: dra.registered(DRIVER), 15)  # the plugin watcher finds our socket again
    assert c.wait(lambda: len(c.devices("gpu-a")) == 8, 15)  # the driver published again
    assert dra.resynced.wait(15), dra.resync_errors  # the running pod was prepared again ...
    assert prepares == 1 and [m for m, *_ in dra.calls] == ["NodePrepareResources"]
    assert dra.container_cdi(api.get("pods", "default", "keep"))["c0"] == ids_before  # ... to the same answer
    assert {p.name: p.read_bytes() for p in n.cdi_dir.glob("*.json")} == spec_before
    # the driver restarts too: its checkpoint keeps the claim (and the capacity it holds)
    assert c.stop_driver(n) == 0
    c.start_driver(n)
    assert c.wait(lambda: dra.registered(DRIVER) and dra.registrations.count(DRIVER) >= 2, 15)
    assert '"keep"' in (n.state_dir / "checkpoint.json").read_text()
    api.delete("pods", "default", "keep")
    assert c.wait(lambda: not dra.claims, 15)
    assert c.wait(lambda: '"keep"' not in (n.state_dir / "checkpoint.json").read_text(), 5)
    assert not list(n.cdi_dir.glob("*.json"))


def test_nvml_hung_100_prepares_in_a_row_none_blocked(cluster, gpusim):
    api, c = cluster
    g, n = node_up(c, "gpu-a", gpusim)
    c.wait(lambda: len(c.devices("gpu-a")) == 8, 30)
    g.set_fault(hang_functions=["nvmlDeviceGetMemoryInfo"])  # the next inventory refresh never returns
    stuck = c.wait(lambda: all(d.get("taints") for d in c.devices("gpu-a").values()), 20)
    assert stuck, c.devices("gpu-a")
    assert c.devices("gpu-a")["gpu-0"]["taints"][0]["value"].startswith("nvml-stuck")
    c.start_scheduler()
    for i in range(100):  # claims that tolerate the taint: only they may use a GPU whose NVML is hung
        c.submit(
            c.claim(f"h{i}", memory="1Gi", cores="1", tolerations=[UNHEALTHY]), c.pod(f"h{i}", claim=f"h{i}")
        )
    assert c.wait(
        lambda: sum(1 for p in api.list("pods") if (p.get("status") or {}).get("phase") == "Running") == 100,
        120,
    ), c.scheduler.failures[-5:]
    results = [c.result("gpu-a", "default", f"h{i}") for i in range(100)]
    assert all(r is not None and r.admitted and r.dra.get("c0") for r in results)
    rpcs = [d for m, d in n.kubelet.dra.durations if m == "NodePrepareResources"]
    assert len(rpcs) >= 100
    slowest = max(rpcs)
    assert slowest < 2.0, f"a NodePrepareResources took {slowest:.3f}s while NVML was hung"
    assert n.driver.poll() is None  # the driver kept running
    spec = cdi.resolve(str(n.cdi_dir), results[99].dra["c0"])
    assert spec["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    rpcs.sort()
    print(
        f"100 prepares while NVML was hung: NodePrepareResources p50 {rpcs[len(rpcs) // 2] * 1000:.1f} ms, "
        f"slowest {slowest * 1000:.1f} ms; slowest admission "
        f"{max(r.duration_s for r in results) * 1000:.1f} ms"
    )


def test_the_loop_follows_its_socket_and_the_mig_lock_by_inotify_not_its_poll(cluster, gpusim):
    """Issue 31: with a 60 s poll the loop still re-serves a deleted socket and follows the MIG lock at
    once (inotify wakes it; its own look comes every 5 s at the latest)."""
    _api, c = cluster
    _g, n = node_up(c, "gpu-a", gpusim, driver_args=["--poll-interval", "60"])
    assert c.wait(lambda: len(c.devices("gpu-a")) == 8, 30)
    sock = n.root / "plugins" / DRIVER / "dra.sock"
    assert sock.exists(), sorted(p.name for p in (n.root / "plugins").rglob("*"))
    sock.unlink()
    log = n.driver_log
    assert c.wait(sock.exists, 4), open(log).read()[-3000:]
    lock = n.root / "mig-apply.lock"
    lock.write_text("")
    reconfiguring = f"{DRIVER}/reconfiguring"

    def taints():
        return [t["key"] for t in c.devices("gpu-a")["gpu-0"].get("taints", [])]

    assert c.wait(lambda: reconfiguring in taints(), 4), open(log).read()[-3000:]
    lock.unlink()
    assert c.wait(lambda: not taints(), 4), open(log).read()[-3000:]

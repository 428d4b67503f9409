"""Dynamic MIG end to end (HAMi v2.10 "Flexible MIG", issue 19): the real ``hami-agent device-plugin``
process in ``operatingmode: mig`` on a SIMULATED A100 (gpusim: GI/CI create/destroy with NVIDIA's
placement rules), the real extender in-process behind the SIMULATED kube-scheduler, and the SIMULATED
kubelet admitting the pods. One scenario, in order: a 1g.10gb then a 3g.40gb on the same GPU; placement
exhaustion refused by the scheduler with HAMi's reason; a plugin restart adopts what runs; deletion
destroys; a busy instance is kept; a create that hangs fails the admission within the deadline and leaves
no instance behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from hami_agent.protocol import keys
from hami_agent.protocol.mig import decode_mig_allocations
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.gpusim import gpusim_state as gs
from tests.integration.deviceplugin.conftest import NODE
from tests.integration.scheduler.cluster import gpu_pod, stack

pytestmark = pytest.mark.integration
GPU = "nvidia.com/gpu"
RPC_DEADLINE = 2.0


def wait(pred, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def instances(node) -> list[tuple[str, int, int]]:
    """(profile, start, size) of every GPU instance on GPU 0, from gpusim's state (the driver's truth)."""
    mig = node.state()["gpus"][0]["mig"]
    return sorted((g["profile"], g["placement"]["start"], g["placement"]["size"])
                  for g in mig.get("gpu_instances") or [])


class Plugin:
    def __init__(self, node, api, sock_dir, tmp_path) -> None:
        self.node, self.api, self.sock_dir, self.tmp = node, api, sock_dir, tmp_path
        allow = [{"models": ["A100-SXM4-80GB"], "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]}]
        cfg = {"nvidia": {"migProfileAllowlist": allow},
               "nodeconfig": [{"name": NODE, "operatingmode": "mig"}],
               "agent": {"registerIntervalSeconds": 0.5, "registerRetrySeconds": 0.5}}
        self.config = tmp_path / "config.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log(self) -> str:
        return "".join((self.tmp / f"plugin-{i}.log").read_text() for i in range(self.starts))

    def start(self) -> None:
        cmd = [sys.executable, "-m", "hami_agent", "device-plugin", "-v", "4", "--node-name", NODE,
               "--kubeconfig", self.api.kubeconfig_path, "--device-plugin-dir", self.sock_dir,
               "--config", str(self.config), "--metrics-bind", "none", "--device-split-count", "4",
               "--poll-interval", "0.1", "--rpc-deadline", str(RPC_DEADLINE),
               "--mig-reconcile-interval", "0.5",
               "--nvml-call-timeout", "5", "--mig-apply-lock", str(self.tmp / "mig.lock")]
        with open(self.tmp / f"plugin-{self.starts}.log", "w") as fh:
            self.proc = subprocess.Popen(cmd, env=self.node.env(), stdout=fh, stderr=subprocess.STDOUT)
        self.starts += 1

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


def _bound(api, name: str) -> bool:
    return bool((api.get("pods", "default", name) or {}).get("spec", {}).get("nodeName"))


def _mig(api, name: str):
    ann = api.get("pods", "default", name)["metadata"]["annotations"]
    return decode_mig_allocations(ann.get(keys.MIG_ALLOCATIONS, ""))


def _schedule_and_admit(api, kubelet, plugin, name: str, mem: int):
    api.create(gpu_pod(name, mem=mem))
    assert wait(lambda: _bound(api, name), 20), f"{name} not bound: {api.list('Event', 'default')}"
    res = kubelet.admit(api.get("pods", "default", name), timeout=15)
    assert res is not None, plugin.log[-3000:]
    return res


def _fail_like_the_kubelet(api, name: str, message: str) -> None:
    api.patch("pods", "default", name, {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                                   "message": message}}, subresource="status")


@pytest.mark.timeout(240)
def test_dynamic_mig_end_to_end(gpusim_factory, api_server, kubelet, sock_dir, tmp_path):
    node = gpusim_factory("a100-80gb-x8", driver=gs.FIXED_DRIVER)

    def one_mig_gpu(state: dict) -> None:
        state["gpus"] = state["gpus"][:1]
        state["gpus"][0]["mig"].update(current=1, pending=1, gpu_instances=[], devices=[])
    node.update(one_mig_gpu)
    gpu = node.state()["gpus"][0]["uuid"]
    api_server.create({"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": NODE, "annotations": {}, "labels": {}},
                       "status": {"allocatable": {GPU: "4"}, "capacity": {GPU: "4"},
                                  "conditions": [{"type": "Ready", "status": "True"}]}})
    plugin = Plugin(node, api_server, sock_dir, tmp_path)
    plugin.start()
    try:
        assert kubelet.wait_registered(GPU, 30, min_devices=4), plugin.log[-3000:]
        register = lambda: (api_server.get("nodes", None, NODE)["metadata"].get("annotations")  # noqa: E731
                            or {}).get(keys.NODE_REGISTER, "")
        assert wait(lambda: '"migProfiles"' in register(), 30), plugin.log[-3000:]
        devices = json.loads(register())
        assert devices[0]["mode"] == "mig" and devices[0]["count"] == 7  # HAMi: the largest instance count
        assert [p["name"] for p in devices[0]["migProfiles"]] == ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]

        with stack(api_server, SchedulerConfig(), allocator=False, backoff_s=0.2) as (_app, _sim):
            # a 1g.10gb: HAMi's rules put it at the highest 1g placement (slice 6)
            res = _schedule_and_admit(api_server, kubelet, plugin, "small", 8000)
            assert res.admitted, (res, plugin.log[-3000:])
            (small,) = _mig(api_server, "small")
            assert (small.profile, small.placement.start, small.has_runtime) == ("1g.10gb", 6, True)
            assert res.allocations["main"][GPU]["envs"] == {"NVIDIA_VISIBLE_DEVICES": small.mig_uuid}
            assert instances(node) == [("1g.10gb", 6, 1)]
            ann = api_server.get("pods", "default", "small")["metadata"]["annotations"]
            assert ann[keys.BIND_PHASE] == "success"

            # then a 3g.40gb on the same GPU: its placement 4..7 overlaps slice 6, so 0..3
            res = _schedule_and_admit(api_server, kubelet, plugin, "big", 30000)
            assert res.admitted, (res, plugin.log[-3000:])
            (big,) = _mig(api_server, "big")
            assert (big.gpu_uuid, big.profile, big.placement.start) == (gpu, "3g.40gb", 0)
            assert instances(node) == [("1g.10gb", 6, 1), ("3g.40gb", 0, 4)]

            # no second 3g.40gb fits: the scheduler refuses with HAMi's reason, nothing is created
            api_server.create(gpu_pod("third", mem=30000))
            assert wait(lambda: any("CardMigTopologyInfeasible" in (e.get("message") or "")
                                    for e in api_server.list("Event", "default")
                                    if e["involvedObject"]["name"] == "third"), 20)
            assert not _bound(api_server, "third")
            api_server.delete("pods", "default", "third")

            # restart: the new process adopts both instances from the pods' annotations and NVML
            plugin.stop()
            plugin.start()
            assert kubelet.wait_registered(GPU, 30, min_devices=4), plugin.log[-3000:]
            time.sleep(2.5)  # several reconcile periods
            assert instances(node) == [("1g.10gb", 6, 1), ("3g.40gb", 0, 4)], plugin.log[-3000:]
            assert "orphaned MIG instance" not in plugin.log and "missing" not in plugin.log

            # deletion destroys: the 1g.10gb goes, the 3g.40gb stays
            api_server.delete("pods", "default", "small")
            kubelet.release(small.mig_uuid)
            assert wait(lambda: instances(node) == [("3g.40gb", 0, 4)], 15), plugin.log[-3000:]

            # a process on the 3g.40gb: its pod is deleted, the instance is kept while it runs
            node.update(lambda s: s["gpus"][0].setdefault("processes", []).append(
                {"pid": 4242, "used_memory_mib": 100, "gi_id": big.gpu_instance_id, "ci_id": 0}))
            api_server.delete("pods", "default", "big")
            time.sleep(2.0)
            assert instances(node) == [("3g.40gb", 0, 4)]
            assert "has running processes" in plugin.log
            node.update(lambda s: s["gpus"][0].__setitem__("processes", []))
            assert wait(lambda: instances(node) == [], 20), plugin.log[-3000:]

            # a create that hangs in the driver after making the GI: the admission fails within the RPC
            # deadline, and the instance the driver made anyway is destroyed once the worker is back
            node.set_fault(hang_after_functions=["nvmlDeviceCreateGpuInstanceWithPlacement"])
            api_server.create(gpu_pod("hung", mem=8000))
            assert wait(lambda: _bound(api_server, "hung"), 20)
            t0 = time.monotonic()
            res = kubelet.admit(api_server.get("pods", "default", "hung"), timeout=15)
            took = time.monotonic() - t0
            assert res is not None and not res.admitted, res
            assert took < RPC_DEADLINE + 1.5, took  # answered within the budget, never blocked
            assert "did not return within" in res.message or "deadline" in res.message, res.message
            assert wait(lambda: api_server.get("pods", "default", "hung")["metadata"]["annotations"]
                        .get(keys.BIND_PHASE) == "failed", 10)
            ann = api_server.get("pods", "default", "hung")["metadata"]["annotations"]
            assert not any(a.has_runtime for a in decode_mig_allocations(ann[keys.MIG_ALLOCATIONS]))
            node.set_fault(hang_after_functions=[])
            _fail_like_the_kubelet(api_server, "hung", res.message)
            assert wait(lambda: instances(node) == [], 30), plugin.log[-3000:]
    finally:
        plugin.stop()

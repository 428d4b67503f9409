"""Doctor names each of the device plugin's Allocate refusals (it allocates only for the node lock's
owner, and refuses writing nothing), from the evidence an operator has: the plugin's log, the
kubelet's log and the pod's UnexpectedAdmissionError event with the node lock and the pod's annotations.

The logs are produced here, not written by hand: the real device plugin (in-process manager, fake NVML
inventory) behind the SIMULATED kubelet, whose klog output and the plugin's klog lines are sliced per
scenario and fed to ``hami-agent doctor logs``. ``tests/fixtures/logs/allocate_refusals_*.log`` are one
such run, kept for the unit tests."""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_agent.deviceplugin.podsource import MemoryPodSource
from hami_agent.log import KlogFormatter
from hami_agent.protocol import keys
from tests.integration.deviceplugin.conftest import NODE, start_plugin  # noqa: F401
from tests.integration.doctor.helpers import codes, event, node, run_doctor, verdict
from tests.sim.kubelet import SimulatedKubelet
from tests.unit.deviceplugin.fakes import (
    FakeSnapshot,
    FakeSource,
    ctr,
    full_gpus,
    gpu_uuid,
    hami_pod,
    lock_value,
    node_register,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
GPU = "nvidia.com/gpu"
U0, U1 = gpu_uuid(0), gpu_uuid(1)
REFUSAL_CODES = {"ALLOCATE_NO_NODE_LOCK", "ALLOCATE_LOCK_NAMES_OTHER_POD", "ALLOCATE_AMBIGUOUS_ADMISSION",
                 "ALLOCATE_OVERCOMMIT_REFUSED", "ALLOCATE_KUBELET_CHOSE_OTHER_DEVICES",
                 "ALLOCATE_POD_NOT_FOUND"}


@pytest.fixture
def sock_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="dr-", dir="/tmp")  # unix socket paths must stay under 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Logs:
    """The kubelet's and the plugin's klog output, sliced per scenario."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kubelet = root / "kubelet.log"
        self.plugin = root / "plugin.log"
        self._marks = (0, 0)

    def mark(self) -> None:
        self._marks = (self.kubelet.stat().st_size, self.plugin.stat().st_size)

    def since_mark(self, name: str) -> tuple[Path, Path]:
        out = []
        for src, start, suffix in ((self.kubelet, self._marks[0], "kubelet"),
                                   (self.plugin, self._marks[1], "plugin")):
            dst = self.root / f"{name}.{suffix}.log"
            with open(src, "rb") as f:
                f.seek(start)
                dst.write_bytes(f.read())
            out.append(dst)
        return out[0], out[1]


@pytest.fixture
def agent_logging():
    """The doctor CLI (run in-process) resets the ``hami_agent`` logger to a stream on the captured
    stderr: put it back afterwards, so no later log line goes to a closed stream."""
    root = logging.getLogger("hami_agent")
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


@pytest.fixture
def rig(tmp_path, sock_dir, start_plugin, agent_logging):  # noqa: F811 - the imported fixture
    logs = Logs(tmp_path)
    handler = logging.FileHandler(logs.plugin)
    handler.setFormatter(KlogFormatter())
    # on the plugin's own logger: the doctor CLI replaces the handlers of "hami_agent" itself
    plugin_logger = logging.getLogger("hami_agent.deviceplugin")
    plugin_logger.addHandler(handler)
    logging.getLogger("hami_agent").setLevel(logging.INFO)
    with open(logs.kubelet, "w", encoding="utf-8") as stream:
        kubelet = SimulatedKubelet(sock_dir, verbosity=4, stream=stream).start()
        try:
            pods = MemoryPodSource(NODE)
            pods.node_annotations[keys.NODE_REGISTER] = node_register(2, count=4)
            running = start_plugin(FakeSource(FakeSnapshot(gpus=full_gpus(2))), pods=pods,
                                   device_split_count=4)
            assert kubelet.wait_registered(GPU, 10, min_devices=8)
            yield kubelet, pods, logs, running
            running.stop()
        finally:
            kubelet.close()
            plugin_logger.removeHandler(handler)
            handler.close()


def refused(kubelet, pods, logs, pod: dict, name: str) -> tuple[str, Path, Path]:
    """Admit ``pod`` through the kubelet; it must be refused with nothing written. The scenario's logs."""
    logs.mark()
    before = {k: dict(p["metadata"]["annotations"]) for k, p in pods.pods.items()}
    res = kubelet.admit(pod, timeout=10)
    assert res is not None and not res.admitted and res.allocations == {}, res
    if res.message.find("no binding pod found") >= 0 or "ambiguous" in res.message:
        # owner unknown or ambiguous: a refusal writes nothing at all
        assert {k: dict(p["metadata"]["annotations"]) for k, p in pods.pods.items()} == before
    pod["status"]["phase"] = "Failed"  # what the kubelet does with a pod that failed admission
    kubelet_log, plugin_log = logs.since_mark(name)
    return res.message, kubelet_log, plugin_log


def doctor_logs(capsys, kubelet_log: Path | None, plugin_log: Path) -> dict:
    argv = ["logs", "--plugin", str(plugin_log)]
    if kubelet_log is not None:
        argv += ["--kubelet", str(kubelet_log)]
    rc, report = run_doctor(capsys, *argv)
    assert rc == 1, report
    return report


def only_refusal(report: dict) -> str:
    found = set(codes(report)) & REFUSAL_CODES
    assert len(found) == 1, codes(report)
    return found.pop()


def diagnosed(capsys, kubelet_log: Path | None, plugin_log: Path) -> str:
    """The refusal doctor names from both logs, and from each log alone (each source suffices)."""
    code = only_refusal(doctor_logs(capsys, kubelet_log, plugin_log))
    assert only_refusal(doctor_logs(capsys, None, plugin_log)) == code
    if kubelet_log is not None:
        rc, report = run_doctor(capsys, "logs", "--kubelet", str(kubelet_log))
        assert rc == 1 and only_refusal(report) == code
    return code


def test_each_refusal_gets_its_own_verdict_from_the_logs(rig, capsys):
    kubelet, pods, logs, running = rig
    out: dict[str, str] = {}

    # 1. a tenant's pod created with spec.nodeName: no node lock names it (nor anyone)
    tenant = hami_pod("byhand", NODE, [ctr("c", 1)], f"{U0},NVIDIA,97871,100:;", ns="tenant")
    pods.add_pod(tenant)
    msg, klog, plog = refused(kubelet, pods, logs, tenant, "no-lock")
    assert "no node lock" in msg
    out["no-lock"] = diagnosed(capsys, klog, plog)

    # 2. the lock names a pod that is gone (its owner was deleted after /bind)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("ghost")
    victim = hami_pod("victim", NODE, [ctr("c", 1)], f"{U0},NVIDIA,1000,10:;")
    pods.add_pod(victim)
    msg, klog, plog = refused(kubelet, pods, logs, victim, "stale-lock")
    assert "the node lock names default/ghost, which does not exist" in msg
    out["stale-lock"] = diagnosed(capsys, klog, plog)
    victim["status"]["phase"] = "Failed"

    # 3. the lock owner, and another pod bound here by hand asking for the same resource
    owner = hami_pod("owner", NODE, [ctr("c", 1)], f"{U1},NVIDIA,1000,10:;")
    rival = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rival", "namespace": "tenant",
                                                             "uid": "uid-rival", "annotations": {}},
             "spec": {"nodeName": NODE, "containers": [ctr("c", 1)]}, "status": {"phase": "Pending"}}
    pods.add_pod(owner)
    pods.add_pod(rival)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("owner")
    msg, klog, plog = refused(kubelet, pods, logs, owner, "ambiguous")
    assert "ambiguous admission" in msg and "tenant/rival" in msg
    out["ambiguous"] = diagnosed(capsys, klog, plog)
    rival["status"]["phase"] = "Failed"
    owner["status"]["phase"] = "Failed"

    # 4. an allocation that over-commits GPU 0 next to an allocated pod holding most of it
    holder = hami_pod("holder", NODE, [ctr("c", 1)], f"{U0},NVIDIA,90000,50:;", phase="success")
    holder["status"]["phase"] = "Running"
    greedy = hami_pod("greedy", NODE, [ctr("c", 1)], f"{U0},NVIDIA,20000,10:;")
    pods.add_pod(holder)
    pods.add_pod(greedy)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("greedy")
    msg, klog, plog = refused(kubelet, pods, logs, greedy, "overcommit")
    assert "refusing to over-commit GPU" in msg
    out["overcommit"] = diagnosed(capsys, klog, plog)

    # 5. the kubelet asks for another GPU than the scheduler's (a topology policy overriding the hint):
    # straight gRPC with the kubelet's call pattern, so only the plugin's log has it
    chooser = hami_pod("chooser", NODE, [ctr("c", 1)], f"{U1},NVIDIA,1000,10:;")
    pods.add_pod(chooser)
    pods.node_annotations[keys.NODE_LOCK] = lock_value("chooser")
    logs.mark()
    with grpc.insecure_channel(f"unix://{running.manager.settings.device_plugin_dir}/nvidia-gpu.sock") as ch:
        with pytest.raises(grpc.RpcError) as err:
            api_pb2_grpc.DevicePluginStub(ch).Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[f"{U0}-3"])]), timeout=5)
    assert "the kubelet chose" in err.value.details()
    _, plog = logs.since_mark("kubelet-choice")
    out["kubelet-choice"] = diagnosed(capsys, None, plog)

    assert out == {"no-lock": "ALLOCATE_NO_NODE_LOCK", "stale-lock": "ALLOCATE_LOCK_NAMES_OTHER_POD",
                   "ambiguous": "ALLOCATE_AMBIGUOUS_ADMISSION", "overcommit": "ALLOCATE_OVERCOMMIT_REFUSED",
                   "kubelet-choice": "ALLOCATE_KUBELET_CHOSE_OTHER_DEVICES"}
    # the unit tests' fixtures are one such run: they must still carry what this run produces
    keep = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
    for scenario in ("no-lock", "stale-lock", "ambiguous", "overcommit", "kubelet-choice"):
        for suffix in ("kubelet", "plugin") if scenario != "kubelet-choice" else ("plugin",):
            now = [_message(ln) for ln in (logs.root / f"{scenario}.{suffix}.log").read_text().splitlines()
                   if "refus" in ln or "no binding pod" in ln]
            kept = (keep / f"allocate_refusals_{suffix}.log").read_text()
            assert now and all(m in kept for m in now), (scenario, suffix, now)


def _message(line: str) -> str:
    """The refusal's text without the klog header, time, pid and uid (those differ from run to run)."""
    text = line.split("] ", 1)[-1]
    return re.sub(r"\(uid [^)]*\)", "", text)[:120]


def test_pod_verdict_quotes_the_event_the_lock_and_the_pod(api_server, capsys, agent_logging):
    """``doctor pod`` on a pod the kubelet refused: the event's text says which refusal; the evidence
    adds what the API shows (no lock on the node, the pod bound by hand, pods that bypassed the
    scheduler)."""
    message = ("Allocate failed due to rpc error: code = Unknown desc = no binding pod found on node gpu-1: "
               "no node lock (hami.io/mutex.lock) names a pod on this node, and only the pod the HAMi "
               "scheduler bound under that lock is allocated; refusing (was the pod scheduled by another "
               "scheduler, or created with spec.nodeName?), which is unexpected")
    api_server.create(node("gpu-1", {keys.NODE_REGISTER: node_register(2)}))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "byhand", "namespace": "tenant", "annotations": {}},
           "spec": {"nodeName": "gpu-1", "schedulerName": "default-scheduler", "containers": [ctr("c", 1)]},
           "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}}
    api_server.create(pod)
    pending = {**pod, "metadata": {"name": "queued", "namespace": "tenant", "annotations": {}},
               "status": {"phase": "Pending"}}
    api_server.create(pending)
    api_server.create(event(pod, "UnexpectedAdmissionError", message, component="kubelet"))
    rc, report = run_doctor(capsys, "pod", "tenant/byhand", "--kubeconfig", api_server.kubeconfig_path,
                            "--no-local")
    assert rc == 1
    v = verdict(report, "ALLOCATE_NO_NODE_LOCK")
    evidence = "\n".join(v["evidence"])
    assert "UnexpectedAdmissionError from kubelet: Allocate failed due to" in evidence
    assert "node.lock.present = False" in evidence
    assert "spec.nodeName=gpu-1" in evidence and "spec.schedulerName=default-scheduler" in evidence
    assert re.search(r"pod tenant/queued is bound to gpu-1 and asks for GPUs but the HAMi scheduler did "
                     r"not place it", evidence), evidence
    assert "ALLOCATE_POD_NOT_FOUND" not in codes(report)
    assert v["runbook"] == "docs/runbooks/ALLOCATE_NO_NODE_LOCK.md"

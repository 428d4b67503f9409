"""The demo's DRA step: the same GPUs, shared the HAMi way, through Dynamic Resource Allocation.

``run(cluster) -> StepResult`` works against any API server the simulators speak to -- the sandbox's
(``DraStepCluster.from_sandbox(sb)``) or an in-process one (``tests/integration/dra/test_sandbox_step.py``).
It adds one SIMULATED GPU node of its own (``gpu-dra``, gpusim profile ``a100-80gb-x8``) so the sandbox's
device-plugin nodes are left alone, and runs for it the real ``hami-agent dra`` process, a SIMULATED kubelet
with its DRA manager, and the SIMULATED kube-scheduler's structured allocator under its own scheduler name
(the sandbox's kube-scheduler, named ``hami-scheduler``, ignores these pods). Node ``gpu-dra`` gives one GPU
to DRA (``dra.devices: {index: [0]}``, as hami_agent_mode ``both`` would), so sharing fills it quickly:

1. the driver registers through the kubelet's plugin watcher and publishes its ResourceSlice;
2. a claim for 20 GiB and 30 % of a GPU lands: the container's CDI edits carry HAMi-core's limits;
3. a second claim (40 GiB, 50 %) shares the same GPU;
4. a third (30 GiB) does not fit and stays pending (``cannot allocate all claims``);
5. the first pod goes: its claim is unprepared (CDI spec removed) and the third lands.

Every step is a check; the result says which passed. Everything it created is deleted at the end.
Demo step f (``sandbox/demo/step_f.py``) runs it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.config import GPUSIM_LIB

DRIVER = "gpu.hami.io"
PROFILE = "a100-80gb-x8"


@dataclass
class DraStepCluster:
    kubeconfig: str  # admin kubeconfig of the API server
    work_dir: Path  # the step's node files: gpusim state, CDI specs, checkpoint, driver log
    gpusim_lib: Path = GPUSIM_LIB
    node: str = "gpu-dra"
    hami_agent: str | None = None  # default: the hami-agent next to this Python

    @classmethod
    def from_sandbox(cls, sb: Any) -> DraStepCluster:
        """The running sandbox (``sandbox.cluster.Sandbox``): its API server and run directory."""
        return cls(str(sb.cfg.kubeconfig), Path(sb.cfg.run_dir) / "dra")


@dataclass
class StepResult:
    ok: bool = True
    checks: list[tuple[str, bool, str]] = field(default_factory=list)  # (name, passed, detail)
    lines: list[str] = field(default_factory=list)  # what the demo prints and reports

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        self.lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))
        self.ok = self.ok and bool(ok)
        return bool(ok)


def run(cluster: DraStepCluster, say: Callable[[str], None] | None = None) -> StepResult:
    from tests.gpusim import gpusim_state as gs
    from tests.sim.dra_cluster import DraCluster

    result = StepResult()

    def note(msg: str) -> None:
        result.lines.append(msg)
        if say is not None:
            say(msg)

    work = Path(cluster.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    state = gs.load_profile(PROFILE)
    gs.set_driver_version(state, "570.172.08")
    state_path = gs.write_state(work / f"{cluster.node}.state.json", state)
    with DraCluster(cluster.kubeconfig, work, driver=DRIVER, hami_agent=cluster.hami_agent) as c:
        client = c.client
        try:
            _steps(c, cluster, state_path, result, note)
        except Exception as exc:  # noqa: BLE001 - a broken step is a failed check, not a crash
            result.check("DRA step ran to the end", False, f"{type(exc).__name__}: {exc}")
        node = c.nodes.get(cluster.node)
        if node is not None and not result.ok and node.driver_log and node.driver_log.exists():
            note("  driver log (last lines):")
            result.lines += ["    " + ln for ln in node.driver_log.read_text().splitlines()[-15:]]
    _cleanup(client, cluster.node)  # after the driver stopped: it would publish its slice again
    return result


def _env(c: Any, node: Any, pod: str) -> dict[str, str]:
    r = c.result(node.name, "default", pod)
    return node.cdi_env(r, "c0")["env"] if r is not None and r.admitted else {}


def _steps(
    c: Any, cluster: DraStepCluster, state_path: Path, result: StepResult, note: Callable[[str], None]
) -> None:
    c.apply_device_classes()
    note(
        f"DRA: node {cluster.node} ({PROFILE}, GPU 0 given to DRA), hami-agent dra, kubelet DRA manager, "
        "kube-scheduler structured allocator"
    )
    n = c.add_node(cluster.node, state_path, cluster.gpusim_lib, config={"dra": {"devices": {"index": [0]}}})
    if not result.check(
        "the driver registered through the kubelet's plugin watcher",
        c.wait(lambda: n.kubelet.dra.registered(DRIVER), 30),
    ):
        return
    devs = c.wait(lambda: c.devices(cluster.node), 30) or {}
    cap = (devs.get("gpu-0") or {}).get("capacity") or {}
    result.check(
        "ResourceSlice published with consumable memory and cores",
        "gpu-0" in devs and (cap.get("memory") or {}).get("requestPolicy") is not None,
        f"devices {sorted(devs)}, memory {(cap.get('memory') or {}).get('value')}",
    )
    c.start_scheduler()
    c.submit(c.claim("dra-20g", memory="20Gi", cores="30"), c.pod("dra-a", claim="dra-20g"))
    # generous bounds: they only matter when the machine is loaded (a few seconds otherwise)
    ok = c.wait(lambda: c.pod_phase("default", "dra-a") == "Running", 90)
    env = _env(c, n, "dra-a") if ok else {}
    result.check(
        "a claim for 20 GiB and 30 % lands with HAMi-core's limits",
        env.get("CUDA_DEVICE_MEMORY_LIMIT_0") == "20480m" and env.get("CUDA_DEVICE_SM_LIMIT") == "30",
        f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')} "
        f"CUDA_DEVICE_MEMORY_LIMIT_0={env.get('CUDA_DEVICE_MEMORY_LIMIT_0')} "
        f"CUDA_DEVICE_SM_LIMIT={env.get('CUDA_DEVICE_SM_LIMIT')}",
    )
    c.submit(c.claim("dra-40g", memory="40Gi", cores="50"), c.pod("dra-b", claim="dra-40g"))
    ok = c.wait(lambda: c.pod_phase("default", "dra-b") == "Running", 90)
    env_b = _env(c, n, "dra-b") if ok else {}
    result.check(
        "a second claim (40 GiB, 50 %) shares the same GPU",
        bool(env_b) and env_b.get("NVIDIA_VISIBLE_DEVICES") == env.get("NVIDIA_VISIBLE_DEVICES"),
        f"CUDA_DEVICE_MEMORY_LIMIT_0={env_b.get('CUDA_DEVICE_MEMORY_LIMIT_0')}",
    )
    c.submit(c.claim("dra-30g", memory="30Gi", cores="10"), c.pod("dra-c", claim="dra-30g"))
    msg = c.wait(lambda: next((m for k, m in c.scheduler.failures if k == "default/dra-c"), None), 15)
    time.sleep(0.5)
    result.check(
        "a third claim (30 GiB) that does not fit stays pending",
        bool(msg) and c.pod_phase("default", "dra-c") == "Pending",
        msg or "no FailedScheduling seen",
    )
    c.client.delete("pods", "dra-a", "default")
    unprepared = c.wait(lambda: not any(i.name == "dra-20g" for i in n.kubelet.dra.claims.values()), 20)
    landed = c.wait(lambda: c.pod_phase("default", "dra-c") == "Running", 90)
    result.check(
        "when the first pod goes its claim is unprepared and the third lands",
        bool(unprepared and landed),
        f"CUDA_DEVICE_MEMORY_LIMIT_0={_env(c, n, 'dra-c').get('CUDA_DEVICE_MEMORY_LIMIT_0')}",
    )


def _cleanup(client: Any, node: str) -> None:
    """Delete what the step created (the real API server would garbage-collect the slices with the Node
    through their owner reference; the simulated one does not collect garbage)."""
    doomed = [("pods", n, "default") for n in ("dra-a", "dra-b", "dra-c")]
    doomed += [("resourceclaims", n, "default") for n in ("dra-20g", "dra-40g", "dra-30g")]
    try:
        items, _rv = client.list("resourceslices", field_selector=f"spec.nodeName={node}")
        doomed += [("resourceslices", o["metadata"]["name"], None) for o in items]
    except Exception:  # noqa: BLE001 - nothing to list
        pass
    doomed.append(("nodes", node, None))
    for kind, name, ns in doomed:
        try:
            # pods: the node's kubelet is gone, so delete at once, as the pod garbage collector does for
            # pods of a deleted node (a graceful delete would wait for a kubelet that never confirms)
            client.delete(kind, name, ns, grace_period_s=0 if kind == "pods" else None)
        except Exception:  # noqa: BLE001,S112 - already gone
            continue


def main(argv: list[str] | None = None) -> int:
    """``python -m sandbox.dra_step`` against the running sandbox."""
    from sandbox.cluster import Sandbox
    from sandbox.config import load

    sb = Sandbox(load())
    res = run(DraStepCluster.from_sandbox(sb), say=print)
    print("\n".join(res.lines))
    return 0 if res.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

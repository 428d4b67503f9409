"""The demo's GPU preemption step (issue 29): a low-priority batch fills GPUs of the A100 node, a
high-priority inference pod arrives, the extender (``--preemption extender``, docs/scheduler.md
"Preemption") evicts the fewest batch pods on the GPU it will use, and the inference pod runs there.

It talks to the API server only (a ``KubeClient``), so the same code runs in the sandbox (demo step g,
``sandbox/demo/step_g.py``) and against an in-process cluster (``tests/integration/sandbox/
test_preempt_step.py``). Every step is a check; the result says which passed, and its lines show the
victims, the GPU and the time from the inference pod's creation to Running. Everything it created is
deleted at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hami_agent.protocol import decode_node_devices, decode_pod_devices, keys

NAMESPACE = "default"
LABEL = {"app": "hami-preempt-demo"}
IMAGE = "registry.invalid/cuda-sample:simulated"  # never pulled: the sandbox has no container runtime
BATCH_PRIORITY = 100  # a real cluster sets these through PriorityClasses (the Priority admission plugin)
INFERENCE_PRIORITY = 100_000
INFERENCE_MEM = 40960  # MiB: more than a GPU has left once the batch filled it
INFERENCE_CORES = 30
BATCH_GRACE_S = 3  # the victims' terminationGracePeriodSeconds


@dataclass
class StepResult:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    gpu: str = ""
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(ok for _n, ok, _d in self.checks)


def _pod(name: str, node: str, prio: int, mem: int, cores: int, uuids: list[str], grace: int = 30) -> dict:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(LABEL),
                         # HAMi's GPU pin: these GPUs only (they are all on the A100 node)
                         "annotations": {keys.USE_GPUUUID: ",".join(uuids)}},
            # the node too: kube-scheduler places the pod; the pin only narrows the GPUs on it
            "spec": {"schedulerName": "hami-scheduler", "priority": prio, "restartPolicy": "Never",
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": IMAGE, "resources": {"limits": limits}}]}}


def gpu_usage(pods: list[dict], node: str) -> dict[str, list[int]]:
    """GPU UUID -> [MiB, cores, pods] assigned to the pods bound to ``node`` (terminating ones included:
    their containers may still run), from ``hami.io/vgpu-devices-allocated``."""
    out: dict[str, list[int]] = {}
    for p in pods:
        ann = (p.get("metadata") or {}).get("annotations") or {}
        if (p.get("spec") or {}).get("nodeName") != node or not ann.get(keys.DEVICES_ALLOCATED):
            continue
        seen: set[str] = set()
        for c in decode_pod_devices(ann[keys.DEVICES_ALLOCATED]):
            for d in c:
                u = out.setdefault(d.uuid, [0, 0, 0])
                u[0] += d.usedmem
                u[1] += d.usedcores
                if d.uuid not in seen:  # one slot per pod (HAMi counts a pod's containers apiece; close)
                    seen.add(d.uuid)
                    u[2] += 1
    return out


def _phase(p: dict | None) -> str:
    return ((p or {}).get("status") or {}).get("phase") or "Pending"


def run(client: Any, node: str, say: Callable[[str], None] = print, timeout_s: float = 120.0,
        grace_s: int = BATCH_GRACE_S) -> StepResult:
    res = StepResult()

    def check(name: str, ok: bool, detail: str = "") -> bool:
        res.checks.append((name, bool(ok), detail))
        return bool(ok)

    def line(msg: str) -> None:
        res.lines.append(msg)
        say(msg)

    names: list[str] = []
    try:
        _steps(client, node, timeout_s, grace_s, res, check, line, names)
    except Exception as exc:  # noqa: BLE001 - a broken step is a failed check, not a crash
        check("preemption step ran to the end", False, f"{type(exc).__name__}: {exc}")
    finally:
        for n in names:
            try:
                client.delete("pods", n, NAMESPACE)
            except Exception:  # noqa: BLE001, S110 - gone already (a victim)
                pass
    return res


def _steps(client: Any, node: str, timeout_s: float, grace_s: int, res: StepResult,
           check: Callable[..., bool], line: Callable[[str], None], names: list[str]) -> None:
    ann = (client.get_node(node).get("metadata") or {}).get("annotations") or {}
    devices = decode_node_devices(ann.get(keys.NODE_REGISTER) or "[]")
    pods = client.list_pods()
    used = gpu_usage(pods, node)
    # the GPUs the inference pod may use once one batch pod is gone: healthy, not MIG, a free slot (the
    # batch pod's, then the inference pod's), room for its memory and cores
    none = [0, 0, 0]
    gpus = [d for d in devices if d.health and d.mode != keys.MODE_MIG
            and used.get(d.id, none)[2] < d.count
            and d.devmem - used.get(d.id, none)[0] >= INFERENCE_MEM
            and d.devcore - used.get(d.id, none)[1] >= INFERENCE_CORES]
    if not check(f"{node} has GPUs the batch can fill", bool(gpus),
                 f"{len(gpus)} of {len(devices)} GPUs with {INFERENCE_MEM} MiB and {INFERENCE_CORES}% free"):
        return
    # the batch: one pod per GPU taking all the memory left on it (no cores: memory is what blocks)
    batch: dict[str, str] = {}  # pod name -> GPU UUID
    for i, d in enumerate(gpus):
        name = f"batch-{i}"
        free = d.devmem - used.get(d.id, none)[0]
        client.create("pods", _pod(name, node, BATCH_PRIORITY, free, 0, [d.id], grace=grace_s), NAMESPACE)
        names.append(name)
        batch[name] = d.id
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not all(
            _phase(_get(client, n)) == "Running" for n in batch):
        time.sleep(0.2)
    running = [n for n in batch if _phase(_get(client, n)) == "Running"]
    line(f"  batch (priority {BATCH_PRIORITY}): {len(batch)} pods fill the free memory of "
         f"{len(batch)} GPU(s) of {node}")
    if not check(f"the low-priority batch runs on {node} and fills its GPUs", len(running) == len(batch),
                 f"{len(running)}/{len(batch)} Running"):
        return
    # the inference pod: may use any of those GPUs, fits none of them while the batch runs
    inf = _pod("inference", node, INFERENCE_PRIORITY, INFERENCE_MEM, INFERENCE_CORES, list(batch.values()))
    t0 = time.monotonic()
    client.create("pods", inf, NAMESPACE)
    names.append("inference")
    peak: dict[str, int] = {}
    while time.monotonic() < end:
        p = _get(client, "inference")
        if _phase(p) == "Running":
            res.seconds = time.monotonic() - t0
            break
        for u, amounts in gpu_usage(client.list_pods(), node).items():  # over-commit samples
            peak[u] = max(peak.get(u, 0), amounts[0])
        time.sleep(0.2)
    p = _get(client, "inference") or {}
    pa = (p.get("metadata") or {}).get("annotations") or {}
    got = [d.uuid for c in decode_pod_devices(pa.get(keys.DEVICES_ALLOCATED) or "") for d in c]
    res.gpu = got[0] if got else ""
    gone = [n for n in batch if _get(client, n) is None or
            ((_get(client, n) or {}).get("metadata") or {}).get("deletionTimestamp")]
    res.victims = gone
    events = [e for e in client.list("events", NAMESPACE)[0]
              if e.get("reason") in ("Preempted", "Preempting")]
    line(f"  inference (priority {INFERENCE_PRIORITY}, {INFERENCE_MEM} MiB, {INFERENCE_CORES}%): "
         f"{_phase(p)} on {(p.get('spec') or {}).get('nodeName') or '-'} GPU {res.gpu or '-'}"
         + (f" after {res.seconds:.1f}s" if res.seconds is not None else ""))
    line(f"  victims: {', '.join(f'{n} (GPU {batch[n]})' for n in gone) or 'none'}")
    for e in events:
        who = (e.get("involvedObject") or {}).get("name")
        line(f"    event {e.get('reason')} on {who}: {e.get('message')}")
    check("the high-priority inference pod runs", res.seconds is not None,
          f"{res.seconds:.1f}s from creation to Running (victims' grace period {grace_s}s)"
          if res.seconds is not None else f"still {_phase(p)} after {timeout_s:.0f}s")
    check("one batch pod preempted, on the GPU the inference pod got",
          len(gone) == 1 and bool(res.gpu) and batch.get(gone[0]) == res.gpu,
          f"victims {gone}, inference on {res.gpu or '-'}")
    check("the victim was told who preempted it (event Preempted)",
          any(e.get("reason") == "Preempted" and (e.get("involvedObject") or {}).get("name") in gone
              for e in events))
    total = {d.id: d.devmem for d in devices}
    over = {u: m for u, m in peak.items() if m > total.get(u, m)}
    check("no GPU was promised more memory than it has while the victim terminated", not over,
          f"{len(peak)} GPU(s) sampled" if not over else f"over: {over}")


def _get(client: Any, name: str) -> dict | None:
    from hami_agent.k8s.errors import NotFoundError

    try:
        return client.get_pod(NAMESPACE, name)
    except NotFoundError:
        return None


__all__ = ["StepResult", "gpu_usage", "run"]

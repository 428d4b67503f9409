"""One node's SIMULATED kubelet in the soak, with the records the counts are made from.

It is the sandbox's node simulator (``sandbox.node_sim.NodeSim``: node status from the device manager,
pods bound here admitted one at a time, ``Running``/``Failed`` written back like the kubelet) around the
kubelet simulator of ``tests/sim/kubelet`` (restarts with the checkpoint, stream drops), plus:

* every device-plugin RPC the kubelet makes (GetPreferredAllocation, Allocate), with its start and end on
  the machine's monotonic clock and its outcome — an RPC that never returns stays "in flight";
* every admission's result, and for a rejected pod the moment the kubelet got the error (the end of the
  failing RPC), which the late-write count compares with the API server's request log;
* ``pause()``: the kubelet stops picking up new pods for a while (a busy sync loop), so that a lock
  holder can die between its bind and its admission.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sandbox.node_sim import NodeSim
from tests.sim.kubelet import AdmissionResult, SimulatedKubelet
from tests.sim.kubelet import endpoint as endpoint_mod

GPU = "nvidia.com/gpu"


@dataclass
class Rpc:
    node: str
    method: str
    pod: str | None  # "ns/name" being admitted
    start: float
    end: float | None = None
    error: str | None = None


@dataclass
class Admission:
    node: str
    pod: str
    uid: str
    admitted: bool
    message: str
    duration_s: float
    answered_at: float  # when the kubelet got the answer that decided it (failing RPC's end, else now)
    allocations: dict[str, dict[str, dict]] = field(default_factory=dict)


class RpcLog:
    """The kubelets' device-plugin RPCs, all nodes (the endpoint class is shared by every kubelet of
    the process, so one observer is installed on it; ``tests/sim/kubelet`` has no RPC hook of its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rpcs: list[Rpc] = []
        self._by_root: dict[str, tuple[str, SimulatedKubelet]] = {}
        self.last_error_end: dict[tuple[str, str], float] = {}  # (node, pod) -> end of its last failed RPC
        self._installed = False

    def register(self, root: str, node: str, kubelet: SimulatedKubelet) -> None:
        with self._lock:
            self._by_root[str(Path(root).resolve())] = (node, kubelet)
        self._install()

    def _install(self) -> None:
        if self._installed:
            return
        self._installed = True
        cls = endpoint_mod.Endpoint
        for method in ("get_preferred_allocation", "allocate"):
            setattr(cls, method, self._wrap(getattr(cls, method), method))

    def _wrap(self, fn: Any, method: str) -> Any:
        log = self

        def observed(ep: Any, *args: Any, **kwargs: Any) -> Any:
            who = log._by_root.get(str(Path(ep.socket).resolve().parent)) if ep.socket else None
            if who is None:
                return fn(ep, *args, **kwargs)
            rec = Rpc(who[0], method, who[1].current_pod, time.monotonic())
            with log._lock:
                log.rpcs.append(rec)
            try:
                out = fn(ep, *args, **kwargs)
            except BaseException as exc:
                rec.error = f"{type(exc).__name__}: {exc}"[:300]
                rec.end = time.monotonic()
                if rec.pod is not None:
                    with log._lock:
                        log.last_error_end[(rec.node, rec.pod)] = rec.end
                raise
            rec.end = time.monotonic()
            return out

        return observed

    def snapshot(self) -> list[Rpc]:
        with self._lock:
            return list(self.rpcs)


class ChaosKubelet(NodeSim):
    def __init__(self, node: str, root: Path, client: Any, rpc_log: RpcLog, stream: TextIO,
                 seed: int) -> None:
        kubelet = SimulatedKubelet(str(root), 3, stream, node_name=node, seed=seed)
        super().__init__(kubelet, client, node, None)
        self.rpc_log = rpc_log
        rpc_log.register(str(root), node, kubelet)
        self.admissions: list[Admission] = []
        self.submitted: dict[str, float] = {}  # uid -> when handed to the kubelet
        self._resume = threading.Event()
        self._resume.set()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------ lifecycle
    def start(self) -> ChaosKubelet:
        self.kubelet.start()
        self._thread = threading.Thread(target=self.run, args=(GPU, 120.0), name=f"kubelet-{self.node}",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self._resume.set()
        if self._thread is not None:
            self._thread.join(5)
        # the admission thread may be inside an RPC without deadline: do not wait for it
        threading.Thread(target=self.kubelet.close, daemon=True).start()

    def pause(self) -> None:
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    # ------------------------------------------------------------------------------ pods
    def poll_pods(self) -> None:
        if not self._resume.is_set():
            # a busy sync loop: pods are not picked up, but deletions are still noticed below
            pods = self.client.list_pods(field_selector=f"spec.nodeName={self.node}")
            live = {(p.get("metadata") or {}).get("uid") or p["metadata"]["name"] for p in pods}
            with self._lock:
                for uid in [u for u in self._seen if u not in live]:
                    self._seen.pop(uid, None)
                    self.kubelet.release(uid)
            return
        with self._lock:
            before = set(self._seen)
        super().poll_pods()
        now = time.monotonic()
        with self._lock:
            for uid in set(self._seen) - before:
                self.submitted.setdefault(uid, now)

    def _admitted(self, pod: dict, r: AdmissionResult) -> None:
        now = time.monotonic()
        answered = now
        if not r.admitted:
            answered = self.rpc_log.last_error_end.get((self.node, r.pod), now)
        self.admissions.append(Admission(self.node, r.pod, r.uid, r.admitted, r.message, r.duration_s,
                                         answered, r.allocations))
        super()._admitted(pod, r)

    # ------------------------------------------------------------------------------ queries
    def in_admission(self) -> str | None:
        return self.kubelet.current_pod

    def waiting(self) -> int:
        """Pods handed to the kubelet whose admission has not returned."""
        done = {a.uid for a in self.admissions}
        with self._lock:
            return sum(1 for uid in self._seen if uid not in done)

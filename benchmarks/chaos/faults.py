"""Carry out the plan's faults against a running ``Cluster``, each at its time offset.

One thread per lane (the plan guarantees that a lane's faults do not overlap), so a fault that takes a
while to apply (an extender restart, a lock holder the soak waits for) never delays another lane's.
Every action is logged with its planned and actual time; ``quiesce()`` ends whatever is still active
(idempotent), so the quiet period starts from a clean state even after an error in a fault thread.

How each fault is made (the real agents see only what a node or the API would show them):

========================  ========================================================================
``nvml_hang``             gpusim ``hang_after_calls: 0`` (every NVML call blocks, in ``pause()``:
                          SIGKILL ends it) or ``hang_functions: [nvmlDeviceGetMemoryInfo]``
``nvml_hang_unkillable``  the same, plus ``hang_file`` on a FUSE file that never answers
                          (``tests/gpusim/dstate.py``): a killed worker stays in state D until the
                          fault ends and the file answers (the driver returns). Without root or
                          ``/dev/fuse``: a killable hang, and the report says so
``gpu_lost``              gpusim ``lost: true`` on one GPU for the duration
``xid``                   one XID event in gpusim, visible to workers for 5 s, then removed (a real
                          event set only delivers events that happen after it registered)
``plugin_restart``        SIGTERM to the device plugin (then SIGKILL to the NVML workers it leaves,
                          as systemd's ``KillMode=mixed``), started again at once
``kubelet_restart``       ``SimulatedKubelet.restart()``: sockets wiped, checkpoint read back
``stream_drop``           ``SimulatedKubelet.drop_stream()``: the ListAndWatch connection breaks
``lock_holder_dies``      the kubelets pick up no new pod until a node lock's owner is bound and not
                          yet admitted; that pod is deleted
``api_outage``            ``api.stop()`` ... ``api.start()`` (every connection dropped)
``api_slow``              every matching request delayed by ``delay_s`` (0.1-2 s) for the window
``api_errors``            the next ``times`` matching requests answered 5xx/429
``extender_kill_leader``  SIGKILL to the replica holding the Lease (connections reset, Lease not
                          released), started again after the duration
``extender_term``         SIGTERM to one replica (leader, follower or a given one), started again
========================  ========================================================================
"""

from __future__ import annotations

import json
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.cluster import Cluster, Node
from benchmarks.chaos.plan import API_SCOPES, KINDS, Fault, Plan
from hami_agent.protocol import keys
from hami_agent.protocol.nodelock import parse_lock_value
from tests.gpusim import dstate
from tests.gpusim import gpusim_state as gs

XID_VISIBLE_S = 5.0
LANES = {k.name: k.lane for k in KINDS}


@dataclass
class Action:
    planned: float
    actual: float
    kind: str
    target: str
    phase: str  # "start" / "end" / "skip" / "error"
    detail: str = ""


@dataclass
class FaultRunner:
    cluster: Cluster
    plan: Plan
    log_path: Path
    t0: float = 0.0
    unkillable_model: str = ""
    actions: list[Action] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _fuse: dict[str, Any] = field(default_factory=dict)  # node -> HangingFile of the active episode
    _fuse_n: int = 0

    def __post_init__(self) -> None:
        why = dstate.available()
        if why is None:  # /dev/fuse opens; whether mount(2) is allowed (CAP_SYS_ADMIN) shows only by trying
            probe = dstate.HangingFile(self.cluster.workdir / "fuse" / "probe")
            try:
                probe.mount()
            except OSError as exc:
                why = f"mounting a FUSE file system failed: {exc}"
            finally:
                probe.close()
        self.unkillable_model = "fuse-d-state" if why is None else f"killable-fallback ({why})"

    # ------------------------------------------------------------------------------ running
    def start(self, t0: float) -> None:
        self.t0 = t0
        lanes: dict[str, list[Fault]] = {}
        for f in self.plan.faults:
            lanes.setdefault(LANES[f.kind].format(node=f.target), []).append(f)
        for lane, faults in sorted(lanes.items()):
            t = threading.Thread(target=self._lane, args=(faults,), name=f"chaos-{lane}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the lanes (a fault in progress is ended by its own thread), then end anything left."""
        self._stop.set()
        for t in self._threads:
            t.join(60)
        self.quiesce()

    def _wait_until(self, offset: float) -> bool:
        """Sleep until ``offset`` seconds after t0; False when stopped meanwhile."""
        while True:
            left = self.t0 + offset - time.monotonic()
            if left <= 0:
                return True
            if self._stop.wait(min(left, 0.5)):
                return False

    def _record(self, f: Fault, phase: str, detail: str = "", planned: float | None = None) -> None:
        a = Action(round(f.at if planned is None else planned, 3), round(time.monotonic() - self.t0, 3),
                   f.kind, f.target, phase, detail)
        with self._lock:
            self.actions.append(a)
            with open(self.log_path, "a") as fh:  # as it happens: a long soak can be followed
                fh.write(json.dumps(a.__dict__) + "\n")

    def _lane(self, faults: list[Fault]) -> None:
        for f in faults:
            if not self._wait_until(f.at):
                return
            try:
                end = getattr(self, f"_{f.kind}")(f)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is reported
                self._record(f, "error", f"{exc!r}")
                self.errors.append(f"{f.kind} at {f.at}s on {f.target}: {traceback.format_exc(limit=3)}")
                continue
            if end is not None:
                # stopping early (the run is being torn down) still ends the fault
                self._wait_until(f.end)
                try:
                    end()
                    self._record(f, "end", planned=f.end)
                except Exception as exc:  # noqa: BLE001
                    self._record(f, "error", f"ending: {exc!r}", planned=f.end)
                    self.errors.append(f"ending {f.kind} at {f.end}s: {traceback.format_exc(limit=3)}")

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._lock:
            for a in self.actions:
                if a.phase == "start":
                    out[a.kind] = out.get(a.kind, 0) + 1
        return out

    def skipped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._lock:
            for a in self.actions:
                if a.phase in ("skip", "error"):
                    out[a.kind] = out.get(a.kind, 0) + 1
        return out

    # ------------------------------------------------------------------------------ end everything
    def quiesce(self) -> None:
        """No fault stays active: API up and answering normally, NVML answering, FUSE reads answered,
        every agent running, every kubelet picking up pods."""
        api = self.cluster.api
        if api is not None:
            api.clear_faults()
            if not api.running:
                api.start()
        for node in self.cluster.nodes.values():
            node.set_faults(hang_after_calls=None, hang_functions=[], hang_file=None)
            gs.update_state(node.state_path, _all_found)
            node.kubelet.resume()
        for name in list(self._fuse):
            self._release_fuse(name)
        for agent in self.cluster.agents():
            if not agent.running():
                agent.start()

    # ------------------------------------------------------------------------------ NVML
    def _node(self, f: Fault) -> Node:
        return self.cluster.nodes[f.target]

    def _hang(self, node: Node, how: str, hang_file: str | None) -> None:
        if how == "memory-info":
            node.set_faults(hang_functions=["nvmlDeviceGetMemoryInfo"], hang_file=hang_file)
        else:
            node.set_faults(hang_after_calls=0, hang_file=hang_file)

    def _nvml_hang(self, f: Fault) -> Any:
        node = self._node(f)
        self._hang(node, f.params.get("how", "all-calls"), None)
        self._record(f, "start", f.params.get("how", ""))

        def end() -> None:
            node.set_faults(hang_after_calls=None, hang_functions=[], hang_file=None)

        return end

    def _nvml_hang_unkillable(self, f: Fault) -> Any:
        node = self._node(f)
        if not self.unkillable_model.startswith("fuse"):
            self._hang(node, f.params.get("how", "all-calls"), None)
            self._record(f, "start", f"{self.unkillable_model}: killable hang instead")
        else:
            self._fuse_n += 1
            mount = self.cluster.workdir / "fuse" / f"{node.name}-{self._fuse_n}"
            hf = dstate.HangingFile(mount)
            hf.mount()
            self._fuse[node.name] = hf
            self._hang(node, f.params.get("how", "all-calls"), str(hf.path))
            self._record(f, "start", f"{f.params.get('how', '')} fuse {mount}")

        def end() -> None:
            node.set_faults(hang_after_calls=None, hang_functions=[], hang_file=None)
            self._release_fuse(node.name)

        return end

    def _release_fuse(self, node: str) -> None:
        hf = self._fuse.pop(node, None)
        if hf is not None:
            hf.release()  # the "driver" returns: D-state workers wake up, their SIGKILL lands
            hf.close()

    def _gpu_lost(self, f: Fault) -> Any:
        node, gpu = self._node(f), int(f.params["gpu"])
        gs.update_state(node.state_path, lambda s: s["gpus"][gpu].__setitem__("lost", True))
        self._record(f, "start", f"gpu {gpu}")

        def end() -> None:
            gs.update_state(node.state_path, lambda s: s["gpus"][gpu].__setitem__("lost", False))

        return end

    def _xid(self, f: Fault) -> None:
        node, gpu, xid = self._node(f), int(f.params["gpu"]), int(f.params["xid"])
        seq: list[int] = []
        gs.update_state(node.state_path, lambda s: seq.append(gs.add_xid(s, gpu, xid)))
        self._record(f, "start", f"gpu {gpu} xid {xid}")

        def forget(state: dict) -> None:
            for g in state["gpus"]:
                g["xid_events"] = [e for e in g.get("xid_events") or [] if e.get("seq") not in seq]

        timer = threading.Timer(XID_VISIBLE_S, lambda: gs.update_state(node.state_path, forget))
        timer.daemon = True
        timer.start()

    # ------------------------------------------------------------------------------ node agents
    def _plugin_restart(self, f: Fault) -> None:
        node = self._node(f)
        rc = node.plugin.stop(signal.SIGTERM)
        node.plugin.start()
        self._record(f, "start", f"exit code {rc}")

    def _kubelet_restart(self, f: Fault) -> None:
        self._node(f).kubelet.kubelet.restart()
        self._record(f, "start")

    def _stream_drop(self, f: Fault) -> None:
        dropped = self._node(f).kubelet.kubelet.drop_stream("nvidia.com/gpu")
        self._record(f, "start" if dropped else "skip", "" if dropped else "no stream to drop")

    def _lock_holder_dies(self, f: Fault) -> None:
        """Every kubelet is busy (picks up no new pod) until some node's lock holder is bound and waiting
        for its admission; that pod is then deleted (its owner gives up), and the kubelets go on."""
        api = self.cluster.api
        assert api is not None
        nodes = list(self.cluster.nodes.values())
        for node in nodes:
            node.kubelet.pause()
        try:
            end = self.t0 + f.end
            while time.monotonic() < end and not self._stop.is_set():
                for node in nodes:
                    victim = self._lock_owner_waiting(node)
                    if victim is not None:
                        api.delete("Pod", victim[0], victim[1])
                        self._record(f, "start", f"deleted {victim[0]}/{victim[1]} on {node.name}, holder of "
                                                 f"{victim[2]!r}")
                        return
                time.sleep(0.05)
            self._record(f, "skip", "no lock holder waiting for admission in the window")
        finally:
            for node in nodes:
                node.kubelet.resume()

    def _lock_owner_waiting(self, node: Node) -> tuple[str, str, str] | None:
        api = self.cluster.api
        assert api is not None
        n = api.get("Node", None, node.name) or {}
        raw = ((n.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_LOCK)
        if not raw:
            return None
        try:
            lock = parse_lock_value(raw)
        except ValueError:
            return None
        if not lock.has_owner:
            return None
        pod = api.get("Pod", lock.namespace, lock.name)
        if pod is None:
            return None
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        uid = (pod.get("metadata") or {}).get("uid")
        admitted = {a.uid for a in node.kubelet.admissions}
        if ((pod.get("spec") or {}).get("nodeName") == node.name and uid not in admitted
                and ann.get(keys.BIND_PHASE) == keys.BIND_PHASE_ALLOCATING):
            return lock.namespace, lock.name, raw
        return None

    # ------------------------------------------------------------------------------ API server
    def _api_outage(self, f: Fault) -> Any:
        api = self.cluster.api
        assert api is not None
        api.stop()
        self._record(f, "start")
        return api.start

    def _api_slow(self, f: Fault) -> Any:
        api = self.cluster.api
        assert api is not None
        path, method = API_SCOPES[f.params["scope"]]
        fault = api.inject_fault(None, path_regex=path, method=method, times=10**9,
                                 delay_s=float(f.params["delay_s"]))
        self._record(f, "start", json.dumps(f.params))
        return lambda: api.end_fault(fault)

    def _api_errors(self, f: Fault) -> None:
        api = self.cluster.api
        assert api is not None
        path, method = API_SCOPES[f.params["scope"]]
        api.inject_fault(int(f.params["code"]), path_regex=path, method=method, times=int(f.params["times"]),
                         retry_after=f.params.get("retry_after"))
        self._record(f, "start", json.dumps(f.params))

    # ------------------------------------------------------------------------------ extenders
    def _extender_kill_leader(self, f: Fault) -> Any:
        i = self.cluster.leader_index()
        if i is None:
            self._record(f, "skip", "no leader at this moment")
            return None
        ext = self.cluster.extenders[i]
        ext.stop(signal.SIGKILL)
        self._record(f, "start", f"SIGKILL {ext.name}")
        return ext.start

    def _extender_term(self, f: Fault) -> Any:
        which = f.params.get("which", "leader")
        leader = self.cluster.leader_index()
        if which in ("leader", "follower"):
            if leader is None:
                self._record(f, "skip", "no leader at this moment")
                return None
            i = leader if which == "leader" else 1 - leader
        else:
            i = int(which.rsplit("-", 1)[1])
        ext = self.cluster.extenders[i]
        rc = ext.stop(signal.SIGTERM)
        self._record(f, "start", f"SIGTERM {ext.name} ({which}), exit code {rc}")
        return ext.start


def _all_found(state: dict) -> None:
    for g in state["gpus"]:
        g["lost"] = False

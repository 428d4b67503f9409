"""SIMULATED kubelet DRA manager: plugin-watcher registration, NodePrepareResources before a pod's
containers start, NodeUnprepareResources when it goes, the claim info checkpoint.

Modelled on kubernetes ``pkg/kubelet/pluginmanager`` (the plugin watcher) and ``pkg/kubelet/cm/dra``
(``manager.go``, ``claiminfo.go``, ``plugin/dra_plugin_manager.go``, ``plugin/dra_plugin.go``):

* **Registration**: ``<root>/plugins_registry`` is scanned (the real watcher uses fsnotify plus a walk at
  start; we poll every ``poll_s``); for a new ``*.sock``: ``GetInfo`` (10 s), type must be ``DRAPlugin``,
  the first of the plugin's ``supported_versions`` the kubelet supports is chosen
  (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``), else ``none of services supported by the plugin (...) are
  supported by the kubelet (...)``; ``NotifyRegistrationStatus`` tells the plugin. One endpoint may not be
  registered twice for a driver. A socket that disappears deregisters the plugin; if no plugin of the
  driver comes back within ``wiping_delay_s`` the driver's ResourceSlices on this node are deleted.
* **Start**: all ResourceSlices of the node are deleted (``wipeResourceSlices`` at kubelet start, retried
  with backoff) -- drivers must publish again; the claim infos are read back from the checkpoint and are
  NOT prepared (``newClaimInfoFromState``), so running pods get NodePrepareResources again (``resync``).
* **Prepare** (``PrepareResources``): for each ``pod.spec.resourceClaims`` entry the claim name comes from
  ``resourceClaimName`` or ``pod.status.resourceClaimStatuses``; the claim is read from the API; the pod
  must be in ``status.reservedFor`` (``pod %s(%s) is not allowed to use resource claim %s(%s)``); claims no
  container uses are skipped; claims not yet prepared are batched per driver of the allocation results and
  sent in one NodePrepareResources per driver with the kubelet's **45 s** timeout; a per-claim error, a
  missing entry (``NodePrepareResources left out N claims``) or an RPC error fails the prepare; the CDI
  device IDs are recorded per request; the checkpoint is written.
* **Unprepare** (``UnprepareResources``): the pod's reference is dropped; a claim no other pod references
  is unprepared with one NodeUnprepareResources per driver (45 s) and forgotten only on success.
* **Health** (KEP-4680): with a health service advertised, ``NodeWatchResources`` is read and the latest
  health per device kept (``health``); a broken stream is retried every 5 s.

Differences from the real kubelet are listed in docs/testing.md (checkpoint format, no claim GC on
pod deletion without ``release``, no pod status updates, no CDI injection: ``cdi_env`` resolves specs
the way a runtime would).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from hami_agent.deviceplugin.api import pluginregistration_pb2 as reg_pb2
from hami_agent.deviceplugin.api import pluginregistration_pb2_grpc as reg_pb2_grpc
from hami_agent.dra.api import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from tests.sim.kubelet.klog import KlogWriter, rpc_error_text

STATE_FILE = "dra_manager_state"
CALL_TIMEOUT_S = 45.0  # defaultClientCallTimeout (dra_plugin.go)
SERVICES = {  # kubelet-supported DRAPlugin services, most recent first
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH_SERVICES = {
    "v1.DRAResourceHealth": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}


class PrepareFailed(RuntimeError):
    """What the kubelet reports in the pod's ``FailedPrepareDynamicResources`` event."""


@dataclass
class Plugin:
    driver: str
    endpoint: str
    registration_socket: str
    service: str
    channel: grpc.Channel
    health_service: str | None = None


@dataclass
class ClaimInfo:
    uid: str
    name: str
    namespace: str
    drivers: list[str]
    pod_uids: set[str] = field(default_factory=set)
    # driver -> [{"requestNames": [...], "poolName", "deviceName", "cdiDeviceIDs": [...]}]
    devices: dict[str, list[dict]] = field(default_factory=dict)
    prepared: bool = False

    def state(self) -> dict:
        return {"ClaimUID": self.uid, "ClaimName": self.name, "Namespace": self.namespace,
                "PodUIDs": sorted(self.pod_uids), "DriverState": {d: {"Devices": self.devices.get(d, [])}
                                                                 for d in self.drivers}}


def claim_name(pod: dict, pod_claim: dict) -> str | None:
    """``resourceclaim.Name``: the claim a pod's ``spec.resourceClaims`` entry refers to (None: not yet
    created from its template)."""
    if pod_claim.get("resourceClaimName"):
        return pod_claim["resourceClaimName"]
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("name") == pod_claim.get("name"):
            return st.get("resourceClaimName")
    return None


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


class DraManager:
    """One kubelet process's DRA manager (``restart`` of the kubelet = a new instance on the same root)."""

    def __init__(self, root: str, client: Any, node_name: str, log: KlogWriter | None = None, *,
                 call_timeout_s: float = CALL_TIMEOUT_S, poll_s: float = 0.1, wiping_delay_s: float = 30.0,
                 wipe_on_start: bool = True, health: bool = True) -> None:
        self.root = root
        self.registry_dir = os.path.join(root, "plugins_registry")
        self.client = client
        self.node_name = node_name
        self.log = log or KlogWriter(0)
        self.call_timeout_s = call_timeout_s
        self.poll_s = poll_s
        self.wiping_delay_s = wiping_delay_s
        self.wipe_on_start = wipe_on_start
        self.health_enabled = health
        self.plugins: dict[str, Plugin] = {}  # driver -> the latest registered plugin
        self.health: dict[tuple[str, str, str], str] = {}  # (driver, pool, device) -> HEALTHY/UNHEALTHY/...
        self.claims: dict[str, ClaimInfo] = {}  # "ns/name" -> info
        self.calls: list[tuple[str, str, list[str]]] = []  # (method, driver, claim uids): every RPC made
        self.durations: list[tuple[str, float]] = []  # (method, seconds until the plugin answered)
        self.registrations: list[str] = []
        self.wiped = threading.Event()
        self.resynced = threading.Event()  # every running pod handed to ``resync`` is prepared again
        self.resync_errors: list[str] = []
        self._known: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pending_wipes: dict[str, float] = {}

    # ------------------------------------------------------------------------------------ lifecycle
    @property
    def state_path(self) -> str:
        return os.path.join(self.root, STATE_FILE)

    def start(self) -> DraManager:
        os.makedirs(self.registry_dir, exist_ok=True)
        self._read_checkpoint()
        for target, name in ((self._watch, "dra-plugin-watcher"), (self._startup_wipe, "dra-startup-wipe")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        """The kubelet process exits: connections close, the checkpoint stays."""
        self._stop.set()
        for t in self._threads:
            t.join(2.0)
        with self._lock:
            for p in self.plugins.values():
                p.channel.close()
            self.plugins.clear()

    # ------------------------------------------------------------------------------------ checkpoint
    def _read_checkpoint(self) -> None:
        try:
            with open(self.state_path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return
        for entry in doc.get("Entries") or []:
            info = ClaimInfo(entry["ClaimUID"], entry["ClaimName"], entry["Namespace"],
                             sorted(entry.get("DriverState") or {}), set(entry.get("PodUIDs") or ()),
                             {d: list((s or {}).get("Devices") or []) for d, s in
                              (entry.get("DriverState") or {}).items()}, prepared=False)
            self.claims[f"{info.namespace}/{info.name}"] = info

    def _write_checkpoint(self) -> None:
        doc = {"Entries": [c.state() for c in self.claims.values()]}
        tmp = self.state_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self.state_path)

    # ------------------------------------------------------------------------------------ registration
    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                present = {os.path.join(self.registry_dir, n) for n in os.listdir(self.registry_dir)
                           if n.endswith(".sock")}
            except OSError:
                present = set()
            for path in sorted(present - self._known):
                if self._register(path):
                    self._known.add(path)
            for path in sorted(self._known - present):
                self._known.discard(path)
                self._deregister(path)
            self._run_pending_wipes()
            self._stop.wait(self.poll_s)

    def _register(self, socket_path: str) -> bool:
        ch = grpc.insecure_channel(f"unix://{socket_path}")
        try:
            info = reg_pb2_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=10)
        except grpc.RpcError as exc:
            self.log.log(3, "plugin_watcher.go:197", "GetInfo failed, retrying", path=socket_path,
                         err=rpc_error_text(exc))
            ch.close()
            return False
        stub = reg_pb2_grpc.RegistrationStub(ch)
        error = ""
        chosen = None
        if info.type != "DRAPlugin":
            error = f"plugin type {info.type!r} is not handled by the DRA manager"
        elif not info.supported_versions:
            error = ("invalid supported gRPC versions of DRA driver plugin "
                     f"{info.name} at endpoint {info.endpoint}: empty list of supported gRPC services "
                     "(aka supported versions)")
        else:
            chosen = next((s for s in info.supported_versions if s in SERVICES), None)
            if chosen is None:
                error = (f"invalid supported gRPC versions of DRA driver plugin {info.name} at endpoint "
                         f"{info.endpoint}: none of services supported by the plugin "
                         f"({list(info.supported_versions)!r}) are supported by the kubelet "
                         f"({list(SERVICES)!r})")
        with self._lock:
            old = self.plugins.get(info.name)
            taken = (old is not None and old.endpoint == info.endpoint
                     and old.registration_socket != socket_path)
            if not error and taken:
                error = f"endpoint {info.endpoint} already registered for DRA driver plugin {info.name}"
        try:
            status = reg_pb2.RegistrationStatus(plugin_registered=not error, error=error)
            stub.NotifyRegistrationStatus(status, timeout=10)
        except grpc.RpcError:
            pass
        if error:
            self.log.error_s("plugin_watcher.go:225", "RegisterPlugin error", error, path=socket_path)
            ch.close()
            return True  # a refused plugin is not retried until its socket changes
        ch.close()
        health = next((s for s in info.supported_versions if s in HEALTH_SERVICES), None)
        plugin = Plugin(info.name, info.endpoint, socket_path, chosen, grpc.insecure_channel(
            f"unix://{info.endpoint}"), health if self.health_enabled else None)
        with self._lock:
            if old is not None and old.channel is not plugin.channel:
                old.channel.close()
            self.plugins[info.name] = plugin
            self._pending_wipes.pop(info.name, None)
            self.registrations.append(info.name)
        self.log.log(3, "dra_plugin_manager.go:297", "Registered DRA plugin", driverName=info.name,
                     endpoint=info.endpoint, chosenService=chosen)
        if plugin.health_service:
            t = threading.Thread(target=self._health_stream, args=(plugin,), name=f"dra-health-{info.name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return True

    def _deregister(self, socket_path: str) -> None:
        with self._lock:
            for driver, p in list(self.plugins.items()):
                if p.registration_socket == socket_path:
                    del self.plugins[driver]
                    p.channel.close()
                    self._pending_wipes[driver] = time.monotonic() + self.wiping_delay_s
                    self.log.log(3, "dra_plugin_manager.go:352", "Unregistered DRA plugin", driverName=driver,
                                 endpoint=p.endpoint)

    def _run_pending_wipes(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [d for d, at in self._pending_wipes.items() if at <= now and d not in self.plugins]
            for d in due:
                del self._pending_wipes[d]
        for driver in due:
            self._wipe(driver)

    def _startup_wipe(self) -> None:
        if not self.wipe_on_start:
            self.wiped.set()
            return
        delay = 0.2
        while not self._stop.is_set():
            try:
                self._wipe("")
                self.wiped.set()
                return
            except Exception as exc:  # API down at kubelet start: retried with backoff (wait.Backoff)
                self.log.log(3, "dra_plugin_manager.go:191", "Deleting ResourceSlice failed, retrying",
                             err=str(exc))
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _wipe(self, driver: str) -> int:
        """``DeleteCollection`` with ``spec.nodeName=<node>[,spec.driver=<driver>]`` (the simulated API
        server has no collection DELETE: list and delete each, same outcome)."""
        selector = f"spec.nodeName={self.node_name}" + (f",spec.driver={driver}" if driver else "")
        items, _rv = self.client.list("resourceslices", field_selector=selector)
        for obj in items:
            try:
                self.client.delete("resourceslices", obj["metadata"]["name"])
            except Exception as exc:  # noqa: BLE001 - already gone is fine
                if "not found" not in str(exc).lower():
                    raise
        self.log.log(3, "dra_plugin_manager.go:182", "Deleted ResourceSlices", fieldSelector=selector,
                     count=len(items))
        return len(items)

    def _health_stream(self, plugin: Plugin) -> None:
        pb, pb_grpc = HEALTH_SERVICES[plugin.health_service or ""]
        while not self._stop.is_set() and self.plugins.get(plugin.driver) is plugin:
            try:
                stream = pb_grpc.DRAResourceHealthStub(plugin.channel).NodeWatchResources(
                    pb.NodeWatchResourcesRequest())
                for resp in stream:
                    with self._lock:
                        for d in resp.devices:
                            key = (plugin.driver, d.device.pool_name, d.device.device_name)
                            self.health[key] = pb.HealthStatus.Name(d.health)
                    if self._stop.is_set():
                        stream.cancel()
                        return
            except grpc.RpcError as exc:
                self.log.log(3, "dra_plugin_manager.go:268", "WatchResources health stream has ended",
                             error=rpc_error_text(exc))
            except ValueError:  # channel closed (deregistered)
                return
            self._stop.wait(5.0)

    def registered(self, driver: str) -> bool:
        with self._lock:
            return driver in self.plugins

    def wait_registered(self, driver: str, timeout: float, after: int = 0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.registered(driver) and self.registrations.count(driver) > after:
                return True
            time.sleep(0.02)
        return False

    # ------------------------------------------------------------------------------------ prepare
    def _call(self, driver: str, method: str, claims: list[ClaimInfo]) -> Any:
        with self._lock:
            plugin = self.plugins.get(driver)
        if plugin is None:
            raise PrepareFailed(f"DRA driver {driver} is not registered")
        pb, pb_grpc = SERVICES[plugin.service]
        request_type = pb.NodePrepareResourcesRequest if method == "NodePrepareResources" \
            else pb.NodeUnprepareResourcesRequest
        req = request_type(claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims])
        self.calls.append((method, driver, [c.uid for c in claims]))
        self.log.log(4, "dra_plugin.go:127", f"Calling {method} rpc", driverName=driver, claims=len(claims))
        stub = pb_grpc.DRAPluginStub(plugin.channel)
        start = time.monotonic()
        try:
            return getattr(stub, method)(req, timeout=self.call_timeout_s)
        except grpc.RpcError as exc:
            raise PrepareFailed(f"{method} failed: {rpc_error_text(exc)}") from None
        finally:
            self.durations.append((method, time.monotonic() - start))

    def prepare(self, pod: dict) -> dict[str, list[str]]:
        """``PrepareResources(pod)``; returns container name -> CDI device IDs (``GetResources``)."""
        md = pod.get("metadata") or {}
        uid, ns, pod_name = md.get("uid", ""), md.get("namespace", "default"), md.get("name", "")
        batches: dict[str, list[ClaimInfo]] = {}
        touched: list[ClaimInfo] = []
        with self._lock:
            for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
                name = claim_name(pod, pod_claim)
                if name is None:
                    raise PrepareFailed(f"prepare resource claim: pod {pod_name}: resource claim for "
                                        f"{pod_claim.get('name')!r} has not been created yet")
                try:
                    claim = self.client.get("resourceclaims", name, ns)
                except Exception as exc:
                    raise PrepareFailed(f"failed to fetch ResourceClaim {name} referenced by pod {pod_name}: "
                                        f"{exc}") from None
                cuid = claim["metadata"]["uid"]
                reserved = {r.get("uid") for r in (claim.get("status") or {}).get("reservedFor") or []}
                if uid not in reserved:
                    raise PrepareFailed(f"pod {pod_name}({uid}) is not allowed to use resource claim "
                                        f"{name}({cuid})")
                used = {c.get("name") for ctr in _containers(pod)
                        for c in (ctr.get("resources") or {}).get("claims") or []}
                if pod_claim.get("name") not in used:
                    continue  # no container uses it: nothing to prepare
                info = self.claims.get(f"{ns}/{name}")
                if info is None or info.uid != cuid:
                    alloc = (claim.get("status") or {}).get("allocation")
                    if not alloc:
                        raise PrepareFailed(f"claim {ns}/{name}: not allocated")
                    results = (alloc.get("devices") or {}).get("results") or []
                    drivers = sorted({r.get("driver") for r in results})
                    info = ClaimInfo(cuid, name, ns, drivers)
                    self.claims[f"{ns}/{name}"] = info
                info.pod_uids.add(uid)
                touched.append(info)
                if not info.prepared:
                    for d in info.drivers:
                        batches.setdefault(d, []).append(info)
        for driver, infos in batches.items():
            resp = self._call(driver, "NodePrepareResources", infos)
            for cuid, result in resp.claims.items():
                info = next((i for i in infos if i.uid == cuid), None)
                if info is None:
                    raise PrepareFailed(f"NodePrepareResources returned result for unknown claim UID {cuid}")
                if result.error:
                    raise PrepareFailed(f"NodePrepareResources failed for claim "
                                        f"{info.namespace}/{info.name}: {result.error}")
                with self._lock:
                    info.devices[driver] = [{"requestNames": list(d.request_names), "poolName": d.pool_name,
                                             "deviceName": d.device_name,
                                             "cdiDeviceIDs": list(d.cdi_device_ids)} for d in result.devices]
                    info.prepared = True
            with self._lock:
                self._write_checkpoint()
            unfinished = len(infos) - len(resp.claims)
            if unfinished:
                raise PrepareFailed(f"NodePrepareResources left out {unfinished} claims")
        with self._lock:
            self._write_checkpoint()
        return self.container_cdi(pod)

    def container_cdi(self, pod: dict) -> dict[str, list[str]]:
        """``GetResources``: the CDI IDs each container gets (a claim reference with a request name gets
        only that request's devices)."""
        ns = (pod.get("metadata") or {}).get("namespace", "default")
        out: dict[str, list[str]] = {}
        with self._lock:
            for ctr in _containers(pod):
                ids: list[str] = []
                for ref in (ctr.get("resources") or {}).get("claims") or []:
                    pod_claim = next((c for c in (pod.get("spec") or {}).get("resourceClaims") or []
                                      if c.get("name") == ref.get("name")), None)
                    name = claim_name(pod, pod_claim) if pod_claim else None
                    info = self.claims.get(f"{ns}/{name}") if name else None
                    if info is None:
                        continue
                    for devs in info.devices.values():
                        for d in devs:
                            if not ref.get("request") or not d["requestNames"] or \
                                    ref["request"] in d["requestNames"]:
                                ids += [i for i in d["cdiDeviceIDs"] if i not in ids]
                out[ctr.get("name", "")] = ids
        return out

    def unprepare_pod(self, pod_uid: str) -> None:
        """``UnprepareResources`` for a pod that is gone (by uid: the claim infos know their pods)."""
        batches: dict[str, list[ClaimInfo]] = {}
        with self._lock:
            for info in list(self.claims.values()):
                if pod_uid not in info.pod_uids:
                    continue
                if len(info.pod_uids) > 1:
                    info.pod_uids.discard(pod_uid)
                    continue
                for d in info.drivers:
                    batches.setdefault(d, []).append(info)
        for driver, infos in batches.items():
            resp = self._call(driver, "NodeUnprepareResources", infos)
            for cuid, result in resp.claims.items():
                info = next((i for i in infos if i.uid == cuid), None)
                if info is None:
                    raise PrepareFailed("NodeUnprepareResources returned result for unknown claim UID "
                                        f"{cuid}")
                if result.error:
                    raise PrepareFailed(f"NodeUnprepareResources failed for claim "
                                        f"{info.namespace}/{info.name}: {result.error}")
                with self._lock:
                    info.pod_uids.discard(pod_uid)
                    self.claims.pop(f"{info.namespace}/{info.name}", None)
            with self._lock:
                self._write_checkpoint()
            unfinished = len(infos) - len(resp.claims)
            if unfinished:
                raise PrepareFailed(f"NodeUnprepareResources left out {unfinished} claims")
        with self._lock:
            self._write_checkpoint()

    def resync(self, pods: list[dict]) -> None:
        """After a kubelet restart the pod workers sync every running pod again, and ``PrepareResources``
        calls NodePrepareResources for claims read back from the checkpoint (they are not "prepared");
        a failure is retried with backoff until it works or the kubelet stops."""
        if not pods:
            self.resynced.set()
            return

        def run() -> None:
            todo = list(pods)
            delay = 0.2
            while todo and not self._stop.is_set():
                pod = todo[0]
                try:
                    self.prepare(pod)
                    todo.pop(0)
                    delay = 0.2
                except PrepareFailed as exc:
                    self.resync_errors.append(str(exc))
                    self._stop.wait(delay)
                    delay = min(delay * 2, 5.0)
            if not todo:
                self.resynced.set()

        t = threading.Thread(target=run, name="dra-resync", daemon=True)
        t.start()
        self._threads.append(t)

    def pod_claims(self, pod_uid: str) -> list[ClaimInfo]:
        with self._lock:
            return [c for c in self.claims.values() if pod_uid in c.pod_uids]

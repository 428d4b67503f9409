"""Node registration loop: publishes this node's GPUs in ``hami.io/node-nvidia-register``.

HAMi's ``WatchAndRegister`` (Project-HAMi/HAMi
``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``): every 30 s (5 s after an error) build the
device list from the NVML inventory and the config, and patch the node annotation only when the encoded JSON
differs from what the node carries. Paused while a MIG reconfiguration holds the MIG apply lock file.

Log lines are HAMi's (seed 000 §1.2, §7), so the seeds' grep recipes work unchanged:
``start working on the devices``, ``nvml registered device id=0, memory=81920, type=NVIDIA-A100, numa=0``,
``patch node with the following annos ...``, ``Successfully registered annotation. Next check in 30s
seconds...``, ``Retrying in 5s seconds...``, ``MIG apply lock file detected``.

Differences from HAMi (safer, same wire result):
* the node's current annotation is compared, not only a private cache, so an annotation deleted or
  corrupted by someone else is restored on the next check (a malformed value is logged and overwritten);
  the node is read from the plugin's watch of its own Node (``node_source``), not fetched: an idle node
  sends the API server no request at all (a GET every 30 s from 5,000 nodes is ~170 requests/s), and a
  change of the annotation by someone else wakes the loop at once;
* NVML is never called here: devices come from the supervisor's in-memory snapshot, so a hung driver
  cannot hang the loop; while NVML is stuck the last-known GPUs are published with ``health: false``;
* GPUs in MIG mode are not published as shareable devices in ``hami-core``/``mps`` mode (they are served
  as ``nvidia.com/mig-<profile>`` by the static MIG path).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hami_agent import log
from hami_agent.config import AgentConfig, MigProfileAllowlistEntry, NodeConfig
from hami_agent.miglock import MigApplyLock
from hami_agent.nvml.model import device_type
from hami_agent.protocol import (
    MigPlacement,
    MigProfile,
    NodeDevice,
    ProtocolError,
    decode_node_devices,
    encode_node_devices,
    keys,
)
from hami_agent.protocol.devices import go_json
from hami_agent.protocol.timefmt import format_go_duration

logger = logging.getLogger(__name__)

# register_once outcomes (also kept in NodeRegistrar.last_result)
RESULT_PATCHED = "patched"
RESULT_UNCHANGED = "unchanged"
RESULT_PAUSED = "paused"  # MIG apply lock present
RESULT_WAITING = "waiting"  # no usable NVML inventory yet
RESULT_ERROR = "error"
# how often the loop's sleep looks at its stop event by itself: every stopper also calls wake(), so this is
# only a safety net (issue 31: at 5 s it woke an idle node 6 times per 30 s register interval for nothing)
STOP_CHECK_S = 30.0

# MIG GPUs have 7 compute slices and 8 memory slices (A100, A30 has 4/4 but is rare here, H100, H20...).
_FULL_COMPUTE_SLICES = 7
_MEMORY_SLICES = 8
_MIG_NAME_RE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+\w+)?$")


class KubeNodes(Protocol):
    """What the registrar needs from ``hami_agent.k8s.KubeClient``."""

    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None],
                               resource_version: str | None = None) -> Any: ...


@dataclass(frozen=True)
class SkippedGpu:
    """A GPU left out of the annotation, and why (for logs, doctor and tests)."""

    index: int
    uuid: str
    reason: str


def mig_profiles_from_names(names: Sequence[str], total_memory_mib: int | None) -> tuple[MigProfile, ...]:
    """MIG profiles derived from profile names (``<g>g.<mem>gb``) when the inventory has no NVML
    profile info: memory = nominal GiB × 1024, core = ceil(g × 100 / 7), sliceCount = g, and the
    standard placements on an 8-memory-slice GPU (NVIDIA MIG user guide): a profile occupying ``s``
    memory slices may start at multiples of ``s`` (1g: 0..6; 4g and 7g: 0 only)."""
    out = []
    for name in names:
        m = _MIG_NAME_RE.match(name)
        if not m:
            continue
        g, gb = int(m.group(1)), int(m.group(2))
        if total_memory_mib:
            per_slice = total_memory_mib / 1024 / _MEMORY_SLICES
            size = max(1, min(_MEMORY_SLICES, 2 ** round(math.log2(max(1.0, gb / per_slice)))))
        else:
            size = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}.get(g, 8)
        if g >= 4:
            starts = [0]
        elif g == 1 and size == 1:
            starts = list(range(_FULL_COMPUTE_SLICES))
        else:
            starts = list(range(0, _MEMORY_SLICES - size + 1, size))
            if g == 2:  # 2g profiles never use the last pair (slice 7 has no compute behind it)
                starts = [s for s in starts if s + size <= _FULL_COMPUTE_SLICES]
        placements = tuple(MigPlacement(start=s, size=size) for s in starts)
        out.append(MigProfile(name=name, memory_mb=gb * 1024, core=math.ceil(g * 100 / _FULL_COMPUTE_SLICES),
                              slice_count=g, placements=placements, instance_count=len(placements)))
    return tuple(out)


def allowed_mig_profile_names(allowlist: Sequence[MigProfileAllowlistEntry], model: str) -> list[str]:
    names: list[str] = []
    for entry in allowlist:
        if entry.matches(model):
            names += [p for p in entry.profiles if p not in names]
    return names


def build_node_devices(snapshot: Any, config: AgentConfig, mode: str | None = None,
                       mig_profiles: Callable[[str], tuple[MigProfile, ...]] | None = None,
                       ) -> tuple[list[NodeDevice], list[SkippedGpu]]:
    """HAMi's ``getAPIDevices`` (Project-HAMi/HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/
    register.go``) from an NVML ``Snapshot`` and the config. ``mode`` overrides the node's
    ``operatingmode`` (the device plugin passes the mode it serves). ``mig_profiles(uuid)``: the profiles
    dynamic MIG discovered through NVML for a GPU (allowlisted); in mig mode only those are published,
    ``count`` = the largest instance count, memory unscaled, 100 cores, as HAMi does."""
    node: NodeConfig = config.node
    mode = mode or node.operating_mode or keys.MODE_HAMI_CORE
    nvml_ok = getattr(snapshot, "status", "ok") == "ok"
    devices: list[NodeDevice] = []
    skipped: list[SkippedGpu] = []
    for gpu in getattr(snapshot, "gpus", ()) or ():
        if node.filter_devices.excludes(gpu.uuid, gpu.index):
            skipped.append(SkippedGpu(gpu.index, gpu.uuid, "excluded by filterdevices"))
            continue
        name = getattr(gpu, "name", "") or getattr(gpu, "type", "") or "GPU"
        numa = gpu.numa if isinstance(gpu.numa, int) and gpu.numa > 0 else 0
        healthy = bool(gpu.healthy) and nvml_ok
        if mode == keys.MODE_MIG:
            if mig_profiles is not None:
                profiles = mig_profiles(gpu.uuid)
                if not profiles:
                    skipped.append(SkippedGpu(gpu.index, gpu.uuid, "no MIG profile discovered (MIG mode off, "
                                              "model not in nvidia.migProfileAllowlist, or NVML failed: see "
                                              "the device plugin log)"))
                    continue
            else:
                profiles = tuple(getattr(gpu, "mig_profiles", ()) or ())
            if not profiles:
                allowed = allowed_mig_profile_names(config.nvidia.mig_profile_allowlist, name)
                profiles = mig_profiles_from_names(allowed, gpu.memory_mib)
            if not profiles:
                skipped.append(SkippedGpu(gpu.index, gpu.uuid, "no MIG profiles allowed for model "
                                          f"{name!r} (check nvidia.migProfileAllowlist)"))
                continue
            devmem = int(gpu.memory_mib or 0)  # no memory scaling in mig mode
            devcore = 100
            count = max(p.instance_count for p in profiles)
        else:
            if getattr(gpu, "mig_enabled", False):
                skipped.append(SkippedGpu(gpu.index, gpu.uuid, "MIG mode is enabled (served as "
                                          "nvidia.com/mig-<profile>, not shared through HAMi-core)"))
                continue
            profiles = ()
            if gpu.memory_mib is None:
                if not node.pre_configured_device_memory:
                    skipped.append(SkippedGpu(gpu.index, gpu.uuid, "GetMemoryInfo not supported and "
                                              "preConfiguredDeviceMemory is not set"))
                    continue
                total = node.pre_configured_device_memory
            else:
                total = gpu.memory_mib
            devmem = int(total * node.device_memory_scaling)
            devcore = int(node.device_core_scaling * 100)
            count = node.device_split_count
        devices.append(NodeDevice(
            id=gpu.uuid, index=gpu.index, count=count, devmem=devmem, devcore=devcore,
            type=device_type(name), numa=numa, mode=mode, health=healthy, mig_profiles=profiles))
    return devices, skipped


def _rv_int(obj: Any) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError, AttributeError):
        return 0


def _error_text(prefix: str, exc: BaseException) -> str:
    """``patch node error: ...``: KubeError messages already start with the verb phrase."""
    text = str(exc) or type(exc).__name__
    return text if text.startswith(prefix) else f"{prefix}: {text}"


class NodeRegistrar:
    """Keeps ``hami.io/node-nvidia-register`` in line with the NVML inventory.

    ``snapshot_source``: an ``NvmlSupervisor`` (anything with ``.snapshot()``) or a callable returning
    a ``Snapshot``. ``mode``: the operating mode the device plugin actually serves (default: the
    node's ``operatingmode``), so the annotation never promises a mode the plugin cannot allocate.
    ``clock`` is used for ``last_success_at`` only; waiting uses the stop event."""

    def __init__(self, client: KubeNodes, node_name: str, snapshot_source: Any, config: AgentConfig,
                 *, interval_s: float | None = None, retry_s: float | None = None,
                 mode: str | None = None, clock: Callable[[], float] = time.monotonic,
                 mig_lock: MigApplyLock | None = None,
                 node_source: Callable[[], dict[str, Any] | None] | None = None,
                 mig_profiles: Callable[[str], tuple[MigProfile, ...]] | None = None) -> None:
        """``node_source``: this node from a watch cache (an ``Informer`` of ``metadata.name=<node>``;
        None while it has not synced, then the node is fetched once)."""
        if not node_name:
            raise ValueError("node name is empty: set --node-name or the NODE_NAME env (the pod's "
                             "spec.nodeName via the downward API)")
        self.client = client
        self.node_name = node_name
        self.config = config
        self.interval_s = float(interval_s if interval_s is not None else config.agent.register_interval_s)
        self.retry_s = float(retry_s if retry_s is not None else config.agent.register_retry_s)
        self.clock = clock
        self.mode = mode
        self.mig_profiles = mig_profiles
        self._snapshot: Callable[[], Any] = (
            snapshot_source.snapshot if hasattr(snapshot_source, "snapshot") else snapshot_source)
        self.last_result: str | None = None
        self.last_error: str | None = None
        self.last_success_at: float | None = None
        self.last_encoded: str | None = None  # what we last saw on (or wrote to) the node
        self.patches = 0
        self.gets = 0  # node reads that went to the API (the watch cache had no node)
        self.node_source = node_source
        self._written_rv = 0  # resourceVersion our last patch produced: an older cached node predates it
        self._wake = threading.Event()
        self.skipped: list[SkippedGpu] = []
        self._logged_devices: str | None = None  # device lines are Info only when the list changes
        self._paused_logged = False
        self.mig_lock = mig_lock or MigApplyLock(config.agent.mig_apply_lock_path, component="register loop")

    # ------------------------------------------------------------------------------------------------
    def _mig_locked(self) -> bool:
        return self.mig_lock.held()  # the device plugin's trust rule (hami_agent.miglock)

    def _log_devices(self, devices: list[NodeDevice], encoded: str) -> None:
        changed = encoded != self._logged_devices
        level = 0 if changed else 4

        log.v(logger, level, "start working on the devices")
        for d in devices:
            log.v(logger, level, "nvml registered device id=%d, memory=%d, type=%s, numa=%d",
                  d.index, d.devmem, d.type, d.numa)
        for s in self.skipped:
            if changed:
                logger.warning("device %d (%s) not registered: %s", s.index, s.uuid, s.reason)
        self._logged_devices = encoded

    def register_once(self) -> bool:
        """One check. True when the node's annotation is known to match the inventory (patched or
        already equal); False when paused, waiting for NVML, or failed (the caller retries sooner)."""
        if self._mig_locked():
            if not self._paused_logged:
                logger.info("MIG apply lock file detected (%s), pausing node registration",
                            self.mig_lock.path)
                self._paused_logged = True
            self.last_result = RESULT_PAUSED
            return False
        if self._paused_logged:
            logger.info("MIG apply lock released, resuming node registration")
            self._paused_logged = False
        try:
            snapshot = self._snapshot()
        except Exception as exc:  # a broken source must not kill the loop
            return self._fail(f"nvml inventory unavailable: {exc}")
        status = getattr(snapshot, "status", "ok")
        if status == "starting" or (status != "ok" and not getattr(snapshot, "gpus", ())):
            if status == "starting":
                log.v(logger, 4, "waiting for the first NVML inventory before registering")
                self.last_result = RESULT_WAITING
                return False
            return self._fail(f"nvml inventory unavailable ({status}): "
                              f"{getattr(snapshot, 'error', None) or 'no GPUs known'}")
        if status != "ok":
            logger.warning("NVML is %s (%s): registering the last known GPUs as unhealthy", status,
                           getattr(snapshot, "stuck_call", None) or getattr(snapshot, "error", None) or "")
        devices, self.skipped = build_node_devices(snapshot, self.config, self.mode, self.mig_profiles)
        encoded = encode_node_devices(devices)
        self._log_devices(devices, encoded)

        try:
            node = self._read_node()
        except Exception as exc:
            return self._fail(_error_text("get node error", exc))
        current = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER)
        if current != encoded and self._predates_our_write(node) and self.last_encoded == encoded:
            current = encoded  # the watch has not delivered our own last patch yet
        if current == encoded:
            self.last_encoded = encoded
            return self._ok(RESULT_UNCHANGED)
        if current:
            try:
                decode_node_devices(current)
            except ProtocolError as exc:
                logger.warning("existing %s annotation is malformed, overwriting it: %s",
                               keys.NODE_REGISTER, exc)
        annos: dict[str, str | None] = {keys.NODE_REGISTER: encoded}
        # Go's %v of a map[string]string, as in HAMi's log line
        logger.info("patch node with the following annos map[%s]",
                    " ".join(f"{k}:{v}" for k, v in sorted(annos.items())))
        log.v(logger, 5, "register annotation JSON %s", go_json(annos))
        try:
            out = self.client.patch_node_annotations(self.node_name, annos)
        except Exception as exc:
            return self._fail(_error_text("patch node error", exc))
        self._written_rv = _rv_int(out)
        self.patches += 1
        self.last_encoded = encoded
        return self._ok(RESULT_PATCHED)

    def _read_node(self) -> dict[str, Any]:
        """This node from the watch cache, else (no cache, or not synced yet) from the API."""
        if self.node_source is not None:
            node = self.node_source()
            if node is not None:
                return node
        self.gets += 1
        return self.client.get_node(self.node_name)

    def _predates_our_write(self, node: dict[str, Any]) -> bool:
        return 0 < _rv_int(node) < self._written_rv

    def wake(self) -> None:
        """Check now."""
        self._wake.set()

    def node_changed(self, node: dict[str, Any]) -> None:
        """Watch handler: check now if the node's annotation is not what we last published (someone
        removed or altered it). Other node changes (the node lock, status) do not wake the loop."""
        current = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER)
        if (self.last_encoded is not None and current != self.last_encoded
                and not self._predates_our_write(node)):
            self.wake()

    def _ok(self, result: str) -> bool:
        self.last_result = result
        self.last_error = None
        self.last_success_at = self.clock()
        return True

    def _fail(self, message: str) -> bool:
        logger.error("%s", message)
        self.last_result = RESULT_ERROR
        self.last_error = message
        return False

    # ------------------------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event) -> None:
        """Loop until ``stop_event`` is set. Never raises: every failure is logged and retried."""
        logger.info("Starting WatchAndRegister")
        while not stop_event.is_set():
            try:
                ok = self.register_once()
            except Exception:  # defensive: a bug here must not stop the heartbeat
                logger.exception("Failed to register annotation: unexpected error")
                ok = False
            if ok:
                logger.info("Successfully registered annotation. Next check in %s seconds...",
                            format_go_duration(self.interval_s))
                wait = self.interval_s
            else:
                if self.last_result == RESULT_ERROR:
                    logger.info("Retrying in %s seconds...", format_go_duration(self.retry_s))
                wait = self.retry_s
            self._wait(stop_event, wait)
        log.v(logger, 4, "WatchAndRegister stopped")

    def _wait(self, stop_event: threading.Event, seconds: float) -> None:
        """Sleep until the next check, a ``wake()`` (node changed) or ``stop_event``. ``stop_event`` is
        looked at every STOP_CHECK_S; whoever sets it calls ``wake()`` for a prompt exit (issue 31: a
        0.5 s look cost an idle node 2 wakeups a second)."""
        end = time.monotonic() + seconds
        while not stop_event.is_set():
            left = end - time.monotonic()
            if left <= 0 or self._wake.wait(min(left, STOP_CHECK_S)):
                break
        self._wake.clear()

    def start(self, stop_event: threading.Event) -> threading.Thread:
        """Run the loop in a daemon thread."""
        t = threading.Thread(target=self.run, args=(stop_event,), name="hami-register", daemon=True)
        t.start()
        return t

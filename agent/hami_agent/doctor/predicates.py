"""Named predicates over facts: the only place where evidence is interpreted.

Each answers True, False or None (the evidence was not collected). The first docstring line is quoted in
the runbooks ("how doctor detects it"), so it states the condition in plain words; ``{arg}`` stands for
the predicate's argument.
"""

from __future__ import annotations

from typing import Any

from hami_agent.doctor import knownbad
from hami_agent.doctor.engine import PredicateRegistry
from hami_agent.doctor.model import MISSING, Facts

REGISTRY = PredicateRegistry()
predicate = REGISTRY.register


def _get(f: Facts, key: str) -> Any:
    return f.get(key)


def _count(f: Facts, key: str) -> int | None:
    v = f.get(key)
    if v is MISSING or v is None:
        return None
    return int(v) if not isinstance(v, (list, tuple, dict)) else len(v)


def _any_true(*answers: bool | None) -> bool | None:
    """True if any is True; False if all are known False; None if none True and some unknown."""
    if any(a is True for a in answers):
        return True
    if all(a is False for a in answers):
        return False
    return None


def _positive(f: Facts, key: str) -> bool | None:
    n = _count(f, key)
    return None if n is None else n > 0


# --------------------------------------------------------------------------------- admission guard
@predicate("allocation_guard_missing")
def allocation_guard_missing(f: Facts) -> bool | None:
    """neither the admission policies hami-allocation-keys and hami-scheduled-gpu-pods are bound nor the guard
    webhook allocation-guard.hami.io (failurePolicy Fail) is registered"""
    missing = f.get("admission.missing")
    if missing is MISSING or missing is None:
        return None
    return len(missing) > 0


# --------------------------------------------------------------------------------- kubelet / NVML
@predicate("kubelet_stall")
def kubelet_stall(f: Facts) -> bool | None:
    """the kubelet log shows "Issuing a GetPreferredAllocation call for container" for a pod with no
    "Making allocation request for device plugin" after it while the same kubelet kept logging for the
    stall window (default 30 s)"""
    return _positive(f, "kubelet.stalls")


@predicate("nvml_hung")
def nvml_hung(f: Facts) -> bool | None:
    """an NVML call did not return within its deadline (doctor's own probe, the plugin's
    hami_device_plugin_nvml_stuck metric, or an "NVML is hung" line in the plugin log)"""
    probe = f.get("nvml.status")
    metric = f.get("plugin.metrics.nvml_stuck")
    return _any_true(
        None if probe is MISSING else probe == "hung",
        None if metric is MISSING else metric >= 1,
        _positive(f, "plugin.log.nvml_hung"),
    )


@predicate("nvml_workers_unkillable")
def nvml_workers_unkillable(f: Facts) -> bool | None:
    """NVML worker processes (`hami_agent.nvml.worker`) were sent SIGKILL and are still alive, stuck in
    the driver in uninterruptible sleep (/proc/<pid>/status SigPnd, stat state D, wchan), or the plugin's
    hami_nvml_stuck_unkillable metric is 1"""
    metric = f.get("plugin.metrics.nvml_stuck_unkillable")
    return _any_true(
        _positive(f, "nvml.workers.unkillable_count"),
        None if metric is MISSING else metric >= 1,
    )


@predicate("nvml_init_error")
def nvml_init_error(f: Facts) -> bool | None:
    """NVML failed (not hung): doctor's probe raised "nvml Init err ...", or the plugin log has
    "nvml Init err" / "nvml GetDeviceCount err\""""
    probe = f.get("nvml.status")
    return _any_true(
        None if probe is MISSING else probe == "error",
        _positive(f, "plugin.log.nvml_init_err"),
        _positive(f, "plugin.log.nvml_device_count_err"),
    )


@predicate("driver_known_bad")
def driver_known_bad(f: Facts) -> bool | None:
    v = f.get("driver.known_bad")
    return None if v is MISSING else bool(v)


# the runbooks quote this docstring; the list comes from its one source
driver_known_bad.__doc__ = (
    "the NVIDIA driver version (from NVML, or /sys/module/nvidia/version when NVML hangs) is on the\n"
    f"    known-bad list ({', '.join(knownbad.sorted_versions())})")


@predicate("mig_mixed")
def mig_mixed(f: Facts) -> bool | None:
    """the node mixes MIG-enabled and full GPUs (from NVML, /proc/driver/nvidia/capabilities, or the
    node's allocatable nvidia.com/mig-* next to nvidia.com/gpu)"""
    v = f.get("mig.mixed")
    return None if v is MISSING else bool(v)


@predicate("mps_control_missing")
def mps_control_missing(f: Facts) -> bool | None:
    """nvidia-cuda-mps-control is not found on $PATH (or the plugin log says "executable file not found")"""
    path = f.get("host.mps_control.path")
    return _any_true(None if path is MISSING else not path, _positive(f, "plugin.log.mps_binary_missing"))


@predicate("mps_in_use")
def mps_in_use(f: Facts) -> bool | None:
    """the node shares GPUs with MPS (a registered device in mode mps, --expect-mps, or an MPS daemon
    start failure in the plugin log)"""
    modes = f.get("node.modes")
    return _any_true(
        None if modes is MISSING else "mps" in modes,
        True if f.get("host.mps.expected") is True else None,
        _positive(f, "plugin.log.mps_binary_missing"),
    )


@predicate("pod_stuck_after_scheduling")
def pod_stuck_after_scheduling(f: Facts) -> bool | None:
    """the pod is bound to a node and still Pending after the pending window, and no event from the
    kubelet mentions it (seed 003: only "Scheduled")"""
    node, phase, age = f.get("pod.node_name"), f.get("pod.phase"), f.get("pod.age_s")
    if node is MISSING or phase is MISSING:
        return None
    if not node or phase != "Pending" or f.get("pod.terminating") is True:
        return False
    window = f.get("ctx.pending_after_s", 60.0)
    bind_age = f.get("pod.bind_age_s")
    waited = bind_age if isinstance(bind_age, (int, float)) else age
    if not isinstance(waited, (int, float)) or waited < window:
        return False
    kubelet = f.get("events.kubelet")
    return None if kubelet is MISSING else kubelet == 0


@predicate("node_pods_stuck_allocating")
def node_pods_stuck_allocating(f: Facts) -> bool | None:
    """pods bound to the node are still Pending with hami.io/bind-phase=allocating after the pending
    window: the kubelet has not called the plugin's Allocate for them"""
    return _positive(f, "node.allocating_pods")


# ------------------------------------------------------------------------------- node annotations
@predicate("node_not_found")
def node_not_found(f: Facts) -> bool | None:
    """the node does not exist in the API"""
    v = f.get("node.found")
    return None if v is MISSING else v is False


@predicate("register_missing")
def register_missing(f: Facts) -> bool | None:
    """the node has no (or an empty) hami.io/node-nvidia-register annotation, or the scheduler says
    "node unregistered\""""
    present = f.get("node.register.present")
    reasons = f.get("events.hami_reasons")
    return _any_true(
        None if present is MISSING or f.get("node.found") is not True else not present,
        None if reasons is MISSING else "NodeUnregistered" in reasons,
    )


@predicate("register_malformed")
def register_malformed(f: Facts) -> bool | None:
    """hami.io/node-nvidia-register does not decode (neither the JSON list nor the legacy text form)"""
    if f.get("node.register.present") is not True:
        return None if f.get("node.register.present") is MISSING else False
    return f.has("node.register.error")


@predicate("register_unhealthy")
def register_unhealthy(f: Facts) -> bool | None:
    """a registered GPU has health=false, or the plugin metrics count Unhealthy device IDs"""
    return _any_true(_positive(f, "node.register.unhealthy"),
                     _positive(f, "plugin.metrics.unhealthy_devices"))


@predicate("handshake_expired")
def handshake_expired(f: Facts) -> bool | None:
    """the scheduler's handshake is stale: `Requesting_<t>` older than the handshake timeout (60 s) while
    the node's allocatable nvidia.com/gpu is 0, a legacy `Deleted_` value, or no handshake at all on a
    registered node with 0 allocatable (the scheduler's NodeCleanUp removed it)"""
    kind = f.get("node.handshake.kind")
    if kind is MISSING:
        return None
    alloc = f.get("node.allocatable_gpu")
    no_alloc = not alloc
    if kind == "deleted":
        return True
    if kind == "requesting":
        age = f.get("node.handshake.age_s")
        return isinstance(age, (int, float)) and age > f.get("ctx.handshake_timeout_s", 60.0) and no_alloc
    if kind == "missing":
        return f.get("node.register.present") is True and no_alloc
    return False


@predicate("allocatable_gpu_zero")
def allocatable_gpu_zero(f: Facts) -> bool | None:
    """the node registers GPUs in its annotation but the kubelet reports 0 (or no) allocatable
    nvidia.com/gpu"""
    if f.get("node.found") is not True:
        return None
    return f.get("node.register.count", 0) > 0 and not f.get("node.allocatable_gpu")


@predicate("node_lock_stale")
def node_lock_stale(f: Facts) -> bool | None:
    """hami.io/mutex.lock is older than the lock expiry (5 min), or its owner pod is gone or already
    finished allocation (bind-phase success/failed) so nobody will release it"""
    if f.get("node.lock.present") is not True:
        return None if f.get("node.lock.present") is MISSING else False
    if f.has("node.lock.error"):
        return True
    return bool(f.get("node.lock.expired") is True
                or f.get("node.lock.owner_state") in ("NotFound", "success", "failed", "Succeeded", "Failed"))


# --------------------------------------------------------------------------------------- logs
@predicate("log")
def log_match(f: Facts, key: str) -> bool | None:
    """the log has lines matching {arg}"""
    return _any_true(*(_positive(f, k) for k in key.split("|")))


@predicate("device_number_mismatch")
def device_number_mismatch(f: Facts) -> bool | None:
    """"device number not matched" in the plugin log, the kubelet log or the pod's events"""
    return _any_true(_positive(f, "plugin.log.device_number_mismatch"),
                     _positive(f, "kubelet.log.device_number_mismatch"),
                     _positive(f, "events.device_number_mismatch"))


@predicate("allocate_refused")
def allocate_refused(f: Facts, key: str) -> bool | None:
    """the device plugin's Allocate refusal {arg} is in the plugin log, the kubelet log ("Allocate
    failed due to ...") or the pod's UnexpectedAdmissionError event"""
    return _any_true(*(_positive(f, f"{src}.{key}") for src in ("plugin.log", "kubelet.log", "events")))


@predicate("pod_devices_malformed")
def pod_devices_malformed(f: Facts) -> bool | None:
    """hami.io/vgpu-devices-to-allocate does not decode, or the plugin logs "failed to decode pod devices\""""
    return _any_true(None if not f.has("pod.found") else f.has("pod.to_allocate_error"),
                     _positive(f, "plugin.log.decode_pod_devices"))


# ------------------------------------------------------------------------------------ HAMi-core
@predicate("libvgpu_missing_on_host")
def libvgpu_missing_on_host(f: Facts) -> bool | None:
    """the node registers GPUs in mode hami-core, and on the node $HOOK_PATH/vgpu/libvgpu.so is missing,
    or $HOOK_PATH/vgpu/ld.so.preload (mounted as the container's /etc/ld.so.preload) is missing or does
    not list libvgpu.so"""
    lib, pre = f.get("host.libvgpu.present"), f.get("host.preload.present")
    if lib is MISSING:
        return None
    modes = f.get("node.modes")
    if modes is MISSING or not modes:
        return None  # without the registration we cannot tell whether HAMi-core is meant to be there
    if "hami-core" not in modes:
        return False  # MIG/MPS-only nodes do not use HAMi-core
    return lib is False or pre is False or f.get("host.preload.lists_libvgpu") is False


@predicate("pod_control_disabled")
def pod_control_disabled(f: Facts) -> bool | None:
    """a container of the pod sets CUDA_DISABLE_CONTROL=true, so HAMi does not mount ld.so.preload"""
    return _positive(f, "pod.control_disabled")


@predicate("shrreg")
def shrreg_code(f: Facts, codes: str) -> bool | None:
    """a shared region analysis finding is one of {arg}"""
    got = f.get("shrreg.codes")
    if got is MISSING:
        return None
    return any(c in got for c in codes.split("|"))


# -------------------------------------------------------------------------------------- scheduler
@predicate("pod_not_found")
def pod_not_found(f: Facts) -> bool | None:
    """the pod does not exist in the API"""
    v = f.get("pod.found")
    return None if v is MISSING else v is False


@predicate("pod_unbound_pending")
def pod_unbound_pending(f: Facts) -> bool | None:
    """the pod is Pending and not bound to a node (spec.nodeName empty)"""
    node, phase = f.get("pod.node_name"), f.get("pod.phase")
    if phase is MISSING:
        return None
    return phase == "Pending" and not node and f.get("pod.terminating") is not True


@predicate("pod_pending_long")
def pod_pending_long(f: Facts) -> bool | None:
    """the pod has been Pending for longer than the pending window (default 60 s)"""
    phase, age = f.get("pod.phase"), f.get("pod.age_s")
    if phase is MISSING:
        return None
    return phase == "Pending" and isinstance(age, (int, float)) and age >= f.get("ctx.pending_after_s", 60.0)


@predicate("requests_hami")
def requests_hami(f: Facts) -> bool | None:
    """the pod requests a HAMi-managed resource (nvidia.com/gpu with optional gpumem/gpucores)"""
    v = f.get("pod.requests_hami")
    return None if v is MISSING else bool(v)


@predicate("scheduler_name_wrong")
def scheduler_name_wrong(f: Facts) -> bool | None:
    """spec.schedulerName differs from the HAMi scheduler's name (--scheduler-name, default
    hami-scheduler)"""
    name = f.get("pod.scheduler_name")
    return None if name is MISSING else name != f.get("pod.expected_scheduler", "hami-scheduler")


@predicate("no_scheduling_events")
def no_scheduling_events(f: Facts) -> bool | None:
    """the pod has no FilteringFailed, FilteringSucceed, BindingFailed, Scheduled or FailedScheduling
    event"""
    keys = ("events.filtering_failed", "events.filtering_succeed", "events.binding_failed",
            "events.scheduled", "events.failed_scheduling")
    counts = [_count(f, k) for k in keys]
    if any(c is None for c in counts):
        return None
    return sum(c or 0 for c in counts) == 0


@predicate("scheduler_reason")
def scheduler_reason(f: Facts, reason: str) -> bool | None:
    """a FilteringFailed / FailedScheduling / BindingFailed event or the PodScheduled condition names the
    HAMi reason {arg}"""
    ev, cond = f.get("events.hami_reasons"), f.get("pod.condition_reasons")
    return _any_true(None if ev is MISSING else reason in ev, None if cond is MISSING else reason in cond)


@predicate("binding_failed")
def binding_failed(f: Facts) -> bool | None:
    """the pod has a BindingFailed event or hami.io/bind-phase=failed"""
    return _any_true(_positive(f, "events.binding_failed"),
                     None if not f.has("pod.bind_phase") else f.get("pod.bind_phase") == "failed")


@predicate("filtering_succeeded")
def filtering_succeeded(f: Facts) -> bool | None:
    """the pod has a FilteringSucceed event (HAMi found a node)"""
    return _positive(f, "events.filtering_succeed")


@predicate("scheduler_down")
def scheduler_down(f: Facts) -> bool | None:
    """the scheduler extender's /healthz does not answer 200 (URL from --scheduler-url)"""
    v = f.get("scheduler.healthz.ok")
    return None if v is MISSING else v is False


@predicate("plugin_down")
def plugin_down(f: Facts) -> bool | None:
    """the device plugin's /healthz does not answer 200 (URL from --plugin-url)"""
    v = f.get("plugin.healthz.ok")
    return None if v is MISSING else v is False


@predicate("collector_failed")
def collector_failed(f: Facts, name: str) -> bool | None:
    """the {arg} evidence collector failed or timed out"""
    return f.has(f"collect.{name}.error")


@predicate("outstanding_preferred_call")
def outstanding_preferred_call(f: Facts) -> bool | None:
    """the kubelet log ends with a GetPreferredAllocation call not yet answered, but less log time than
    the stall window has passed since it"""
    return _positive(f, "kubelet.outstanding")


@predicate("pod_running")
def pod_running(f: Facts) -> bool | None:
    """the pod is Running or has Succeeded (so scheduling is over)"""
    phase = f.get("pod.phase")
    return None if phase is MISSING else phase in ("Running", "Succeeded")

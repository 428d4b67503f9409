"""What each verdict code means to an operator: the symptom and background the runbooks print.

How doctor detects a code and the fix come from the rules themselves (``runbooks.py`` renders both), so
this table only holds what the rules cannot say.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami_agent.doctor import knownbad
from hami_agent.doctor.trees.seed001_scheduler import REASONS


@dataclass(frozen=True)
class CodeDoc:
    title: str
    symptom: str
    background: str = ""
    seed: str = ""


_DOCS: dict[str, CodeDoc] = {
    "KUBELET_DEVICE_MANAGER_STALL": CodeDoc(
        "kubelet blocked in GetPreferredAllocation",
        "Pods scheduled to the node stay Pending with only a `Scheduled` event; deleted pods stay "
        "Terminating; "
        "GPU and non-GPU pods alike. Restarting kubelet and the device plugin helps only until the next GPU "
        "pod.",
        "The kubelet admits pods serially and calls the device plugin's GetPreferredAllocation and Allocate "
        "without a deadline (kubernetes #117435, #130855). A plugin call that never returns blocks "
        "admission of "
        "every later pod. The kubelet's klog line `\"Issuing a GetPreferredAllocation call for container\"` "
        "is "
        "then the last device-manager line for that pod: no `\"Making allocation request for device "
        "plugin\"` "
        "follows.",
        "003 §3.1.6, §3.2"),
    "NVML_INIT_HANG_KNOWN_BAD_DRIVER": CodeDoc(
        "NVML hangs on a known-bad R570 driver",
        "The device plugin stops answering (see KUBELET_DEVICE_MANAGER_STALL); `nvidia-smi` may hang too; "
        "the node mixes MIG-partitioned and full GPUs.",
        f"Drivers {knownbad.describe_versions()} have an NVML regression: `nvmlInit` hangs "
        "on nodes with a mix of MIG slices and full GPUs (NVIDIA gpu-operator #1361). Fixed in 570.172.08; "
        "workaround: downgrade to 570.86.15 or undo the MIG split. Doctor reads the driver version from "
        "/sys/module/nvidia/version when NVML itself hangs.",
        "003 §3.3-§4"),
    "NVML_HANG": CodeDoc(
        "an NVML call does not return",
        "The device plugin marks GPUs unhealthy or stops updating; `nvidia-smi` hangs; processes in D state.",
        "A call into the driver did not return within doctor's deadline (default 10 s). The driver version "
        "is not on the known-bad list, so the cause is something else: XID errors, a wedged GPU, a driver "
        "lock held by a dead process.",
        "003 §3.3"),
    "NVML_WORKER_UNKILLABLE": CodeDoc(
        "NVML workers killed but stuck in the driver (D state)",
        "GPUs turn Unhealthy with reason `nvml-stuck-unkillable`; the agent logs `nvml-stuck-unkillable: N "
        "NVML worker process(es) were killed and have not exited`; `ps` shows `hami_agent.nvml.worker` "
        "processes in state D that `kill -9` does not remove; `nvidia-smi` hangs.",
        "hami-agent calls NVML only in child processes and SIGKILLs one whose call misses its deadline. A "
        "thread stuck inside the driver sleeps uninterruptibly, so the kill stays pending and the process "
        "keeps its /dev/nvidia* handles and memory until the driver returns. To keep that footprint bounded "
        "the agent allows at most HAMI_NVML_MAX_ABANDONED_WORKERS (default 2) such processes and starts no "
        "new NVML worker while they are alive; it resumes by itself when one exits. Nothing in user space "
        "can end them: the driver must return (rarely) or the node must reboot.",
        "003 §3.3"),
    "KNOWN_BAD_DRIVER_WITH_MIG": CodeDoc(
        "known-bad driver on a node that mixes MIG and full GPUs",
        "Nothing yet, or occasional Pending pods: the seed-003 hang is intermittent (\"偶现\").",
        "The conditions of gpu-operator #1361 hold on this node; NVML answered this time but can hang at the "
        "next initialisation.", "003 §2, §3.4"),
    "KNOWN_BAD_DRIVER": CodeDoc(
        "known-bad driver (not triggered yet)",
        "None yet.",
        "The driver build is on the known-bad list, but the node does not mix MIG and full GPUs today. "
        "Partitioning some GPUs with MIG would trigger the hang.", "003 §5.1"),
    "MPS_CONTROL_BINARY_MISSING": CodeDoc(
        "nvidia-cuda-mps-control is missing",
        "The MPS control daemon pod is in CrashLoopBackOff with `exec: \"nvidia-cuda-mps-control\": "
        "executable file not found in $PATH`.",
        "Driver upgrades can remove the compute utilities that ship the MPS control binary; the privileged "
        "MPS daemon container uses the host's binary.", "003 §5.2"),
    "POD_STUCK_AFTER_SCHEDULING": CodeDoc(
        "pod bound to a node but never admitted by the kubelet",
        "`kubectl describe pod` shows only `Scheduled` (or `BindingSucceed`); no kubelet events; the pod "
        "keeps hami.io/bind-phase=allocating.",
        "The scheduler did its part; the kubelet on the node has not called the plugin's Allocate. Without "
        "the node's kubelet log doctor cannot prove a device-manager stall, so it points you there.",
        "003 §3.1.1"),
    "NODE_NOT_FOUND": CodeDoc("node does not exist", "`kubectl get node <node>` answers NotFound."),
    "NODE_NOT_REGISTERED": CodeDoc(
        "no GPUs registered for the node",
        "GPU pods never land on the node; scheduler reason `node unregistered`; the node has no "
        "hami.io/node-nvidia-register annotation.",
        "The device plugin writes the register annotation every 30 s after NVML enumerated the GPUs; no "
        "annotation means the plugin is not running, NVML fails, or the patch is refused.", "000 §4.1, 001"),
    "REGISTER_ANNOTATION_MALFORMED": CodeDoc(
        "register annotation does not decode",
        "Scheduler log `device decode error`; GPU pods are not placed on the node.",
        "Usually a version skew between device plugin and scheduler (JSON since HAMi v2.8, colon text "
        "before).", "000 §4.2, §4.3"),
    "NVML_INIT_ERROR": CodeDoc(
        "NVML cannot be initialised",
        "Plugin log `nvml Init err` or `nvml GetDeviceCount err`; no GPUs registered.",
        "The driver is not loaded, the container does not see /dev/nvidia* or the driver libraries, or "
        "library and kernel module versions differ.", "000 §1.3, §4.1"),
    "PATCH_NODE_ERROR": CodeDoc(
        "device plugin cannot patch its node",
        "Plugin log `patch node error` / `get node error`; annotations stale or absent.",
        "RBAC (nodes get/patch), a wrong NODE_NAME, or the API server unreachable.", "000 §1.3, §4.1"),
    "HANDSHAKE_EXPIRED": CodeDoc(
        "scheduler handshake with the node expired",
        "Pods Pending; scheduler log mentions the handshake; the node's GPUs vanish from the scheduler.",
        "The scheduler writes `Requesting_<time>` to hami.io/node-handshake and, 60 s later, keeps the node "
        "only if the kubelet reports allocatable nvidia.com/gpu > 0; otherwise it deletes the handshake and "
        "drops the node's devices (legacy schedulers wrote `Deleted_<time>`).", "000 §4.3, 001"),
    "NO_GPU_ALLOCATABLE": CodeDoc(
        "kubelet reports no allocatable GPUs",
        "`kubectl get node -o jsonpath='{.status.allocatable}'` lacks nvidia.com/gpu or shows 0.",
        "The register annotation exists, so the plugin ran, but it is not registered with the kubelet "
        "(socket missing, kubelet restarted and the plugin did not re-register).", "000 §6 PEND3/PEND4"),
    "DEVICE_UNHEALTHY": CodeDoc(
        "GPU registered as unhealthy",
        "Fewer usable GPUs; reason CardNotHealth for pods.",
        "The plugin marks a GPU unhealthy after a critical XID, a lost GPU, or a stuck NVML worker.",
        "000 §3"),
    "ALLOCATE_DEVICE_NUMBER_MISMATCH": CodeDoc(
        "Allocate: device number not matched",
        "Pod fails admission with `UnexpectedAdmissionError`; plugin log `device number not matched`.",
        "The number of devices in the pod's hami.io/vgpu-devices-to-allocate entry differs from the number "
        "the kubelet requests for the container.", "000 §4.4"),
    "ALLOCATE_UNKNOWN_DEVICE": CodeDoc(
        "Allocate: unknown device", "Plugin log `invalid allocation request ... unknown device`.",
        "The kubelet asked for a device ID that the plugin no longer advertises.", "000 §4.4"),
    "ALLOCATE_POD_NOT_FOUND": CodeDoc(
        "Allocate could not read the pod being admitted",
        "Pod fails admission with `UnexpectedAdmissionError`; plugin log `failed to get pending pod: ...` "
        "(HAMi's own plugin: a bare `no binding pod found on node <node>`).",
        "The kubelet's Allocate names devices, not pods. hami-agent identifies the pod by the node lock "
        "(`hami.io/mutex.lock`, written by the scheduler's /bind) and its owner, read from the informer "
        "caches or, on a miss, from the API within the RPC's 2 s budget. `failed to get pending pod` "
        "means those reads did not answer in time (API server slow or unreachable, or RBAC). There is no "
        "fallback to \"the oldest pod with bind-phase=allocating\" (HAMi's): it could hand one pod's "
        "devices to another. When the lock was read but names nobody usable, doctor reports "
        "ALLOCATE_NO_NODE_LOCK or ALLOCATE_LOCK_NAMES_OTHER_POD instead.",
        "000 §4.4"),
    "ALLOCATE_NO_NODE_LOCK": CodeDoc(
        "Allocate refused: no node lock names a pod on the node",
        "Pod fails admission with `UnexpectedAdmissionError`: `Allocate failed due to rpc error: code = "
        "Unknown desc = no binding pod found on node <node>: no node lock (hami.io/mutex.lock) names a "
        "pod on this node, and only the pod the HAMi scheduler bound under that lock is allocated; "
        "refusing (was the pod scheduled by another scheduler, or created with spec.nodeName?), which is "
        "unexpected`.",
        "The device plugin allocates only for the pod the HAMi scheduler locked the node for: the lock is "
        "written by the extender's /bind before the binding and released after that pod's Allocate, and "
        "tenants cannot write Node objects. A pod that reached the node any other way (spec.nodeName in "
        "its spec, another scheduler) cannot prove its allocation, so Allocate refuses and writes "
        "nothing: whatever hami.io annotations it carries (possibly forged) are not used. A pod the HAMi "
        "scheduler did bind meets this only if its lock disappeared before the kubelet admitted it "
        "(expiry after 5 min, or removed by hand).",
        "000 §4.4"),
    "ALLOCATE_LOCK_NAMES_OTHER_POD": CodeDoc(
        "Allocate refused: the node lock names a pod that is not being admitted",
        "Pods on the node fail admission with `UnexpectedAdmissionError`: `... no binding pod found on "
        "node <node>: the node lock names <ns>/<pod>, which does not exist; refusing to allocate` or `... "
        "the node lock names <ns>/<pod>, but it is Running, not waiting for admission` (or: being "
        "deleted, bound to another node, bind-phase not 'allocating', nothing left to allocate).",
        "A lock whose owner no longer needs it (the pod was deleted, failed, bound elsewhere or already "
        "allocated) names nobody the kubelet can be admitting, so every GPU pod on the node is refused "
        "until the lock goes. The device plugin releases the lock after Allocate; when it refused and "
        "wrote nothing (the owner was unknown) the scheduler's leader releases it at its next lock audit "
        "(every 60 s; a new leader audits at once), and any lock expires after 5 minutes. Worst case: "
        "about 60 s plus one API round trip (docs/device-plugin.md).",
        "000 §4.4, 001"),
    "ALLOCATE_AMBIGUOUS_ADMISSION": CodeDoc(
        "Allocate refused: more than one pod could be the one being admitted",
        "Pod fails admission with `UnexpectedAdmissionError`: `... ambiguous admission on node <node>: "
        "the node lock names <ns>/<pod> (uid ...), but <ns>/<other> also wait(s) for 'nvidia.com/gpu' on "
        "this node without an allocation, and Allocate cannot tell which pod the kubelet is admitting; "
        "refusing and writing nothing (pods that request GPUs must reach the node through the HAMi "
        "scheduler)`.",
        "The kubelet's Allocate names devices, not pods. The lock owner is the pod being admitted only if "
        "no other not-yet-admitted pod on the node asks for the same resource; otherwise the lock owner's "
        "devices and limits could go to the other pod. The other pods are usually created with "
        "spec.nodeName (bypassing the scheduler), or a pod whose bind answer was lost while the API "
        "applied it.",
        "000 §4.4"),
    "ALLOCATE_OVERCOMMIT_REFUSED": CodeDoc(
        "Allocate refused an allocation the scheduler cannot have made",
        "Pod fails admission with `UnexpectedAdmissionError`: `... refusing to over-commit GPU <uuid> on "
        "node <node>: pod <ns>/<pod> would bring it to <N> MiB of memory, the GPU has <M> MiB ... was "
        "hami.io/vgpu-devices-allocated written by someone else?`, or `GPU <uuid> is not registered in "
        "hami.io/node-nvidia-register of node <node>`, or `... differs from the scheduler's "
        "hami.io/vgpu-devices-allocated ...; refusing an allocation the scheduler did not make`.",
        "Defence in depth behind the admission rule that keeps tenants from writing HAMi's allocation "
        "keys: before Allocate consumes an allocation it adds it to what the node's other allocated pods "
        "hold and compares the sum with the GPUs the node registered (memory, cores, slots, exclusivity), "
        "and checks that the two allocation annotations agree. The scheduler never produces what fails "
        "here, so the annotations were written by someone else: the admission policy is missing, or "
        "someone with the scheduler's or a node's credentials wrote them.",
),
    "ALLOCATE_KUBELET_CHOSE_OTHER_DEVICES": CodeDoc(
        "Allocate refused: the kubelet chose other GPUs than the scheduler allocated",
        "Pod fails admission with `UnexpectedAdmissionError`: `... pod <ns>/<pod> container '<c>': the "
        "kubelet chose [...] (GPUs [...]), but the scheduler allocated [...] to it in "
        "hami.io/vgpu-devices-to-allocate; refusing rather than handing out devices the kubelet did not "
        "choose (GetPreferredAllocation had no hint for this pod, or a topology policy overrode it)`.",
        "The kubelet picks the device IDs it passes to Allocate and accounts them to the container; the "
        "plugin's GetPreferredAllocation only suggests the scheduler's GPUs. When the kubelet's Topology "
        "Manager prefers other devices (NUMA alignment), or the suggestion had no hint, handing out the "
        "scheduler's GPU anyway would leave the kubelet's accounting and the container's devices apart; "
        "the plugin refuses instead (HAMi hands out the annotated GPU).",
        "000 §4.4"),
    "POD_DEVICES_MALFORMED": CodeDoc(
        "pod device annotation does not decode", "Plugin log `failed to decode pod devices`.",
        "Version skew between scheduler and plugin.", "000 §4.4"),
    "LIBVGPU_NOT_LOADED": CodeDoc(
        "HAMi-core (libvgpu.so) not loaded",
        "Containers use more GPU memory than requested; no shared-region (.cache) files appear.",
        "HAMi mounts $HOOK_PATH/vgpu/libvgpu.so and $HOOK_PATH/vgpu/ld.so.preload (as the container's "
        "/etc/ld.so.preload) unless the container sets CUDA_DISABLE_CONTROL=true.", "000 §4.5"),
    "DEVICE_PLUGIN_UNHEALTHY": CodeDoc(
        "device plugin health endpoint failing", "The plugin's /healthz does not answer 200.", "", "000 §5"),
    "PLUGIN_GRPC_CRASHING": CodeDoc(
        "device plugin gRPC server keeps crashing", "Plugin log `GRPC server has repeatedly crashed`.",
        "", "000 §7"),
    "POD_NOT_FOUND": CodeDoc("pod does not exist", "`kubectl get pod` answers NotFound."),
    "SCHEDULER_NOT_RUNNING": CodeDoc(
        "scheduler extender not answering", "GPU pods stay Pending without HAMi events.", "", "001 C1"),
    "NO_HAMI_RESOURCES": CodeDoc(
        "pod requests no HAMi resource",
        "The pod is Pending but HAMi is not involved: it requests no nvidia.com/gpu.", "", "001 C3"),
    "WRONG_SCHEDULER_NAME": CodeDoc(
        "pod not sent to the HAMi scheduler",
        "GPU pod Pending with no HAMi events; spec.schedulerName is another scheduler.",
        "HAMi's webhook normally sets schedulerName; pods created while it was down, or excluded with "
        "hami.io/webhook=ignore, keep their own.", "001 C4/C5"),
    "NO_SCHEDULER_EVENTS": CodeDoc(
        "no scheduling events for a GPU pod",
        "`kubectl describe pod` shows no events at all while the pod is Pending.",
        "kube-scheduler (with the HAMi extender) has not processed the pod: it is not running, not leader, "
        "or blocked.", "001 扩展排查"),
    "BINDING_FAILED": CodeDoc(
        "binding the pod failed", "BindingFailed event; hami.io/bind-phase=failed.",
        "Bind takes the node lock, patches bind-phase and creates the Binding; any error (lock contention, "
        "API errors) fails it.", "001 H"),
    "FILTER_OK_BUT_PENDING": CodeDoc(
        "filter succeeded but the pod is still Pending",
        "FilteringSucceed event, yet the pod is not bound.",
        "HAMi found a node; another scheduler plugin or the bind step stopped the pod.", "001 I"),
    "ALLOCATION_GUARD_MISSING": CodeDoc(
        "the allocation guard is not installed",
        "Nothing fails visibly: the cluster merely accepts a pod owner's rewrite of its own pod's "
        "`hami.io/vgpu-devices-to-allocate` after scheduling (Allocate then hands out the GPU it names, at "
        "full memory and cores), and pods created with `spec.nodeName` that ask for `nvidia.com/gpu` (the "
        "scheduled pod on that node then fails admission with `UnexpectedAdmissionError: ambiguous "
        "admission`).",
        "HAMi's allocation keys live on the pod, which its owner may edit. The guard refuses every write of "
        "them but the scheduler's (and, on a pod bound to its node, that node's device plugin's), and "
        "refuses rival pods: the ValidatingAdmissionPolicies `hami-allocation-keys` and "
        "`hami-scheduled-gpu-pods` (Kubernetes >= 1.30, run inside kube-apiserver) or, on an older cluster, "
        "the extender's `/validate` webhook `allocation-guard.hami.io` with `failurePolicy: Fail`. "
        "`playbooks/site.yml` installs one of them on every run with a kubeconfig for the cluster, and fails "
        "when it cannot (unless `hami_rbac_admission_required: false`). See docs/security.md \"Safe as "
        "installed\".",
        "issue 27"),
    "STALE_NODE_LOCK": CodeDoc(
        "stale node lock",
        "GPU pods to one node bind slowly or fail with `node lock contention`.",
        "hami.io/mutex.lock (`<RFC3339>,<ns>,<pod>`) is held by a pod that is gone or already allocated, or "
        "for longer than the 5 minute expiry; the plugin normally releases it after Allocate.",
        "000 §5.4, 001"),
    "SHRREG_DEAD_LOCK_HOLDER": CodeDoc(
        "shared region locked by a dead process",
        "Container log `Lock shrreg timeout`; CUDA calls in the container stall.",
        "A process holding the region's semaphore died; nobody posts it again.", "002 锁恢复流程"),
    "SHRREG_LOCK_TIMEOUT": CodeDoc(
        "shared-region lock timeouts", "Container log `Lock shrreg timeout`.",
        "Either a dead holder (see SHRREG_DEAD_LOCK_HOLDER) or a transient race.", "002 速查表"),
    "SHRREG_ZOMBIE_TASKS": CodeDoc(
        "zombie tasks in a shared region",
        "Memory shown as used after processes exited; `shrreg_tool --inspect` lists dead PIDs.", "",
        "002 显存泄漏排查"),
    "SHRREG_VERSION_MISMATCH": CodeDoc(
        "shared region version mismatch",
        "Container log `The current version number ... is different from the file's version number`.",
        "Major differences are incompatible; minor ones are compatible but should be unified.",
        "002 版本兼容性"),
    "SHRREG_SLOTS_FULL": CodeDoc(
        "no free process slot in a shared region", "`SET_TASK_PID FAILED`; new CUDA processes fail.", "",
        "002 E"),
    "SET_TASK_PID_FAILED": CodeDoc(
        "HAMi-core could not register the host PID", "Container log `SET_TASK_PID FAILED`.", "", "002 E"),
    "SHRREG_REGION_CORRUPT": CodeDoc(
        "damaged shared region", "The region cannot be decoded or has impossible values.", "", "002"),
    "CUDA_OOM": CodeDoc(
        "CUDA out of memory under HAMi-core", "Container log `Device N OOM`; the program fails to allocate.",
        "HAMi-core enforces nvidia.com/gpumem per container.", "002 C"),
    "UNKNOWN": CodeDoc(
        "no decision tree matches",
        "A symptom (Pending pod, unanswered kubelet call, evidence that could not be collected) that none of "
        "the seeds' trees explains.",
        "Doctor never guesses: it prints what it saw and what it could not collect."),
}

for _reason, _code, _sev, _meaning, _fix in REASONS:
    _DOCS[_code] = CodeDoc(
        f"scheduler reason {_reason}",
        f"Pod Pending; a FilteringFailed event like `1 nodes {_reason}(gpu-1)` or a FailedScheduling message "
        f"with `1/1 {_reason}`.",
        f"HAMi's Fit rejected the GPUs with {_reason}: {_meaning}.", "001 速查表")


def doc_for(code: str) -> CodeDoc:
    return _DOCS.get(code) or CodeDoc(code.replace("_", " ").lower(), "(see the summary doctor prints)")


def documented_codes() -> list[str]:
    return sorted(_DOCS)

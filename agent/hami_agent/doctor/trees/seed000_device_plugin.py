"""Seed 000 (device plugin guide): registration, NVML errors, handshake, Allocate failures, libvgpu.so."""

from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.model import CRITICAL, ERROR, WARNING

REREGISTER = "ansible-playbook playbooks/reregister_devices.yml -l {target.node}"
RETRY = ("a refused pod is Failed (UnexpectedAdmissionError) and the kubelet does not retry it: delete it; "
         "its controller creates a new one, which the HAMi scheduler places again")
REFUSALS = ("allocate_refused:refused_no_lock", "allocate_refused:refused_lock_other",
            "allocate_refused:refused_ambiguous", "allocate_refused:refused_overcommit",
            "allocate_refused:refused_kubelet_choice")


def _refusal_evidence(key: str, *more: str) -> tuple[str, ...]:
    return (f"plugin.log.{key}", f"kubelet.log.{key}", f"events.{key}", *more)


TREE = Tree(
    name="seed000_device_plugin",
    seed="000 device plugin debugging guide",
    title="device registration, handshake and Allocate",
    rules=(
        Rule(
            code="NODE_NOT_FOUND", severity=ERROR, when=("node_not_found",),
            summary="node {target.node} does not exist in the API",
            evidence=("node.found",),
            fix="check the node name (`kubectl get nodes`); NODE_NAME of the device plugin must match it",
        ),
        Rule(
            code="NODE_NOT_REGISTERED", severity=ERROR, when=("register_missing",),
            summary="node {target.node} has no GPUs registered (hami.io/node-nvidia-register absent or "
                    "empty): "
                    "the scheduler does not know its devices",
            evidence=("node.register.present", "events.hami_reasons", "plugin.log.patch_node_error",
                      "plugin.log.nvml_init_err", "plugin.log.registered_ok"),
            fix="make sure the device plugin runs on the node and can patch it (RBAC, NODE_NAME); then "
                + REREGISTER,
        ),
        Rule(
            code="REGISTER_ANNOTATION_MALFORMED", severity=ERROR, when=("register_malformed",),
            summary="hami.io/node-nvidia-register on {target.node} does not decode: {node.register.error}",
            evidence=("node.register.error",),
            fix="run the same HAMi version for the device plugin and the scheduler; " + REREGISTER
                + " rewrites the annotation",
        ),
        Rule(
            code="NVML_INIT_ERROR", severity=ERROR, when=("nvml_init_error",), unless=("nvml_hung",),
            summary="NVML is not usable on {target.node}: {nvml.error}",
            evidence=("nvml.status", "plugin.log.nvml_init_err", "plugin.log.nvml_device_count_err"),
            fix="check the driver (`nvidia-smi`), that the plugin container mounts /dev/nvidia* and the "
                "driver libraries, and NVIDIA_VISIBLE_DEVICES; collect details with "
                "ansible-playbook playbooks/collect_diagnostics.yml -l {target.node}",
        ),
        Rule(
            code="PATCH_NODE_ERROR", severity=ERROR,
            when=("log:plugin.log.patch_node_error|plugin.log.get_node_error",),
            summary="the device plugin cannot read or patch its node (\"patch node error\" / \"get node "
                    "error\")",
            evidence=("plugin.log.patch_node_error", "plugin.log.get_node_error"),
            fix="grant the plugin's ServiceAccount get/patch on nodes, check that NODE_NAME equals the "
                "node's "
                "name and that the API server is reachable; then " + REREGISTER,
        ),
        Rule(
            code="HANDSHAKE_EXPIRED", severity=ERROR, when=("handshake_expired",),
            summary="the scheduler's handshake with {target.node} expired (hami.io/node-handshake "
                    "{node.handshake.kind}, {node.handshake.age_s}s old, allocatable nvidia.com/gpu "
                    "{node.allocatable_gpu}): the scheduler treats the node's GPUs as gone",
            evidence=("node.handshake.kind", "node.handshake.age_s", "node.allocatable_gpu",
                      "node.register.present"),
            fix="get the device plugin registered with the kubelet again (allocatable nvidia.com/gpu > 0): "
                + REREGISTER + "; check NTP if the handshake time is in the future or far past",
        ),
        Rule(
            code="NO_GPU_ALLOCATABLE", severity=ERROR, when=("allocatable_gpu_zero",),
            unless=("handshake_expired",),
            summary="{target.node} registers {node.register.count} GPU(s) but the kubelet reports "
                    "allocatable "
                    "nvidia.com/gpu {node.allocatable_gpu}: the plugin is not registered with the kubelet",
            evidence=("node.register.count", "node.allocatable_gpu"),
            fix="check the plugin socket /var/lib/kubelet/device-plugins/nvidia-gpu.sock and the plugin log "
                "(\"Registered device plugin for 'nvidia.com/gpu' with Kubelet\"); " + REREGISTER,
        ),
        Rule(
            code="DEVICE_UNHEALTHY", severity=WARNING, when=("register_unhealthy",),
            summary="GPU(s) on {target.node} are registered unhealthy: {node.register.unhealthy}",
            evidence=("node.register.unhealthy", "plugin.metrics.unhealthy_devices", "nvml.gpus"),
            fix="`nvidia-smi -q -d HEALTH,ECC` on the node; check the plugin log for XID errors; drain and "
                "reset or replace the GPU",
        ),
        Rule(
            code="ALLOCATE_DEVICE_NUMBER_MISMATCH", severity=ERROR, when=("device_number_mismatch",),
            summary="Allocate failed with \"device number not matched\": the devices the scheduler wrote "
                    "into "
                    "the pod annotation differ from what the kubelet asked for",
            evidence=("plugin.log.device_number_mismatch", "kubelet.log.device_number_mismatch",
                      "events.device_number_mismatch", "pod.allocated"),
            fix="compare hami.io/vgpu-devices-to-allocate with the container's nvidia.com/gpu limit; run the "
                "same HAMi version for scheduler and plugin; delete the pod so it is scheduled again",
        ),
        Rule(
            code="ALLOCATE_UNKNOWN_DEVICE", severity=ERROR, when=("log:plugin.log.unknown_device",),
            summary="Allocate asked for a device ID the plugin does not advertise (\"unknown device\")",
            evidence=("plugin.log.unknown_device",),
            fix="check GPU health and the advertised IDs (`hami-agent devices`); " + REREGISTER,
        ),
        # The device plugin's refusals: it allocates only for the node lock's owner, and writes nothing
        # when it refuses (deviceplugin/owner.py, allocator.py, capacity.py).
        Rule(
            code="ALLOCATE_NO_NODE_LOCK", severity=ERROR, when=("allocate_refused:refused_no_lock",),
            summary="the device plugin on {target.node} refused Allocate: no node lock (hami.io/mutex.lock) "
                    "names a pod there, so the pod being admitted was not bound by the HAMi scheduler (or "
                    "its lock was gone before the kubelet admitted it); nothing was allocated or written",
            evidence=_refusal_evidence("refused_no_lock", "node.lock.present", "node.unscheduled_gpu_pods",
                                       "pod.node_name", "pod.scheduler_name", "pod.vgpu_node",
                                       "pod.bind_phase", "pod.bind_age_s"),
            fix="a pod created with spec.nodeName (or by another scheduler) bypasses the HAMi scheduler and "
                "gets no GPU: delete it and create it without spec.nodeName, so hami-scheduler places it "
                "(the webhook sets schedulerName). A pod that does carry hami.io/vgpu-node={target.node} "
                "and bind-phase=allocating lost its lock before admission (the kubelet took longer than the "
                "5 min lock expiry, or the lock was removed by hand): " + RETRY,
        ),
        Rule(
            code="ALLOCATE_LOCK_NAMES_OTHER_POD", severity=ERROR,
            when=("allocate_refused:refused_lock_other",),
            summary="the device plugin on {target.node} refused Allocate: the node lock names a pod that "
                    "does not exist or is not waiting for its devices (owner {node.lock.owner}, state "
                    "{node.lock.owner_state}, {node.lock.age_s}s old), so no pod can be allocated there "
                    "until the lock goes; nothing was written",
            evidence=_refusal_evidence("refused_lock_other", "node.lock.owner", "node.lock.age_s",
                                       "node.lock.owner_state", "pod.bind_phase"),
            fix="the scheduler's leader releases a lock whose owner is gone, finished, bound elsewhere or "
                "already allocated at its next lock audit (every 60 s) and any lock after the 5 min expiry; "
                "now: ansible-playbook playbooks/remediate_node_lock.yml -l {target.node} (or: kubectl "
                "annotate node {target.node} hami.io/mutex.lock-); then " + RETRY,
        ),
        Rule(
            code="ALLOCATE_AMBIGUOUS_ADMISSION", severity=ERROR, when=("allocate_refused:refused_ambiguous",),
            summary="the device plugin on {target.node} refused Allocate: besides the node lock's owner, "
                    "other pods on the node wait for the same resource without an allocation, so it cannot "
                    "tell which pod the kubelet is admitting (the kubelet's request names devices, not "
                    "pods); nothing was written",
            evidence=_refusal_evidence("refused_ambiguous", "node.unscheduled_gpu_pods", "node.lock.owner"),
            fix="the other pods the message names reached the node without the HAMi scheduler (spec.nodeName "
                "set by their creator, or another scheduler): delete them, or recreate them without "
                "spec.nodeName so hami-scheduler places them. A pod whose bind answer was lost is rejected "
                "by the kubelet on its own and stops counting. Then " + RETRY,
        ),
        Rule(
            code="ALLOCATE_OVERCOMMIT_REFUSED", severity=CRITICAL,
            when=("allocate_refused:refused_overcommit",),
            summary="the device plugin on {target.node} refused an allocation the scheduler cannot have "
                    "made: the pod's hami.io allocation annotations would over-commit a GPU, name a GPU the "
                    "node did not register, or disagree with each other; someone other than the scheduler "
                    "wrote them",
            evidence=_refusal_evidence("refused_overcommit", "pod.allocated", "node.register.devices"),
            fix="check that the admission rule protecting HAMi's allocation keys is installed (kubectl get "
                "validatingadmissionpolicy hami-allocation-keys; docs/security.md) and find other damage "
                "with `hami-agent doctor invariants`; delete the pod (its allocation is not trustworthy): "
                "its controller's new pod is placed by the HAMi scheduler",
        ),
        Rule(
            code="ALLOCATE_KUBELET_CHOSE_OTHER_DEVICES", severity=ERROR,
            when=("allocate_refused:refused_kubelet_choice",),
            summary="the kubelet on {target.node} asked Allocate for other GPUs than the HAMi scheduler "
                    "allocated to the container; the device plugin refused rather than hand out devices the "
                    "kubelet accounted elsewhere (nothing was allocated)",
            evidence=_refusal_evidence("refused_kubelet_choice", "pod.allocated"),
            fix="usually the kubelet's Topology Manager (topologyManagerPolicy single-numa-node, restricted "
                "or best-effort) overrode GetPreferredAllocation, or GetPreferredAllocation had no hint "
                "because the node lock was not visible yet (plugin log at -v 3: \"without scheduler "
                "hint\"): with a strict NUMA policy ask the scheduler for NUMA-aligned GPUs "
                "(nvidia.com/numa-bind: \"true\" on the pod); " + RETRY,
        ),
        Rule(
            code="ALLOCATE_POD_NOT_FOUND", severity=ERROR, when=("log:plugin.log.pending_pod_missing",),
            unless=REFUSALS,
            summary="Allocate could not read the pod being admitted (\"failed to get pending pod\" / HAMi's "
                    "\"no binding pod found on node\"): the node lock or its owner did not come from the "
                    "API within the RPC deadline",
            evidence=("plugin.log.pending_pod_missing", "node.lock.owner"),
            fix="check API server reachability from {target.node} and the plugin's RBAC (nodes get on its "
                "own node, pods get/list); " + RETRY,
        ),
        Rule(
            code="POD_DEVICES_MALFORMED", severity=ERROR, when=("pod_devices_malformed",),
            summary="the pod's device annotation does not decode: {pod.to_allocate_error}",
            evidence=("pod.to_allocate_error", "plugin.log.decode_pod_devices"),
            fix="run the same HAMi version for scheduler and plugin; delete the pod so it is scheduled again",
        ),
        Rule(
            code="LIBVGPU_NOT_LOADED", severity=ERROR, when=("libvgpu_missing_on_host",),
            summary="HAMi-core cannot be injected on {target.node}: libvgpu.so or its ld.so.preload is "
                    "missing "
                    "under the hook path, so containers run without memory/core limits",
            evidence=("host.libvgpu.present", "host.preload.present", "host.preload.lists_libvgpu"),
            fix="reinstall HAMi-core on the node (role hami.node.hami_core: "
                "ansible-playbook playbooks/site.yml -l {target.node})",
        ),
        Rule(
            code="LIBVGPU_NOT_LOADED", severity=WARNING, when=("pod_control_disabled",),
            summary="pod {pod.ref} disables HAMi-core (CUDA_DISABLE_CONTROL=true in {pod.control_disabled}): "
                    "its GPU memory and cores are not limited",
            evidence=("pod.control_disabled",),
            fix="remove CUDA_DISABLE_CONTROL from the container's env if limits are wanted",
            subject="pod {pod.ref}",
        ),
        Rule(
            code="DEVICE_PLUGIN_UNHEALTHY", severity=ERROR, when=("plugin_down",),
            summary="the device plugin's /healthz does not answer 200",
            evidence=("plugin.healthz.ok",),
            fix="check the plugin pod/service on {target.node} (`kubectl logs`); "
                "ansible-playbook playbooks/collect_diagnostics.yml -l {target.node}",
        ),
        Rule(
            code="PLUGIN_GRPC_CRASHING", severity=ERROR, when=("log:plugin.log.grpc_crash",),
            summary="the device plugin's gRPC server keeps crashing (\"GRPC server has repeatedly crashed\")",
            evidence=("plugin.log.grpc_crash",),
            fix="check permissions on /var/lib/kubelet/device-plugins and free resources; restart the "
                "plugin: "
                + REREGISTER,
        ),
    ),
)

"""Seed 000 (device plugin guide): registration, NVML errors, handshake, Allocate failures, libvgpu.so."""

from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.model import ERROR, WARNING

REREGISTER = "ansible-playbook playbooks/reregister_devices.yml -l {target.node}"

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
        Rule(
            code="ALLOCATE_POD_NOT_FOUND", severity=ERROR, when=("log:plugin.log.pending_pod_missing",),
            summary="Allocate could not find the pod being admitted (\"failed to get pending pod\" / \"no "
                    "binding "
                    "pod found on node\")",
            evidence=("plugin.log.pending_pod_missing", "node.lock.owner"),
            fix="check API server reachability and the plugin's RBAC (get/list pods); the pod must carry "
                "hami.io/bind-phase=allocating and hami.io/vgpu-node={target.node}",
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

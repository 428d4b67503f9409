"""Seed 001 (scheduler guide): no events / wrong schedulerName, one verdict per HAMi filter reason,
binding failures, "FilteringSucceed but still Pending", and the node lock."""

from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.model import CRITICAL, ERROR, INFO, WARNING

# HAMi reason -> (code, severity, meaning, fix). One rule per row (seed 001 速查表 + Project-HAMi/HAMi
# pkg/device/nvidia/device.go Fit, pkg/scheduler/score.go).
REASONS: tuple[tuple[str, str, str, str, str], ...] = (
    ("CardInsufficientMemory", "CARD_INSUFFICIENT_MEMORY", ERROR,
     "no GPU has enough free memory for the request (nvidia.com/gpumem)",
     "lower nvidia.com/gpumem, free memory on a GPU, or target a node with larger GPUs"),
    ("CardInsufficientCore", "CARD_INSUFFICIENT_CORE", ERROR,
     "no GPU has enough free compute share (nvidia.com/gpucores)",
     "lower nvidia.com/gpucores or wait for other pods on the GPUs to finish"),
    ("CardTypeMismatch", "CARD_TYPE_MISMATCH", ERROR,
     "the GPU type or mode does not match nvidia.com/use-gputype / nouse-gputype / vgpu-mode",
     "fix the pod's GPU type annotations or add nodes with that GPU type"),
    ("CardUuidMismatch", "CARD_UUID_MISMATCH", ERROR,
     "no GPU matches nvidia.com/use-gpuuuid / nouse-gpuuuid",
     "fix the UUID list in the pod annotations (`hami-agent devices` lists the UUIDs)"),
    ("CardTimeSlicingExhausted", "CARD_TIME_SLICING_EXHAUSTED", ERROR,
     "every GPU already hosts deviceSplitCount pods (no free replica)",
     "wait for pods to finish or raise deviceSplitCount in the device config"),
    ("CardComputeUnitsExhausted", "CARD_COMPUTE_UNITS_EXHAUSTED", ERROR,
     "a GPU's cores are fully taken and the pod asks for 0 cores",
     "request nvidia.com/gpucores explicitly or wait for GPUs to free up"),
    ("CardNotHealth", "CARD_NOT_HEALTH", ERROR,
     "the GPUs that could fit are registered unhealthy",
     "run `hami-agent doctor node <node>` to see why the GPU is unhealthy"),
    ("CardCordoned", "CARD_CORDONED", WARNING,
     "the GPUs that could fit are cordoned (hami.io/device-cordon)",
     "remove the UUID from hami.io/device-cordon when the GPU is fine again"),
    ("NumaNotFit", "NUMA_NOT_FIT", ERROR,
     "nvidia.com/numa-bind is set and no single NUMA node has enough GPUs",
     "request fewer GPUs or drop nvidia.com/numa-bind"),
    ("ExclusiveDeviceAllocateConflict", "EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT", ERROR,
     "the pod wants whole GPUs (exclusive) but they are shared by other pods",
     "wait for the sharing pods to end or schedule to another node"),
    ("CardNotFoundCustomFilterRule", "CARD_NOT_FOUND_CUSTOM_FILTER_RULE", ERROR,
     "a vendor-specific filter rule rejected every GPU",
     "check the device config's filter rules for this GPU type"),
    ("CardMigTopologyInfeasible", "CARD_MIG_TOPOLOGY_INFEASIBLE", ERROR,
     "no MIG placement on the GPUs can host the requested profile",
     "request a smaller MIG profile or re-partition the GPU (nvidia_mig role)"),
    ("NodeInsufficientDevice", "NODE_INSUFFICIENT_DEVICE", ERROR,
     "the node has fewer GPUs than the pod requests",
     "lower nvidia.com/gpu or use a node with more GPUs"),
    ("AllocatedCardsInsufficientRequest", "ALLOCATED_CARDS_INSUFFICIENT_REQUEST", ERROR,
     "only part of the requested GPUs fit on any node",
     "lower nvidia.com/gpu or the per-GPU memory/cores"),
    ("ResourceQuotaNotFit", "RESOURCE_QUOTA_NOT_FIT", ERROR,
     "the namespace ResourceQuota (limits.nvidia.com/gpumem or gpucores) is used up",
     "raise the ResourceQuota or free GPU quota in the namespace (`kubectl describe quota`)"),
    ("ModeNotFit", "MODE_NOT_FIT", ERROR,
     "the requested nvidia.com/vgpu-mode is not offered by any GPU",
     "fix nvidia.com/vgpu-mode or configure a node in that mode"),
    ("NodeUnfitPod", "NODE_UNFIT_POD", ERROR,
     "the node's device information does not fit the pod (stale or mismatched registration)",
     "run `hami-agent doctor node <node>` to check its register annotation and handshake"),
)


def _reason_rule(reason: str, code: str, severity: str, meaning: str, fix: str) -> Rule:
    return Rule(
        code=code, severity=severity, when=(f"scheduler_reason:{reason}",), unless=("pod_running",),
        summary=f"HAMi filtered out the node(s) for pod {{pod.ref}}: {reason}: {meaning}",
        evidence=("events.hami_reasons", "pod.scheduled_condition", "pod.hami_requests"),
        fix=fix, subject="pod {pod.ref}",
    )


TREE = Tree(
    name="seed001_scheduler",
    seed="001 scheduler debugging guide",
    title="pod scheduling: events, filter reasons, binding, node lock",
    rules=(
        Rule(
            code="POD_NOT_FOUND", severity=ERROR, when=("pod_not_found",),
            summary="pod {pod.ref} does not exist", evidence=("pod.found",),
            fix="check the namespace and name (`kubectl get pods -A | grep <name>`)",
        ),
        Rule(
            code="SCHEDULER_NOT_RUNNING", severity=CRITICAL, when=("scheduler_down",),
            summary="the HAMi scheduler extender does not answer /healthz: GPU pods cannot be scheduled",
            evidence=("scheduler.healthz.ok",),
            fix="kubectl -n kube-system get pods -l app=hami-scheduler; restart it "
                "(kubectl -n kube-system rollout restart deployment hami-scheduler)",
        ),
        Rule(
            code="NO_HAMI_RESOURCES", severity=INFO, when=("pod_unbound_pending",), unless=("requests_hami",
                                                                                          "pod_not_found"),
            summary="pod {pod.ref} requests no HAMi-managed resource (nvidia.com/gpu ...), so HAMi is not "
                    "involved in its scheduling",
            evidence=("pod.requests_hami",),
            fix="add nvidia.com/gpu (and gpumem/gpucores) to the container limits if it needs a GPU",
            subject="pod {pod.ref}",
        ),
        Rule(
            code="WRONG_SCHEDULER_NAME", severity=ERROR,
            when=("pod_unbound_pending", "requests_hami", "scheduler_name_wrong", "no_scheduling_events"),
            summary="pod {pod.ref} uses schedulerName {pod.scheduler_name}, not {pod.expected_scheduler}: "
                    "HAMi "
                    "never sees it",
            evidence=("pod.scheduler_name", "pod.hami_requests", "events.count"),
            fix="set spec.schedulerName: {pod.expected_scheduler} (or enable HAMi's mutating webhook, which "
                "sets it) and recreate the pod",
            subject="pod {pod.ref}",
        ),
        Rule(
            code="NO_SCHEDULER_EVENTS", severity=ERROR,
            when=("pod_unbound_pending", "requests_hami", "no_scheduling_events", "pod_pending_long"),
            unless=("scheduler_name_wrong",),
            summary="pod {pod.ref} has been Pending {pod.age_s}s with no scheduling event at all: the HAMi "
                    "scheduler is not processing it",
            evidence=("pod.scheduler_name", "pod.hami_requests", "events.count", "scheduler.healthz.ok"),
            fix="check the scheduler is running (kubectl -n kube-system get pods -l app=hami-scheduler) and "
                "its "
                "log at -v=5; restart it: kubectl -n kube-system rollout restart deployment hami-scheduler",
            subject="pod {pod.ref}",
        ),
        *(_reason_rule(*row) for row in REASONS),
        Rule(
            code="BINDING_FAILED", severity=ERROR, when=("binding_failed",), unless=("pod_running",),
            summary="binding pod {pod.ref} failed (BindingFailed event or bind-phase=failed)",
            evidence=("events.binding_failed", "pod.bind_phase", "node.lock.owner"),
            fix="read the BindingFailed message: \"node lock contention\" -> see STALE_NODE_LOCK; API "
                "errors -> "
                "check etcd/API server health and the scheduler's RBAC to patch nodes and bind pods",
            subject="pod {pod.ref}",
        ),
        Rule(
            code="FILTER_OK_BUT_PENDING", severity=WARNING,
            when=("filtering_succeeded", "pod_unbound_pending", "pod_pending_long"),
            unless=("binding_failed",),
            summary="HAMi found a node for pod {pod.ref} (FilteringSucceed) but it is still Pending and "
                    "unbound: "
                    "another scheduler plugin or the bind step is blocking it",
            evidence=("events.filtering_succeed", "events.failed_scheduling", "pod.scheduled_condition"),
            fix="read the kube-scheduler log for this pod at -v=5 (other plugins' filter results, bind "
                "errors)",
            subject="pod {pod.ref}",
        ),
        Rule(
            code="STALE_NODE_LOCK", severity=WARNING, when=("node_lock_stale",),
            summary="hami.io/mutex.lock on {target.node} is stale (owner {node.lock.owner}, "
                    "{node.lock.age_s}s "
                    "old, owner state {node.lock.owner_state}): GPU pods to this node wait for the 5 min "
                    "expiry",
            evidence=("node.lock.owner", "node.lock.age_s", "node.lock.owner_state", "node.lock.error"),
            fix="ansible-playbook playbooks/remediate_node_lock.yml -l {target.node} "
                "(or: kubectl annotate node {target.node} hami.io/mutex.lock-)",
        ),
    ),
)

"""Seed 003 (the incident): kubelet admission blocked behind a GetPreferredAllocation that never returns,
because NVML hangs on the known-bad R570 drivers (``hami_agent.known_bad_drivers``) when MIG and full
GPUs are mixed; and, after the driver upgrade, the MPS control binary that went missing."""

from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.model import CRITICAL, ERROR, INFO, WARNING

PLAYBOOK_NVML = ("ansible-playbook playbooks/remediate_nvml_hang.yml -l {target.node} "
                 "-e remediate_kubeconfig=<kubeconfig>")
UPGRADE = (" (cordons and drains the node, upgrades the driver to 570.172.08, reboots, verifies NVML, "
           "uncordons)")

UNKILLABLE_SUMMARY = (
    "{nvml.workers.unkillable_count} NVML worker process(es) were killed but cannot exit: stuck in the "
    "driver in uninterruptible sleep, keeping their /dev/nvidia* handles and memory ({nvml.workers."
    "unkillable_pids}); the agent starts no new NVML worker while its limit of them is alive (GPUs "
    "Unhealthy, reason nvml-stuck-unkillable)")
UNKILLABLE_EVIDENCE = ("nvml.workers.unkillable", "plugin.metrics.nvml_stuck_unkillable", "driver.version")

TREE = Tree(
    name="seed003_kubelet_stall",
    seed="003 incident: pods Pending/Terminating after MIG split (NVML init hang, R570)",
    title="kubelet device manager stall and the NVML hang behind it",
    rules=(
        Rule(
            code="KUBELET_DEVICE_MANAGER_STALL", severity=CRITICAL, when=("kubelet_stall",),
            summary="kubelet device manager is blocked: GetPreferredAllocation for pod "
                    "{kubelet.stall.pod_uid} "
                    "container {kubelet.stall.container} ({kubelet.stall.resource}) issued at "
                    "{kubelet.stall.issued_at} never returned ({kubelet.stall.waited_s}s of later log); "
                    "every "
                    "pod admitted after it on this node waits too",
            evidence=("kubelet.stalls", "nvml.status", "driver.version"),
            fix="run `hami-agent doctor node {target.node}` on the node to find why the plugin's call "
                "hangs (NVML); on a known-bad driver: " + PLAYBOOK_NVML + ". To unblock admission "
                "meanwhile, restart the device plugin pod and then the kubelet; the stall comes back until "
                "the cause is fixed",
            subject="pod uid {kubelet.stall.pod_uid}",
        ),
        Rule(
            code="NVML_INIT_HANG_KNOWN_BAD_DRIVER", severity=CRITICAL, when=("nvml_hung", "driver_known_bad"),
            summary="NVML hangs ({nvml.stuck_call}) on known-bad driver {driver.version} "
                    "(NVIDIA gpu-operator #1361; MIG mixed with full GPUs: {mig.mixed}); upgrade to "
                    "{driver.fixed_in}",
            evidence=("nvml.status", "plugin.metrics.nvml_stuck", "plugin.log.nvml_hung", "driver.version",
                      "driver.known_bad", "mig.mixed"),
            fix=PLAYBOOK_NVML + UPGRADE + "; workaround without an upgrade: undo the MIG split or "
                "downgrade to 570.86.15",
        ),
        Rule(
            code="NVML_WORKER_UNKILLABLE", severity=CRITICAL,
            when=("nvml_workers_unkillable", "driver_known_bad"),
            summary=UNKILLABLE_SUMMARY + "; driver {driver.version} is known-bad",
            evidence=UNKILLABLE_EVIDENCE,
            fix=PLAYBOOK_NVML + UPGRADE + " (the reboot ends the stuck processes)",
        ),
        Rule(
            code="NVML_WORKER_UNKILLABLE", severity=CRITICAL, when=("nvml_workers_unkillable",),
            summary=UNKILLABLE_SUMMARY,
            evidence=UNKILLABLE_EVIDENCE,
            fix="a call into the driver never returns and no signal can end the process: collect evidence "
                "(ansible-playbook playbooks/collect_diagnostics.yml -l {target.node}; `dmesg -T` for XID "
                "errors), then drain the node (kubectl drain {target.node} --ignore-daemonsets "
                "--delete-emptydir-data) and reboot it; only the driver returning or a reboot ends them",
        ),
        Rule(
            code="NVML_HANG", severity=CRITICAL, when=("nvml_hung",), unless=("driver_known_bad",),
            summary="NVML does not answer: {nvml.stuck_call} hung (driver {driver.version}, not on the "
                    "known-bad list); the GPU driver is stuck",
            evidence=("nvml.status", "plugin.metrics.nvml_stuck", "plugin.log.nvml_hung", "driver.version"),
            fix="the driver is not on the known-bad list: collect evidence with ansible-playbook "
                "playbooks/collect_diagnostics.yml -l {target.node}, look for XID errors in `dmesg -T`, "
                "restart the device plugin; reboot the node if NVML still hangs (a process stuck in the "
                "driver cannot be killed)",
        ),
        Rule(
            code="KNOWN_BAD_DRIVER_WITH_MIG", severity=ERROR, when=("driver_known_bad", "mig_mixed"),
            unless=("nvml_hung",),
            summary="driver {driver.version} is known to hang NVML on nodes mixing MIG and full GPUs, and "
                    "this "
                    "node does: the seed-003 stall can start at any moment",
            evidence=("driver.version", "driver.known_bad", "mig.mixed"),
            fix=PLAYBOOK_NVML + UPGRADE + ", before it hangs",
        ),
        Rule(
            code="KNOWN_BAD_DRIVER", severity=WARNING, when=("driver_known_bad",),
            unless=("mig_mixed", "nvml_hung"),
            summary="driver {driver.version} is on the known-bad list; it hangs NVML as soon as MIG and full "
                    "GPUs are mixed on this node",
            evidence=("driver.version", "driver.known_bad", "mig.mixed"),
            fix="upgrade the driver to {driver.fixed_in} before enabling MIG on a subset of GPUs: "
                + PLAYBOOK_NVML,
        ),
        Rule(
            code="MPS_CONTROL_BINARY_MISSING", severity=ERROR, when=("mps_control_missing", "mps_in_use"),
            summary="nvidia-cuda-mps-control is missing while this node shares GPUs with MPS: the MPS "
                    "control "
                    "daemon cannot start (seed 003 §5.2, typically after a driver upgrade)",
            evidence=("host.mps_control.path", "plugin.log.mps_binary_missing", "node.modes",
                      "host.mps.expected"),
            fix="ansible-playbook playbooks/remediate_mps_daemon.yml -l {target.node}; by hand: install "
                "nvidia-compute-utils-<branch> matching the driver (seed 003 §5.2) and restart the MPS "
                "daemon",
        ),
        Rule(
            code="MPS_CONTROL_BINARY_MISSING", severity=INFO, when=("mps_control_missing",),
            summary="nvidia-cuda-mps-control is not installed; harmless unless this node will share GPUs "
                    "with MPS",
            evidence=("host.mps_control.path",),
            fix="before using MPS: ansible-playbook playbooks/remediate_mps_daemon.yml -l {target.node}",
        ),
        Rule(
            code="POD_STUCK_AFTER_SCHEDULING", severity=ERROR, when=("pod_stuck_after_scheduling",),
            unless=("kubelet_stall",),
            summary="pod {pod.ref} was bound to {pod.node_name} but the kubelet has not acted on it "
                    "(no kubelet events, still Pending): the node's pod admission looks blocked",
            evidence=("pod.node_name", "pod.phase", "pod.bind_phase", "pod.bind_age_s", "events.count"),
            fix="run `hami-agent doctor node {pod.node_name} --kubelet-log <file>` on that node (or with "
                "journald access) to confirm a kubelet device-manager stall and find the hung call",
            subject="pod {pod.ref}",
        ),
        Rule(
            code="POD_STUCK_AFTER_SCHEDULING", severity=ERROR, when=("node_pods_stuck_allocating",),
            unless=("kubelet_stall",),
            summary="{node.allocating_pods} pod(s) bound to {node.name} wait for the device plugin's "
                    "Allocate "
                    "(bind-phase=allocating, still Pending): the kubelet is not admitting pods",
            evidence=("node.allocating_pods",),
            fix="check the kubelet log on {target.node} (`hami-agent doctor node {target.node} "
                "--kubelet-log <file>`); " + PLAYBOOK_NVML,
        ),
    ),
)

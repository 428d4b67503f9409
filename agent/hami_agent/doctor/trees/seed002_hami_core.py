"""Seed 002 (HAMi-core guide): shared-region locks, zombie tasks, version mismatch, slots, OOM."""

from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.model import CRITICAL, ERROR, WARNING

SHRREG = "ansible-playbook playbooks/remediate_shrreg.yml -l {target.node}"

TREE = Tree(
    name="seed002_hami_core",
    seed="002 HAMi-core debugging guide",
    title="HAMi-core shared regions and container-side errors",
    rules=(
        Rule(
            code="SHRREG_DEAD_LOCK_HOLDER", severity=CRITICAL,
            when=("shrreg:LOCK_HELD_DEAD_OWNER",),
            summary="a shared region is LOCKED by a dead process: every process of that container waits "
                    "(\"Lock shrreg timeout\")",
            evidence=("shrreg.LOCK_HELD_DEAD_OWNER", "hamicore.log.lock_timeout", "hamicore.log.dead_owner"),
            fix=SHRREG + "; by hand, only after checking the holder is dead: shrreg_tool --force-unlock "
                "--device N, then --cleanup --device N, then --inspect (seed 002)",
        ),
        Rule(
            code="SHRREG_LOCK_TIMEOUT", severity=ERROR, when=("log:hamicore.log.lock_timeout",),
            unless=("shrreg:LOCK_HELD_DEAD_OWNER",),
            summary="HAMi-core in the container times out on the shared-region lock "
                    "(\"Lock shrreg timeout\")",
            evidence=("hamicore.log.lock_timeout", "hamicore.log.dead_owner"),
            fix="on the node: `shrreg_tool --inspect` to see the lock holder; if it is dead: " + SHRREG,
        ),
        Rule(
            code="SHRREG_ZOMBIE_TASKS", severity=WARNING, when=("shrreg:ZOMBIE_TASK",),
            summary="shared regions list processes that have exited (zombie task slots still hold memory)",
            evidence=("shrreg.ZOMBIE_TASK",),
            fix=SHRREG + "; by hand: shrreg_tool --cleanup --device N",
        ),
        Rule(
            code="SHRREG_VERSION_MISMATCH", severity=ERROR,
            when=("shrreg:VERSION_MISMATCH_MAJOR|VERSION_MISMATCH_MINOR",),
            summary="a shared region's version differs from this HAMi-core's",
            evidence=("shrreg.VERSION_MISMATCH_MAJOR", "shrreg.VERSION_MISMATCH_MINOR",
                      "hamicore.log.version_mismatch"),
            fix="run one HAMi-core version on the node (libvgpu.so and device plugin); restart the affected "
                "pods so they create regions of the current version",
        ),
        Rule(
            code="SHRREG_VERSION_MISMATCH", severity=ERROR, when=("log:hamicore.log.version_mismatch",),
            summary="HAMi-core reports a version mismatch with its shared region",
            evidence=("hamicore.log.version_mismatch",),
            fix="run one HAMi-core version on the node (libvgpu.so and device plugin); restart the pod",
        ),
        Rule(
            code="SHRREG_SLOTS_FULL", severity=ERROR,
            when=("shrreg:SLOTS_FULL",),
            summary="a shared region has no free process slot: new CUDA processes cannot register",
            evidence=("shrreg.SLOTS_FULL", "hamicore.log.set_task_pid_failed"),
            fix=SHRREG + " (cleans dead slots); then restart the pod if it stays full",
        ),
        Rule(
            code="SET_TASK_PID_FAILED", severity=WARNING, when=("log:hamicore.log.set_task_pid_failed",),
            summary="HAMi-core could not register the process's host PID (\"SET_TASK_PID FAILED\"): "
                    "accounting falls back to the container PID",
            evidence=("hamicore.log.set_task_pid_failed",),
            fix="check the task slots (`shrreg_tool --inspect`), the /dev/shm and /tmp/vgpulock mounts, and "
                "that the pod's HAMi-core matches the node's",
        ),
        Rule(
            code="SHRREG_REGION_CORRUPT", severity=ERROR, when=("shrreg:REGION_CORRUPT|REGION_UNREADABLE",),
            summary="a shared region file is damaged or unreadable",
            evidence=("shrreg.REGION_CORRUPT", "shrreg.REGION_UNREADABLE"),
            fix="restart the pod that owns the region (the file is recreated); never delete a live region",
        ),
        Rule(
            code="CUDA_OOM", severity=ERROR, when=("log:hamicore.log.oom",),
            summary="the container ran out of its GPU memory limit (HAMi-core \"Device N OOM\")",
            evidence=("hamicore.log.oom",),
            fix="raise nvidia.com/gpumem for the container, or reduce the model/batch size; check for zombie "
                "tasks holding memory (`shrreg_tool --inspect`)",
        ),
    ),
)

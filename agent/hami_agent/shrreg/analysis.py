"""Findings on a decoded region: zombie tasks, the four leak cases of seed 002, locks, versions.

NVML per-process usage is an *input* (a list of ``NvmlProcess``), so the same analysis runs on data
from ``hami_agent.nvml``, from a JSON file, or from a test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from hami_agent.shrreg.layout import AGENT_MAJOR, AGENT_MINOR, LAYOUTS, MAX_PROCS, V0B, V11, V11_TRANSIENT
from hami_agent.shrreg.liveness import Attachment, State
from hami_agent.shrreg.model import Region

MIB = 1 << 20
DEFAULT_TOLERANCE_BYTES = 256 * MIB  # CUDA context overhead NVML sees but allocations do not
WRAP_THRESHOLD = 1 << 62  # totals this large are an underflow wrap, not real memory

OK = "ok"
WARNING = "warning"
ERROR = "error"

# Codes (stable; doctor and docs refer to them)
ZOMBIE_TASK = "ZOMBIE_TASK"
LOCK_HELD_DEAD_OWNER = "LOCK_HELD_DEAD_OWNER"
LOCK_HELD_LIVE_OWNER = "LOCK_HELD_LIVE_OWNER"
LOCK_HELD_NO_OWNER = "LOCK_HELD_NO_OWNER"
POSTINIT_BLOCKED = "POSTINIT_BLOCKED"
LEAK_NORMAL = "LEAK_NORMAL"
LEAK_INTERNAL = "LEAK_INTERNAL"
LEAK_EXTERNAL = "LEAK_EXTERNAL"
LEAK_TRACKING_MISMATCH = "LEAK_TRACKING_MISMATCH"
COUNTER_WRAP = "COUNTER_WRAP"
OVER_LIMIT = "OVER_LIMIT"
SLOTS_FULL = "SLOTS_FULL"
HOSTPID_UNKNOWN = "HOSTPID_UNKNOWN"
VERSION_MISMATCH_MAJOR = "VERSION_MISMATCH_MAJOR"
VERSION_MISMATCH_MINOR = "VERSION_MISMATCH_MINOR"
TRANSIENT_LAYOUT = "TRANSIENT_LAYOUT"
REGION_CORRUPT = "REGION_CORRUPT"
WRITE_IN_PROGRESS = "WRITE_IN_PROGRESS"


@dataclass(frozen=True)
class NvmlProcess:
    """One row of nvmlDeviceGetComputeRunningProcesses: host PID, its GPU, usedGpuMemory bytes."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str
    remedy: str
    path: str
    device: int | None = None
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_nvml_processes(path: str) -> list[NvmlProcess]:
    """Read ``[{"gpu_uuid"|"uuid": ..., "pid": N, "used_bytes"|"used_mib": N}, ...]`` from a JSON file."""
    with open(path, encoding="utf-8") as fh:
        rows = json.load(fh)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of processes, got {type(rows).__name__}")
    out = []
    for i, row in enumerate(rows):
        try:
            uuid = row.get("gpu_uuid") or row["uuid"]
            used = row.get("used_bytes")
            if used is None and row.get("used_mib") is not None:
                used = int(row["used_mib"]) * MIB
            out.append(
                NvmlProcess(
                    gpu_uuid=str(uuid), pid=int(row["pid"]), used_bytes=None if used is None else int(used)
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"{path}: entry {i}: expected gpu_uuid, pid and used_bytes/used_mib ({exc})"
            ) from exc
    return out


def _mib(n: int) -> str:
    return f"{n // MIB} MiB"


def parse_version(text: str) -> tuple[int, int]:
    """``"1.2"`` -> (1, 2); ValueError naming the expected form."""
    try:
        major_s, minor_s = text.strip().split(".", 1)
        return int(major_s), int(minor_s)
    except ValueError as exc:
        raise ValueError(f"--expect-version {text!r}: expected MAJOR.MINOR, e.g. 1.2") from exc


def analyse_version(region: Region, expect: tuple[int, int] = (AGENT_MAJOR, AGENT_MINOR)) -> list[Finding]:
    out: list[Finding] = []
    p = region.path
    exp = f"{expect[0]}.{expect[1]}"
    if region.layout == V11_TRANSIENT:
        out.append(
            Finding(
                TRANSIENT_LAYOUT,
                ERROR,
                f"version mismatch risk: layout v1.1-transient ({LAYOUTS[V11_TRANSIENT].hamiv}); the "
                "header says 1.1 but fields are shifted: v1.1/v1.2 libraries corrupt this file and "
                "HAMi's monitor misreads it",
                "upgrade HAMi-core (HAMi v2.8.2+) on the node, then restart the pods that use this "
                "region; do not repair this file in place",
                p,
            )
        )
        return out
    if region.layout == V0B:
        if expect[0] >= 1:
            out.append(
                Finding(
                    VERSION_MISMATCH_MAJOR,
                    ERROR,
                    f"version mismatch (Version mismatch): region is v0b ({LAYOUTS[V0B].hamiv}, no "
                    f"version in the header) but the expected library version is {exp}: MAJOR_VERSION "
                    "differs",
                    "MAJOR_VERSION 不同: 完全不兼容; unify HAMi-core and device-plugin versions and redeploy "
                    "all components, then restart the pods",
                    p,
                )
            )
        return out
    major, minor = region.major, region.minor
    if major != expect[0]:
        out.append(
            Finding(
                VERSION_MISMATCH_MAJOR,
                ERROR,
                f"version mismatch (Version mismatch): region MAJOR={major}, MINOR={minor}; expected {exp}",
                "MAJOR_VERSION 不同: 完全不兼容; unify versions and redeploy all components",
                p,
            )
        )
    elif minor != expect[1]:
        detail = ""
        if region.layout == V11 and expect >= (1, 2):
            detail = (
                " A v1.2 library on this v1.1 file finds sem_postinit never initialised: new processes "
                "wait ~330 s ('Postinit lock timeout') and then run without SM limiting"
            )
        out.append(
            Finding(
                VERSION_MISMATCH_MINOR,
                WARNING,
                f"version mismatch (Version mismatch): region MAJOR={major}, MINOR={minor}; expected {exp} "
                f"(\"The current version number {expect[0]}.{expect[1]} is different from the file's "
                f'version number {major}.{minor}").{detail}',
                "MINOR_VERSION 不同: 向下兼容，但建议统一版本; upgrade the older component first, "
                "then restart the pod so its container gets a fresh region",
                p,
            )
        )
    return out


def analyse_region(
    region: Region,
    attachment: Attachment | None = None,
    nvml: Iterable[NvmlProcess] | None = None,
    *,
    expect_version: tuple[int, int] = (AGENT_MAJOR, AGENT_MINOR),
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
) -> list[Finding]:
    """All findings for one region. ``attachment`` enables liveness checks, ``nvml`` the leak cases."""
    p = region.path
    out: list[Finding] = []
    for w in region.warnings:
        out.append(
            Finding(
                REGION_CORRUPT,
                ERROR,
                f"region damaged: {w}",
                "restart the pod so its container gets a fresh region",
                p,
            )
        )
    out.extend(analyse_version(region, expect_version))

    verdicts: dict[int, State] = {}
    if attachment is not None:
        for slot in region.procs:
            if slot.pid > 0:
                verdicts[slot.pid] = attachment.verdict(slot.pid).state

    # Lock state
    if region.sem.locked and region.sem.initialised:
        owner = region.owner_pid
        if owner == 0:
            out.append(
                Finding(
                    LOCK_HELD_NO_OWNER,
                    WARNING,
                    "Lock Status: LOCKED with no owner (owner_pid 0): a holder was killed between "
                    "releasing owner_pid and sem_post (HAMi issue #2500), or a process is inside the "
                    "critical section now",
                    "if it stays LOCKED: stop the processes using the region (restart the pod), then "
                    "shrreg_tool --force-unlock; HAMi-core exits waiters after 5 minutes ('Cannot "
                    "acquire lock after 5 minutes')",
                    p,
                )
            )
        elif attachment is not None:
            v = attachment.verdict(owner)
            if v.state is State.DEAD:
                out.append(
                    Finding(
                        LOCK_HELD_DEAD_OWNER,
                        ERROR,
                        f"Lock Status: LOCKED, Lock Holder PID {owner} is DEAD: 'Lock shrreg timeout' in "
                        "every process of this container until the lock is recovered",
                        "shrreg_tool --force-unlock --device N, then shrreg_tool --cleanup --device N, "
                        "then shrreg_tool --inspect (seed 002: 锁恢复流程); restart the pod if it stays "
                        "abnormal",
                        p,
                        pid=owner,
                    )
                )
            elif v.state is State.ALIVE:
                out.append(
                    Finding(
                        LOCK_HELD_LIVE_OWNER,
                        WARNING,
                        f"Lock Status: LOCKED, Lock Holder PID {owner} is alive: a lock that stays held "
                        "means the holder is stuck or deadlocked",
                        "do NOT force-unlock a live holder; analyse the process (stack, D state), "
                        "restart the pod if it is stuck",
                        p,
                        pid=owner,
                    )
                )
            else:
                out.append(
                    Finding(
                        LOCK_HELD_LIVE_OWNER,
                        WARNING,
                        f"Lock Status: LOCKED, Lock Holder PID {owner}: {v.reason}",
                        "re-run as root in the host PID namespace",
                        p,
                        pid=owner,
                    )
                )
    pi = region.sem_postinit
    if pi is not None and pi.value == 0 and region.layout != V11:
        out.append(
            Finding(
                POSTINIT_BLOCKED,
                WARNING,
                "sem_postinit is held (value 0): new processes wait for host-PID detection up to ~330 s "
                "('Waiting for postinit lock'), then run without SM limiting",
                "if no process is starting right now: shrreg_tool --force-unlock (resets it when no "
                "process is attached) or restart the pod",
                p,
            )
        )

    # Slots
    if region.proc_num >= MAX_PROCS:
        out.append(
            Finding(
                SLOTS_FULL,
                ERROR,
                f"task slots full ({region.proc_num}/{MAX_PROCS}): new CUDA processes exit at start "
                "(SET_TASK_PID FAILED / 任务槽已满)",
                "clean inactive tasks: shrreg_tool --cleanup --device N (清理不活跃任务)",
                p,
            )
        )
    for slot in region.procs:
        st = verdicts.get(slot.pid)
        tracked_total = sum(u.total for u in slot.used)
        if slot.pid > 0 and st is State.DEAD:
            extra = (
                f", still holding {_mib(tracked_total)} of tracked memory (内部泄漏 until cleaned)"
                if tracked_total
                else ""
            )
            out.append(
                Finding(
                    ZOMBIE_TASK,
                    ERROR,
                    f"PID {slot.pid}: DEAD (zombie entry) in slot {slot.index} (host PID "
                    f"{slot.hostpid}){extra}",
                    "shrreg_tool --cleanup --device N clears zombie task records; restart the pod if OOM "
                    "persists (清理僵尸进程, 重启 Pod)",
                    p,
                    pid=slot.pid,
                )
            )
        if slot.write_in_progress:
            sev = ERROR if st is State.DEAD else WARNING
            out.append(
                Finding(
                    WRITE_IN_PROGRESS,
                    sev,
                    f"slot {slot.index} (PID {slot.pid}) seqlock is odd ({slot.seqlock}): a counter update "
                    "is in progress"
                    + (" and its writer is dead: readers spin on it" if st is State.DEAD else ""),
                    "shrreg_tool --cleanup removes the slot once the writer is dead",
                    p,
                    pid=slot.pid,
                )
            )
        if slot.pid > 0 and slot.hostpid == 0 and slot.status == 1 and st is not State.DEAD:
            out.append(
                Finding(
                    HOSTPID_UNKNOWN,
                    WARNING,
                    f"PID {slot.pid}: hostpid is 0 (SET_TASK_PID FAILED - using container PID for "
                    "accounting): SM limiting is disabled for this process and NVML usage cannot be "
                    "matched",
                    "check the task count and /dev/shm permissions and mounts; check HAMi-core version "
                    "compatibility",
                    p,
                    pid=slot.pid,
                )
            )
        for d in region.device_indices():
            if slot.used[d].total >= WRAP_THRESHOLD:
                out.append(
                    Finding(
                        COUNTER_WRAP,
                        ERROR,
                        f"Device {d}: PID {slot.pid} tracked memory {slot.used[d].total} wrapped around "
                        "(a free was accounted twice): 跟踪不一致, HAMi-Core tracking is wrong",
                        "shrreg_tool --cleanup after the process exits, or restart the pod; report the "
                        "HAMi-core bug",
                        p,
                        device=d,
                        pid=slot.pid,
                    )
                )
    for d in region.device_indices():
        used = region.used_bytes(d)
        lim = region.limit[d]
        if lim and used > lim and used < WRAP_THRESHOLD:
            out.append(
                Finding(
                    OVER_LIMIT,
                    WARNING,
                    f"Device {d}: Used Memory {_mib(used)} exceeds Total Memory {_mib(lim)} (过量分配): "
                    "cuMemGetInfo fails with CUDA_ERROR_INVALID_VALUE and allocations report "
                    f"'Device {d} OOM'",
                    "look for zombie tasks (shrreg_tool --cleanup), otherwise raise nvidia.com/gpumem",
                    p,
                    device=d,
                )
            )

    if nvml is not None:
        out.extend(_leak_findings(region, attachment, list(nvml), verdicts, tolerance_bytes))
    return out


def _leak_findings(
    region: Region,
    attachment: Attachment | None,
    nvml: list[NvmlProcess],
    verdicts: dict[int, State],
    tol: int,
) -> list[Finding]:
    """Seed 002's table: tracked (HAMi-Core) vs actual (NVML) per process and device."""
    p = region.path
    out: list[Finding] = []
    usage: dict[tuple[str, int], int] = {}
    for row in nvml:
        if row.used_bytes is None:
            continue
        key = (row.gpu_uuid, row.pid)
        usage[key] = usage.get(key, 0) + row.used_bytes
    # container PID -> host PIDs through the processes that have the region mapped
    host_of: dict[int, list[int]] = {}
    if attachment is not None:
        for hp in attachment.others():
            host_of.setdefault(hp.inner_pid, []).append(hp.pid)
    seen_host: set[int] = set()
    for slot in region.procs:
        if slot.pid <= 0 or verdicts.get(slot.pid) is State.DEAD:
            continue
        hosts = [slot.hostpid] if slot.hostpid else host_of.get(slot.pid, [])
        if not hosts:
            continue
        seen_host.update(hosts)
        for d in region.device_indices():
            uuid = region.uuids[d][:40]
            tracked = slot.used[d].total
            if tracked >= WRAP_THRESHOLD:
                continue  # reported as COUNTER_WRAP
            listed = [usage[(uuid, h)] for h in hosts if (uuid, h) in usage]
            actual = sum(listed)
            slack = max(tol, max(tracked, actual) // 10)
            where = f"Device {d} ({uuid}) PID {slot.pid} (host PID {', '.join(map(str, hosts))})"
            if not listed:
                if tracked > slack:
                    out.append(
                        Finding(
                            LEAK_INTERNAL,
                            ERROR,
                            f"{where}: 内部泄漏 (internal leak): HAMi-Core tracks {_mib(tracked)} but NVML "
                            "shows no memory for the process: the tracked value was not reduced after "
                            "the memory was freed",
                            "restart the process/pod to reset its slot; if it repeats, report a "
                            "HAMi-core bug with LIBCUDA_LOG_LEVEL=4 logs",
                            p,
                            device=d,
                            pid=slot.pid,
                        )
                    )
                continue
            if actual - tracked > slack:
                out.append(
                    Finding(
                        LEAK_EXTERNAL,
                        ERROR,
                        f"{where}: 外部泄漏 (external leak): NVML shows {_mib(actual)}, far above "
                        f"HAMi-Core's tracked {_mib(tracked)}: allocations not intercepted by HAMi-Core",
                        "check that libvgpu.so is preloaded in the process (cat /proc/<pid>/maps | grep "
                        "libvgpu) and that CUDA_DISABLE_CONTROL is not set; statically linked CUDA "
                        "bypasses the hook",
                        p,
                        device=d,
                        pid=slot.pid,
                    )
                )
            elif tracked - actual > slack:
                out.append(
                    Finding(
                        LEAK_TRACKING_MISMATCH,
                        ERROR,
                        f"{where}: 跟踪不一致 (tracking mismatch): HAMi-Core tracks {_mib(tracked)} but NVML "
                        f"shows {_mib(actual)}: HAMi-Core tracking is wrong (possible bug)",
                        "restart the pod to reset the region; report a HAMi-core bug with "
                        "LIBCUDA_LOG_LEVEL=4 logs",
                        p,
                        device=d,
                        pid=slot.pid,
                    )
                )
            else:
                out.append(
                    Finding(
                        LEAK_NORMAL,
                        OK,
                        f"{where}: normal: tracked {_mib(tracked)}, NVML {_mib(actual)} (difference "
                        "within the CUDA context overhead)",
                        "none",
                        p,
                        device=d,
                        pid=slot.pid,
                    )
                )
    # Processes that have this region mapped, use its GPUs, but have no slot: nothing tracks them.
    if attachment is not None:
        uuids = {region.uuids[d][:40]: d for d in region.device_indices()}
        for hp in attachment.others():
            if hp.pid in seen_host:
                continue
            for (uuid, hpid), used in usage.items():
                if hpid == hp.pid and uuid in uuids and used > tol:
                    d = uuids[uuid]
                    out.append(
                        Finding(
                            LEAK_EXTERNAL,
                            ERROR,
                            f"Device {d} ({uuid}) host PID {hp.pid}: 外部泄漏 (external leak): NVML shows "
                            f"{_mib(used)} for a process with no task slot in the region: its allocations "
                            "are not tracked by HAMi-Core",
                            "check that libvgpu.so is preloaded in the process and CUDA_DISABLE_CONTROL "
                            "is not set",
                            p,
                            device=d,
                            pid=hp.pid,
                        )
                    )
    return out


def worst_severity(findings: Iterable[Finding]) -> str:
    sev = OK
    for f in findings:
        if f.severity == ERROR:
            return ERROR
        if f.severity == WARNING:
            sev = WARNING
    return sev

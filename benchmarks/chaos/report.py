"""The soak's verdict: the counts of the one JSON line, each computed from records the agents do not
write themselves (the API server's objects and request log, the kubelets' admission and RPC records,
/proc, exit codes and logs), and the invariant checker of ``hami_agent.doctor.invariants``.

Definitions (also in docs/testing.md, "Chaos soak"):

``pods_admitted``          admissions the kubelets completed (devices handed out).
``admission_stalls``       admissions in which one device-plugin RPC (GetPreferredAllocation, Allocate)
                           took longer than the plugin's deadline + the stall margin, as the kubelet
                           measured it, or was still unanswered at the end; once per pod.
``late_writes``            pods the kubelet rejected for which a write setting
                           ``hami.io/bind-phase=success`` reached the API server after the kubelet had
                           the error (request log vs the end of the failing RPC, one monotonic clock).
``over_commits``           GPUs over-committed at the end among bound pods: memory, cores, sharing
                           slots, or an exclusive (100-core) pod sharing (``overcommit-*``,
                           ``exclusive-shared``).
``double_allocations``     one kubelet device ID held by two live pods, or a container handed GPUs
                           other than its annotation says (``allocate-mismatch``).
``lost_allocations``       live pods the kubelet admitted whose API record does not show it:
                           ``bind-phase`` not ``success`` or ``hami.io/vgpu-node`` not the node.
``leaked_node_locks``      node locks left at the end whose owner no longer needs them, or older than
                           the expiry (``stale-lock``).
``max_nvml_processes``     most NVML worker processes alive at once for one agent of one node (<= K+1).
``max_abandoned_workers``  most SIGKILLed-but-alive workers at once for one agent of one node (<= K).
``crashes``                agent processes that exited without being told to, plus tracebacks in
                           agent logs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.api import SuccessWrite
from benchmarks.chaos.kubelet import GPU, Admission, Rpc
from hami_agent.doctor.invariants import check
from hami_agent.protocol import keys

OVER_COMMIT = ("overcommit-memory", "overcommit-cores", "overcommit-slots", "exclusive-shared")
DOUBLE = ("allocate-mismatch",)
LOCKS = ("stale-lock",)
TRACEBACK = "Traceback (most recent call last):"


@dataclass
class Tracebacks:
    count: int = 0
    samples: list[str] = field(default_factory=list)  # "log: last line of the traceback"


def scan_tracebacks(logs: list[Path], keep: int = 5) -> Tracebacks:
    out = Tracebacks()
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            if TRACEBACK not in line:
                continue
            out.count += 1
            if len(out.samples) < keep:
                # the exception line: the first unindented line after the traceback's frames
                tail = next((x for x in lines[i + 1:i + 80] if x and not x.startswith((" ", "\t"))), "?")
                out.samples.append(f"{path}: {tail[:200]}")
    return out


def _alive_admitted(admissions: list[Admission], pods_by_uid: dict[str, dict]) -> list[Admission]:
    return [a for a in admissions if a.admitted and a.uid in pods_by_uid]


def allocations_for_checker(live: list[Admission]) -> dict[str, dict[str, dict[str, str]]]:
    """``{uid: {container: envs}}`` of what Allocate handed out (the checker's ``allocations``)."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for a in live:
        per = out.setdefault(a.uid, {})
        for ctr, res in a.allocations.items():
            if GPU in res:
                per[ctr] = dict(res[GPU].get("envs") or {})
    return out


def stalls(rpcs: list[Rpc], limit_s: float, end: float) -> tuple[list[str], list[str]]:
    """(admissions with an RPC slower than ``limit_s``, those of them whose RPC was still unanswered at
    ``end``), one line per pod."""
    slow: dict[tuple[str, str | None], float] = {}
    open_: dict[tuple[str, str | None], float] = {}
    for r in rpcs:
        took = (r.end if r.end is not None else end) - r.start
        key = (r.node, r.pod)
        if took > limit_s:
            slow[key] = max(slow.get(key, 0.0), took)
            if r.end is None:
                open_[key] = max(open_.get(key, 0.0), took)
    return ([f"{node} {pod}: {took:.1f}s{' (unanswered)' if (node, pod) in open_ else ''}"
             for (node, pod), took in slow.items()],
            [f"{node} {pod}: unanswered after {took:.1f}s" for (node, pod), took in open_.items()])


def late_writes(admissions: list[Admission], writes: list[SuccessWrite]) -> list[str]:
    """Pods the kubelet rejected that got a ``bind-phase=success`` write the API server received after the
    kubelet had its error. (A success *state* on a rejected pod, whatever its cause, is the checker's
    ``allocated-no-devices`` and fails the run as one of the other violations.)"""
    by_uid: dict[str, list[SuccessWrite]] = defaultdict(list)
    by_name: dict[tuple[str, str], list[SuccessWrite]] = defaultdict(list)
    for w in writes:
        if w.uid:
            by_uid[w.uid].append(w)
        else:
            by_name[(w.namespace, w.name)].append(w)
    out = []
    for a in admissions:
        if a.admitted:
            continue
        ns, name = a.pod.split("/", 1)
        late = [w for w in by_uid.get(a.uid, []) + by_name.get((ns, name), []) if w.at > a.answered_at]
        if late:
            out.append(f"{a.pod} ({a.node}): success write {min(w.at for w in late) - a.answered_at:.3f}s "
                       f"after the kubelet's error ({a.message[:120]})")
    return out


def double_ids(live: list[Admission]) -> list[str]:
    holders: dict[tuple[str, str], set[str]] = defaultdict(set)
    for a in live:
        for res in a.allocations.values():
            for dev in (res.get(GPU) or {}).get("devices") or []:
                holders[(a.node, dev)].add(a.pod)
    return [f"{node} device {dev} held by {sorted(pods)}"
            for (node, dev), pods in holders.items() if len(pods) > 1]


def lost(live: list[Admission], pods_by_uid: dict[str, dict]) -> list[str]:
    out = []
    for a in live:
        ann = (pods_by_uid[a.uid].get("metadata") or {}).get("annotations") or {}
        if ann.get(keys.BIND_PHASE) != keys.BIND_PHASE_SUCCESS or ann.get(keys.VGPU_NODE) != a.node:
            out.append(f"{a.pod} admitted on {a.node} but bind-phase={ann.get(keys.BIND_PHASE)!r} "
                       f"vgpu-node={ann.get(keys.VGPU_NODE)!r}")
    return out


def failure_reasons(admissions: list[Admission]) -> list[str]:
    """Why admissions failed, most frequent first (pod names and device IDs folded away)."""
    from collections import Counter

    reasons: Counter = Counter()
    for a in admissions:
        if not a.admitted:
            msg = a.message.removeprefix("Allocate failed due to ").removeprefix("rpc error: code = ")
            msg = re.sub(r"chaos-[ab]/chaos-\d+", "<pod>", msg)
            msg = re.sub(r"(GPU|MIG)-[0-9a-f-]+", "<id>", msg)
            reasons[msg[:110]] += 1
    return [f"{n} x {msg}" for msg, n in reasons.most_common()]


def state_counts(nodes: list[dict], pods: list[dict], admissions: list[Admission], rpcs: list[Rpc],
                 writes: list[SuccessWrite], *, stall_limit_s: float, now: float) -> tuple[dict, dict]:
    """The counts that depend on the cluster's final state (run before the cluster is torn down)."""
    pods_by_uid = {(p.get("metadata") or {}).get("uid"): p for p in pods}
    live = _alive_admitted(admissions, pods_by_uid)
    report = check(nodes, pods, allocations=allocations_for_checker(live))
    kinds = report.by_kind()
    slow, unanswered = stalls(rpcs, stall_limit_s, now)
    details: dict[str, list[str]] = {
        "admission_stalls": slow,
        "unanswered_rpcs": unanswered,
        "late_writes": late_writes(admissions, writes),
        "double_allocations": double_ids(live) + [str(v) for v in report.violations if v.kind in DOUBLE],
        "lost_allocations": lost(live, pods_by_uid),
        "violations": [str(v) for v in report.violations][:50],
        "admission_failures": failure_reasons(admissions),
    }
    other = {k: n for k, n in kinds.items() if k not in OVER_COMMIT + DOUBLE + LOCKS}
    counts = {
        "pods_admitted": sum(1 for a in admissions if a.admitted),
        "admission_stalls": len(slow),
        "unanswered_rpcs": len(unanswered),
        "late_writes": len(details["late_writes"]),
        "over_commits": sum(kinds.get(k, 0) for k in OVER_COMMIT),
        "double_allocations": len(details["double_allocations"]),
        "lost_allocations": len(details["lost_allocations"]),
        "leaked_node_locks": sum(kinds.get(k, 0) for k in LOCKS),
        "other_violations": sum(other.values()),
        "violations": kinds,
        "admissions_failed": sum(1 for a in admissions if not a.admitted),
        "success_writes": len(writes),  # what the late-write check had to look at
        "max_rpc_s": round(max(((r.end if r.end is not None else now) - r.start for r in rpcs),
                               default=0.0), 3),
        "pods_live_at_end": len(pods),
        "pods_running_at_end": len(live),
    }
    return counts, details


def verdict(counts: dict[str, Any], k: int) -> list[str]:
    fails = [f"{name}={counts[name]}" for name in
             ("late_writes", "over_commits", "double_allocations", "lost_allocations", "leaked_node_locks",
              "crashes", "other_violations", "unclean_stops", "harness_errors", "unanswered_rpcs")
             if counts.get(name)]
    if counts["max_nvml_processes"] > k + 1:
        fails.append(f"max_nvml_processes={counts['max_nvml_processes']} > K+1={k + 1}")
    if counts["max_abandoned_workers"] > k:
        fails.append(f"max_abandoned_workers={counts['max_abandoned_workers']} > K={k}")
    return fails


KEY_ORDER = ("seconds", "seed", "pods_admitted", "admission_stalls", "late_writes", "over_commits",
             "double_allocations", "lost_allocations", "leaked_node_locks", "max_nvml_processes",
             "max_abandoned_workers", "crashes")


def json_line(counts: dict[str, Any]) -> dict[str, Any]:
    """The brief's keys first, in its order, then the extra fields."""
    out = {k: counts[k] for k in KEY_ORDER if k in counts}
    out.update({k: v for k, v in counts.items() if k not in out})
    return out


def first_lines(text: str, n: int = 3) -> str:
    return re.sub(r"\s+", " ", " | ".join(text.strip().splitlines()[:n]))

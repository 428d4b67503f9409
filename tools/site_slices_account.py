# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""tools/site_slices.py's account: the processes' per-node accounts merged into one, printed as the
callback hami.node.fleet_account prints one, with the slice that ran each node, and the run's exit code.
Standard library only; a run is anything with ``name``, ``hosts``, ``status``, ``rc``, ``timeout``, ``log``,
``account()`` and ``summary()`` (site_slices.Run)."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

# as plugins/callback/fleet_account.py (a unit test keeps them equal; that module needs Ansible, this not)
ATTENTION = ("failed", "unreachable", "parked", "refused", "deferred", "skipped")
ORDER = (
    "unreachable",
    "failed",
    "parked",
    "refused",
    "deferred",
    "skipped",
    "pending roll",
    "rolled",
    "changed",
    "converged",
)


def missing(run) -> str:
    """Why a host of ``run`` has no verdict."""
    if run.status == "timeout":
        why = f"stopped after running past its timeout ({run.timeout:.0f}s)"
    elif run.status == "ended":
        why = f"ended (exit {run.rc}) without a verdict for the node"
    else:
        why = "did not run"
    label = "the final run" if run.name == "final" else f"slice {run.name}"
    return f"{label} {why}; see {run.log}"


def merge(slices: list, final, started: float, carrier: str = "") -> dict:
    """One account in fleet_account's format: each node's verdict from the last process that ran it (a node
    the final run only re-converged keeps its slice's verdict), plus the slice that ran it."""
    nodes: dict[str, dict] = {}
    docs = []
    for r in slices:
        doc = r.account() or {}
        docs.append(doc)
        for h in r.hosts:
            v = dict(
                (doc.get("nodes") or {}).get(h) or {"state": "failed", "play": "slices", "detail": missing(r)}
            )
            v["slice"] = r.name
            nodes[h] = v
    if final is not None:
        doc = final.account() or {}
        docs.append(doc)
        for h in final.hosts:
            got = (doc.get("nodes") or {}).get(h)
            before = nodes.get(h)
            if h == carrier and before is not None:
                # it carried the cluster-wide writes: its slice's verdict, unless the final run found worse
                if got is not None and got.get("state") in ATTENTION:
                    nodes[h] = {**got, "slice": before["slice"], "final": True}
                continue
            v = dict(got or {"state": "failed", "play": "final", "detail": missing(final)})
            v["slice"] = before["slice"] if before else "final"
            v["final"] = True
            nodes[h] = v
        for h, v in (doc.get("nodes") or {}).items():  # a host the final run met outside its limit list
            if h not in nodes:
                nodes[h] = {**v, "slice": "final", "final": True}
    counts: dict[str, int] = {}
    for v in nodes.values():
        counts[v["state"]] = counts.get(v["state"], 0) + 1
    findings: dict = {}
    for doc in docs:
        findings.update(doc.get("findings") or {})
    last = next((d for d in reversed(docs) if d), {})
    return {
        "findings": findings,
        "playbook": "%s (%d slice(s))" % (last.get("playbook") or "site.yml", len(slices)),
        "report_dir": next((d.get("report_dir") for d in reversed(docs) if d.get("report_dir")), ""),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(),
        "seconds": round(time.time() - started, 1),
        "settings": last.get("settings", {}),
        "roll": (final.account() or {}).get("roll", {}) if final is not None else {},
        "summary": {k: counts[k] for k in ORDER if k in counts},
        # a pending roll left in the merged account was never rolled: it needs a rerun
        "needs_attention": sorted(n for n, v in nodes.items() if v["state"] in ATTENTION + ("pending roll",)),
        "nodes": dict(sorted(nodes.items())),
        "slices": [r.summary() for r in slices] + ([final.summary()] if final is not None else []),
    }


def exit_code(doc: dict) -> int:
    """The worst: 0 only when nothing needs attention; else the highest exit code of the processes (a
    stopped one counts 124), at least 2 (Ansible's "a host failed")."""
    worst = max([r["rc"] or 0 for r in doc["slices"]] + [0])
    if doc["needs_attention"] or doc["findings"]:
        return max(worst, 2)
    return 0


def _clip(text, limit):
    text = " ".join(str(text or "").split())
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + " ... " + text[-(limit - head - 5) :]


def describe(v: dict) -> str:
    """One line of the printed account, as fleet_account's describe()."""
    state = v["state"]
    if state == "rolled":
        text = "batch %s: %s" % (v.get("batch", "?"), v.get("detail") or "changed inside a window")
    elif state in ("failed", "unreachable"):
        where = " / ".join(x for x in (v.get("play"), v.get("task")) if x)
        text = "%s%s" % (("[%s] " % where) if where else "", v.get("detail", ""))
    elif state == "parked":
        text = "gate %s failed: %s (runbook %s)" % (
            v.get("gate", "?"),
            v.get("detail", ""),
            v.get("runbook", "-"),
        )
    elif state in ("refused", "deferred", "skipped", "pending roll"):
        text = v.get("detail", "")
    elif state == "changed":
        text = "%d task(s) changed: %s" % (v.get("changed_tasks", 0), "; ".join(v.get("changed", [])))
    else:
        text = v.get("detail") or "nothing to change"
    return _clip(text, 300)


def render(doc: dict) -> list[str]:
    """The printed account: fleet_account's lines, each with the slice that ran the node."""
    lines = []
    width = max([len(n) for n in doc["nodes"]] + [4])
    for name, v in sorted(
        doc["nodes"].items(),
        key=lambda kv: (ORDER.index(kv[1]["state"]) if kv[1]["state"] in ORDER else 99, kv[0]),
    ):
        label = v["state"].upper() if v["state"] in ATTENTION + ("pending roll",) else v["state"]
        lines.append("%-*s  %-11s [slice %s] %s" % (width, name, label, v.get("slice", "?"), describe(v)))
    for code, message in sorted((doc.get("findings") or {}).items()):
        lines.append("%-*s  %-11s %s" % (width, "(cluster)", code, _clip(message, 300)))
    summary = ", ".join("%s %d" % kv for kv in doc["summary"].items()) or "no hosts"
    findings = len(doc.get("findings") or {})
    about = ("; %d finding(s) about the cluster" % findings) if findings else ""
    lines.append("summary: %s; %d node(s) need attention%s" % (summary, len(doc["needs_attention"]), about))
    return lines


def write(doc: dict, run_dir: Path) -> Path:
    """Beside the rollout report when the run names one (site_rollout_report_dir), else in the run dir."""
    where = Path(doc["report_dir"]) if doc["report_dir"] else run_dir
    where.mkdir(parents=True, exist_ok=True)
    (where / "_account.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (where / "_needs-attention.txt").write_text("".join(f"{n}\n" for n in doc["needs_attention"]))
    if where != run_dir:
        (run_dir / "_account.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return where

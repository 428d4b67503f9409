# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""tools/site_slices.py's account: the processes' per-node accounts merged into one, printed as the
callback hami.node.fleet_account prints one, with the slice that ran each node, and the run's exit code.
Standard library only: the printed lines and the files are the callback's own code
(plugins/module_utils/_fleet_account.py, which needs no Ansible). A run is anything with ``name``,
``hosts``, ``status``, ``rc``, ``timeout``, ``log``, ``account()`` and ``summary()`` (site_slices.Run)."""

from __future__ import annotations

import datetime
import importlib.util
import sys
import time
from pathlib import Path


def _shared():
    """The account's one copy (verdict order, printed lines, files), shared with the callback
    hami.node.fleet_account: plugins/module_utils/_fleet_account.py, loaded by its path (both ship in the
    collection) - importing it the collection's way would need Ansible."""
    name = "hami_node_fleet_account"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "plugins" / "module_utils" / "_fleet_account.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


fleet_account = _shared()
ATTENTION = fleet_account.ATTENTION
ORDER = fleet_account.ORDER
# a pending roll left in the merged account was never rolled: it needs a rerun
NEEDS_RERUN = ATTENTION + ("pending roll",)


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
        "needs_attention": sorted(n for n, v in nodes.items() if v["state"] in NEEDS_RERUN),
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


def render(doc: dict) -> list[str]:
    """The printed account: fleet_account's lines, each with the slice that ran the node."""
    return fleet_account.render(doc, loud=NEEDS_RERUN, prefix=lambda v: "[slice %s] " % v.get("slice", "?"))


def write(doc: dict, run_dir: Path) -> Path:
    """Beside the rollout report when the run names one (site_rollout_report_dir), else in the run dir."""
    where = Path(doc["report_dir"]) if doc["report_dir"] else run_dir
    fleet_account.write(doc, str(where))
    if where != run_dir:
        (run_dir / fleet_account.ACCOUNT_FILE).write_text(fleet_account.dumps(doc))
    return where

"""The demo's summaries: one self-contained HTML file and report.json (stdlib only)."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any

STEP_TITLES = {
    "a": "sandbox up",
    "b": "provision (site.yml)",
    "c": "sample workload",
    "d": "seed 003 replay",
    "e": "rollout of a driver pin change",
    "f": "DRA claims (hami-agent dra)",
    "g": "GPU preemption",
    "h": "report",
}


def write_json(path: Path, checks: list[Any], titles: dict[str, str], rollout: dict,
               accounts: dict | None = None) -> None:
    """``{"ok", "steps": [{"name", "ok", "checks": [{"name", "ok", "detail"}]}], "rollout": {...},
    "site_accounts": {run: site.yml's per-node account}}``."""
    steps: dict[str, list[Any]] = {}
    for c in checks:
        steps.setdefault(c.step, []).append(c)
    doc = {
        "ok": bool(checks) and all(c.ok for c in checks),
        "steps": [{"name": f"{step}) {titles.get(step, '')}", "ok": all(c.ok for c in cs),
                   "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in cs]}
                  for step, cs in steps.items()],
        "rollout": rollout,
        "site_accounts": accounts or {},
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def write_html(path: Path, checks: list[Any], sections: dict[str, list[str]], elapsed: float,
               panels: str = "") -> None:
    """``panels``: the dashboard picture (``sandbox.report_metrics.panels_html``), trusted HTML."""
    passed = sum(c.ok for c in checks)
    rows = "\n".join(
        f"<tr class='{'ok' if c.ok else 'fail'}'><td>{html.escape(c.step)}</td>"
        f"<td>{'PASS' if c.ok else 'FAIL'}</td>"
        f"<td>{html.escape(c.name)}</td><td>{html.escape(c.detail)}</td></tr>"
        for c in checks
    )
    logs = "\n".join(
        f"<h3>{html.escape(step)}) {html.escape(STEP_TITLES.get(step, ''))}</h3><pre>"
        f"{html.escape(chr(10).join(lines))}</pre>"
        for step, lines in sections.items()
        if step
    )
    verdict = (
        "all checks passed" if checks and passed == len(checks) else f"{len(checks) - passed} check(s) failed"
    )
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>hami.node demo report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }}
tr.ok td:nth-child(2) {{ color: #060; font-weight: bold; }}
tr.fail td:nth-child(2) {{ color: #b00; font-weight: bold; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 85%; }}
</style></head><body>
<h1>hami.node demo: {html.escape(verdict)}</h1>
<p>{passed}/{len(checks)} checks passed in {elapsed:.0f}s, {time.strftime("%Y-%m-%d %H:%M:%S %Z")}.
Everything ran on a SIMULATED cluster: gpusim GPUs, a simulated Kubernetes API server, kube-scheduler and
kubelets; the agent, the playbooks and the podman nodes are real (docs/sandbox.md).</p>
<table><tr><th>step</th><th>result</th><th>check</th><th>detail</th></tr>
{rows}
</table>
{"<h2>Dashboard</h2>" + panels if panels else ""}
<h2>Output</h2>
{logs}
</body></html>
""")

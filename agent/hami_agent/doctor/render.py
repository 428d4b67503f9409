"""Output: a readable plain-text tree for people, JSON for tools, JMESPath queries over the JSON."""

from __future__ import annotations

import json
from typing import Any

from hami_agent.doctor.model import Report, Verdict


def to_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str)


def query(report: Report, expression: str) -> Any:
    """JMESPath over the JSON form (``--query``); raises ValueError on a bad expression."""
    import jmespath
    from jmespath.exceptions import JMESPathError

    try:
        return jmespath.search(expression, report.to_dict())
    except JMESPathError as exc:
        raise ValueError(f"--query {expression!r}: {exc}") from exc


def _verdict_lines(v: Verdict, last: bool, evidence_max: int = 12) -> list[str]:
    head = "`-- " if last else "|-- "
    pad = "    " if last else "|   "
    out = [f"{head}[{v.severity.upper()}] {v.code}" + (f"  ({v.subject})" if v.subject else "")]
    out.append(f"{pad}{v.summary}")
    if v.evidence:
        out.append(f"{pad}evidence:")
        shown = v.evidence[:evidence_max]
        out.extend(f"{pad}  > {line}" for line in shown)
        if len(v.evidence) > len(shown):
            out.append(f"{pad}  > ... {len(v.evidence) - len(shown)} more (see --json)")
    out.append(f"{pad}fix: {v.fix}")
    out.append(f"{pad}runbook: {v.runbook}  [tree {v.tree}]")
    return out


def to_text(report: Report) -> str:
    problems = report.problems
    status = f"{len(problems)} problem(s) found" if problems else "no problem found"
    lines = [f"hami doctor {report.command} {report.target}: {status}"]
    verdicts = report.verdicts
    if not verdicts:
        lines.append("`-- nothing to report")
    for i, v in enumerate(verdicts):
        lines.extend(_verdict_lines(v, i == len(verdicts) - 1))
    failed = [c for c in report.collectors if not c.ok]
    done = [c.name for c in report.collectors if c.ok]
    lines.append("")
    lines.append("evidence collected: " + (", ".join(done) if done else "none"))
    for c in failed:
        lines.append(f"evidence NOT collected: {c.name}: {c.error}")
    if report.children:
        lines.append(f"checked: {', '.join(f'{c.command} {c.target}' for c in report.children)}")
    return "\n".join(lines)

"""Render ``docs/runbooks/<CODE>.md`` from the trees (detection, fix) and the catalog (symptom).

``python -m hami_agent.doctor.runbooks --write docs/runbooks`` regenerates them, and the invariant checker's
pages ``docs/runbooks/invariants/<kind>.md`` (from ``invariant_docs``); unit tests check that the files on
disk match, so a rule change cannot leave its runbook behind.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from hami_agent.doctor import invariant_docs
from hami_agent.doctor.catalog import doc_for
from hami_agent.doctor.diagnose import UNKNOWN
from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.predicates import REGISTRY
from hami_agent.doctor.trees import TREES

_PLACEHOLDERS = {"target.node": "<node>", "pod.ref": "<ns>/<pod>", "pod.node_name": "<node>",
                 "node.name": "<node>", "driver.fixed_in": "570.172.08"}


def _plain(template: str) -> str:
    return re.sub(r"\{([a-zA-Z0-9_.]+)\}",
                  lambda m: _PLACEHOLDERS.get(m.group(1), f"<{m.group(1)}>"), template)


def rules_for(code: str) -> list[tuple[Tree, Rule]]:
    return [(t, r) for t in TREES for r in t.rules if r.code == code]


def render(code: str) -> str:
    doc = doc_for(code)
    lines = [f"# {code}: {doc.title}", ""]
    rules = rules_for(code)
    sev = sorted({r.severity for _, r in rules}) or ["warning"]
    trees = sorted({t.name for t, _ in rules}) or ["none (fallback)"]
    lines += [f"Severity: {', '.join(sev)}. Decision tree: {', '.join(trees)}."
              + (f" Seed: {doc.seed}." if doc.seed else ""), ""]
    lines += ["## Symptom", "", doc.symptom, ""]
    if doc.background:
        lines += ["## Background", "", doc.background, ""]
    lines += ["## How doctor detects it", ""]
    if not rules:
        lines += ["Emitted when doctor sees a symptom (a pod Pending past the pending window, a failed "
                  "bind, a "
                  "GetPreferredAllocation call still unanswered at the end of the kubelet log, or an "
                  "evidence "
                  "collector that failed) and no rule of any tree fires with a problem severity. The verdict "
                  "lists the symptom lines and every collector error.", ""]
    for i, (_tree, rule) in enumerate(rules, 1):
        head = f"Rule {i} ({rule.severity}): " if len(rules) > 1 else f"Rule ({rule.severity}): "
        lines += [head + "fires when all of", ""]
        lines += [f"- {REGISTRY.describe(p)}" for p in rule.when]
        if rule.unless:
            lines += ["", "and none of", ""]
            lines += [f"- {REGISTRY.describe(p)}" for p in rule.unless]
        if rule.evidence:
            lines += ["", "Evidence quoted: " + ", ".join(f"`{k}`" for k in rule.evidence) + "."]
        lines.append("")
    lines += ["## Fix", ""]
    fixes = list(dict.fromkeys(_plain(r.fix) for _, r in rules))
    if code == UNKNOWN:
        fixes = ["`ansible-playbook playbooks/collect_diagnostics.yml -l <node>` collects logs, annotations "
                 "and NVML state for a human; re-run doctor with --kubelet-log, --plugin-log, "
                 "--scheduler-url "
                 "and on the node itself for more evidence."]
    lines += [f"- {f}" for f in fixes]
    lines += ["", f"Check again: `hami-agent doctor ...` (or `kubectl hami doctor ...`) no longer reports "
                  f"{code}.",
              ""]
    return "\n".join(lines)


def all_pages() -> dict[str, str]:
    codes = sorted({r.code for t in TREES for r in t.rules} | {UNKNOWN})
    return {f"{code}.md": render(code) for code in codes}


def invariant_pages() -> dict[str, str]:
    """``invariants/<kind>.md`` for every kind the invariant checker reports."""
    return {f"invariants/{kind}.md": invariant_docs.render(kind) for kind in sorted(invariant_docs.KIND_DOCS)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hami_agent.doctor.runbooks")
    p.add_argument("--write", metavar="DIR", help="write the pages into DIR (else list them)")
    args = p.parse_args(argv)
    pages = {**all_pages(), **invariant_pages()}
    if not args.write:
        print("\n".join(pages))
        return 0
    out = Path(args.write)
    for name, text in pages.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(pages)} runbooks to {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

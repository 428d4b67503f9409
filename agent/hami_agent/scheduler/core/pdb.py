"""PodDisruptionBudgets in GPU preemption's dry run (issue 29; docs/scheduler.md "Preemption"): which victims
of a set would violate a budget, counted the way kube-scheduler counts them (kubernetes v1.35.4
``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go`` ``filterPodsWithPDBViolation``,
``:373-419``). A budget is counted,
not enforced: preemption deletes, it does not evict.

Upstream's rules: the pods are taken most important first; a pod matches a budget of its own namespace whose
selector matches its labels (a pod without labels, and a nil or empty or invalid selector, match nothing); a
pod already in the budget's ``status.disruptedPods`` spends nothing; every other match spends one of the
budget's ``status.disruptionsAllowed``, and the pod violates when a budget it matches has gone below zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_agent.scheduler.core.model import PodUsage

_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Budget:
    namespace: str
    selector: Mapping[str, Any]
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str]  # status.disruptedPods: pod names already being disrupted


def budget(obj: Mapping[str, Any]) -> Budget:
    """A ``policy/v1`` PodDisruptionBudget as the dry run reads it."""
    md, spec, status = (obj.get("metadata") or {}), (obj.get("spec") or {}), (obj.get("status") or {})
    sel = spec.get("selector")
    return Budget(md.get("namespace") or "default", sel if isinstance(sel, dict) else {},
                  int(status.get("disruptionsAllowed") or 0), frozenset(status.get("disruptedPods") or {}))


def selector_matches(sel: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelectorAsSelector`` then ``Matches``; empty or invalid (an unknown operator, ``In`` or
    ``NotIn`` without values) matches nothing, as ``filterPodsWithPDBViolation`` treats both."""
    match_labels = sel.get("matchLabels") or {}
    exprs = sel.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in exprs:
        key, op, values = e.get("key"), e.get("operator"), set(e.get("values") or [])
        if op not in _OPS or (op in ("In", "NotIn") and not values):
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


class Violations:
    """``filterPodsWithPDBViolation`` over a victim set: ``self(pods)`` gives the UIDs that violate a budget.
    ``labels_of``: a victim's labels (the pod informer's copy), None when unknown (then it matches
    nothing)."""

    def __init__(self, budgets: Iterable[Budget],
                 labels_of: Callable[[PodUsage], Mapping[str, str] | None]) -> None:
        self.budgets = list(budgets)
        self.labels_of = labels_of
        self._labels: dict[str, Mapping[str, str]] = {}  # per dry run: one lookup per victim

    def __bool__(self) -> bool:
        return bool(self.budgets)

    def __call__(self, pods: Sequence[PodUsage]) -> frozenset[str]:
        """``pods`` most important first (``core.preempt.importance``), as upstream passes them."""
        if not self.budgets:
            return frozenset()
        allowed = [b.allowed for b in self.budgets]
        out = set()
        for p in pods:
            labels = self._labels_of(p)
            if not labels:
                continue  # upstream: a pod with no labels matches no budget
            for i, b in enumerate(self.budgets):
                if b.namespace != p.namespace or not selector_matches(b.selector, labels):
                    continue
                if p.name in b.disrupted:
                    continue  # already processed by the API server: spends nothing
                allowed[i] -= 1
                if allowed[i] < 0:
                    out.add(p.uid)
        return frozenset(out)

    def _labels_of(self, p: PodUsage) -> Mapping[str, str]:
        got = self._labels.get(p.uid)
        if got is None:
            got = self._labels[p.uid] = self.labels_of(p) or {}
        return got

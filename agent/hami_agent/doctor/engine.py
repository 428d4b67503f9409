"""The generic decision-tree engine: rules are data, conditions are named predicates over facts.

A ``Rule`` fires when every predicate in ``when`` answers True and none in ``unless`` answers True.
Predicates answer True, False or None ("unknown": the evidence was not collected); ``when`` needs a
definite True, so missing evidence can never produce a confident verdict. Predicate names may carry one
argument after a colon (``"scheduler_reason:CardInsufficientMemory"``), so one predicate serves a table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hami_agent.doctor.model import Facts, Verdict, severity_rank

Predicate = Callable[..., "bool | None"]


@dataclass(frozen=True)
class Rule:
    code: str
    severity: str
    when: tuple[str, ...]
    summary: str
    fix: str
    evidence: tuple[str, ...] = ()  # fact keys whose lines prove the verdict
    unless: tuple[str, ...] = ()
    subject: str = ""  # template naming what the verdict is about (pod, node, GPU)


@dataclass(frozen=True)
class Tree:
    name: str  # e.g. "seed003_kubelet_stall"
    seed: str  # the seed document the tree encodes
    title: str
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class Plan:
    rule: Rule
    when: tuple[Callable[[Facts], bool | None], ...]
    unless: tuple[Callable[[Facts], bool | None], ...]

    def fires(self, facts: Facts) -> bool:
        for p in self.when:
            if p(facts) is not True:
                return False
        for p in self.unless:
            if p(facts) is True:
                return False
        return True


MAX_PLANS = 256  # trees with a resolved plan (the seed trees, plus those tests build)


class PredicateRegistry:
    """name -> function(facts[, arg]) -> bool | None."""

    def __init__(self) -> None:
        self._fns: dict[str, Predicate] = {}
        # tree id -> (the tree, its rules with their predicates resolved); the tree is kept, so its id
        # cannot be reused while cached
        self._plans: dict[int, tuple[Tree, list[Plan]]] = {}

    def register(self, name: str) -> Callable[[Predicate], Predicate]:
        def deco(fn: Predicate) -> Predicate:
            if name in self._fns:
                raise ValueError(f"predicate {name!r} registered twice")
            self._fns[name] = fn
            return fn

        return deco

    def names(self) -> list[str]:
        return sorted(self._fns)

    def resolve(self, spec: str) -> tuple[Predicate, str | None]:
        name, sep, arg = spec.partition(":")
        fn = self._fns.get(name)
        if fn is None:
            raise KeyError(f"unknown predicate {name!r} (in {spec!r}); known: {', '.join(self.names())}")
        return fn, (arg if sep else None)

    def evaluate(self, spec: str, facts: Facts) -> bool | None:
        fn, arg = self.resolve(spec)
        return fn(facts, arg) if arg is not None else fn(facts)

    def bind(self, spec: str) -> Callable[[Facts], bool | None]:
        """``spec`` resolved once: a function of the facts alone."""
        fn, arg = self.resolve(spec)
        return fn if arg is None else (lambda facts: fn(facts, arg))

    def plan_rule(self, rule: Rule) -> Plan:
        return Plan(rule, tuple(self.bind(p) for p in rule.when), tuple(self.bind(p) for p in rule.unless))

    def plan(self, tree: Tree) -> list[Plan]:
        """The tree's rules with their predicates bound, built once per tree: ``doctor cluster`` evaluates
        every rule for each of 1,000+ subjects, and resolving each name again cost a third of that."""
        hit = self._plans.get(id(tree))
        if hit is not None and hit[0] is tree:
            return hit[1]
        plans = [self.plan_rule(rule) for rule in tree.rules]
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[id(tree)] = (tree, plans)
        return plans

    def describe(self, spec: str) -> str:
        """The predicate's docstring as one line, with its argument: used by the runbooks."""
        fn, arg = self.resolve(spec)
        doc = " ".join((fn.__doc__ or spec).split())
        return doc.replace("{arg}", " or ".join(f"`{a}`" for a in (arg or "").split("|")))


def fires(rule: Rule, facts: Facts, registry: PredicateRegistry) -> bool:
    """One rule on its own (``Plan.fires`` holds the rule's logic; ``evaluate`` uses cached plans)."""
    return registry.plan_rule(rule).fires(facts)


def evidence_lines(rule: Rule, facts: Facts) -> list[str]:
    out: list[str] = []
    for key in rule.evidence:
        lines = facts.lines(key)
        if lines:
            out.extend(lines)
        elif facts.has(key):
            value = facts.get(key)
            if value not in (None, "", [], {}):
                out.append(f"{key} = {value}")
    return list(dict.fromkeys(out))  # de-duplicated, first occurrence kept


def evaluate(trees: Iterable[Tree], facts: Facts, registry: PredicateRegistry) -> list[Verdict]:
    """Every firing rule of every tree, one verdict per code (the first, most specific rule wins),
    ranked by severity."""
    out: list[Verdict] = []
    seen: set[str] = set()
    for tree in trees:
        for plan in registry.plan(tree):
            rule = plan.rule
            if rule.code in seen or not plan.fires(facts):
                continue
            seen.add(rule.code)
            out.append(Verdict(
                code=rule.code, severity=rule.severity, summary=facts.render(rule.summary),
                evidence=evidence_lines(rule, facts), fix=facts.render(rule.fix), tree=tree.name,
                subject=facts.render(rule.subject) if rule.subject else "",
                runbook=f"docs/runbooks/{rule.code}.md",
            ))
    return rank(out)


def rank(verdicts: list[Verdict]) -> list[Verdict]:
    return sorted(verdicts, key=lambda v: (severity_rank(v.severity), v.code))

"""Doctor data model: facts gathered as evidence, verdicts, and the report a command prints."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Severities, most severe first. "info" verdicts are not problems (exit code 0).
CRITICAL = "critical"
ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (CRITICAL, ERROR, WARNING, INFO)
PROBLEM_SEVERITIES = (CRITICAL, ERROR, WARNING)


def severity_rank(severity: str) -> int:
    """0 for critical ... 3 for info; unknown severities sort last."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        return len(SEVERITIES)


class _Missing:
    """The value of a fact nobody collected (distinct from a collected ``None``)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class Facts:
    """Named facts (``"node.lock.age_s"`` -> value) plus, per fact, the evidence lines that prove it.

    Collectors ``set`` facts; predicates ``get`` them (``MISSING`` when never collected, so a predicate can
    answer "unknown" instead of guessing); verdicts quote the ``lines`` of the facts they rest on.
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._lines: dict[str, list[str]] = {}

    def set(self, key: str, value: Any, *lines: str) -> None:
        self._values[key] = value
        if lines:
            self._lines.setdefault(key, []).extend(ln for ln in lines if ln)

    def add_lines(self, key: str, *lines: str) -> None:
        self._lines.setdefault(key, []).extend(ln for ln in lines if ln)

    def get(self, key: str, default: Any = MISSING) -> Any:
        return self._values.get(key, default)

    def has(self, key: str) -> bool:
        return key in self._values

    def lines(self, key: str) -> list[str]:
        return list(self._lines.get(key, ()))

    def keys(self) -> list[str]:
        return sorted(self._values)

    def update(self, other: Facts) -> None:
        self._values.update(other._values)
        for key, lines in other._lines.items():
            self._lines.setdefault(key, []).extend(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able view: ``{key: value}`` (dataclass values become dicts)."""
        return {k: _jsonable(self._values[k]) for k in sorted(self._values)}

    def render(self, template: str) -> str:
        """Replace ``{fact.key}`` with the fact's value (``?`` when missing)."""
        def sub(m: re.Match[str]) -> str:
            value = self._values.get(m.group(1), MISSING)
            if value is MISSING or value is None:
                return "?"
            if isinstance(value, float):
                return f"{value:.0f}"
            return str(value)

        return _PLACEHOLDER.sub(sub, template)


_PLACEHOLDER = re.compile(r"\{([a-zA-Z0-9_.]+)\}")


_SCALARS = (str, int, float, bool, type(None))


def _jsonable(value: Any) -> Any:
    if type(value) in _SCALARS:  # the common case first: doctor cluster converts ~100,000 values
        return value
    if value is MISSING:
        return None
    if hasattr(value, "__dataclass_fields__"):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


@dataclass
class Verdict:
    """One diagnosis: a stable code, how bad, what it means, the lines that prove it, and the fix."""

    code: str
    severity: str
    summary: str
    evidence: list[str]
    fix: str
    tree: str
    subject: str = ""
    runbook: str = ""

    @property
    def is_problem(self) -> bool:
        return self.severity in PROBLEM_SEVERITIES

    def to_dict(self) -> dict[str, Any]:
        # not asdict(): the same dict without its deep copy of every field (1,000+ verdicts in a doctor
        # cluster report); the only mutable field is the evidence list of strings
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["evidence"] = list(self.evidence)
        return out


@dataclass
class CollectorResult:
    """How one evidence collector fared: a failure is itself evidence, never a crash."""

    name: str
    ok: bool
    duration_s: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """What ``doctor`` prints: the target, ranked verdicts, the facts and how collection went."""

    command: str
    target: str
    verdicts: list[Verdict] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    collectors: list[CollectorResult] = field(default_factory=list)
    children: list[Report] = field(default_factory=list)

    @property
    def problems(self) -> list[Verdict]:
        out = [v for v in self.verdicts if v.is_problem]
        for child in self.children:
            out.extend(child.problems)
        return out

    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "target": self.target,
            "problem_found": bool(self.problems),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "facts": self.facts,
            "collectors": [c.to_dict() for c in self.collectors],
            "children": [c.to_dict() for c in self.children],
        }

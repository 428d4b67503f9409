"""The decision-tree engine, the trees' integrity, and runbooks for every code."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_agent.doctor import REGISTRY, TREES, all_codes
from hami_agent.doctor.catalog import documented_codes
from hami_agent.doctor.engine import PredicateRegistry, Rule, Tree, evaluate, fires
from hami_agent.doctor.model import MISSING, Facts
from hami_agent.doctor.runbooks import all_pages

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def _registry() -> PredicateRegistry:
    reg = PredicateRegistry()

    @reg.register("flag")
    def flag(f: Facts, key: str) -> bool | None:
        """fact {arg} is set"""
        v = f.get(key)
        return None if v is MISSING else bool(v)

    return reg


def test_rule_needs_definite_true_and_unknown_never_fires() -> None:
    reg = _registry()
    rule = Rule("X", "error", ("flag:a", "flag:b"), "x", "fix")
    f = Facts()
    f.set("a", True)
    assert fires(rule, f, reg) is False  # b unknown
    f.set("b", False)
    assert fires(rule, f, reg) is False
    f.set("b", True)
    assert fires(rule, f, reg) is True


def test_unless_blocks_only_on_true() -> None:
    reg = _registry()
    rule = Rule("X", "error", ("flag:a",), "x", "fix", unless=("flag:c",))
    f = Facts()
    f.set("a", True)
    assert fires(rule, f, reg) is True  # c unknown does not block
    f.set("c", True)
    assert fires(rule, f, reg) is False


def test_first_rule_per_code_wins_and_templates_render() -> None:
    reg = _registry()
    tree = Tree("t", "seed", "title", (
        Rule("X", "critical", ("flag:a",), "first {who}", "fix {who}", evidence=("a",)),
        Rule("X", "info", ("flag:a",), "second", "fix"),
        Rule("Y", "warning", ("flag:a",), "missing {nope}", "fix"),
    ))
    f = Facts()
    f.set("a", True, "a is true because of line 7")
    f.set("who", "gpu-1")
    verdicts = evaluate([tree], f, reg)
    assert [(v.code, v.severity) for v in verdicts] == [("X", "critical"), ("Y", "warning")]
    assert verdicts[0].summary == "first gpu-1" and verdicts[0].fix == "fix gpu-1"
    assert verdicts[0].evidence == ["a is true because of line 7"]
    assert verdicts[1].summary == "missing ?"


def test_every_predicate_in_the_trees_exists_and_is_documented() -> None:
    for tree in TREES:
        for rule in tree.rules:
            for spec in rule.when + rule.unless:
                fn, _ = REGISTRY.resolve(spec)  # raises KeyError for unknown names
                assert fn.__doc__, f"predicate {spec} has no docstring"


def test_all_predicates_answer_unknown_or_false_on_empty_facts() -> None:
    """With no evidence, no predicate may claim a problem (no confident wrong verdicts)."""
    empty = Facts()
    for tree in TREES:
        for rule in tree.rules:
            for spec in rule.when:
                assert REGISTRY.evaluate(spec, empty) is not True, spec
    assert evaluate(TREES, empty, REGISTRY) == []


def test_required_codes_exist() -> None:
    codes = set(all_codes())
    for required in ("KUBELET_DEVICE_MANAGER_STALL", "NVML_INIT_HANG_KNOWN_BAD_DRIVER", "NVML_HANG",
                     "KNOWN_BAD_DRIVER_WITH_MIG", "MPS_CONTROL_BINARY_MISSING", "HANDSHAKE_EXPIRED",
                     "NODE_NOT_REGISTERED", "REGISTER_ANNOTATION_MALFORMED", "CARD_INSUFFICIENT_MEMORY",
                     "NO_SCHEDULER_EVENTS", "WRONG_SCHEDULER_NAME", "BINDING_FAILED", "FILTER_OK_BUT_PENDING",
                     "STALE_NODE_LOCK", "ALLOCATE_DEVICE_NUMBER_MISMATCH", "LIBVGPU_NOT_LOADED",
                     "SHRREG_DEAD_LOCK_HOLDER", "SHRREG_ZOMBIE_TASKS", "SHRREG_VERSION_MISMATCH", "CUDA_OOM",
                     "UNKNOWN"):
        assert required in codes, required


def test_one_code_per_hami_reason() -> None:
    from hami_agent.doctor.trees.seed001_scheduler import REASONS
    from hami_agent.protocol.reasons import ALL_REASONS

    covered = {r[0] for r in REASONS}
    # NodeFitPod is a log message for success, not a failure
    assert set(ALL_REASONS) - {"NodeFitPod"} == covered


def test_every_code_has_a_catalog_entry_and_an_up_to_date_runbook() -> None:
    assert set(all_codes()) <= set(documented_codes())
    pages = all_pages()
    assert sorted(pages) == sorted(f"{c}.md" for c in all_codes())
    stale = [name for name, text in pages.items()
             if not (ROOT / "docs" / "runbooks" / name).is_file()
             or (ROOT / "docs" / "runbooks" / name).read_text(encoding="utf-8") != text]
    assert not stale, f"regenerate with: python -m hami_agent.doctor.runbooks --write docs/runbooks ({stale})"
    for text in pages.values():
        for section in ("## Symptom", "## How doctor detects it", "## Fix"):
            assert section in text


def test_fixes_name_the_remediation_playbooks() -> None:
    fixes = " ".join(r.fix for t in TREES for r in t.rules)
    for playbook in ("remediate_nvml_hang.yml", "remediate_mps_daemon.yml", "remediate_node_lock.yml",
                     "remediate_shrreg.yml", "reregister_devices.yml", "collect_diagnostics.yml"):
        assert f"playbooks/{playbook}" in fixes, playbook


def test_predicates_are_resolved_once_per_tree_not_per_subject(monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor cluster evaluates every rule for 1,000+ subjects: the names are resolved once, and the
    verdicts are those of the rule-by-rule evaluation (``fires``)."""
    reg = _registry()
    tree = Tree("t", "seed", "title", (
        Rule("A", "error", ("flag:a",), "a", "fix", unless=("flag:b",)),
        Rule("B", "warning", ("flag:a", "flag:c"), "b", "fix"),
        Rule("A", "info", ("flag:c",), "a again", "fix"),  # the first rule of a code wins
    ))
    resolved: list[str] = []
    real = reg.resolve
    monkeypatch.setattr(reg, "resolve", lambda spec: resolved.append(spec) or real(spec))
    for a, b, c in [(True, False, True), (True, True, True), (False, None, True), (None, None, None)] * 5:
        f = Facts()
        for key, v in (("a", a), ("b", b), ("c", c)):
            if v is not None:
                f.set(key, v)
        got = [(v.code, v.summary) for v in evaluate([tree], f, reg)]
        want: list[tuple[str, str]] = []
        for rule in tree.rules:
            if rule.code not in [w[0] for w in want] and fires(rule, f, _registry()):
                want.append((rule.code, rule.summary))
        assert sorted(got) == sorted(want)
    assert sorted(resolved) == ["flag:a", "flag:a", "flag:b", "flag:c", "flag:c"]  # once per rule's name


def test_verdict_dict_is_every_field() -> None:
    from dataclasses import asdict

    from hami_agent.doctor.model import Verdict

    v = Verdict("C", "error", "s", ["a", "b"], "fix", "tree", "node x", "docs/runbooks/C.md")
    assert v.to_dict() == asdict(v)
    d = v.to_dict()
    d["evidence"].append("c")
    assert v.evidence == ["a", "b"]  # a copy, as asdict's

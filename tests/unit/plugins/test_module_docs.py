"""A validate-modules-like sanity check (ansible-test's needs a download we cannot do offline).

For every module: DOCUMENTATION / EXAMPLES / RETURN parse as YAML; documented options match the
argument_spec (names, types, defaults, choices, required, suboptions); examples use FQCNs and valid
option names; check-mode support is declared and matches supports_check_mode.
"""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import yaml
from ansible.module_utils import basic

pytestmark = pytest.mark.unit

MODULES = ["nvidia_gpu_info", "nvidia_driver_facts", "nvidia_mig", "nvidia_mps", "kubelet_config",
           "hami_node", "hami_agent_install", "k8s_node_maintenance", "k8s_rollout"]
FILE_COMMON = {
    "mode",
    "owner",
    "group",
    "seuser",
    "serole",
    "selevel",
    "setype",
    "unsafe_writes",
    "attributes",
}


class _Captured(Exception):
    pass


def argspec(mod) -> dict:
    captured = {}

    def fake_init(self, **kwargs):
        captured.update(kwargs)
        raise _Captured()

    with mock.patch.object(basic.AnsibleModule, "__init__", fake_init), pytest.raises(_Captured):
        mod.main()
    return captured


def documented_options(doc: dict) -> dict:
    """The module's options with those of its hami.node documentation fragments (as ansible-doc shows)."""
    options = dict(doc.get("options") or {})
    for frag in doc.get("extends_documentation_fragment") or []:
        if frag.startswith("hami.node."):
            mod = importlib.import_module("ansible_collections.hami.node.plugins.doc_fragments.%s"
                                          % frag.split(".")[-1])
            fragment = yaml.safe_load(mod.ModuleDocFragment.DOCUMENTATION).get("options") or {}
            for name, opt in fragment.items():
                options.setdefault(name, opt)
    return options


def compare(doc_opts: dict, spec: dict, where: str) -> list[str]:
    errors = []
    for name, s in spec.items():
        d = doc_opts.get(name)
        if d is None:
            errors.append("%s: option %s is not documented" % (where, name))
            continue
        if d.get("type", "str") != s.get("type", "str"):
            errors.append("%s: %s type doc=%s spec=%s" % (where, name, d.get("type"), s.get("type")))
        if d.get("default") != s.get("default"):
            errors.append("%s: %s default doc=%r spec=%r" % (where, name, d.get("default"), s.get("default")))
        if d.get("choices") != s.get("choices"):
            errors.append("%s: %s choices differ" % (where, name))
        if bool(d.get("required")) != bool(s.get("required")):
            errors.append("%s: %s required differs" % (where, name))
        if d.get("elements") != s.get("elements"):
            errors.append("%s: %s elements differ" % (where, name))
        if not d.get("description"):
            errors.append("%s: %s has no description" % (where, name))
        if s.get("options"):
            errors.extend(compare(d.get("suboptions") or {}, s["options"], "%s.%s" % (where, name)))
    for name in doc_opts:
        if name not in spec:
            errors.append("%s: documented option %s is not in the argument_spec" % (where, name))
    return errors


@pytest.mark.parametrize("name", MODULES)
def test_docs_match_argument_spec(name):
    mod = importlib.import_module("ansible_collections.hami.node.plugins.modules.%s" % name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    yaml.safe_load(mod.RETURN)
    assert doc["module"] == name and doc["short_description"] and len(doc["short_description"]) <= 110
    spec = argspec(mod)
    options = documented_options(doc)
    if spec.get("add_file_common_args"):
        assert "ansible.builtin.files" in doc.get("extends_documentation_fragment", [])
        for opt in FILE_COMMON:
            spec["argument_spec"].pop(opt, None)
    assert compare(options, spec["argument_spec"], name) == []
    assert doc["attributes"]["check_mode"]["support"] == (
        "full" if spec.get("supports_check_mode") else "none"
    )
    assert doc["attributes"]["diff_mode"]["support"] in ("full", "none")


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_fqcn_and_known_options(name):
    mod = importlib.import_module("ansible_collections.hami.node.plugins.modules.%s" % name)
    options = set(documented_options(yaml.safe_load(mod.DOCUMENTATION)))
    tasks = yaml.safe_load(mod.EXAMPLES)
    used = [t for t in tasks if "hami.node.%s" % name in t]
    assert used, "no example calls hami.node.%s" % name
    for task in used:
        args = task["hami.node.%s" % name] or {}
        assert set(args) <= options, set(args) - options
    for task in tasks:
        modules = [
            k
            for k in task
            if k
            not in (
                "name",
                "register",
                "when",
                "delegate_to",
                "run_once",
                "check_mode",
                "diff",
                "loop",
                "changed_when",
                "failed_when",
                "ignore_errors",
            )
        ]
        assert all("." in m for m in modules), modules


def test_compare_detects_drift():
    spec = {
        "a": {"type": "int", "default": 1},
        "b": {"type": "list", "elements": "dict", "options": {"c": {"type": "str", "required": True}}},
    }
    doc = {
        "a": {"type": "str", "default": 1, "description": "x"},
        "b": {
            "type": "list",
            "elements": "dict",
            "description": "y",
            "suboptions": {"c": {"description": "z"}},
        },
        "ghost": {"description": "w"},
    }
    errors = compare(doc, spec, "m")
    assert any("a type" in e for e in errors) and any("m.b: c required" in e for e in errors)
    assert any("ghost" in e for e in errors)

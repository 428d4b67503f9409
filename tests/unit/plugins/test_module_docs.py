"""A validate-modules-like sanity check (ansible-test's needs a download we cannot do offline).

For every module: DOCUMENTATION / EXAMPLES / RETURN parse as YAML; documented options match the
argument_spec (names, types, defaults, choices, required, suboptions); examples use FQCNs and valid
option names; check-mode support is declared and matches supports_check_mode; the meaning of check and
diff mode comes from the one fragment hami.node.attributes. Documentation fragments are merged by
Ansible's own code (ansible.utils.plugin_docs.add_fragments), as ansible-doc merges them.
"""

from __future__ import annotations

import importlib
import types
from unittest import mock

import pytest
import yaml
from ansible.module_utils import basic
from ansible.plugins.loader import fragment_loader
from ansible.utils.plugin_docs import add_fragments

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


class _Fragments:
    """The fragment loader add_fragments asks: hami.node's fragments imported from this checkout (Ansible's
    loader finds collection content only once its collection finder is installed, which these tests do not
    do), Ansible's own (ansible.builtin.files) from Ansible's loader."""

    def get(self, name: str):
        if name.startswith("ansible.builtin."):
            return fragment_loader.get(name[len("ansible.builtin."):])
        if not name.startswith("hami.node."):
            return None
        try:
            mod = importlib.import_module("ansible_collections.hami.node.plugins.doc_fragments."
                                          + name[len("hami.node."):])
        except ImportError:
            return None  # add_fragments then reads "hami.node.<fragment>.<variable>"
        texts = {k: v for k, v in vars(mod.ModuleDocFragment).items() if k.isupper()}
        return types.SimpleNamespace(ansible_name=name, **texts)


def rendered(mod) -> dict:
    """The module's documentation with its fragments merged, as ansible-doc shows it."""
    doc = yaml.safe_load(mod.DOCUMENTATION)
    add_fragments(doc, mod.__file__, _Fragments(), is_module=True)
    return doc


def documented_options(mod, file_common: bool = False) -> dict:
    """The module's options with those of its documentation fragments, less the file options
    ``add_file_common_args`` brings (not in the module's argument_spec)."""
    options = dict(rendered(mod).get("options") or {})
    return {k: v for k, v in options.items() if not (file_common and k in FILE_COMMON)}


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
    file_common = bool(spec.get("add_file_common_args"))
    if file_common:
        assert "ansible.builtin.files" in doc.get("extends_documentation_fragment", [])
        for opt in FILE_COMMON:
            spec["argument_spec"].pop(opt, None)
    assert compare(documented_options(mod, file_common), spec["argument_spec"], name) == []
    attributes = rendered(mod)["attributes"]
    assert attributes["check_mode"]["support"] == ("full" if spec.get("supports_check_mode") else "none")
    assert attributes["diff_mode"]["support"] in ("full", "none")


@pytest.mark.parametrize("name", MODULES)
def test_check_and_diff_mode_are_explained_once(name):
    """The words for check and diff mode are the fragment's; a module states its support and details."""
    mod = importlib.import_module("ansible_collections.hami.node.plugins.modules.%s" % name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert "hami.node.attributes" in doc["extends_documentation_fragment"]
    for attr in ("check_mode", "diff_mode"):
        assert "description" not in (doc.get("attributes") or {}).get(attr, {}), (name, attr)
        merged = rendered(mod)["attributes"][attr]
        assert merged["description"] and merged["support"], (name, attr, merged)


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_fqcn_and_known_options(name):
    mod = importlib.import_module("ansible_collections.hami.node.plugins.modules.%s" % name)
    options = set(documented_options(mod))
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

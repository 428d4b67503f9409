"""plugins/filter/tag_selected.py: the roles site.yml's looped include_role includes are those Ansible's own
tag rules would run, one include per role (Ansible's Taggable.evaluate_tags is the reference)."""

from __future__ import annotations

import itertools

import pytest
from ansible.errors import AnsibleFilterError
from ansible.playbook.block import Block
from ansible.playbook.play import Play
from ansible.playbook.task import Task
from ansible_collections.hami.node.plugins.filter.tag_selected import tag_selected

pytestmark = pytest.mark.unit

ROLES = ["nvidia_driver", "kubelet", "hami_agent"]
TAG_SETS = [[], ["all"], ["tagged"], ["untagged"], ["site_kubelet"], ["site_kubelet", "site_hami_agent"],
            ["always"], ["nvidia_driver_install"], ["never"]]


def _ansible_runs(role: str, only: list[str], skip: list[str]) -> bool:
    """Would Ansible run a task tagged only site_<role> (the include_role of one role, as before)?"""
    task = Task(block=Block(play=Play()))
    task.tags = [f"site_{role}"]
    return task.evaluate_tags(only or ["all"], skip, all_vars={})


@pytest.mark.parametrize(("only", "skip"), list(itertools.product(TAG_SETS, TAG_SETS)))
def test_the_roles_are_those_ansible_would_include_one_by_one(only: list[str], skip: list[str]) -> None:
    expected = [r for r in ROLES if _ansible_runs(r, only, skip)]
    assert tag_selected(ROLES, only or ["all"], skip) == expected


def test_order_is_kept_and_a_default_run_selects_every_role() -> None:
    assert tag_selected(["hami_agent", "kubelet"], ["all"], []) == ["hami_agent", "kubelet"]


def test_a_tag_that_is_not_a_list_is_refused_by_name() -> None:
    with pytest.raises(AnsibleFilterError, match="run_tags must be a list"):
        tag_selected(ROLES, "all")

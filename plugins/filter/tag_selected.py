# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Filter ``hami.node.tag_selected``: the roles whose site tag the run's --tags / --skip-tags select."""

from __future__ import annotations

DOCUMENTATION = r"""
name: tag_selected
short_description: The roles whose tag (site_<role>) this run's --tags and --skip-tags select
version_added: 0.1.0
description:
  - site.yml includes a node's roles with one looped C(include_role), each role's tasks tagged C(site_<role>)
    (one include per node instead of one per role; docs/performance.md, "Fleet"). An included role runs its
    argument validation, which Ansible tags C(always); this filter leaves out the roles that the run's tags
    leave out, so a role whose tag is not selected is not included at all, as with one include per role.
  - The rules are Ansible's own for a task tagged C(site_<role>) (C(all), C(tagged), C(untagged), C(never)
    and the skip list; Ansible's C(Taggable.evaluate_tags)).
options:
  _input:
    description: Role names, in the order they run.
    type: list
    elements: str
    required: true
  run_tags:
    description: C(ansible_run_tags).
    type: list
    elements: str
    required: true
  skip_tags:
    description: C(ansible_skip_tags).
    type: list
    elements: str
    default: []
  prefix:
    description: The tag of role C(r) is C(prefix ~ r).
    type: str
    default: site_
"""

EXAMPLES = r"""
- name: The roles
  ansible.builtin.include_role:
    name: "hami.node.{{ item }}"
    apply:
      tags: ["site_{{ item }}"]
  loop: "{{ ['kubelet', 'hami_agent'] | hami.node.tag_selected(ansible_run_tags, ansible_skip_tags) }}"
  tags: [site_kubelet, site_hami_agent]
"""

RETURN = r"""
_value:
  description: The roles of O(_input) whose tag is selected, in their order.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError  # noqa: E402


def _selected(tag, only, skip):
    """Ansible's rule for a task whose only tag is ``tag`` (neither ``always`` nor ``never``)."""
    run = not only or "all" in only or "tagged" in only or tag in only
    return run and not ("all" in skip or "tagged" in skip or tag in skip)


def tag_selected(roles, run_tags, skip_tags=None, prefix="site_"):
    for name, value in (("_input", roles), ("run_tags", run_tags), ("skip_tags", skip_tags or [])):
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise AnsibleFilterError(f"tag_selected: {name} must be a list, got {value!r}")
    only, skip = set(run_tags), set(skip_tags or [])
    return [r for r in roles if _selected(prefix + str(r), only, skip)]


class FilterModule:
    def filters(self):
        return {"tag_selected": tag_selected}

# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""What check mode and diff mode mean for every hami.node module, written once.

A module lists ``hami.node.attributes`` in ``extends_documentation_fragment`` and states under its own
``attributes`` only its ``support`` and, where it says more than the words here, ``details``; Ansible merges
the two per attribute, the module's keys winning (``add_fragments`` in ansible-core's
lib/ansible/utils/plugin_docs.py). A read-only module adds ``hami.node.attributes.read_only`` and states
nothing. Collections do the same: ansible-core's ``action_common_attributes`` fragment,
community.general's ``attributes`` fragment (plugins/doc_fragments/attributes.py)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check mode (C(--check)) and report what it would change without changing anything.
  diff_mode:
    description: Shows what it changed, or would change in check mode, when run with C(--diff).
"""

    # a module that only reads: the same in check mode, nothing to diff
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing changes, so there is nothing to diff.
"""

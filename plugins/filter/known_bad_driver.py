# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Filter ``hami.node.known_bad_driver``: look a driver version up in the collection's known-bad list."""

from __future__ import annotations

DOCUMENTATION = r"""
name: known_bad_driver
short_description: Look an NVIDIA driver version up in the known-bad list
version_added: 0.1.0
description:
  - Returns the known-bad entry for O(_input) (C(version), C(reason), C(reference), C(condition),
    C(fixed_in)), or C(none) when the build is not known to be bad.
  - The list is the collection's one list, C(plugins/module_utils/known_bad_drivers.py), the same data the
    C(nvidia_gpu_info) and C(nvidia_mig) modules and the hami-agent use.
options:
  _input:
    description: Upstream driver version, for example C(570.158.01).
    type: str
    required: true
  extra:
    description:
      - Site-specific builds to refuse as well, each a dict with C(version) and C(reason).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Refuse a known-bad driver
  ansible.builtin.assert:
    that: (nvidia_driver_version | hami.node.known_bad_driver) is none
"""

RETURN = r"""
_value:
  description: The entry, or none.
  type: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import known_bad_drivers  # noqa: E402


def known_bad_driver(version, extra=None):
    if version is not None and not isinstance(version, str):
        raise AnsibleFilterError(
            "known_bad_driver: the input must be a driver version string, got %r" % (version,)
        )
    try:
        return known_bad_drivers.lookup_extra(version, extra)
    except ValueError as exc:
        raise AnsibleFilterError("known_bad_driver: %s" % exc) from None


class FilterModule:
    def filters(self):
        return {"known_bad_driver": known_bad_driver}

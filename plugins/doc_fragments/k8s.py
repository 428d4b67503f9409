# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""The options every controller-side module of hami.node takes to reach the cluster (module_utils/_k8s.py
CONNECTION_ARGS): written once, shown in each module's documentation by ``extends_documentation_fragment``."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path of a kubeconfig file. When not set, the module uses E(KUBECONFIG), then C(~/.kube/config),
        then the in-cluster service account.
    type: path
  context:
    description: kubeconfig context to use.
    type: str
  api_timeout:
    description: Seconds each API request may take.
    type: float
    default: 10
"""

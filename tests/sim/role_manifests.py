"""The manifests the ``hami_rbac`` role ships, rendered from its own templates and defaults for tests.

Tests and the sandbox load *these* into the simulated API server (never a copy), so the RBAC and the
admission policy under test are byte for byte what the role applies. Rendering uses Jinja2 with Ansible's
template settings (``trim_blocks``) and the role's ``defaults/main.yml``; defaults that are themselves
templates (``hami_rbac_node_name`` etc.) must be given as overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
RBAC_ROLE = ROOT / "roles" / "hami_rbac"


def role_defaults(role: Path = RBAC_ROLE) -> dict[str, Any]:
    data = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    # a default that is a Jinja expression needs Ansible's context: callers override those
    return {k: v for k, v in data.items() if not (isinstance(v, str) and "{{" in v)}


def ansible_bool(value: Any) -> bool:
    """Ansible's ``bool`` filter (ansible.plugins.filter.core.to_bool), the one Ansible filter the
    templates use; Jinja2 has no equivalent."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    return str(value).strip().lower() in ("yes", "on", "1", "true", "y")


def render(template: str, role: Path = RBAC_ROLE, **overrides: Any) -> list[dict]:
    """The YAML documents of ``role/templates/<template>`` rendered with the role's defaults."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(role / "templates"), trim_blocks=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["bool"] = ansible_bool
    variables = {"ansible_managed": "Ansible managed (test render)", **role_defaults(role), **overrides}
    text = env.get_template(template).render(**variables)
    return [d for d in yaml.safe_load_all(text) if d]


def rbac_manifests(nodes: list[str], namespace: str = "kube-system", **overrides: Any) -> list[dict]:
    """Cluster RBAC + one identity per node + the admission policy, as ``site.yml`` applies them."""
    base = {"hami_rbac_namespace": namespace, **overrides}
    docs = render("cluster.yaml.j2", **base)
    for node in nodes:
        for d in render("node.yaml.j2", hami_rbac_node_name=node, **base):
            if d not in docs:
                docs.append(d)
    if base.get("hami_rbac_admission_policy", role_defaults().get("hami_rbac_admission_policy", True)):
        docs += render("admission.yaml.j2", **base)
    return docs


__all__ = ["RBAC_ROLE", "rbac_manifests", "render", "role_defaults"]

"""Per-component identities for the sandbox (opt-in: ``HAMI_SANDBOX_IDENTITIES=1``).

The simulated API server then authenticates (one bearer token per component), enforces the RBAC and the
admission policy the ``hami_rbac`` role renders (tests/sim/role_manifests.py), and records every call in
its audit log. Each component gets its own kubeconfig under ``<run dir>/identities/``:

* ``scheduler.kubeconfig``: ``system:serviceaccount:kube-system:hami-scheduler`` (extender + webhook);
* ``plugin-<node>.kubeconfig``: ``...:hami-device-plugin-<node>`` (device plugin, monitor on that node);
* ``operator.kubeconfig``: a user in ``hami-operators`` (bound to the read-only ``hami-doctor`` role).

The sandbox's main kubeconfig stays the admin's (the SIMULATED kube-scheduler and kubelets, the demo's own
checks, ``site.yml``'s kubernetes.core tasks). When the API server stops, it writes ``audit.jsonl``: one
line per request (user, verb, group, resource, subresource, namespace, name, code), which
``tests/e2e/test_sandbox_demo.py`` compares with the role's grants (RBAC granted = used).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sandbox.config import SCHEDULER_PREEMPTION

ENV = "HAMI_SANDBOX_IDENTITIES"
SA_NS = "kube-system"
OPERATORS = "hami-operators"


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0", "false", "no")


def identities_dir(run_dir: Path) -> Path:
    return run_dir / "identities"


def kubeconfig(run_dir: Path, name: str) -> Path | None:
    """The identity's kubeconfig when the sandbox runs with identities, else None (use the admin's)."""
    path = identities_dir(run_dir) / f"{name}.kubeconfig"
    return path if enabled() and path.exists() else None


def apiserver_args(run_dir: Path, nodes: list[str]) -> list[str]:
    """Extra ``sandbox.apiserver_main`` arguments ([] unless the sandbox runs with identities)."""
    if not enabled():
        return []
    return ["--identities", str(identities_dir(run_dir)), "--nodes", ",".join(nodes)]


def setup(api: Any, nodes: list[str], out_dir: Path) -> dict[str, str]:
    """Load the role's RBAC + policy into ``api`` (an ``ApiServer(auth=..., rbac=True)``), create one token
    per component and write their kubeconfigs to ``out_dir``; returns name -> username."""
    from tests.sim.apiserver_auth import user
    from tests.sim.role_manifests import rbac_manifests

    api.apply(*rbac_manifests(nodes, namespace=SA_NS, hami_rbac_doctor_groups=[OPERATORS],
                              hami_rbac_scheduler_preemption=SCHEDULER_PREEMPTION))
    out_dir.mkdir(parents=True, exist_ok=True)
    who = {"scheduler": api.auth.add_service_account(SA_NS, "hami-scheduler"),
           "operator": api.auth.add_user(user("sandbox-operator", OPERATORS))}
    for node in nodes:
        who[f"plugin-{node}"] = api.auth.add_service_account(SA_NS, f"hami-device-plugin-{node}")
    names = {}
    for name, token in who.items():
        src = Path(api.kubeconfig_for(token, name))
        dest = out_dir / f"{name}.kubeconfig"
        dest.write_bytes(src.read_bytes())
        os.chmod(dest, 0o644)  # the node containers read it through a bind mount (a test cluster's token)
        names[name] = api.auth.lookup(token).username
    return names


def dump_audit(api: Any, path: Path) -> int:
    """Write the API server's audit log as JSON lines; returns the number of records."""
    n = 0
    with open(path, "w") as f:
        for rec in list(api.audit):
            a = rec.attrs
            if a is None:
                continue
            f.write(json.dumps({"user": rec.user.username, "groups": list(rec.user.groups), "verb": a.verb,
                                "group": a.group, "resource": a.resource, "subresource": a.subresource,
                                "namespace": a.namespace, "name": a.name, "path": a.path,
                                "code": rec.code}) + "\n")
            n += 1
    return n


__all__ = ["ENV", "OPERATORS", "apiserver_args", "dump_audit", "enabled", "identities_dir", "kubeconfig",
           "setup"]

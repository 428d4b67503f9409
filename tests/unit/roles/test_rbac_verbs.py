"""The RBAC rendered by roles/hami_rbac grants exactly the API verbs the agent's code calls.

The calls are read from the source with ``ast`` (no process runs): every call of a ``KubeClient`` API method
in the component's package, plus the shared helpers it uses (Informer -> list+watch of its kind, LeaderElector
and the node lock -> the calls inside ``k8s/leader.py`` / ``k8s/nodelock.py``). A new client call that the
RBAC does not grant fails here, naming the file, the line and the missing verb; a granted verb no code uses
fails the least-privilege check.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable
from pathlib import Path

import pytest

from hami_agent.k8s.client import KINDS, KubeClient
from tests.sim.role_manifests import render

pytestmark = pytest.mark.unit


ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "agent" / "hami_agent"
TEMPLATES = ROOT / "roles" / "hami_rbac" / "templates"

# KubeClient convenience methods -> (resource, verb) pairs they need
NAMED: dict[str, tuple[tuple[str, str], ...]] = {
    "get_node": (("nodes", "get"),),
    "list_nodes": (("nodes", "list"),),
    "patch_node_annotations": (("nodes", "patch"),),
    "patch_node_metadata": (("nodes", "patch"),),
    "get_pod": (("pods", "get"),),
    "list_pods": (("pods", "list"),),
    "patch_pod_metadata": (("pods", "patch"),),
    "patch_pod_status": (("pods/status", "patch"),),
    "bind_pod": (("pods/binding", "create"),),
    "list_resource_quotas": (("resourcequotas", "list"),),
    "get_lease": (("leases", "get"),),
    # a repeated event bumps count with a patch (client-go's correlator)
    "create_event": (("events", "create"), ("events", "patch")),
}
# generic methods taking the kind as first argument -> verb
GENERIC = {"get": "get", "list": "list", "create": "create", "patch": "patch", "replace": "update",
           "delete": "delete", "watch": "watch"}
NOT_API = {"close", "with_options", "from_kubeconfig", "host"}
HELPERS = {"LeaderElector": AGENT / "k8s" / "leader.py", "lock_node": AGENT / "k8s" / "nodelock.py",
           "release_node_lock": AGENT / "k8s" / "nodelock.py"}


def _api_methods() -> set[str]:
    names = {n for n, _ in inspect.getmembers(KubeClient) if not n.startswith("_")}
    return names - NOT_API


def _literal_kind(call: ast.Call, keyword: str = "kind") -> str | None:
    args = list(call.args)
    for kw in call.keywords:
        if kw.arg == keyword:
            args.insert(0, kw.value)
    for arg in args[:2]:  # Informer(client, "pods") / client.get("leases", ...)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in KINDS:
            return arg.value
    return None


def required_verbs(files: Iterable[Path]) -> tuple[set[tuple[str, str]], list[str]]:
    """(resource, verb) pairs the files need, and problems (calls this test cannot map)."""
    need: set[tuple[str, str]] = set()
    problems: list[str] = []
    api = _api_methods()
    seen_helpers: set[Path] = set()
    todo = list(files)
    while todo:
        path = todo.pop()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{node.lineno}"
            if name == "Informer":
                kind = _literal_kind(node)
                if kind is None:
                    problems.append(f"{where}: Informer kind is not a literal")
                else:
                    need |= {(kind, "list"), (kind, "watch")}
            elif name in HELPERS and HELPERS[name] not in seen_helpers and path != HELPERS[name]:
                seen_helpers.add(HELPERS[name])
                todo.append(HELPERS[name])
            elif isinstance(func, ast.Attribute) and name in NAMED:
                need |= set(NAMED[name])
            elif isinstance(func, ast.Attribute) and name in GENERIC:
                kind = _literal_kind(node)
                if kind is not None:  # otherwise dict.get / list.get etc.: not an API call
                    need.add((kind, GENERIC[name]))
            elif isinstance(func, ast.Attribute) and name in api:
                owner = ast.unparse(func.value)
                if "client" in owner.lower():
                    problems.append(f"{where}: KubeClient.{name} is not mapped to RBAC verbs in this test")
    return need, problems


def _render(name: str) -> list[dict]:
    # the role's own defaults (tests/sim/role_manifests.py), as the role renders them
    return render(name, hami_rbac_node_name="gpu-1")


def granted(docs: list[dict], *role_names: str) -> set[tuple[str, str]]:
    out = set()
    for doc in docs:
        if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] in role_names:
            for rule in doc["rules"]:
                out |= {(res, verb) for res in rule["resources"] for verb in rule["verbs"]}
    return out


def _py(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((AGENT / d).rglob("*.py"))
            if "api" not in p.relative_to(AGENT).parts]  # generated gRPC stubs


DOCS = _render("cluster.yaml.j2") + _render("node.yaml.j2")
IDENTITIES = {
    # the per-node credential runs the device plugin and the monitor
    "device plugin + monitor": (("deviceplugin", "monitor"),
                                ("hami-device-plugin", "hami-device-plugin-gpu-1")),
    "scheduler": (("scheduler",), ("hami-scheduler",)),
}


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_every_call_is_granted(identity: str) -> None:
    dirs, roles = IDENTITIES[identity]
    need, problems = required_verbs(_py(*dirs))
    assert not problems, problems
    assert need, "no API call found: the scan is broken"
    missing = need - granted(DOCS, *roles)
    assert not missing, f"{identity}: code needs {sorted(missing)}, add them to roles/hami_rbac/templates"


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_nothing_is_granted_that_no_code_uses(identity: str) -> None:
    dirs, roles = IDENTITIES[identity]
    need, _ = required_verbs(_py(*dirs))
    extra = granted(DOCS, *roles) - need
    assert not extra, f"{identity}: granted but unused (least privilege): {sorted(extra)}"


def _role(name: str) -> dict:
    return next(d for d in DOCS if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)


def test_node_identity_is_limited_to_its_own_node() -> None:
    role = _role("hami-device-plugin-gpu-1")
    assert [r["resources"] for r in role["rules"]] == [["nodes"]]
    assert all(r["resourceNames"] == ["gpu-1"] for r in role["rules"])
    shared = _role("hami-device-plugin")
    assert all("nodes" not in r["resources"] for r in shared["rules"])


def test_no_wildcards_and_no_cluster_admin() -> None:
    for doc in DOCS:
        assert doc.get("roleRef", {}).get("name") != "cluster-admin"
        for rule in doc.get("rules", []):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], doc["metadata"]["name"]


def test_scan_maps_calls_and_ignores_dict_get(tmp_path: Path) -> None:
    """The scan itself: API calls are mapped, a dict .get of a non-kind key is not an API call, and an
    unmapped KubeClient method is reported."""
    src = tmp_path / "probe.py"
    src.write_text("def f(client, d):\n    client.delete('pods', 'p', 'ns')\n    d.get('metadata')\n"
                   "    Informer(client, kind='nodes')\n    client.bind_pod('ns', 'p', 'n')\n"
                   "    client.call('GET', '/x')\n")
    need, problems = required_verbs([src])
    assert need == {("pods", "delete"), ("nodes", "list"), ("nodes", "watch"), ("pods/binding", "create")}
    assert len(problems) == 1 and "KubeClient.call is not mapped" in problems[0]

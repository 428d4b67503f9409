"""The RBAC rendered by roles/hami_rbac grants exactly the API verbs the agent's code calls.

The calls are read from the source with ``ast`` (no process runs): every call of a ``KubeClient`` API method
in the component's package, plus the shared helpers it uses (Informer -> list+watch of its kind, LeaderElector
and the node lock -> the calls inside ``k8s/leader.py`` / ``k8s/nodelock.py``). Generic calls are mapped
too, whatever the receiver is called: ``x.call("POST", "/apis/.../tokenreviews", verb=..., kind=...)`` by
its method and literal path (TokenReview, SubjectAccessReview), ``x.patch("pods", ..., content_type=...)``
and the other kind-first methods by their literal kind. A new client call that the RBAC does not grant fails
here, naming the file, the line and the missing verb; a granted verb no code uses fails the least-privilege
check; a client call this scan cannot map is a failure, not a silent miss.

Why both this and the dynamic check (``tests/integration/security/test_rbac_used.py``, granted = used
against the simulated API server with RBAC enforced): the dynamic test sees only the calls its scenario
reaches, and needs an allowlist for rare paths (Allocate's API fallback) and cannot reach the optional
modes (``--extender-auth=token``'s reviews); this scan sees every call site in a second, including error
and optional paths, and says which line needs which verb. The dynamic test proves the mapping is right
for the paths it runs; each catches what the other cannot.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
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
# KubeClient.call(method, path, *, verb, kind, ...): the RBAC verb of the HTTP method (a GET of a
# collection would be "list": every literal GET path here names one object)
HTTP_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# RBAC verbs granted by a binding the role renders only when its variable is on, to a ClusterRole the
# cluster bootstraps: system:auth-delegator (kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/
# policy.go: create tokenreviews, create subjectaccessreviews), bound by hami_rbac_scheduler_token_review
# for --extender-auth=token.
AUTH_DELEGATOR = {("tokenreviews", "create"), ("subjectaccessreviews", "create")}
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


def _path_resource(node: ast.expr) -> str | None:
    """The resource of a literal API path: ``/apis/authentication.k8s.io/v1/tokenreviews`` ->
    ``tokenreviews``, ``/api/v1/namespaces/ns/pods/p/binding`` -> ``pods/binding``."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return None
    parts = [p for p in node.value.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        return None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return None
    return rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")


def _generic_call(call: ast.Call) -> tuple[str, str] | None:
    """(resource, verb) of ``KubeClient.call(METHOD, PATH, verb=..., kind=...)``, None if not literal."""
    if len(call.args) < 2 or not isinstance(call.args[0], ast.Constant):
        return None
    verb = HTTP_VERBS.get(str(call.args[0].value))
    resource = _path_resource(call.args[1])
    return (resource, verb) if verb and resource else None


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
            elif isinstance(func, ast.Attribute) and name == "call" and any(k.arg == "verb"
                                                                            for k in node.keywords):
                # KubeClient.call takes verb= and kind= keywords (NVML's call(name, fn) does not)
                pair = _generic_call(node)
                if pair is None:
                    problems.append(f"{where}: KubeClient.call with a path this test cannot read "
                                    "(use a literal)")
                else:
                    need.add(pair)
            elif isinstance(func, ast.Attribute) and name in api:
                owner = ast.unparse(func.value)
                if "client" in owner.lower() or "api" in owner.lower():
                    problems.append(f"{where}: KubeClient.{name} is not mapped to RBAC verbs in this test")
    return need, problems


def _render(name: str, **overrides) -> list[dict]:
    # the role's own defaults (tests/sim/role_manifests.py), as the role renders them
    return render(name, hami_rbac_node_name="gpu-1", **overrides)


# What only GPU preemption needs (granted only with hami_rbac_scheduler_preemption on)
PREEMPTION = frozenset({("pods", "delete"), ("pods/status", "patch"), ("poddisruptionbudgets", "list"),
                        ("poddisruptionbudgets", "watch")})

# ClusterRoles the cluster bootstraps that the role only binds (rules as in kubernetes bootstrappolicy)
BOOTSTRAP = {"system:auth-delegator": AUTH_DELEGATOR}


def granted(docs: list[dict], *role_names: str, sa: str | None = None) -> set[tuple[str, str]]:
    """What the ClusterRoles ``role_names`` grant, plus bootstrap roles the documents bind to ``sa``."""
    out = set()
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] in role_names:
            for rule in doc["rules"]:
                out |= {(res, verb) for res in rule["resources"] for verb in rule["verbs"]}
        elif doc["kind"] == "ClusterRoleBinding" and doc["roleRef"]["name"] in BOOTSTRAP and any(
                s.get("kind") == "ServiceAccount" and s.get("name") == sa for s in doc.get("subjects") or []):
            out |= BOOTSTRAP[doc["roleRef"]["name"]]
    return out


def _py(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((AGENT / d).rglob("*.py"))
            if "api" not in p.relative_to(AGENT).parts]  # generated gRPC stubs


def _docs(**overrides) -> list[dict]:
    return _render("cluster.yaml.j2", **overrides) + _render("node.yaml.j2", **overrides)


DOCS = _docs()


@dataclass(frozen=True)
class Identity:
    dirs: tuple[str, ...]  # the agent packages that run with this credential
    roles: tuple[str, ...]  # its ClusterRoles
    sa: str | None = None  # its ServiceAccount, for bootstrap roles the role binds to it
    overrides: tuple[tuple[str, object], ...] = ()  # hami_rbac variables of this deployment
    optional: frozenset[tuple[str, str]] = frozenset()  # needed only in a mode the variables leave off


IDENTITIES = {
    # the per-node credential runs the device plugin and the monitor
    "device plugin + monitor": Identity(("deviceplugin", "monitor"),
                                        ("hami-device-plugin", "hami-device-plugin-gpu-1")),
    # --extender-auth=token needs TokenReview + SubjectAccessReview: granted only when the role is asked to
    "scheduler": Identity(("scheduler",), ("hami-scheduler", "hami-scheduler-leader-election"),
                          "hami-scheduler", optional=frozenset(AUTH_DELEGATOR) | PREEMPTION),
    # GPU preemption (hami_scheduler_preemption: extender): victims deleted, nominations, conditions, budgets
    "scheduler, preemption": Identity(("scheduler",), ("hami-scheduler", "hami-scheduler-leader-election"),
                                      "hami-scheduler", (("hami_rbac_scheduler_preemption", "extender"),),
                                      optional=frozenset(AUTH_DELEGATOR)),
    "scheduler, token auth": Identity(("scheduler",), ("hami-scheduler", "hami-scheduler-leader-election"),
                                      "hami-scheduler", (("hami_rbac_scheduler_token_review", True),),
                                      optional=PREEMPTION),
    # an operator's `hami-agent doctor` (cluster, node, pod, invariants) with the read-only role
    "doctor": Identity(("doctor",), ("hami-doctor",)),
}


def _granted(ident: Identity) -> set[tuple[str, str]]:
    return granted(_docs(**dict(ident.overrides)), *ident.roles, sa=ident.sa)


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_every_call_is_granted(identity: str) -> None:
    ident = IDENTITIES[identity]
    need, problems = required_verbs(_py(*ident.dirs))
    assert not problems, problems
    assert need, "no API call found: the scan is broken"
    missing = need - _granted(ident)
    assert missing == ident.optional, (
        f"{identity}: code needs {sorted(missing - ident.optional)}, add them to roles/hami_rbac/templates"
        if missing - ident.optional else f"{identity}: {sorted(ident.optional - missing)} are granted now: "
                                           "drop them from this identity's optional set")


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_nothing_is_granted_that_no_code_uses(identity: str) -> None:
    ident = IDENTITIES[identity]
    need, _ = required_verbs(_py(*ident.dirs))
    extra = _granted(ident) - need
    assert not extra, f"{identity}: granted but unused (least privilege): {sorted(extra)}"


def _role(name: str) -> dict:
    return next(d for d in DOCS if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)


def test_the_schedulers_lease_rights_are_its_own_lease_only() -> None:
    """Issue 27 item 4: whoever updates the Lease names the leader followers forward to. The scheduler may
    get and update its own Lease (a Role in its namespace, by name) and create Leases; nothing
    cluster-wide."""
    cluster_wide = [r for d in DOCS if d["kind"] == "ClusterRole" for r in d.get("rules", [])
                    if "leases" in r["resources"]]
    assert cluster_wide == []
    name = "hami-scheduler-leader-election"
    role = next(d for d in DOCS if d["kind"] == "Role" and d["metadata"]["name"] == name)
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["hami-scheduler"],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    binding = next(d for d in DOCS if d["kind"] == "RoleBinding" and d["metadata"]["name"] == name)
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hami-scheduler",
                                    "namespace": "kube-system"}]
    other = _docs(hami_rbac_scheduler_lease_namespace="hami", hami_rbac_scheduler_lease_name="sched-a")
    role = next(d for d in other if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == "hami" and role["rules"][0]["resourceNames"] == ["sched-a"]


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


def test_scan_sees_generic_calls_on_any_receiver(tmp_path: Path) -> None:
    """What the scan missed before: ``call()`` with a literal path (TokenReview/SubjectAccessReview in
    serve/auth.py, on ``self._api`` and on a ``with_options(...)`` view), and kind-first generic calls
    with a content type (the plugin's JSON patch of pods) on receivers not named ``client``."""
    src = tmp_path / "probe.py"
    src.write_text(
        "def f(self, path):\n"
        "    self._api.call('POST', '/apis/authentication.k8s.io/v1/tokenreviews', verb='create',\n"
        "                   kind='tokenreview', body={})\n"
        "    self._api.with_options(timeout_s=1).call(\n"
        "        'POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', verb='create', kind='sar')\n"
        "    self.k8s.patch('pods', 'p', [], 'ns', content_type='application/json-patch+json')\n"
        "    api.call('POST', '/api/v1/namespaces/ns/pods/p/binding', verb='bind', kind='pod')\n"
        "    self.nv.call('nvmlDeviceGetCount', fn)\n"  # NVML's call(): no verb=, not an API call
        "    self._api.call('GET', path, verb='get', kind='pod')\n")
    need, problems = required_verbs([src])
    assert need == {("tokenreviews", "create"), ("subjectaccessreviews", "create"), ("pods", "patch"),
                    ("pods/binding", "create")}
    assert len(problems) == 1
    assert "probe.py:9: KubeClient.call with a path this test cannot read" in problems[0]

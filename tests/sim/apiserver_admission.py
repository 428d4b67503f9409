"""ValidatingAdmissionPolicy for the simulated API server, evaluated by a real CEL engine (cel-python).

The policies and bindings are ordinary objects in the store (``admissionregistration.k8s.io/v1``), e.g. the
manifest the ``hami_rbac`` role renders. On every write the server asks :meth:`Admission.validate` with the
final object (after the patch is applied), the stored one, and the request's user; nothing is written when
it refuses. Semantics follow kube-apiserver (``staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/
validating/`` ``dispatcher.go``, ``validator.go``; API reference "ValidatingAdmissionPolicy v1"; KEP-3488):

* a policy applies only through a binding; both the policy's ``matchConstraints`` and the binding's
  ``matchResources`` must match (resource rules with operations, groups, versions, ``resource/subresource``
  and ``*`` forms, scope, ``excludeResourceRules``, ``namespaceSelector``, ``objectSelector``), then every
  ``matchConditions`` expression must be true;
* CEL variables ``object``, ``oldObject`` (null on CREATE), ``request`` (AdmissionRequest: ``kind``,
  ``resource``, ``subResource``, ``name``, ``namespace``, ``operation``, ``userInfo``, ...),
  ``namespaceObject``, ``params`` (null: ``paramKind`` is not simulated and refuses, see below) and
  ``variables`` (each composited variable sees the ones before it; an error surfaces only where used);
* a validation that is false denies with ``messageExpression`` (when it yields a non-empty single-line
  string), else ``message``, else ``failed expression: <expression>``; ``reason`` (default ``Invalid``) sets
  the HTTP code (Forbidden 403, Invalid 422, Unauthorized 401, RequestEntityTooLarge 413);
* the refusal is ``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
  '<binding>' denied request: <message>`` (``admission.NewForbidden`` with the reason and code replaced,
  ``details.causes[0].message`` the inner message), exactly as ``dispatcher.go`` builds it;
* an expression error follows ``failurePolicy`` (Fail, the default: deny with
  ``expression '<e>' resulted in error: <err>``; Ignore: skip);
* ``validationActions``: Deny (refuse), Warn (HTTP ``Warning: 299`` header), Audit (the audit annotation
  ``validation.policy.admission.k8s.io/validation_failure``); ``auditAnnotations`` are recorded as
  ``<policy>/<key>`` unless their value is null or empty.

Harsher than the real server, never kinder: expressions are not type-checked when the policy is created
(a typo fails at request time, with failurePolicy), ``paramKind``/``paramRef`` refuse every matched request
instead of being evaluated, and of the Kubernetes CEL libraries only the strings extension's ``join`` is
provided (any other Kubernetes-specific function fails as an unknown function). Gaps: docs/testing.md.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes

from tests.sim.apiserver_auth import UserInfo
from tests.sim.apiserver_store import ApiError, Obj, ResourceType, Store, resource_for_kind

FAILURE_ANNOTATION = "validation.policy.admission.k8s.io/validation_failure"
REASON_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}


@dataclass(frozen=True)
class AdmissionRequest:
    """One write as admission sees it."""

    operation: str  # CREATE / UPDATE / DELETE / CONNECT
    rt: ResourceType  # the resource in the URL (pods for pods/binding)
    subresource: str
    namespace: str
    name: str
    user: UserInfo
    kind: tuple[str, str, str]  # group, version, kind of ``object`` (Binding for pods/binding)
    dry_run: bool = False


@dataclass
class AdmissionOutcome:
    """What admission adds to the request's audit record and response (filled in by ``validate``)."""

    warnings: list[str] = field(default_factory=list)
    audit_annotations: dict[str, str] = field(default_factory=dict)


class _Compiled:
    """One policy's expressions, compiled once per resourceVersion."""

    def __init__(self, env: celpy.Environment, policy: Obj) -> None:
        spec = policy.get("spec") or {}
        self.env = env
        self.programs: dict[str, Any] = {}
        for text in self._expressions(spec):
            if text not in self.programs:
                try:
                    self.programs[text] = env.program(env.compile(text), functions=K8S_FUNCTIONS)
                except Exception as exc:  # CELParseError and friends: the expression is unusable
                    self.programs[text] = exc

    @staticmethod
    def _expressions(spec: Obj) -> list[str]:
        out = [c.get("expression", "") for c in spec.get("matchConditions") or []]
        out += [v.get("expression", "") for v in spec.get("variables") or []]
        for v in spec.get("validations") or []:
            out.append(v.get("expression", ""))
            if v.get("messageExpression"):
                out.append(v["messageExpression"])
        out += [a.get("valueExpression", "") for a in spec.get("auditAnnotations") or []]
        return out

    def evaluate(self, text: str, activation: dict[str, Any]) -> Any:
        """The value, or raises ``_EvalError`` naming the expression."""
        prog = self.programs.get(text)
        if isinstance(prog, Exception):
            raise _EvalError(f"compilation failed: {_short(prog)}")
        try:
            return prog.evaluate(activation)
        except Exception as exc:  # CELEvalError, or a Python error inside the engine
            raise _EvalError(_short(exc)) from exc


class _EvalError(Exception):
    pass


def _short(exc: Exception) -> str:
    if isinstance(exc, celpy.CELEvalError) and exc.args:
        return str(exc.args[0])
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _join(items: Any, sep: Any = "") -> celtypes.StringType:
    """cel-go strings extension ``list.join([separator])``, part of the Kubernetes CEL environment."""
    if not isinstance(items, list):
        raise TypeError("join: receiver must be a list of strings")
    if not all(isinstance(i, str) for i in items):
        raise TypeError("join: list elements must be strings")
    return celtypes.StringType(str(sep).join(str(i) for i in items))


K8S_FUNCTIONS = {"join": _join}


def label_selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector: ``None``/``{}`` matches everything."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _rule_matches(rule: Obj, req: AdmissionRequest) -> bool:
    rt = req.rt
    ops = rule.get("operations") or []
    if "*" not in ops and req.operation not in ops:
        return False
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if "*" not in groups and rt.group not in groups:
        return False
    if "*" not in versions and rt.version not in versions:
        return False
    scope = rule.get("scope") or "*"
    if scope == "Cluster" and rt.namespaced or scope == "Namespaced" and not rt.namespaced:
        return False
    names = rule.get("resourceNames") or []
    if names and req.name not in names:
        return False
    for r in rule.get("resources") or []:
        res, _, sub = r.partition("/")
        if res not in ("*", rt.plural):
            continue
        if (not sub and not req.subresource) or sub == "*" or (sub and sub == req.subresource):
            return True
    return False


class Admission:
    """The simulated ValidatingAdmissionPolicy plugin. Stateless apart from a compile cache."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.env = celpy.Environment()
        self._lock = threading.Lock()
        self._compiled: dict[tuple[str, str], _Compiled] = {}

    def active(self) -> bool:
        """True when at least one binding exists (then writes need admission)."""
        return bool(self.store.list(resource_for_kind("validatingadmissionpolicybindings"), None)[0])

    def _program(self, policy: Obj) -> _Compiled:
        key = (policy["metadata"]["name"], policy["metadata"]["resourceVersion"])
        with self._lock:
            got = self._compiled.get(key)
            if got is None:
                got = _Compiled(self.env, policy)
                if len(self._compiled) > 256:  # bounded: policies are few; old versions go
                    self._compiled.clear()
                self._compiled[key] = got
            return got

    # -- the plugin
    def validate(self, req: AdmissionRequest, obj: Obj | None, old: Obj | None,
                 outcome: AdmissionOutcome | None = None) -> AdmissionOutcome:
        outcome = outcome or AdmissionOutcome()
        bindings, _ = self.store.list(resource_for_kind("validatingadmissionpolicybindings"), None)
        if not bindings:
            return outcome
        vap = resource_for_kind("validatingadmissionpolicies")
        ns_obj = self._namespace(req)
        for binding in bindings:
            bspec = binding.get("spec") or {}
            try:
                policy = self.store.get(vap, "", bspec.get("policyName", ""))
            except ApiError:
                continue  # a binding to a missing policy is ignored
            spec = policy.get("spec") or {}
            if not self._matches(spec.get("matchConstraints"), req, obj, old, ns_obj):
                continue
            narrowed = bspec.get("matchResources")
            if narrowed and not self._matches(narrowed, req, obj, old, ns_obj):
                continue
            self._apply(policy, binding, req, obj, old, ns_obj, outcome)
        return outcome

    def _namespace(self, req: AdmissionRequest) -> Obj | None:
        if not req.rt.namespaced or not req.namespace:
            return None
        try:
            return self.store.get(resource_for_kind("namespaces"), "", req.namespace)
        except ApiError:
            return None

    @staticmethod
    def _matches(match: Obj | None, req: AdmissionRequest, obj: Obj | None, old: Obj | None,
                 ns_obj: Obj | None) -> bool:
        match = match or {}
        rules = match.get("resourceRules")
        if rules is not None and not any(_rule_matches(r, req) for r in rules):
            return False
        if any(_rule_matches(r, req) for r in match.get("excludeResourceRules") or []):
            return False
        if req.rt.namespaced and ns_obj is not None:
            ns_labels = (ns_obj.get("metadata") or {}).get("labels") or {}
            if not label_selector_matches(match.get("namespaceSelector"), ns_labels):
                return False
        sel = match.get("objectSelector")
        if sel:
            candidates = [o for o in (obj, old) if o is not None]
            if not any(label_selector_matches(sel, (o.get("metadata") or {}).get("labels") or {})
                       for o in candidates):
                return False
        return True

    def _activation(self, req: AdmissionRequest, obj: Obj | None, old: Obj | None,
                    ns_obj: Obj | None) -> dict[str, Any]:
        group, version, kind = req.kind
        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": req.rt.group, "version": req.rt.version, "resource": req.rt.plural},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": req.rt.group, "version": req.rt.version, "resource": req.rt.plural},
            "name": req.name, "namespace": req.namespace, "operation": req.operation,
            "userInfo": req.user.to_dict(), "dryRun": req.dry_run,
        }
        if req.subresource:
            request["subResource"] = request["requestSubResource"] = req.subresource
        return {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                "request": celpy.json_to_cel(request), "params": None,
                "namespaceObject": celpy.json_to_cel(ns_obj)}

    def _apply(self, policy: Obj, binding: Obj, req: AdmissionRequest, obj: Obj | None,  # noqa: PLR0917
               old: Obj | None, ns_obj: Obj | None, outcome: AdmissionOutcome) -> None:
        spec = policy.get("spec") or {}
        pname, bname = policy["metadata"]["name"], binding["metadata"]["name"]
        actions = (binding.get("spec") or {}).get("validationActions") or []
        fail_closed = (spec.get("failurePolicy") or "Fail") == "Fail"
        prog = self._program(policy)

        def decide(message: str, reason: str, index: int) -> None:
            if "Warn" in actions:
                outcome.warnings.append(f"Validation failed for ValidatingAdmissionPolicy '{pname}' with "
                                        f"binding '{bname}': {message}")
            if "Audit" in actions:
                failures = json.loads(outcome.audit_annotations.get(FAILURE_ANNOTATION, "[]"))
                failures.append({"message": message, "policy": pname, "binding": bname,
                                 "expressionIndex": index, "validationActions": actions})
                outcome.audit_annotations[FAILURE_ANNOTATION] = json.dumps(failures)
            if "Deny" in actions:
                raise _denial(req, pname, bname, message, reason)

        if spec.get("paramKind"):
            if fail_closed:
                decide("params (paramKind/paramRef) are not supported by the simulated API server", "", -1)
            return
        activation = self._activation(req, obj, old, ns_obj)
        for cond in spec.get("matchConditions") or []:
            try:
                ok = prog.evaluate(cond.get("expression", ""), activation)
            except _EvalError as exc:
                if fail_closed:
                    decide(f"failed to evaluate matchCondition {cond.get('name')!r}: {exc}", "", -1)
                return
            if not (isinstance(ok, celtypes.BoolType) and bool(ok)):
                return  # the policy does not apply to this request
        variables: dict[Any, Any] = {}
        for var in spec.get("variables") or []:
            activation["variables"] = celtypes.MapType(dict(variables))
            try:
                value = prog.evaluate(var.get("expression", ""), activation)
            except _EvalError as exc:
                # lazily fatal, like the real composited variables: only where an expression uses it
                value = celpy.CELEvalError(
                    f"composited variable {var.get('name')!r} fails to evaluate: {exc}")
            variables[celtypes.StringType(var.get("name", ""))] = value
        activation["variables"] = celtypes.MapType(dict(variables))

        for index, v in enumerate(spec.get("validations") or []):
            expr = v.get("expression", "")
            try:
                result = prog.evaluate(expr, activation)
                if not isinstance(result, celtypes.BoolType):
                    raise _EvalError(f"expression did not evaluate to a bool: {result!r}")
            except _EvalError as exc:
                if fail_closed:
                    decide(f"expression '{expr}' resulted in error: {exc}", "", index)
                continue
            if bool(result):
                continue
            decide(self._message(prog, v, activation), v.get("reason") or "", index)

        for ann in spec.get("auditAnnotations") or []:
            try:
                value = prog.evaluate(ann.get("valueExpression", ""), activation)
            except _EvalError as exc:
                if fail_closed:
                    decide(f"valueExpression of audit annotation {ann.get('key')!r} resulted in error: {exc}",
                           "", -1)
                continue
            if value is not None and str(value):
                outcome.audit_annotations[f"{pname}/{ann.get('key', '')}"] = str(value)

    @staticmethod
    def _message(prog: _Compiled, v: Obj, activation: dict[str, Any]) -> str:
        if v.get("messageExpression"):
            try:
                msg = prog.evaluate(v["messageExpression"], activation)
            except _EvalError:
                msg = None  # logged by the real server; falls back to message
            if isinstance(msg, str) and msg.strip() and "\n" not in msg:
                return str(msg)
        if v.get("message"):
            return str(v["message"])
        return f"failed expression: {v.get('expression', '').strip()}"


def _denial(req: AdmissionRequest, policy: str, binding: str, message: str, reason: str) -> ApiError:
    """dispatcher.go: admission.NewForbidden(a, message) with reason (default Invalid) and its code."""
    inner = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    reason = reason or "Invalid"
    code = REASON_CODES.get(reason, 422)
    gr = f"{req.rt.plural}.{req.rt.group}" if req.rt.group else req.rt.plural
    full = f'{gr} "{req.name}" is forbidden: {inner}' if req.name else f"{gr} is forbidden: {inner}"
    details: dict[str, Any] = {"kind": req.rt.plural, "causes": [{"message": inner}]}
    if req.name:
        details["name"] = req.name
    if req.rt.group:
        details["group"] = req.rt.group
    return ApiError(code, reason, full, details)


__all__ = ["FAILURE_ANNOTATION", "Admission", "AdmissionOutcome", "AdmissionRequest",
           "label_selector_matches"]

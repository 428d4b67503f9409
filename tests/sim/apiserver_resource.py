"""``resource.k8s.io/v1`` in the simulated API server: the write rules of DeviceClass, ResourceSlice,
ResourceClaim and ResourceClaimTemplate.

The kinds are served like any other (``RESOURCES`` in ``apiserver_store.py``); this module adds what
kube-apiserver's registry strategies and validation do for them (kubernetes ``pkg/registry/resource/*/
strategy.go``, ``pkg/apis/resource/validation/validation.go``), with the real error texts:

* **ResourceClaim**: ``status`` is dropped on create and only ``/status`` writes it; ``spec`` is immutable;
  requests are defaulted (``allocationMode: ExactCount``, ``count: 1``) and validated (names, exactly one of
  ``exactly``/``firstAvailable``, device class, CEL selectors must compile, tolerations, capacity
  requests); ``status.reservedFor`` needs an allocation, at most 256 unique consumers; a set
  ``status.allocation`` is immutable; a new allocation names existing requests and valid devices.
* **ResourceSlice**: driver, pool (name, ``generation >= 0``, ``resourceSliceCount > 0``), exactly one of
  ``nodeName``/``nodeSelector``/``allNodes``/``perDeviceNodeSelection``; ``driver``, ``nodeName`` and
  ``pool.name`` immutable; at most 128 devices (64 when any device has taints); unique DNS-label device
  names; at most 32 attributes + capacities, each attribute exactly one value, versions semver; a
  ``requestPolicy`` only with ``allowMultipleAllocations`` and consistent with the capacity (min, max,
  default, step); taints with a valid effect, ``timeAdded`` filled in by the server when missing (so a
  driver that compares its desired slice with the stored one must carry it over, as with a real server).
* **DeviceClass**: selectors compile, ``extendedResourceName`` is an extended resource name.
* **ResourceClaimTemplate**: the claim spec rules above; ``spec`` immutable.
* ``metadata.generation`` starts at 1 and is bumped on every spec change (slices, classes).

Not modelled (docs/testing.md): the ``resourceclaims/binding`` synthetic authorization of status writes,
deletion protection finalizers doing anything (deletion is immediate here), list-valued attributes,
shared counters and partitionable devices beyond shape, DeviceTaintRules, v1beta1/v1beta2 versions.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.quantity import parse_quantity
from tests.sim.apiserver_store import ApiError, Obj, Store

GROUP = "resource.k8s.io"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
MAX_DEVICES, MAX_DEVICES_ADVANCED = 128, 64
# semver.org 2.0.0, as kube-apiserver's validateDeviceAttributeVersionValue checks it
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(-(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*)?"
                    r"(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$")


class Quantity:
    """An exact quantity for the validation's comparisons."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    @classmethod
    def parse(cls, text: Any) -> Quantity:
        try:
            return cls(parse_quantity(text))
        except ProtocolError as exc:
            raise ValueError(str(exc)) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def _cel_problem(expression: str) -> str | None:
    """kube-apiserver compiles selectors on create. The CEL engine (cel-python, a dev dependency) is imported
    here, not at module import, so the API server also runs where it is not installed (the molecule
    scenarios' simulator venvs); there selectors are stored unchecked (docs/testing.md)."""
    try:
        from tests.sim.dra_cel import DEFAULT
    except ImportError:
        return None
    return DEFAULT.compile_check(expression)


class Errors:
    """A ``field.ErrorList``: collects errors, raises one 422 with kube-apiserver's message."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind, self.name = kind, name
        self.items: list[tuple[str, str]] = []  # (field, message)

    @staticmethod
    def _value(v: Any) -> str:
        if isinstance(v, str):
            return json.dumps(v)
        return "<object>" if isinstance(v, (dict, list)) else str(v)

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.items.append((path, f"{path}: Invalid value: {self._value(value)}: {detail}"))

    def required(self, path: str, detail: str = "") -> None:
        self.items.append((path, f"{path}: Required value" + (f": {detail}" if detail else "")))

    def forbidden(self, path: str, detail: str) -> None:
        self.items.append((path, f"{path}: Forbidden: {detail}"))

    def too_many(self, path: str, n: int, most: int) -> None:
        self.items.append((path, f"{path}: Too many: {n}: must have at most {most} items"))

    def duplicate(self, path: str, value: Any) -> None:
        self.items.append((path, f"{path}: Duplicate value: {self._value(value)}"))

    def unsupported(self, path: str, value: Any, supported: tuple[str, ...]) -> None:
        shown = ", ".join(json.dumps(s) for s in supported)
        msg = f"{path}: Unsupported value: {self._value(value)}: supported values: {shown}"
        self.items.append((path, msg))

    def raise_if_any(self) -> None:
        if not self.items:
            return
        msgs = [m for _f, m in self.items]
        inner = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
        raise ApiError(422, "Invalid", f'{self.kind}.{GROUP} "{self.name}" is invalid: {inner}',
                       {"name": self.name, "group": GROUP, "kind": self.kind,
                        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f}
                                   for f, m in self.items]})


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity(errs: Errors, path: str, value: Any) -> Quantity | None:
    try:
        return Quantity.parse(value)
    except ValueError:
        errs.invalid(path, value, "quantities must match the regular expression "
                     "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
        return None


def _driver_name(errs: Errors, path: str, value: Any) -> None:
    if not value:
        errs.required(path)
    elif not isinstance(value, str) or len(value) > 63 or not DNS_SUBDOMAIN.match(value):
        errs.invalid(path, value, "a lowercase RFC 1123 subdomain of at most 63 characters is required")


def _dns_label(errs: Errors, path: str, value: Any) -> None:
    if not value:
        errs.required(path)
    elif not isinstance(value, str) or len(value) > 63 or not DNS_LABEL.match(value):
        errs.invalid(path, value, "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                     "characters or '-', and must start and end with an alphanumeric character")


def _pool_name(errs: Errors, path: str, value: Any) -> None:
    if not value:
        errs.required(path)
    elif (not isinstance(value, str) or len(value) > 253
          or not all(DNS_SUBDOMAIN.match(p) for p in value.split("/"))):
        errs.invalid(path, value, "must consist of one or more DNS sub-domains separated by slashes")


def _qualified_name(errs: Errors, path: str, name: str) -> None:
    domain, sep, ident = name.rpartition("/")
    if sep:
        _driver_name(errs, path, domain)
    if not ident or len(ident) > 32 or not C_IDENTIFIER.match(ident):
        errs.invalid(path, ident, "a valid C identifier of at most 32 characters is required")


def _selectors(errs: Errors, path: str, selectors: Any) -> None:
    if selectors is None:
        return
    if not isinstance(selectors, list):
        errs.invalid(path, selectors, "must be a list")
        return
    if len(selectors) > 32:
        errs.too_many(path, len(selectors), 32)
        return
    for i, sel in enumerate(selectors):
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if not isinstance(expr, str) or not expr:
            errs.required(f"{path}[{i}].cel.expression")
            continue
        if len(expr) > 10 * 1024:
            errs.too_many(f"{path}[{i}].cel.expression", len(expr), 10 * 1024)
            continue
        problem = _cel_problem(expr)
        if problem:
            errs.invalid(f"{path}[{i}].cel.expression", expr, problem)


def _tolerations(errs: Errors, path: str, tolerations: Any) -> None:
    for i, t in enumerate(tolerations or []):
        p = f"{path}[{i}]"
        op = t.get("operator") or "Equal"
        if op not in ("Exists", "Equal"):
            errs.unsupported(f"{p}.operator", op, ("Equal", "Exists"))
        if op == "Exists" and t.get("value"):
            errs.invalid(f"{p}.operator", t.get("value"), "value must be empty when `operator` is 'Exists'")
        if not t.get("key") and op != "Exists":
            errs.invalid(f"{p}.operator", op, "operator must be Exists when `key` is empty")
        if t.get("effect") and t["effect"] not in ("NoSchedule", "NoExecute"):
            errs.unsupported(f"{p}.effect", t["effect"], ("NoExecute", "NoSchedule"))


def _exact_request(errs: Errors, p: str, req: Obj, defaults: bool) -> None:
    cls = req.get("deviceClassName")
    if not cls:
        errs.required(f"{p}.deviceClassName")
    elif not isinstance(cls, str) or not DNS_SUBDOMAIN.match(cls):
        errs.invalid(f"{p}.deviceClassName", cls, "a lowercase RFC 1123 subdomain is required")
    if defaults:  # kube-apiserver's defaulting (pkg/apis/resource/v1/defaults.go)
        req.setdefault("allocationMode", "ExactCount")
        if req["allocationMode"] == "ExactCount":
            req.setdefault("count", 1)
    mode = req.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        errs.unsupported(f"{p}.allocationMode", mode, ("All", "ExactCount"))
    elif mode == "ExactCount" and not (isinstance(req.get("count", 1), int) and req.get("count", 1) > 0):
        errs.invalid(f"{p}.count", req.get("count"), "must be greater than zero")
    _selectors(errs, f"{p}.selectors", req.get("selectors"))
    _tolerations(errs, f"{p}.tolerations", req.get("tolerations"))
    for key, value in ((req.get("capacity") or {}).get("requests") or {}).items():
        _qualified_name(errs, f"{p}.capacity.requests[{key}]", key)
        _quantity(errs, f"{p}.capacity.requests[{key}]", value)


def validate_claim_spec(errs: Errors, path: str, spec: Any, defaults: bool) -> None:
    devices = (spec or {}).get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, dict):
        errs.required(f"{path}.devices")
        return
    seen: set[str] = set()
    requests = devices.get("requests") or []
    if len(requests) > 32:
        errs.too_many(f"{path}.devices.requests", len(requests), 32)
        return
    for i, req in enumerate(requests):
        p = f"{path}.devices.requests[{i}]"
        if not isinstance(req, dict):
            errs.invalid(p, req, "must be an object")
            continue
        _dns_label(errs, f"{p}.name", req.get("name"))
        if req.get("name") in seen:
            errs.duplicate(f"{p}.name", req.get("name"))
        seen.add(req.get("name"))
        exact, first = req.get("exactly"), req.get("firstAvailable")
        if bool(exact) == bool(first):
            errs.required(p, "exactly one of `exactly` or `firstAvailable` is required")
            continue
        if exact:
            _exact_request(errs, f"{p}.exactly", exact, defaults)
        else:
            subs: set[str] = set()
            for j, sub in enumerate(first):
                sp = f"{p}.firstAvailable[{j}]"
                _dns_label(errs, f"{sp}.name", sub.get("name"))
                if sub.get("name") in subs:
                    errs.duplicate(f"{sp}.name", sub.get("name"))
                subs.add(sub.get("name"))
                _exact_request(errs, sp, sub, defaults)
    for i, c in enumerate(devices.get("constraints") or []):
        for key in ("matchAttribute", "distinctAttribute"):
            if c.get(key) and "/" not in c[key]:
                errs.invalid(f"{path}.devices.constraints[{i}].{key}", c[key],
                             "a fully qualified name must be a domain and a name separated by a slash")
    for i, cfg in enumerate(devices.get("config") or []):
        opaque = (cfg or {}).get("opaque")
        if not isinstance(opaque, dict):
            errs.required(f"{path}.devices.config[{i}].opaque")
            continue
        _driver_name(errs, f"{path}.devices.config[{i}].opaque.driver", opaque.get("driver"))
        if not isinstance(opaque.get("parameters"), dict):
            errs.invalid(f"{path}.devices.config[{i}].opaque.parameters", "<value omitted>",
                         "must be a valid JSON object")


def _allocation(errs: Errors, path: str, alloc: Obj, request_names: set[str]) -> None:
    results = ((alloc.get("devices") or {}).get("results")) or []
    if len(results) > 32:
        errs.too_many(f"{path}.devices.results", len(results), 32)
        return
    for i, r in enumerate(results):
        p = f"{path}.devices.results[{i}]"
        if r.get("request", "").split("/")[0] not in request_names:
            errs.invalid(f"{p}.request", r.get("request"), "must be the name of a request in the claim or "
                         "the name of a request and a subrequest separated by '/'")
        _driver_name(errs, f"{p}.driver", r.get("driver"))
        _pool_name(errs, f"{p}.pool", r.get("pool"))
        _dns_label(errs, f"{p}.device", r.get("device"))


def claim_strategy(old: Obj | None, new: Obj, subresource: str | None, seed: bool) -> None:
    name = (new.get("metadata") or {}).get("name", "")
    errs = Errors("ResourceClaim", name)
    if old is None:
        if not seed:
            new.pop("status", None)  # PrepareForCreate: status is the scheduler's (resourceclaims/status)
        validate_claim_spec(errs, "spec", new.get("spec"), defaults=True)
        errs.raise_if_any()
        return
    if subresource != "status":
        if new.get("spec") != old.get("spec"):
            errs.invalid("spec", "object", "field is immutable")
        errs.raise_if_any()
        return
    status, old_status = new.get("status") or {}, old.get("status") or {}
    reserved = status.get("reservedFor") or []
    if len(reserved) > 256:
        errs.too_many("status.reservedFor", len(reserved), 256)
    uids: set[str] = set()
    for i, ref in enumerate(reserved):
        for key in ("resource", "name", "uid"):
            if not ref.get(key):
                errs.required(f"status.reservedFor[{i}].{key}")
        if ref.get("uid") in uids:
            errs.duplicate(f"status.reservedFor[{i}]", ref.get("uid"))
        uids.add(ref.get("uid"))
    if reserved and not status.get("allocation"):
        errs.forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
    if old_status.get("allocation") and status.get("allocation"):
        if status["allocation"] != old_status["allocation"]:
            errs.invalid("status.allocation", "object", "field is immutable")
    elif status.get("allocation"):
        requests = (((new.get("spec") or {}).get("devices") or {}).get("requests")) or []
        _allocation(errs, "status.allocation", status["allocation"], {r.get("name") for r in requests})
    errs.raise_if_any()


def template_strategy(old: Obj | None, new: Obj, subresource: str | None, seed: bool) -> None:
    errs = Errors("ResourceClaimTemplate", (new.get("metadata") or {}).get("name", ""))
    if old is None:
        validate_claim_spec(errs, "spec.spec", (new.get("spec") or {}).get("spec"), defaults=True)
    elif new.get("spec") != old.get("spec"):
        errs.invalid("spec", "object", "field is immutable")
    errs.raise_if_any()


def _bump_generation(old: Obj | None, new: Obj) -> None:
    meta = new.setdefault("metadata", {})
    if old is None:
        meta["generation"] = 1
    else:
        gen = int((old.get("metadata") or {}).get("generation") or 1)
        meta["generation"] = gen + 1 if new.get("spec") != old.get("spec") else gen


def class_strategy(old: Obj | None, new: Obj, subresource: str | None, seed: bool) -> None:
    errs = Errors("DeviceClass", (new.get("metadata") or {}).get("name", ""))
    spec = new.get("spec") or {}
    if old is None or spec.get("selectors") != (old.get("spec") or {}).get("selectors"):
        _selectors(errs, "spec.selectors", spec.get("selectors"))
    ext = spec.get("extendedResourceName")
    if ext is not None and (not isinstance(ext, str) or "/" not in ext or ext.startswith("kubernetes.io/")
                            or ext.startswith("requests.")):
        errs.invalid("spec.extendedResourceName", ext, "must be a valid extended resource name")
    errs.raise_if_any()
    _bump_generation(old, new)


def _request_policy(errs: Errors, p: str, value: Quantity, policy: Obj) -> None:
    if policy.get("validValues") and policy.get("validRange"):
        errs.forbidden(p, 'exactly one policy can be specified, cannot specify "validValues" and '
                          '"validRange" at the same time')
        return
    default = None
    if policy.get("default") is not None:
        default = _quantity(errs, f"{p}.default", policy["default"])
    rng = policy.get("validRange")
    if rng is not None:
        if default is None:
            errs.required(f"{p}.default", "required when validRange is defined")
            return
        if rng.get("min") is None:
            errs.required(f"{p}.validRange.min", "required when validRange is defined")
            return
        lo = _quantity(errs, f"{p}.validRange.min", rng["min"])
        hi = _quantity(errs, f"{p}.validRange.max", rng["max"]) if rng.get("max") is not None else None
        step = _quantity(errs, f"{p}.validRange.step", rng["step"]) if rng.get("step") is not None else None
        if lo is None:
            return
        if lo.value > value.value:
            errs.invalid(f"{p}.validRange.min", rng["min"], "min is larger than capacity value")
        if default.value < lo.value:
            errs.invalid(f"{p}.validRange.min", policy["default"], f"default is less than min: {rng['min']}")
        if hi is not None:
            if hi.value > value.value:
                errs.invalid(f"{p}.validRange.max", rng["max"], "max is larger than capacity value")
            if default.value > hi.value:
                errs.invalid(f"{p}.validRange.max", policy["default"],
                             f"default is more than max: {rng['max']}")
        if step is not None and step.value > 0:
            if lo.value + step.value > value.value:
                errs.invalid(f"{p}.validRange.step", rng["step"], "one step is larger than capacity value")
            for what in (default, hi):
                if what is not None and (what.value - lo.value) % step.value != 0:
                    errs.invalid(f"{p}.validRange.step", str(what), f"value is not a multiple of a given "
                                 f"step ({rng['step']}) from ({rng['min']})")
    elif policy.get("validValues"):
        if default is None:
            errs.required(f"{p}.default", "required when validValues is defined")
        elif not any(_quantity(errs, f"{p}.validValues", v) == default for v in policy["validValues"]):
            errs.invalid(f"{p}.validValues", policy["default"], "default value is not valid according to the "
                         "requestPolicy")


def _device(errs: Errors, p: str, dev: Obj, old_dev: Obj | None) -> None:
    _dns_label(errs, f"{p}.name", dev.get("name"))
    attrs, caps = dev.get("attributes") or {}, dev.get("capacity") or {}
    if len(attrs) + len(caps) > 32:
        errs.invalid(p, len(attrs) + len(caps),
                     "the total number of attributes and capacities must not exceed 32")
    for key, attr in attrs.items():
        ap = f"{p}.attributes[{key}]"
        _qualified_name(errs, ap, key)
        values = [k for k in ("int", "bool", "string", "version") if k in (attr or {})]
        if len(values) != 1:
            errs.invalid(ap, "" if not values else attr, "exactly one value must be specified")
            continue
        v = attr[values[0]]
        if values[0] in ("string", "version") and len(str(v)) > 64:
            errs.too_many(f"{ap}.{values[0]}", len(str(v)), 64)
        if values[0] == "version" and not SEMVER.match(str(v)):
            errs.invalid(f"{ap}.version", v, "must be a string compatible with semver.org spec 2.0.0")
    multi = bool(dev.get("allowMultipleAllocations"))
    for key, cap in caps.items():
        cp = f"{p}.capacity[{key}]"
        _qualified_name(errs, cp, key)
        value = _quantity(errs, f"{cp}.value", (cap or {}).get("value"))
        policy = (cap or {}).get("requestPolicy")
        if policy is not None and not multi:
            errs.forbidden(f"{cp}.requestPolicy", "allowMultipleAllocations must be true")
        elif policy is not None and value is not None:
            _request_policy(errs, f"{cp}.requestPolicy", value, policy)
    taints = dev.get("taints") or []
    if len(taints) > 16:
        errs.too_many(f"{p}.taints", len(taints), 16)
    old_added = {(t.get("key"), t.get("value"), t.get("effect")): t.get("timeAdded")
                 for t in (old_dev or {}).get("taints") or []}
    for i, t in enumerate(taints):
        tp = f"{p}.taints[{i}]"
        if not t.get("key") or not LABEL_NAME.match(str(t["key"])):
            errs.invalid(f"{tp}.key", t.get("key"), "name part must consist of alphanumeric characters, '-', "
                         "'_' or '.', and must start and end with an alphanumeric character")
        if t.get("effect") not in TAINT_EFFECTS:
            errs.unsupported(f"{tp}.effect", t.get("effect"), TAINT_EFFECTS)
        if not t.get("timeAdded"):  # "Added automatically during create or update if not set"
            t["timeAdded"] = old_added.get((t.get("key"), t.get("value"), t.get("effect"))) or _now()


def slice_strategy(old: Obj | None, new: Obj, subresource: str | None, seed: bool) -> None:
    errs = Errors("ResourceSlice", (new.get("metadata") or {}).get("name", ""))
    spec = new.get("spec")
    if not isinstance(spec, dict):
        errs.required("spec")
        errs.raise_if_any()
        return
    _driver_name(errs, "spec.driver", spec.get("driver"))
    pool = spec.get("pool") or {}
    _pool_name(errs, "spec.pool.name", pool.get("name"))
    count, gen = pool.get("resourceSliceCount", 0), pool.get("generation", 0)
    if not isinstance(count, int) or count <= 0:
        errs.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero")
    if not isinstance(gen, int) or gen < 0:
        errs.invalid("spec.pool.generation", gen, "must be greater than or equal to zero")
    if old is not None:
        old_spec = old.get("spec") or {}
        old_pool = (old_spec.get("pool") or {}).get("name")
        for field_path, a, b in (("spec.pool.name", pool.get("name"), old_pool),
                                 ("spec.driver", spec.get("driver"), old_spec.get("driver")),
                                 ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName"))):
            if a != b:
                errs.invalid(field_path, a, "field is immutable")
    chosen = [f"`{k}`" for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
              if spec.get(k)]
    if spec.get("nodeName") == "":
        errs.invalid("spec.nodeName", "", "must be either unset or set to a non-empty string")
    if not chosen:
        errs.required("spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                              "`perDeviceNodeSelection` is required")
    elif len(chosen) > 1:
        errs.invalid("spec", "{" + ", ".join(chosen) + "}", "exactly one of `nodeName`, `nodeSelector`, "
                     "`allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set")
    devices = spec.get("devices") or []
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices if isinstance(d, dict))
    most = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > most:
        errs.too_many("spec.devices", len(devices), most)
    else:
        old_devices = {d.get("name"): d for d in ((old or {}).get("spec") or {}).get("devices") or []}
        names: set[str] = set()
        for i, dev in enumerate(devices):
            if not isinstance(dev, dict):
                errs.invalid(f"spec.devices[{i}]", dev, "must be an object")
                continue
            _device(errs, f"spec.devices[{i}]", dev, old_devices.get(dev.get("name")))
            if dev.get("name") in names:
                errs.duplicate(f"spec.devices[{i}]", dev.get("name"))
            names.add(dev.get("name"))
    errs.raise_if_any()
    _bump_generation(old, new)


def install(store: Store) -> None:
    """Register the resource.k8s.io write rules with the store (called by ``ApiServer``)."""
    store.strategies.update({"resourceclaims": claim_strategy, "resourceclaimtemplates": template_strategy,
                             "deviceclasses": class_strategy, "resourceslices": slice_strategy})


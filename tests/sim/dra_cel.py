"""The Kubernetes DRA CEL environment for the SIMULATED kube-scheduler, on a real CEL engine (cel-python).

kube-scheduler evaluates DeviceClass and ResourceClaim selectors (``spec.selectors[].cel.expression``) once
per candidate device with one variable, ``device`` (kubernetes ``staging/src/k8s.io/dynamic-resource-
allocation/cel/compile.go``; API reference ``CELDeviceSelector``):

* ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool);
* ``device.attributes[<domain>].<id>``: attributes grouped by domain; an unqualified attribute name belongs
  to the driver's domain (``uuid`` of driver ``gpu.hami.io`` is ``device.attributes["gpu.hami.io"].uuid``);
  values are int, bool, string or semver (``version`` attributes);
* ``device.capacity[<domain>].<id>``: capacities as ``Quantity`` values;
* an unknown domain gives an empty map; an unknown field is an evaluation error ("no such member"), which
  aborts the allocation, as the real scheduler does;
* the Kubernetes CEL libraries used with devices: ``quantity(s)``, ``isQuantity(s)``, Quantity methods
  ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``, ``asInteger``, ``asApproximateFloat``,
  ``sign``, ``isInteger`` and ``==``; ``semver(s)``, ``isSemver(s)``, Semver methods ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``, ``patch`` and ``==`` (kubernetes
  ``staging/src/k8s.io/apiserver/pkg/cel/library/quantity.go`` and ``semverlib.go``).

Everything else is cel-python's standard CEL (macros, string functions, ``has()``, ``in``). Not supported,
and therefore an error (harsher, never kinder): ``cel.bind``, optional types (``.?x``, ``orValue``),
``includes()`` of list attributes, type-checking at compile time, the cost limit
(``CELSelectorExpressionMaxCost``). The list is repeated in docs/testing.md.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes

from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.quantity import parse_quantity

Obj = dict[str, Any]

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
                     r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$")


class CelError(ValueError):
    """A selector that does not compile, errs at run time or does not yield a bool."""


def format_quantity(value: Fraction, binary: bool = True) -> str:
    """Canonical-enough Kubernetes form of an integral quantity (``21474836480`` -> ``20Gi``); what
    ``resource.NewQuantity(v, BinarySI).String()`` prints for the values the allocator produces."""
    if value.denominator != 1:
        milli = value * 1000
        return f"{int(milli)}m" if milli.denominator == 1 else str(float(value))
    n = int(value)
    if n == 0:
        return "0"
    for suffix, mult in (_BINARY if binary else _DECIMAL):
        if n % mult == 0 and abs(n) >= mult:
            return f"{n // mult}{suffix}"
    return str(n)


class Quantity:
    """A Kubernetes ``resource.Quantity`` as CEL sees it (exact arithmetic on ``Fraction``)."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = Fraction(value)

    @classmethod
    def parse(cls, text: Any) -> Quantity:
        try:
            return cls(parse_quantity(str(text) if not isinstance(text, (int, float)) else text))
        except ProtocolError as exc:
            raise CelError(str(exc)) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({format_quantity(self.value)})"


class Semver:
    """A semantic version (semver.org 2.0.0) as CEL sees it."""

    __slots__ = ("major", "minor", "patch", "pre")

    def __init__(self, text: str, normalize: bool = False) -> None:
        if normalize:
            text = _normalize_semver(text)
        m = _SEMVER.match(text)
        if not m:
            raise CelError(f"invalid semver {text!r}")
        self.major, self.minor, self.patch = int(m.group(1)), int(m.group(2)), int(m.group(3))
        self.pre = tuple(m.group(4).split(".")) if m.group(4) else ()

    def key(self) -> tuple:
        # a release sorts after its pre-releases; numeric identifiers sort numerically, before strings
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and other.key() == self.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return f"Semver({self.major}.{self.minor}.{self.patch}{'-' + '.'.join(self.pre) if self.pre else ''})"


def _normalize_semver(text: str) -> str:
    """``semver(s, true)``: strip a leading ``v``, fill missing minor/patch, drop leading zeros."""
    text = text.removeprefix("v")
    m = re.search(r"[-+]", text)
    core, rest = (text[:m.start()], text[m.start():]) if m else (text, "")
    parts = core.split(".")
    while len(parts) < 3:
        parts.append("0")
    parts = [str(int(p)) if p.isdigit() else p for p in parts]
    return ".".join(parts) + rest


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return (a.key() > b.key()) - (a.key() < b.key())
    raise CelError(f"no such overload: compareTo({type(a).__name__}, {type(b).__name__})")


def _quantity_only(a: Any, what: str) -> Quantity:
    if not isinstance(a, Quantity):
        raise CelError(f"no such overload: {what} on {type(a).__name__}")
    return a


def _semver_only(a: Any, what: str) -> Semver:
    if not isinstance(a, Semver):
        raise CelError(f"no such overload: {what} on {type(a).__name__}")
    return a


def _is_semver(s: Any, normalize: Any = False) -> celtypes.BoolType:
    try:
        Semver(str(s), bool(normalize))
        return celtypes.BoolType(True)
    except CelError:
        return celtypes.BoolType(False)


def _is_quantity(s: Any) -> celtypes.BoolType:
    try:
        Quantity.parse(str(s))
        return celtypes.BoolType(True)
    except CelError:
        return celtypes.BoolType(False)


def _as_integer(q: Any) -> celtypes.IntType:
    v = _quantity_only(q, "asInteger").value
    if v.denominator != 1 or not -(2**63) <= v.numerator < 2**63:
        raise CelError(f"cannot convert value to integer: {format_quantity(v)}")
    return celtypes.IntType(v.numerator)


def _sign(v: Fraction) -> int:
    return (v > 0) - (v < 0)


FUNCTIONS: dict[str, Any] = {
    "quantity": lambda s: Quantity.parse(str(s)),
    "isQuantity": _is_quantity,
    "semver": lambda s, normalize=False: Semver(str(s), bool(normalize)),
    "isSemver": _is_semver,
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "add": lambda a, b: Quantity(_quantity_only(a, "add").value
                                 + (b.value if isinstance(b, Quantity) else Fraction(int(b)))),
    "sub": lambda a, b: Quantity(_quantity_only(a, "sub").value
                                 - (b.value if isinstance(b, Quantity) else Fraction(int(b)))),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(_quantity_only(q, "asApproximateFloat").value)),
    "sign": lambda q: celtypes.IntType(_sign(_quantity_only(q, "sign").value)),
    "isInteger": lambda q: celtypes.BoolType(_quantity_only(q, "isInteger").value.denominator == 1),
    "major": lambda v: celtypes.IntType(_semver_only(v, "major").major),
    "minor": lambda v: celtypes.IntType(_semver_only(v, "minor").minor),
    "patch": lambda v: celtypes.IntType(_semver_only(v, "patch").patch),
}


class _DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map, not an error."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """``uuid`` -> (driver, "uuid"); ``resource.kubernetes.io/pcieRoot`` -> ("resource.kubernetes.io",
    "pcieRoot")."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def attribute_value(attr: Obj) -> Any:
    """The CEL value of one ResourceSlice attribute (exactly one of int/bool/string/version)."""
    if "int" in attr:
        return celtypes.IntType(int(attr["int"]))
    if "bool" in attr:
        return celtypes.BoolType(bool(attr["bool"]))
    if "string" in attr:
        return celtypes.StringType(str(attr["string"]))
    if "version" in attr:
        return Semver(str(attr["version"]))
    raise CelError(f"unsupported attribute value {attr!r}")


def device_activation(driver: str, device: Obj) -> dict[str, Any]:
    """The ``device`` variable for one ResourceSlice device."""
    attrs: dict[str, dict] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        attrs.setdefault(domain, {})[celtypes.StringType(ident)] = attribute_value(value)
    caps: dict[str, dict] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        caps.setdefault(domain, {})[celtypes.StringType(ident)] = Quantity.parse(value.get("value"))
    return {"device": celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(driver),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
            bool(device.get("allowMultipleAllocations"))),
        celtypes.StringType("attributes"): _DomainMap(
            {celtypes.StringType(d): celtypes.MapType(v) for d, v in attrs.items()}),
        celtypes.StringType("capacity"): _DomainMap(
            {celtypes.StringType(d): celtypes.MapType(v) for d, v in caps.items()}),
    })}


class SelectorCache:
    """Compiled selector programs, shared by every evaluation (compiling costs milliseconds)."""

    MAX = 1024  # distinct expressions kept; beyond, the cache starts over (bounded memory)

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def program(self, expression: str) -> Any:
        with self._lock:
            prog = self._programs.get(expression)
        if prog is not None:
            if isinstance(prog, CelError):
                raise prog
            return prog
        try:
            prog = self._env.program(self._env.compile(expression), functions=FUNCTIONS)
        except Exception as exc:  # CELParseError and friends
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            prog = CelError(f"compilation failed: {first}")
        with self._lock:
            if len(self._programs) >= self.MAX:
                self._programs.clear()
            self._programs[expression] = prog
        if isinstance(prog, CelError):
            raise prog
        return prog

    def compile_check(self, expression: str) -> str | None:
        """None if ``expression`` compiles, else the error (the API server's create-time check)."""
        try:
            self.program(expression)
            return None
        except CelError as exc:
            return str(exc)

    def matches(self, expression: str, driver: str, device: Obj) -> bool:
        """Evaluate one selector for one device; raises CelError on any failure (allocation aborts)."""
        prog = self.program(expression)
        try:
            result = prog.evaluate(device_activation(driver, device))
        except CelError:
            raise
        except Exception as exc:  # CELEvalError, or a Python error inside the engine or our functions
            detail = exc.args[0] if isinstance(exc, celpy.CELEvalError) and exc.args else exc
            raise CelError(f"CEL runtime error: {detail}") from None
        if isinstance(result, celpy.CELEvalError):
            raise CelError(f"CEL runtime error: {result.args[0] if result.args else result}")
        if not isinstance(result, (bool, celtypes.BoolType)):
            raise CelError(f"must evaluate to bool, got {type(result).__name__}")
        return bool(result)


DEFAULT = SelectorCache()

"""Kubernetes resource quantities (``20k``, ``1Gi``, ``500m``, ``1e3``), enough for HAMi's
``Quantity.AsInt64`` semantics. Hand-written because the ``kubernetes`` client's parser lives in a
module we must not import here (protocol imports nothing heavy) and returns Decimals with rounding."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from hami_agent.protocol.errors import ProtocolError

# re.ASCII: without it Python's \d takes any Unicode digit ("\u0663" as 3); Kubernetes' ParseQuantity
# (apimachinery pkg/api/resource/quantity.go) accepts only 0-9
_QUANTITY_RE = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$",
                          re.ASCII)
_SUFFIX = {
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
}
INT64_MAX = 2**63 - 1


def parse_quantity(value: object, what: str = "quantity") -> Fraction:
    """Exact value of a Kubernetes quantity (string or JSON number)."""
    if isinstance(value, bool):
        raise ProtocolError(f"{what}: {value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ProtocolError(f"{what}: {value!r} is not a quantity")
        return Fraction(value)
    if not isinstance(value, str):
        raise ProtocolError(f"{what}: {value!r} is not a quantity")
    if len(value) > 64:  # real quantities are short; also avoids Python's int-conversion digit limit
        raise ProtocolError(f"{what}: {value[:64]!r}... is too long for a Kubernetes quantity")
    if value.isdigit() and value.isascii():  # the common "4096": a plain integer, no regex or suffix
        return Fraction(int(value))
    m = _QUANTITY_RE.match(value.strip())
    if not m:
        raise ProtocolError(f"{what}: {value!r} is not a Kubernetes quantity (e.g. 2, 20k, 1Gi)")
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    if suffix[:1] in ("e", "E"):
        exp = int(suffix[1:])
        if abs(exp) > 100:
            raise ProtocolError(f"{what}: {value!r} exponent is out of range")
        mult = Fraction(10) ** exp
    else:
        mult = _SUFFIX[suffix]
    result = Fraction(number) * mult
    return -result if sign == "-" else result


def quantity_as_int64(value: object, what: str = "quantity") -> int | None:
    """``Quantity.AsInt64``: the integer value, or None when it is fractional or overflows int64."""
    if isinstance(value, str) and len(value) <= 18 and value.isdigit() and value.isascii():
        return int(value)  # the common case on every pod event: below 10**18, so within int64
    q = parse_quantity(value, what)
    if q.denominator != 1 or not -(2**63) <= q.numerator <= INT64_MAX:
        return None
    return q.numerator


def quantity_int(value: object, what: str = "quantity") -> int:
    """Like :func:`quantity_as_int64`, but a fractional or out-of-range value is an error too (for
    counts that must be whole numbers: GPUs, MIG instances, quota limits)."""
    n = quantity_as_int64(value, what)
    if n is None:
        raise ProtocolError(f"{what}: {value!r} is not an integer")
    return n

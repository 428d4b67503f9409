"""Go standard-library string behaviours HAMi's texts and parsers depend on, hand-written because no
Python library reproduces them byte for byte: ``strconv.Quote`` (the ``%q`` verb in HAMi's error
messages), ``strings.TrimSpace`` (``unicode.IsSpace``, which differs from ``str.strip``), and
``strconv.ParseBool`` / ``strconv.ParseInt(s, 10, 64)``."""

from __future__ import annotations

import re

# unicode.IsSpace: '\t', '\n', '\v', '\f', '\r', ' ', U+0085 (NEL), U+00A0 (NBSP), and the other
# White_Space code points. Python's str.isspace also counts U+001C..U+001F, which Go does not.
_GO_SPACE = frozenset("\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                      "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}

_DECIMAL = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: Go rejects "1_000" and non-ASCII digits
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_SHORT_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                  "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def trim_space(s: str) -> str:
    """``strings.TrimSpace``."""
    start, end = 0, len(s)
    while start < end and s[start] in _GO_SPACE:
        start += 1
    while end > start and s[end - 1] in _GO_SPACE:
        end -= 1
    return s[start:end]


def quote(s: str) -> str:
    """``strconv.Quote`` (Go's ``%q`` of a string): printable runes as they are (``unicode.IsPrint``,
    approximated by ``str.isprintable``, which uses the same Unicode categories), the short escapes,
    ``\\xNN`` below U+0080, ``\\uNNNN`` / ``\\UNNNNNNNN`` above."""
    out = ['"']
    for ch in s:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def parse_bool(s: str) -> bool | None:
    """``strconv.ParseBool``: the value, or None where Go returns an error."""
    return _GO_BOOLS.get(s)


def parse_int64(s: str) -> int | None:
    """``strconv.ParseInt(s, 10, 64)``: the value, or None where Go returns an error (syntax or range)."""
    if not _DECIMAL.fullmatch(s) or len(s) > 40:
        return None
    value = int(s)
    return value if INT64_MIN <= value <= INT64_MAX else None

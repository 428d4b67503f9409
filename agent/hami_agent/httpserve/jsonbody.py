"""Request bodies as JSON, with the answers a client can act on: empty, malformed, too deep → 400.

``json.loads`` recurses once per nesting level and raises ``RecursionError`` near 1,000 levels (a
``[`` × 100,000 body); Kubernetes objects nest about 15 levels deep (managedFields' ``fieldsV1``
mirrors the object, a few more). We refuse more than ``MAX_DEPTH`` levels before parsing, and treat a
``RecursionError`` that still happens as the same refusal.

``RepeatedArray``: kube-scheduler sends the same ``NodeNames`` array (88 KiB at 5,000 nodes) on every
/filter and /prioritize; parsing it again cost more than the decision itself. The array is parsed once and
reused while it comes back byte-identical, with a check that makes the result always the one
``json.loads`` gives for the whole body (see ``RepeatedArray.parse``)."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from hami_agent.httpserve.model import HTTPError

MAX_DEPTH = 100

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def too_deep(raw: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """True when the JSON text nests arrays/objects more than ``max_depth`` levels (brackets inside
    strings do not count)."""
    # Fast path, C speed: fewer opening brackets than the limit cannot nest deeper than it. A
    # kube-scheduler ExtenderArgs with 5,000 node names has a handful; only odd bodies pay the scan.
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    depth = 0
    for tok in _BRACKET.findall(_STRING.sub(b"", raw)):
        if tok in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # Python accepts NaN/Infinity; Go and RFC 8259 do not


class RepeatedArray:
    """The array value of one top-level key (``NodeNames``) that repeats byte for byte across bodies:
    parsed once, then reused. Thread-safe (the last array is one tuple, replaced whole).

    How a body is parsed (``parse``): find ``"<key>": [`` (a hint only); take the array's text, the
    previous one when the body continues with it byte for byte (a memcmp), else up to the first ``]``,
    parsed alone; parse the body with that text replaced by the marker ``["#",NaN]``, whose ``NaN``
    becomes a sentinel object. The result is used only when exactly one ``NaN`` was parsed and it is
    the second element of the top-level ``<key>`` value. Then the marker stood where a value may stand,
    outside any string (inside one, its ``"`` would end the string and ``#`` is no JSON); the array's
    text is a complete value too, so putting it back gives the body, and ``json.loads`` of the body
    equals the result with that array's value in the marker's place. Any other case (a miss, a failed
    parse, another encoding than UTF-8) answers None: the caller parses the whole body, which also gives
    the very error ``json.loads`` gives."""

    _MARKER = b'["#",NaN]'

    def __init__(self, key: str) -> None:
        self.key = key
        self._find = re.compile(rb'"' + re.escape(key.encode()) + rb'"[ \t\n\r]*:[ \t\n\r]*\[')
        self._last: tuple[bytes, list, int] | None = None  # the array's text, value and brackets
        self._lock = threading.Lock()  # only for the counters
        self.hits = 0  # bodies whose array was the previous one (tests, benchmarks)
        self.misses = 0

    def parse(self, raw: bytes, max_depth: int = MAX_DEPTH) -> Any | None:
        """``json.loads(raw)`` (constants refused) when the array could be set aside and ``raw`` has
        no more opening brackets than ``max_depth`` (``too_deep``'s fast path, without counting the
        reused array again), else None."""
        if json.detect_encoding(raw) != "utf-8":  # the split below is at ASCII bytes of UTF-8 text
            return None
        m = self._find.search(raw)
        if m is None:
            return None
        start = m.end() - 1
        last = self._last
        if last is not None and raw.startswith(last[0], start):
            text, value, brackets = last
            hit = True
        else:
            end = raw.find(b"]", start) + 1
            if end == 0:
                return None
            text = raw[start:end]
            brackets = text.count(b"[") + text.count(b"{")
            if brackets > max_depth:
                return None
            try:
                value = json.loads(text.decode("utf-8", "surrogatepass"), parse_constant=_reject_constant)
            except (ValueError, RecursionError):  # a "]" inside a string, or not JSON at all
                return None
            hit = False
        rest = start + len(text)
        if (brackets + raw.count(b"[", 0, start) + raw.count(b"{", 0, start) + raw.count(b"[", rest)
                + raw.count(b"{", rest)) > max_depth:
            return None  # perhaps too deep: the caller's full check decides
        sentinel = object()
        seen: list[str] = []

        def constant(name: str) -> Any:
            seen.append(name)
            return sentinel

        try:
            out = json.loads(raw[:start] + self._MARKER + raw[rest:], parse_constant=constant)
        except (ValueError, RecursionError):
            return None
        got = out.get(self.key) if type(out) is dict else None
        if len(seen) != 1 or type(got) is not list or len(got) != 2 or got[1] is not sentinel:
            return None
        out[self.key] = list(value)  # a copy: a caller may change its list, never the one reused
        if not hit:
            self._last = (text, value, brackets)
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1
        return out


def parse_json(raw: bytes, what: str, max_depth: int = MAX_DEPTH,
               repeated: RepeatedArray | None = None) -> Any:
    """Parse ``raw`` or raise ``HTTPError(400)`` naming ``what`` (e.g. ``/filter ExtenderArgs``).
    ``repeated``: an array value that repeats across bodies, parsed once (``RepeatedArray``)."""
    if not raw or raw.isspace():
        raise HTTPError(400, f"{what}: empty request body; send a JSON object")
    if repeated is not None:
        out = repeated.parse(raw, max_depth)
        if out is not None:
            return out
    if too_deep(raw, max_depth):
        raise HTTPError(400, f"{what}: JSON nested more than {max_depth} levels deep; "
                             "send the object kube-scheduler or the API server sends")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise HTTPError(400, f"{what}: JSON nested too deeply to parse") from None
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"{what}: body is not UTF-8 JSON ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise HTTPError(400, f"malformed JSON body for {what}: {exc}") from None

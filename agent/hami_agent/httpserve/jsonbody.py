"""Request bodies as JSON, with the answers a client can act on: empty, malformed, too deep → 400.

``json.loads`` recurses once per nesting level and raises ``RecursionError`` near 1,000 levels (a
``[`` × 100,000 body); Kubernetes objects nest about 15 levels deep (managedFields' ``fieldsV1``
mirrors the object, a few more). We refuse more than ``MAX_DEPTH`` levels before parsing, and treat a
``RecursionError`` that still happens as the same refusal."""

from __future__ import annotations

import json
import re
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


def parse_json(raw: bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw`` or raise ``HTTPError(400)`` naming ``what`` (e.g. ``/filter ExtenderArgs``)."""
    if not raw or raw.isspace():
        raise HTTPError(400, f"{what}: empty request body; send a JSON object")
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

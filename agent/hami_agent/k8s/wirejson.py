"""JSON as the API server sends it, decoded by orjson, with the result ``json.loads`` gives.

Why not the standard library alone: kube-apiserver's objects are large (a pod with its defaults and
``managedFields`` 5-8 KB, a GPU node with its images 12-15 KB) and the extender decodes about fifteen of
them per scheduled pod (watch events of two pod watches and the node watch, answers it reads). orjson
(https://github.com/ijl/orjson) decodes them ~2.4x faster than ``json``'s C decoder (a 12.8 KB node:
113 -> 47 µs on the development machine; docs/performance.md).

orjson refuses some text ``json`` accepts: lone surrogates in ``\\u`` escapes, ``NaN``/``Infinity``, numbers
beyond a float's range, UTF-16/32 text. Those fall back to ``json.loads``, and text neither accepts raises
``json``'s own ``ValueError`` (``orjson.JSONDecodeError`` is one). One result differs: an integer outside
[-2**63, 2**64) decodes to a float, where ``json`` gives an int. The API server never sends one in the
objects the agent reads (their integers are Go int32/int64 fields), and Kubernetes' own decoding of
unstructured JSON does the same (k8s.io/apimachinery ``pkg/util/json``: int64, else float64)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)

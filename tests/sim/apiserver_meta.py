"""ObjectMeta validation of the simulated API server: label keys and values, annotation keys and size.

The real server validates every object's metadata on create and update (kubernetes/apimachinery
``pkg/api/validation/objectmeta.go`` ``ValidateObjectMeta`` -> ``ValidateLabels``, ``ValidateAnnotations``)
and refuses the whole write with 422 Invalid. Without this the simulator would accept a label value of
more than 63 characters (a long node name in ``hami.io/vgpu-node``) that the real server refuses.
Messages follow ``k8s.io/apimachinery/pkg/util/validation/validation.go``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.sim.apiserver_store import ApiError, ResourceType

Obj = dict[str, Any]

LABEL_VALUE_MAX = 63
TOTAL_ANNOTATION_SIZE_LIMIT_B = 256 * (1 << 10)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE_FMT = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
                    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
                    "'my_value',  or '12345', regex used for validation is "
                    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
_QUALIFIED_NAME_FMT = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
                       "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
                       "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def _qualified_name_errors(key: str) -> list[str]:
    """``IsQualifiedName``: an optional DNS-subdomain prefix and ``/``, then a name part of 1-63."""
    prefix, _, name = key.rpartition("/") if "/" in key else ("", "", key)
    errs = []
    if "/" in key:
        if not prefix:
            errs.append("prefix part must be non-empty")
        elif len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            errs.append("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                        "characters, '-' or '.', and must start and end with an alphanumeric character")
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > LABEL_VALUE_MAX:
        errs.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.fullmatch(name):
        errs.append(_QUALIFIED_NAME_FMT)
    return errs


def object_meta_errors(meta: Obj) -> list[tuple[str, str]]:
    """(field, message) for each problem in ``meta``'s labels and annotations, as the real server words
    them (``metadata.labels: Invalid value: "...": must be no more than 63 characters``)."""
    out: list[tuple[str, str]] = []
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    for key, raw in labels.items() if isinstance(labels, dict) else ():
        for msg in _qualified_name_errors(str(key)):
            out.append(("metadata.labels", f"metadata.labels: Invalid value: {json.dumps(key)}: {msg}"))
        value = "" if raw is None else str(raw)
        if len(value) > LABEL_VALUE_MAX:
            out.append(("metadata.labels", f"metadata.labels: Invalid value: {json.dumps(value)}: "
                        "must be no more than 63 characters"))
        elif not _LABEL_VALUE.fullmatch(value):
            out.append(("metadata.labels", f"metadata.labels: Invalid value: {json.dumps(value)}: "
                        f"{_LABEL_VALUE_FMT}"))
    total = 0
    for key, value in annotations.items() if isinstance(annotations, dict) else ():
        for msg in _qualified_name_errors(str(key).lower()):
            out.append(("metadata.annotations", f"metadata.annotations: Invalid value: {json.dumps(key)}: "
                        f"{msg}"))
        total += len(str(key)) + len("" if value is None else str(value))
    if total > TOTAL_ANNOTATION_SIZE_LIMIT_B:
        out.append(("metadata.annotations", "metadata.annotations: Too long: may not be more than "
                    f"{TOTAL_ANNOTATION_SIZE_LIMIT_B} bytes"))
    return out


def validate_object_meta(rt: ResourceType, old: Obj | None, new: Obj, subresource: str | None) -> None:
    """A ``Store.on_write`` hook: 422 Invalid, nothing written, when the new object's metadata is
    invalid (creates and every update, status writes included, as on the real server)."""
    meta = new.get("metadata") or {}
    errors = object_meta_errors(meta)
    if not errors:
        return
    name = meta.get("name", "")
    kind = rt.kind if not rt.group else f"{rt.kind}.{rt.group}"
    # an aggregate of several errors is bracketed (apimachinery util/errors aggregate.Error())
    text = errors[0][1] if len(errors) == 1 else "[" + ", ".join(m for _, m in errors) + "]"
    raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}',
                   {"name": name, "kind": rt.plural,
                    "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errors]})

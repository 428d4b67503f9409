"""Hypothesis strategies shared by the fuzz suites: arbitrary JSON, and structured mutations of a valid
request (one field anywhere in it replaced by arbitrary JSON, or removed)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

json_leaf = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=24))
json_value = st.recursive(
    json_leaf, lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4), max_leaves=12)

# values the scheduler's parsers read from annotations and resources: near-valid strings hurt most
quantity_text = st.sampled_from(["1", "0", "-1", "1.5", "1e3", "100Mi", "3Gi", "", " ", "0x10", "1/2",
                                 "99999999999999999999", "NaN", "1,000", "☃"]) | st.text(max_size=12)


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indexes) into a JSON value, the root included."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*prefix, i))
    return out


def mutate(template: Any, path: tuple, op: str, value: Any) -> Any:
    """A copy of ``template`` with ``path`` replaced by ``value`` (op ``replace``) or removed (``delete``)."""
    if not path:
        return value
    doc = copy.deepcopy(template)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if op == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw: Any, template: Any, values: Any = json_value) -> Any:
    path = draw(st.sampled_from(paths(template)))
    op = draw(st.sampled_from(["replace", "replace", "delete"])) if path else "replace"
    return mutate(template, path, op, draw(values))

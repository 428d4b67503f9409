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


# Names the API server would never accept (issue 27 item 5): lone UTF-16 surrogates (``quote()`` in the API
# path builder raised on them: a 500), control and non-ASCII characters, upper case, and names longer than
# the DNS-1123 limits (a namespace is a label: at most 63; pod and node names subdomains: at most 253).
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
bad_name = st.one_of(
    st.tuples(st.text("abc-", max_size=8), surrogate, st.text("abc", max_size=8)).map("".join),
    st.tuples(st.text("abc", max_size=8), st.characters(max_codepoint=0x1F) | st.characters(
        min_codepoint=0x80, max_codepoint=0x10FFFF, exclude_categories=("Cs",)), st.text("xyz", max_size=4))
    .map("".join),
    st.integers(min_value=64, max_value=70).map(lambda n: "n" * n),
    st.integers(min_value=254, max_value=4096).map(lambda n: "n" * n),
    st.sampled_from(["UPPER", "a..b", "-a", "a-", ".a", "a.", "a b", "a/b", "a%2fb", "..", "a_b"]),
)
# bytes that are not UTF-8 at all: the JSON body carries them raw inside the name's string
non_utf8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80",
                            b"\x80abc", b"n\xfe"])

"""``hami_agent.k8s.wirejson.loads``: orjson's speed, ``json.loads``'s results and errors. Compared against
``json.loads`` on generated JSON (every kind of value the API server sends, and the text orjson refuses),
so a later orjson that decodes something differently fails here, not in a cluster."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_agent.k8s import wirejson

pytestmark = pytest.mark.unit

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
TEXT = st.text()  # includes lone surrogates (json.dumps escapes them; orjson refuses them: the fallback)
SCALARS = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False) | TEXT
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(TEXT, inner, max_size=5), max_leaves=40)


def _same(a: object, b: object) -> bool:
    """Equal, with the types and float signs ``==`` overlooks (1 == 1.0, -0.0 == 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans(), st.sampled_from([None, 1]))
def test_decodes_what_json_decodes(value: object, ascii_only: bool, indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    for data in (text, text.encode("utf-8", "surrogatepass")):
        expected = json.loads(data)
        assert _same(wirejson.loads(data), expected), data


@pytest.mark.parametrize("text", [
    '"\\ud800"',  # a lone surrogate: orjson refuses it
    "NaN", "[Infinity, -Infinity]", "1e400",  # constants and overflow: orjson refuses them
    '{"a": 1, "a": 2}',  # the last duplicate wins in both
    "-0.0", "18446744073709551615", "-9223372036854775808",
])
def test_text_orjson_refuses_or_treats_apart_decodes_as_json_does(text: str) -> None:
    expected = json.loads(text)
    got = wirejson.loads(text.encode())
    assert repr(got) == repr(expected)


def test_utf16_text_falls_back_to_json() -> None:
    data = json.dumps({"kind": "Pod"}).encode("utf-16")
    assert wirejson.loads(data) == {"kind": "Pod"}


@pytest.mark.parametrize("text", ["", "{", '{"a":}', "[1,]", "\ufeff{}", "nul"])
def test_invalid_text_raises_value_error_as_json_does(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        wirejson.loads(text)


def test_utf8_bytes_with_a_byte_order_mark_decode_as_json_decodes_them() -> None:
    data = "\ufeff{}".encode()
    assert wirejson.loads(data) == json.loads(data) == {}


def test_the_one_documented_difference_an_integer_beyond_64_bits_becomes_a_float() -> None:
    # kube-apiserver never sends one in the agent's objects; apimachinery's unstructured decoding also
    # gives float64 here. If orjson ever changes this, the docstring and this test change with it.
    assert wirejson.loads(b"18446744073709551616") == float(2**64)
    assert json.loads(b"18446744073709551616") == 2**64

"""The NodeNames fast path of the body parser (``httpserve.jsonbody.RepeatedArray``) answers exactly what
``json.loads`` of the whole body answers (value, or the same 400), whatever the bodies and their order."""

from __future__ import annotations

import json
import random

import pytest

from hami_agent.httpserve.jsonbody import RepeatedArray, parse_json
from hami_agent.httpserve.model import HTTPError


def _plain(raw: bytes) -> tuple[str, str]:
    """What the parser answers without the fast path: ("ok", repr of the value) or ("400", message)."""
    try:
        return "ok", repr(parse_json(raw, "t"))
    except HTTPError as exc:
        return "400", str(exc)


def _fast(raw: bytes, rep: RepeatedArray) -> tuple[str, str]:
    try:
        return "ok", repr(parse_json(raw, "t", repeated=rep))
    except HTTPError as exc:
        return "400", str(exc)


def _body(pod: dict, names: list[str], sep: str = ":", tail: str = "") -> bytes:
    arr = json.dumps(names)
    return ('{"Pod":' + json.dumps(pod) + ',"Nodes":null,"NodeNames"' + sep + arr + tail + "}").encode()


NAMES = [f"gpu-node-{i:05d}" for i in range(300)]
POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u-1"}, "spec": {"containers": []}}


def test_repeated_array_is_reused_and_equal() -> None:
    rep = RepeatedArray("NodeNames")
    for j in range(5):
        pod = {**POD, "metadata": {**POD["metadata"], "name": f"p-{j}"}}
        raw = _body(pod, NAMES)
        assert _fast(raw, rep) == _plain(raw)
    assert (rep.misses, rep.hits) == (1, 4)


def test_reused_list_is_a_copy() -> None:
    rep = RepeatedArray("NodeNames")
    raw = _body(POD, NAMES)
    first = parse_json(raw, "t", repeated=rep)
    first["NodeNames"].append("changed by a caller")
    again = parse_json(raw, "t", repeated=rep)
    assert again["NodeNames"] == NAMES and rep.hits == 1


@pytest.mark.parametrize("raw", [
    b'{"Pod":{"a":"\\"NodeNames\\": [\\"x\\"]"},"NodeNames":["x"]}',  # the key inside a string first
    b'{"Pod":{},"NodeNames":["x"],"NodeNames":["y"]}',  # duplicate key: the last wins
    b'{"Pod":{},"NodeNames":["x"],"NodeNames":["y","z"]}',  # ... with as many elements as the marker
    b'{"Pod":{},"NodeNames":["x"],"NodeNames":NaN}',  # a constant elsewhere: refused
    b'{"Pod":{},"NodeNames":[NaN]}',
    b'{"Pod":{},"NodeNames":["a]b"]}',  # "]" inside a name: no fast path
    b'{"Pod":{},"NodeNames":["\\u0067pu"]}',  # escapes
    b'{"Pod":{},"NodeNames" \t:\r\n ["x" , "y"\n]}',  # whitespace
    b'{"Pod":{},"NodeNames":[]}',
    b'{"Pod":{},"NodeNames":[["x"]]}',
    b'{"Pod":{},"NodeNames":["x"]',  # truncated
    b'{"Pod":{},"NodeNames":["x"]}}',
    b'{"Pod":{"x":"NodeNames\\":["},"NodeNames":["x"]}',
    b'["NodeNames":["x"]]',
    b'"NodeNames":["x"]',
    b'{"Pod":{},"nodenames":["x"]}',
    b'{"Pod":{},"NodeNames":["\xff"]}',  # not UTF-8
    b'\xef\xbb\xbf{"Pod":{},"NodeNames":["x"]}',  # a BOM
    '{"Pod":{},"NodeNames":["x"]}'.encode("utf-16"),
    b'{"Pod":{"k":"\xc3\xa9"},"NodeNames":["\xc3\xa9"]}',
    # many brackets, in the array and out of it: deep enough to refuse, or only many
    b'{"Pod":' + b"[" * 60 + b"]" * 60 + b',"NodeNames":[' + b'{"a":' * 50 + b"1" + b"}" * 50 + b"]}",
    b'{"Pod":' + b"[" * 101 + b"]" * 101 + b',"NodeNames":["x"]}',
    b'{"Pod":{},"NodeNames":[' + b'{"a":' * 101 + b"1" + b"}" * 101 + b"]}",
])
def test_odd_bodies_after_a_cached_array(raw: bytes) -> None:
    rep = RepeatedArray("NodeNames")
    for warm in (b'{"Pod":{},"NodeNames":["x"]}', b'{"Pod":{},"NodeNames":["x", "y"\n]}',
                 b'{"Pod":{},"NodeNames":["\\u0067pu"]}', b'{"Pod":{},"NodeNames":[["x"]]}',
                 b'{"Pod":{},"NodeNames":[' + b'{"a":' * 50 + b"1" + b"}" * 50 + b"]}"):
        parse_json(warm, "t", repeated=rep)  # a previous array that a hit may reuse
        assert _fast(raw, rep) == _plain(raw)
        assert _fast(raw, rep) == _plain(raw)  # and again, with the array (if any) cached from ``raw``


_ALPHABET = b'[]{}",:\\ \n\tabxyNn0123456789-.eEu\xc3\xa9\xff'


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    op = rng.random()
    i = rng.randrange(len(b) + 1)
    if op < 0.4 and i < len(b):
        b[i] = rng.choice(_ALPHABET)
    elif op < 0.7:
        b[i:i] = bytes([rng.choice(_ALPHABET)])
    elif i < len(b):
        del b[i]
    return bytes(b)


def test_fuzz_against_json_loads() -> None:
    """Bodies in a sequence: mostly the same array (some byte-identical, some one byte apart, longer or
    shorter, escaped, re-spaced), each mutated at random; every answer equals the plain parser's."""
    rng = random.Random(18)
    rep = RepeatedArray("NodeNames")
    names = NAMES[:40]
    variants = [
        lambda: _body(POD, names),
        lambda: _body(POD, names[:-1]),
        lambda: _body(POD, [*names, "extra-node"]),
        lambda: _body(POD, names, sep=" : "),
        lambda: _body(POD, names, tail=',"x":1'),
        lambda: _body(POD, [n.replace("g", "\\u0067") for n in names]).replace(b"\\\\u", b"\\u"),
        lambda: _body(POD, names).replace(b'", "', b'","'),
        lambda: _body({**POD, "s": 'NodeNames": ["gpu-node-00000"'}, names),
    ]
    agree = 0
    variant = variants[0]
    for _ in range(3000):
        if rng.random() < 0.2:  # runs of the same array, as kube-scheduler sends them
            variant = rng.choice(variants)
        raw = variant()
        for _k in range(rng.choice((0, 0, 0, 1, 1, 2, 3))):
            # the array is most of the body: most mutations land in it, where a wrong reuse would hide
            raw = _mutate(rng, raw)
        assert _fast(raw, rep) == _plain(raw), raw
        agree += 1
    assert agree == 3000 and rep.hits > 300 and rep.misses > 50

"""MIG allocation annotation (§6.7) and node pair-score annotation (§1.3)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_agent.protocol import MigPlacement, ProtocolError
from hami_agent.protocol.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami_agent.protocol.score import LINK_SCORES, decode_pair_scores, encode_pair_scores

pytestmark = pytest.mark.unit


def test_mig_allocations_round_trip_with_and_without_runtime_fields():
    planned = MigAllocation(0, 0, "GPU-a", "3g.48gb", MigPlacement(4, 4))
    created = MigAllocation(1, 0, "GPU-a", "1g.12gb", MigPlacement(0, 1), "MIG-x", 5, 0)
    text = encode_mig_allocations([planned, created])
    data = json.loads(text)
    assert data[0] == {"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-a", "profile": "3g.48gb",
                       "placement": {"start": 4, "size": 4}}
    runtime = (data[1]["migUUID"], data[1]["gpuInstanceID"], data[1]["computeInstanceID"])
    assert runtime == ("MIG-x", 5, 0)
    assert decode_mig_allocations(text) == [planned, created]
    assert decode_mig_allocations("") == [] and decode_mig_allocations("null") == []


@pytest.mark.parametrize("value, quoted", [
    ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g","placement":{"start":0,"size":1},'
     '"migUUID":"MIG-x"}]', "all present or all absent"),
    ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g","placement":{"start":0,"size":1}},'
     '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-b","profile":"1g","placement":{"start":1,"size":1}}]',
     "appears twice"),
    ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g"}]', "'placement'"),
    ('[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g","placement":{"start":0,"size":1}}]',
     "-1"),
    ('{"a":1}', "{'a': 1}"),
    ("[", "'['"),
])
def test_mig_allocations_rejects(value, quoted):
    with pytest.raises(ProtocolError) as err:
        decode_mig_allocations(value)
    assert quoted in str(err.value)


def test_pair_scores_round_trip_and_table():
    scores = {"GPU-a": {"GPU-b": 200}, "GPU-b": {"GPU-a": 200}}
    text = encode_pair_scores(scores)
    assert text == '[{"uuid":"GPU-a","score":{"GPU-b":200}},{"uuid":"GPU-b","score":{"GPU-a":200}}]'
    assert decode_pair_scores(text) == scores
    assert LINK_SCORES["SameBoard"] == 60 and LINK_SCORES["CrossCPU"] == 10
    with pytest.raises(ProtocolError, match="'x'"):
        decode_pair_scores('[{"uuid":"GPU-a","score":{"GPU-b":"x"}}]')


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_decoders_never_crash(value):
    for decoder in (decode_mig_allocations, decode_pair_scores):
        try:
            decoder(value)
        except ProtocolError:
            pass

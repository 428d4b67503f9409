"""Property tests: encode→decode round trips, and no input crashes a decoder (only ProtocolError)."""

from __future__ import annotations

import string
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_agent.protocol import (
    ContainerDevice,
    MigPlacement,
    MigProfile,
    NodeDevice,
    ProtocolError,
    decode_node_devices,
    decode_pod_devices,
    encode_node_devices,
    encode_node_devices_legacy,
    encode_pod_devices,
    gen_reason,
    parse_reason,
    parse_scoring_weights,
)
from hami_agent.protocol.handshake import parse_handshake
from hami_agent.protocol.nodelock import format_lock_value, parse_lock_value
from hami_agent.protocol.quantity import parse_quantity

pytestmark = pytest.mark.unit
SETTINGS = settings(max_examples=200, deadline=None)

int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
text_field = st.text(alphabet=st.characters(blacklist_characters=",:;", blacklist_categories=("Cs",)),
                     max_size=20)
any_text = st.text(max_size=60)
k8s_name = st.text(alphabet=string.ascii_lowercase + string.digits + "-.", min_size=1, max_size=30)

placements = st.builds(MigPlacement, start=int32, size=int32)
profiles = st.builds(MigProfile, name=st.text(max_size=10), memory_mb=int32, core=int32, slice_count=int32,
                     placements=st.lists(placements, max_size=3).map(tuple))
node_devices = st.builds(
    NodeDevice, id=st.text(max_size=20), index=st.integers(0, 2**63), count=int32, devmem=int32,
    devcore=int32, type=st.text(max_size=20), numa=st.integers(-(2**63), 2**63 - 1),
    mode=st.text(max_size=10), health=st.booleans(), mig_profiles=st.lists(profiles, max_size=2).map(tuple))
legacy_devices = st.builds(
    NodeDevice, id=text_field.filter(bool), index=st.integers(0, 2**32), count=int32, devmem=int32,
    devcore=int32, type=text_field, numa=st.integers(-1000, 1000), mode=text_field, health=st.booleans())
container_devices = st.builds(ContainerDevice, uuid=text_field, type=text_field, usedmem=int32,
                              usedcores=int32)


@SETTINGS
@given(st.lists(node_devices, max_size=4))
def test_node_devices_json_round_trip(devices):
    assert decode_node_devices(encode_node_devices(devices)) == devices


@SETTINGS
@given(st.lists(legacy_devices, min_size=1, max_size=4))
def test_node_devices_legacy_round_trip(devices):
    # a legacy record whose id is empty would be an empty-looking segment only if all fields were empty
    assert decode_node_devices(encode_node_devices_legacy(devices)) == devices


@SETTINGS
@given(st.lists(st.lists(container_devices.filter(lambda d: d.uuid), max_size=3), max_size=4))
def test_pod_devices_round_trip(containers):
    assert decode_pod_devices(encode_pod_devices(containers)) == containers


@SETTINGS
@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 1, 1),
                    timezones=st.just(timezone.utc)), k8s_name, k8s_name)
def test_lock_value_round_trip(when, ns, name):
    v = parse_lock_value(format_lock_value(when, ns, name))
    assert (v.when, v.namespace, v.name) == (when.replace(microsecond=0), ns, name)


@SETTINGS
@given(st.dictionaries(st.text(alphabet=string.ascii_letters, min_size=1, max_size=12), st.integers(0, 99),
                       max_size=6), st.integers(0, 99))
def test_reason_round_trip(reasons, total):
    assert parse_reason(gen_reason(reasons, total)) == reasons


@SETTINGS
@given(any_text | st.sampled_from(["[", "[{}]", "null", "[null]", '[{"migProfiles":[1]}]', "::", "a,b:"]))
def test_node_devices_decoder_never_crashes(value):
    try:
        result = decode_node_devices(value)
    except ProtocolError:
        return
    assert all(isinstance(d, NodeDevice) for d in result)


@SETTINGS
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
                        st.sampled_from(["id", "count", "health", "migProfiles", "placements", "x"]), kids,
                        max_size=3), max_leaves=10))
def test_node_devices_decoder_never_crashes_on_json_shapes(obj):
    import json

    try:
        text = json.dumps(obj)
    except ValueError:
        return
    try:
        decode_node_devices(text)
    except ProtocolError:
        pass


@SETTINGS
@given(any_text)
def test_other_decoders_never_crash(value):
    for decoder in (decode_pod_devices, parse_lock_value, parse_reason, parse_handshake,
                    parse_scoring_weights, parse_quantity):
        try:
            decoder(value)
        except ProtocolError:
            pass


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=4000, max_value=6000), st.sampled_from([
    "GPU-a,NVIDIA,{d},1:", "GPU-a,{d},1,100,T,0,true:", "{d}/2 CardNotHealth", "slot={d},core=1,memory=1",
    "{d}", '[{{"id":"a","count":{d}}}]']))
def test_huge_numbers_are_protocol_errors_not_crashes(digits, template):
    value = template.format(d="9" * digits)
    for decoder in (decode_pod_devices, decode_node_devices, parse_reason, parse_scoring_weights,
                    parse_quantity):
        try:
            decoder(value)
        except ProtocolError:
            pass


@SETTINGS
@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 1, 1)))
def test_handshake_round_trips(when):
    from hami_agent.protocol import handshake as hs

    assert hs.parse_handshake(hs.format_requesting(when)).when == when.replace(microsecond=0)
    assert hs.parse_handshake(hs.format_deleted(when)).when == when.replace(microsecond=0)
    aware = when.replace(tzinfo=timezone.utc)
    assert hs.parse_handshake(hs.format_reported(aware)).when == aware

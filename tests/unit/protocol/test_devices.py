"""Node register annotation and pod device strings: golden vectors (Project-HAMi/HAMi
pkg/device/devices.go and its devices_test.go)."""

from __future__ import annotations

import json

import pytest

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
    pod_devices_remaining,
)

pytestmark = pytest.mark.unit

CD = ContainerDevice


# ---------------------------------------------------------------- node devices, JSON

def test_golden_register_json_from_hami_tests_decodes():
    value = ('[{"id":"GPU-0","count":5,"devmem":8192,"devcore":100,"type":"NVIDIA-Tesla P4",'
             '"numa":0,"health":true,"index":0}]')
    assert decode_node_devices(value) == [
        NodeDevice(id="GPU-0", index=0, count=5, devmem=8192, devcore=100, type="NVIDIA-Tesla P4",
                   numa=0, mode="", health=True)]


def test_encode_uses_omitempty_and_field_order():
    d = NodeDevice(id="GPU-0", index=0, count=5, devmem=8192, devcore=100, type="NVIDIA-Tesla P4",
                   numa=0, mode="hami-core", health=True)
    assert encode_node_devices([d]) == (
        '[{"id":"GPU-0","count":5,"devmem":8192,"devcore":100,"type":"NVIDIA-Tesla P4",'
        '"mode":"hami-core","health":true}]')


def test_golden_register_json_from_logs_round_trips_byte_identical():
    value = ('[{"id":"GPU-4f02...","count":100,"devmem":32768,"devcore":100,'
             '"type":"NVIDIA-NVIDIA GeForce RTX 3070","mode":"hami-core","health":true}]')
    devices = decode_node_devices(value)
    assert devices[0].type == "NVIDIA-NVIDIA GeForce RTX 3070"
    assert devices[0].count == 100 and devices[0].health is True
    assert encode_node_devices(devices) == value


def test_nonzero_index_numa_and_unhealthy():
    d = NodeDevice(id="GPU-b", index=3, count=10, devmem=1000, devcore=100, type="NVIDIA-A100", numa=1,
                   mode="hami-core", health=False)
    out = json.loads(encode_node_devices([d]))
    assert out == [{"id": "GPU-b", "index": 3, "count": 10, "devmem": 1000, "devcore": 100,
                    "type": "NVIDIA-A100", "numa": 1, "mode": "hami-core"}]
    assert "health" not in out[0]  # false is omitted
    assert decode_node_devices(encode_node_devices([d])) == [d]


def test_mig_profiles_json_shape_and_round_trip():
    p = MigProfile(name="1g.12gb", memory_mb=12288, core=15, slice_count=1,
                   placements=(MigPlacement(0, 1), MigPlacement(6, 1)), instance_count=7)
    d = NodeDevice(id="GPU-m", count=7, devmem=97871, devcore=100, type="NVIDIA-NVIDIA H20", mode="mig",
                   health=True, mig_profiles=(p,))
    text = encode_node_devices([d])
    obj = json.loads(text)[0]
    assert obj["migProfiles"] == [{"name": "1g.12gb", "memoryMB": 12288, "core": 15, "sliceCount": 1,
                                   "placements": [{"start": 0, "size": 1}, {"start": 6, "size": 1}]}]
    assert list(obj) == ["id", "count", "devmem", "devcore", "type", "mode", "migProfiles", "health"]
    back = decode_node_devices(text)
    assert back == [d]
    assert back[0].mig_profiles[0].instance_count == 0  # not serialized


def test_go_html_escaping_matches_go_marshal():
    d = NodeDevice(id="GPU-<x>&", type="NVIDIA-é")
    text = encode_node_devices([d])
    assert text == '[{"id":"GPU-\\u003cx\\u003e\\u0026","type":"NVIDIA-é"}]'
    assert decode_node_devices(text)[0].id == "GPU-<x>&"


def test_go_field_names_decode_case_insensitively():
    value = ('[{"ID":"GPU-1","Index":2,"Count":10,"Devmem":100,"Devcore":100,"Type":"NVIDIA-T4",'
             '"Health":true}]')
    assert decode_node_devices(value) == [NodeDevice(id="GPU-1", index=2, count=10, devmem=100, devcore=100,
                                                     type="NVIDIA-T4", health=True)]


def test_unknown_json_fields_ignored_and_null_is_empty():
    assert decode_node_devices('[{"id":"GPU-1","devicevendor":"NVIDIA","custominfo":{"a":1}}]') == [
        NodeDevice(id="GPU-1")]
    assert decode_node_devices("null") == []
    assert decode_node_devices("[]") == []
    assert encode_node_devices([]) == "[]"


# ---------------------------------------------------------------- node devices, legacy text

def test_golden_legacy_7_field_text():
    value = ("GPU-0055...,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
             "GPU-0fc3...,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:")
    devices = decode_node_devices(value)
    assert [d.id for d in devices] == ["GPU-0055...", "GPU-0fc3..."]
    assert devices[0] == NodeDevice(id="GPU-0055...", index=0, count=10, devmem=32768, devcore=100,
                                    type="NVIDIA-Tesla V100-PCIE-32GB", numa=0, mode="hami-core", health=True)


def test_legacy_9_field_round_trip():
    devs = [NodeDevice(id="GPU-a", index=1, count=10, devmem=100, devcore=100, type="NVIDIA-A", numa=1,
                       mode="mps", health=False)]
    text = encode_node_devices_legacy(devs)
    assert text == "GPU-a,10,100,100,NVIDIA-A,1,false,1,mps:"
    assert decode_node_devices(text) == devs


def test_legacy_go_parsebool_and_empty_segments():
    devices = decode_node_devices("::GPU-a,1,2,3,T,0,1::GPU-b,1,2,3,T,0,F:")
    assert [d.health for d in devices] == [True, False]


@pytest.mark.parametrize("value, quoted", [
    ("GPU-a,1,2,3", "GPU-a,1,2,3"),  # no ':' and not JSON
    ("GPU-a,1,2,3,T,0,true,1:", "GPU-a,1,2,3,T,0,true,1"),  # 8 fields
    ("GPU-a,x,2,3,T,0,true:", "'x'"),
    ("GPU-a,1,2,3,T,0,yes:", "'yes'"),
    ("GPU-a,1,99999999999,3,T,0,true:", "'99999999999'"),
    ('[{"id":1}]', "1"),
    ('[{"id":"a","count":1.5}]', "1.5"),
    ('[{"id":"a","count":true}]', "True"),
    ('[{"id":"a","health":"true"}]', "'true'"),
    ('{"id":"a"}', "{'id': 'a'}"),
    ('[1]', "1"),
    ('[{"id":"a"', '[{"id":"a"'),
    ("", "empty"),
    ('[{"id":"a","index":-1}]', "-1"),
    ('[{"id":"a","migProfiles":[{"name":"x","placements":[{"start":"0"}]}]}]', "'0'"),
])
def test_node_devices_decoder_rejects_and_quotes(value, quoted):
    with pytest.raises(ProtocolError) as err:
        decode_node_devices(value)
    assert quoted in str(err.value)


def test_legacy_encoder_refuses_separators():
    with pytest.raises(ProtocolError, match="separator"):
        encode_node_devices_legacy([NodeDevice(id="GPU-a", type="NVIDIA,A")])


def test_encoder_refuses_int32_overflow():
    with pytest.raises(ProtocolError, match="int32"):
        encode_node_devices([NodeDevice(id="GPU-a", devmem=2**31)])


# ---------------------------------------------------------------- pod device strings

@pytest.mark.parametrize("value, expected", [
    ("GPU-aaa,NVIDIA,3000,50:;GPU-bbb,NVIDIA,4000,60:;",
     [[CD("GPU-aaa", "NVIDIA", 3000, 50)], [CD("GPU-bbb", "NVIDIA", 4000, 60)]]),
    (";;GPU-main1,NVIDIA,2000,50:;", [[], [], [CD("GPU-main1", "NVIDIA", 2000, 50)]]),
    (";GPU-aaa,NVIDIA,3000,50:GPU-bbb,NVIDIA,3000,50:;GPU-aaa,NVIDIA,4000,60:;",
     [[], [CD("GPU-aaa", "NVIDIA", 3000, 50), CD("GPU-bbb", "NVIDIA", 3000, 50)],
      [CD("GPU-aaa", "NVIDIA", 4000, 60)]]),
    (";", [[]]),
    (";;", [[], []]),
    ("", []),
])
def test_pod_devices_golden_both_directions(value, expected):
    assert decode_pod_devices(value) == expected
    assert encode_pod_devices(expected) == value


def test_pod_devices_without_trailing_semicolon_and_extra_fields():
    assert decode_pod_devices("GPU-a,NVIDIA,1,2") == [[CD("GPU-a", "NVIDIA", 1, 2)]]
    assert decode_pod_devices("GPU-a,NVIDIA,1,2,extra:;") == [[CD("GPU-a", "NVIDIA", 1, 2)]]


@pytest.mark.parametrize("value, quoted", [
    ("GPU-a,NVIDIA,3000:;", "GPU-a,NVIDIA,3000"),
    ("GPU-a,NVIDIA,lots,50:;", "'lots'"),
    (";GPU-a,NVIDIA,1,1.5:;", "'1.5'"),
])
def test_pod_devices_decoder_rejects_and_quotes(value, quoted):
    with pytest.raises(ProtocolError) as err:
        decode_pod_devices(value)
    assert quoted in str(err.value)


def test_pod_devices_encoder_refuses_separators():
    with pytest.raises(ProtocolError):
        encode_pod_devices([[CD("GPU-a;", "NVIDIA", 1, 1)]])


def test_pod_devices_remaining_tracks_vendor_word():
    assert pod_devices_remaining(decode_pod_devices(";GPU-a,NVIDIA,1,1:;"))
    assert not pod_devices_remaining(decode_pod_devices(";;"))

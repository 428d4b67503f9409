"""module_utils._hami: decoding HAMi node annotations (Project-HAMi/HAMi pkg/device/devices.go)."""

from __future__ import annotations

import datetime

import pytest
from ansible_collections.hami.node.plugins.module_utils import _hami

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 11, 21, 12, 0, 0, tzinfo=datetime.timezone.utc)


def test_register_json_defaults_omitted_fields():
    value = (
        '[{"id":"GPU-a","count":10,"devmem":97871,"devcore":100,"type":"NVIDIA-NVIDIA H20",'
        '"mode":"hami-core","health":true},{"id":"GPU-b","index":1,"numa":1,"count":10,"devmem":97871,'
        '"devcore":100,"type":"NVIDIA-NVIDIA H20"}]'
    )
    devs = _hami.decode_register(value)
    assert devs[0]["index"] == 0 and devs[0]["numa"] == 0 and devs[0]["health"] is True
    assert devs[1]["index"] == 1 and devs[1]["health"] is False and devs[1]["mode"] == "hami-core"


def test_register_legacy_text():
    value = (
        "GPU-0055,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        "GPU-0fc3,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,false,1,mig:"
    )
    devs = _hami.decode_register(value)
    assert [(d["id"], d["health"], d["index"], d["mode"]) for d in devs] == [
        ("GPU-0055", True, 0, "hami-core"),
        ("GPU-0fc3", False, 1, "mig"),
    ]
    with pytest.raises(_hami.DecodeError, match="has 3 fields"):
        _hami.decode_register("a,b,c:")
    with pytest.raises(_hami.DecodeError, match="neither JSON"):
        _hami.decode_register("garbage")


def test_handshake_states_and_age():
    hs = _hami.decode_handshake("Requesting_2026-11-21 11:59:00", NOW)
    assert hs == {"state": "requesting", "time": "2026-11-21T11:59:00Z", "age_s": 60.0}
    assert _hami.decode_handshake("Deleted_2026-11-21 11:00:00", NOW)["age_s"] == 3600.0
    rep = _hami.decode_handshake("Reported 2026-11-21 11:59:30.43 +0000 UTC m=+1104711.77", NOW)
    assert rep["state"] == "reported" and rep["age_s"] == 30.0
    assert _hami.decode_handshake(None, NOW)["state"] == "absent"
    assert _hami.decode_handshake("Requesting_2024.01.23 04:30:04", NOW)["state"] == "requesting"


def test_lock_stale_and_fresh():
    fresh = _hami.decode_lock("2026-11-21T11:58:00Z,default,train-0", NOW)
    assert fresh["namespace"] == "default" and fresh["pod"] == "train-0" and not fresh["stale"]
    stale = _hami.decode_lock("2026-11-21T11:50:00+00:00,ns,p", NOW)
    assert stale["stale"] and stale["age_s"] == 600
    legacy = _hami.decode_lock("2026-11-21T11:00:00Z", NOW)
    assert legacy["pod"] is None and legacy["stale"]
    with pytest.raises(_hami.DecodeError, match="bad timestamp"):
        _hami.decode_lock("yesterday,ns,p", NOW)


def test_cordon_roundtrip_and_summary():
    assert _hami.decode_cordon("GPU-a, GPU-b,") == ["GPU-a", "GPU-b"]
    assert _hami.encode_cordon([]) is None
    node = {
        "metadata": {
            "name": "n",
            "resourceVersion": "7",
            "annotations": {
                "hami.io/node-handshake": "Requesting_2026-11-21 11:59:50",
                "hami.io/mutex.lock": "bad",
                "hami.io/node-nvidia-register": "[",
                "other/x": "y",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "80"}},
    }
    s = _hami.summarize(node, NOW)
    assert set(s["annotations"]) == {
        "hami.io/node-handshake",
        "hami.io/mutex.lock",
        "hami.io/node-nvidia-register",
    }
    assert s["register_error"] and s["lock_error"] and s["handshake"]["age_s"] == 10.0
    assert s["allocatable_gpus"] == "80"

"""Node lock, handshake, reasons, keys: golden vectors (Project-HAMi/HAMi pkg/device/devices.go,
pkg/util/nodelock/nodelock.go, pkg/device/nvidia/device.go)."""

from __future__ import annotations

import ast
import pathlib
from datetime import datetime, timedelta, timezone

import pytest

from hami_agent import protocol
from hami_agent.protocol import ProtocolError, gen_reason, keys, parse_reason
from hami_agent.protocol import handshake as hs
from hami_agent.protocol import reasons as rs
from hami_agent.protocol.nodelock import NodeLockValue, format_lock_value, parse_lock_value
from hami_agent.protocol.timefmt import format_go_duration

pytestmark = pytest.mark.unit
UTC = timezone.utc


# ---------------------------------------------------------------- node lock

def test_lock_value_golden_both_directions():
    when = datetime(2024, 1, 23, 4, 30, 4, tzinfo=UTC)
    assert format_lock_value(when, "default", "pod-a") == "2024-01-23T04:30:04Z,default,pod-a"
    assert parse_lock_value("2024-01-23T04:30:04Z,default,pod-a") == NodeLockValue(when, "default", "pod-a")


def test_lock_value_with_offset_and_fraction():
    v = parse_lock_value("2024-01-23T12:30:04.123+08:00,ns,p")
    assert v.when == datetime(2024, 1, 23, 4, 30, 4, 123000, tzinfo=UTC)
    assert format_lock_value(datetime(2024, 1, 23, 12, 30, 4, tzinfo=timezone(timedelta(hours=8))), "ns",
                             "p") == "2024-01-23T12:30:04+08:00,ns,p"


def test_legacy_bare_timestamp_has_no_owner():
    v = parse_lock_value("2024-01-23T04:30:04Z")
    assert v.namespace == "" and v.name == "" and not v.has_owner
    assert not v.owned_by("", "")


def test_lock_expiry_and_ownership():
    v = parse_lock_value("2024-01-23T04:30:04Z,ns,p")
    assert v.owned_by("ns", "p") and not v.owned_by("ns", "q")
    assert not v.expired(v.when + timedelta(minutes=5))
    assert v.expired(v.when + timedelta(minutes=5, seconds=1))


@pytest.mark.parametrize("value", ["", "yesterday,ns,p", "2024-01-23T04:30:04Z,ns", "2024-01-23T04:30:04Z,,p",
                                   "2024-01-23 04:30:04,ns,p", "2024-13-23T04:30:04Z,ns,p",
                                   "2024-01-23T04:30:04Z,ns,p,extra"])
def test_lock_value_rejects_and_quotes(value):
    with pytest.raises(ProtocolError) as err:
        parse_lock_value(value)
    msg = str(err.value)
    # the whole value, or the offending time part, is quoted
    assert repr(value) in msg or repr(value.split(",")[0]) in msg


def test_format_lock_value_rejects_bad_owner():
    with pytest.raises(ProtocolError):
        format_lock_value(datetime.now(UTC), "a,b", "p")


# ---------------------------------------------------------------- handshake

def test_requesting_golden_both_directions():
    when = datetime(2024, 1, 23, 4, 30, 4)
    assert hs.format_requesting(when) == "Requesting_2024-01-23 04:30:04"
    h = hs.parse_handshake("Requesting_2024-01-23 04:30:04")
    assert (h.kind, h.when) == (hs.KIND_REQUESTING, when)
    assert hs.is_requesting("Requesting_2024-01-23 04:30:04")


def test_v24_dotted_layout_and_deleted():
    assert hs.parse_handshake("Requesting_2024.01.23 04:30:04").when == datetime(2024, 1, 23, 4, 30, 4)
    d = hs.parse_handshake("Deleted_2024-01-23 04:30:04")
    assert d.kind == hs.KIND_DELETED
    assert hs.format_deleted(d.when) == "Deleted_2024-01-23 04:30:04"


def test_legacy_reported_go_time_string():
    h = hs.parse_handshake("Reported 2024-01-23 04:30:04.43 +0000 UTC m=+1104711.77")
    assert h.kind == hs.KIND_REPORTED
    assert h.when == datetime(2024, 1, 23, 4, 30, 4, 430000, tzinfo=UTC)
    assert hs.format_reported(h.when) == "Reported 2024-01-23 04:30:04.43 +0000 UTC"
    cst = timezone(timedelta(hours=8), "CST")
    expected = "Reported 2024-01-23 12:00:00 +0800 CST"
    assert hs.format_reported(datetime(2024, 1, 23, 12, 0, tzinfo=cst)) == expected
    assert hs.parse_handshake("Reported 2024-01-23 12:00:00 +0800 CST").when == datetime(2024, 1, 23, 4, 0,
                                                                                           tzinfo=UTC)


def test_missing_and_other_values():
    assert hs.parse_handshake(None).kind == hs.KIND_MISSING
    assert hs.parse_handshake("").kind == hs.KIND_MISSING
    assert hs.parse_handshake("whatever").kind == hs.KIND_OTHER
    assert not hs.is_requesting(None)


@pytest.mark.parametrize("value", ["Requesting_soon", "Deleted_2024-01-23", "Reported yesterday"])
def test_handshake_bad_time_rejected_with_quote(value):
    with pytest.raises(ProtocolError) as err:
        hs.parse_handshake(value)
    assert value.split("_")[-1].split(" ", 1)[-1] in str(err.value)


# ---------------------------------------------------------------- reasons

def test_reason_golden_both_directions():
    text = "1/2 CardInsufficientMemory, 1/2 CardTypeMismatch"
    assert gen_reason({"CardTypeMismatch": 1, "CardInsufficientMemory": 1}, 2) == text
    assert parse_reason(text) == {"CardInsufficientMemory": 1, "CardTypeMismatch": 1}


def test_reasons_sort_as_whole_strings_like_hami():
    expected = "10/12 CardCordoned, 2/12 CardNotHealth"
    assert gen_reason({"CardNotHealth": 2, "CardCordoned": 10}, 12) == expected


def test_parse_reason_rejects_and_quotes():
    with pytest.raises(ProtocolError, match="'1 of 2 CardTypeMismatch'"):
        parse_reason("1 of 2 CardTypeMismatch")
    with pytest.raises(ProtocolError, match="total 3"):
        parse_reason("1/2 CardTypeMismatch, 1/3 CardNotHealth")
    assert parse_reason("") == {}


def test_all_18_reason_constants_exact_spelling():
    assert rs.ALL_REASONS == (
        "CardTypeMismatch", "CardUuidMismatch", "CardTimeSlicingExhausted", "CardComputeUnitsExhausted",
        "CardInsufficientMemory", "CardInsufficientCore", "CardNotHealth", "CardCordoned", "NumaNotFit",
        "ExclusiveDeviceAllocateConflict", "CardNotFoundCustomFilterRule", "CardMigTopologyInfeasible",
        "NodeInsufficientDevice", "AllocatedCardsInsufficientRequest", "NodeUnfitPod", "NodeFitPod",
        "ResourceQuotaNotFit", "ModeNotFit")
    assert len(set(rs.ALL_REASONS)) == 18


# ---------------------------------------------------------------- keys and misc

def test_annotation_keys_exact():
    assert keys.NODE_REGISTER == "hami.io/node-nvidia-register"
    assert keys.NODE_HANDSHAKE == "hami.io/node-handshake"
    assert keys.NODE_LOCK == "hami.io/mutex.lock"
    assert keys.DEVICE_CORDON == "hami.io/device-cordon"
    assert keys.VGPU_NODE == "hami.io/vgpu-node"
    assert keys.DEVICES_TO_ALLOCATE == "hami.io/vgpu-devices-to-allocate"
    assert keys.DEVICES_ALLOCATED == "hami.io/vgpu-devices-allocated"
    assert keys.BIND_PHASE == "hami.io/bind-phase"
    assert keys.BIND_PHASES == ("allocating", "success", "failed")
    assert keys.mig_resource_name("3g.48gb") == "nvidia.com/mig-3g.48gb"
    assert keys.mig_profile_from_resource("nvidia.com/mig-1g.12gb") == "1g.12gb"
    assert keys.mig_profile_from_resource("nvidia.com/gpu") is None


@pytest.mark.parametrize("seconds, text", [(30, "30s"), (5, "5s"), (90, "1m30s"), (0.5, "500ms"),
                                           (3600, "1h0m0s"), (0, "0s"), (300, "5m0s")])
def test_go_duration_format(seconds, text):
    assert format_go_duration(seconds) == text


def test_protocol_imports_nothing_else_of_ours():
    pkg = pathlib.Path(protocol.__file__).parent
    for path in pkg.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hami_agent"):
                assert node.module.startswith("hami_agent.protocol"), (path.name, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("hami_agent") or alias.name.startswith(
                        "hami_agent.protocol"), (path.name, alias.name)

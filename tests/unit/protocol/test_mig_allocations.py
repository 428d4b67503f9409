"""``hami.io/vgpu-mig-allocations`` decoding follows HAMi's DecodeMigAllocations
(Project-HAMi/HAMi pkg/device/nvidia/mig_allocations.go:79-112)."""

from __future__ import annotations

import pytest

from hami_agent.protocol import ProtocolError
from hami_agent.protocol.mig import decode_mig_allocations, encode_mig_allocations

pytestmark = pytest.mark.unit

BASE = '"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.10gb"'


def test_a_zero_size_placement_is_incomplete():
    # mig_allocations.go:89: Placement.Size == 0 -> "MIG allocation %d is incomplete" (it used to decode)
    with pytest.raises(ProtocolError, match="incomplete"):
        decode_mig_allocations(f'[{{{BASE},"placement":{{"start":6,"size":0}}}}]')


def test_an_empty_mig_uuid_counts_as_absent():
    # mig_allocations.go:93: only a non-empty migUUID is a runtime field
    (a,) = decode_mig_allocations(f'[{{{BASE},"placement":{{"start":6,"size":1}},"migUUID":""}}]')
    assert not a.has_runtime
    with pytest.raises(ProtocolError, match="all present or all absent"):
        decode_mig_allocations(f'[{{{BASE},"placement":{{"start":6,"size":1}},"migUUID":"MIG-x"}}]')


def test_placements_are_uint32_and_round_trip():
    with pytest.raises(ProtocolError, match="between 0 and 4294967295"):
        decode_mig_allocations(f'[{{{BASE},"placement":{{"start":4294967296,"size":1}}}}]')
    raw = (f'[{{{BASE},"placement":{{"start":6,"size":1}},"migUUID":"MIG-x","gpuInstanceID":0,'
           '"computeInstanceID":0}]')
    assert encode_mig_allocations(decode_mig_allocations(raw)) == raw

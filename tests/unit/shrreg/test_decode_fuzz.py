"""Property tests: arbitrary bytes, damaged headers and truncations never crash the decoder."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_agent.shrreg.layout import LAYOUTS, MAGIC, RegionFormatError
from hami_agent.shrreg.reader import decode_region
from tests.unit.shrreg.builder import MIB, build

pytestmark = pytest.mark.unit

BASES = {
    name: build(name, ndev=2, slots=[(10, 100, 1, [MIB, 2 * MIB]), (11, 0, 2, [0, 3 * MIB])])
    for name in LAYOUTS
}


def _decode_or_format_error(buf: bytes, size: int):
    try:
        return decode_region(buf, size, "fuzz")
    except RegionFormatError as exc:
        assert "fuzz" in str(exc)
        return None


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=64), size=st.integers(min_value=0, max_value=3_000_000))
def test_random_short_buffers(data, size):
    _decode_or_format_error(data, size)


@settings(max_examples=100, deadline=None)
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    patches=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2_008_984), st.binary(min_size=1, max_size=16)),
        max_size=12,
    ),
    header=st.tuples(st.sampled_from([MAGIC, 0, -1, 12345]), st.integers(0, 5), st.integers(0, 5)),
)
def test_patched_real_layouts(layout, patches, header):
    buf = bytearray(BASES[layout])
    for off, raw in patches:
        if off < len(buf):
            buf[off : off + len(raw)] = raw[: len(buf) - off]
    struct.pack_into("<iII", buf, 0, *header)
    r = _decode_or_format_error(bytes(buf), len(buf))
    if r is not None:
        assert 0 <= len(r.procs) <= 1024
        assert all(0 <= d < 16 for d in r.device_indices())
        r.to_dict()
        for d in r.device_indices():
            r.used_bytes(d)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    cut=st.integers(min_value=0, max_value=2_008_985),
    claimed=st.booleans(),
)
def test_truncations(layout, cut, claimed):
    buf = BASES[layout][:cut]
    # claimed: the file size says "big" but the read returned fewer bytes (file shrank mid-read)
    size = len(BASES[layout]) if claimed else len(buf)
    r = _decode_or_format_error(buf, size)
    if r is not None:
        assert len(buf) >= LAYOUTS[r.layout].size


def test_wild_proc_num_and_device_num_are_flagged_corrupt_and_slots_not_decoded():
    buf = bytearray(build("v1.2", slots=[(5, 0, 1, [MIB])]))
    lay = LAYOUTS["v1.2"]
    struct.pack_into("<i", buf, lay.off_proc_num, -7)
    struct.pack_into("<Q", buf, lay.off_device_num, 1 << 40)
    r = decode_region(bytes(buf), len(buf), "x")
    assert r.procs == () and any("proc_num -7" in w for w in r.warnings)
    assert any("device_num" in w for w in r.warnings)
    assert r.corrupt
    # a proc_num past 1024 is noise: decoding 1024 slots of it (the old clamp) cost up to a minute of
    # seqlock retries on a random body and exported garbage metrics
    struct.pack_into("<Q", buf, lay.off_device_num, 1)
    struct.pack_into("<i", buf, lay.off_proc_num, 99999)
    r = decode_region(bytes(buf), len(buf), "x")
    assert r.corrupt and r.procs == ()
    struct.pack_into("<i", buf, lay.off_proc_num, 1)
    r = decode_region(bytes(buf), len(buf), "x")
    assert not r.corrupt and len(r.procs) == 1

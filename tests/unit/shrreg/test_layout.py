import struct

import pytest

from hami_agent.shrreg.layout import LAYOUTS, MAGIC, RegionFormatError, detect_layout

pytestmark = pytest.mark.unit


def head(flag=MAGIC, a=1, b=2):
    return struct.pack("<iII", flag, a, b)


@pytest.mark.parametrize(
    "name,size,procs,proc_num,slot",
    [
        ("v0b", 1197896, 1848, 1197880, 1168),
        ("v1.1", 2008952, 1856, 2008896, 1960),
        ("v1.1-transient", 2008984, 1888, 2008928, 1960),
        ("v1.2", 2008952, 1856, 2008896, 1960),
    ],
)
def test_documented_offsets(name, size, procs, proc_num, slot):
    lay = LAYOUTS[name]
    assert (lay.size, lay.off_procs, lay.off_proc_num, lay.slot_size) == (size, procs, proc_num, slot)
    assert lay.off_procs + 1024 * lay.slot_size == lay.off_proc_num
    assert lay.slot_struct().size == lay.slot_size


def test_v12_and_transient_specifics():
    v12, t = LAYOUTS["v1.2"], LAYOUTS["v1.1-transient"]
    assert (v12.s_seqlock, v12.off_sem_postinit, v12.s_status) == (1936, 2008920, 1928)
    assert (t.s_seqlock, t.off_sem_postinit, t.off_device_num, t.s_status) == (8, 56, 88, 1936)
    assert LAYOUTS["v1.1"].s_seqlock is None and LAYOUTS["v0b"].off_last_kernel_time is None


@pytest.mark.parametrize(
    "size,hdr,expected",
    [
        (2008953, head(a=1, b=2), "v1.2"),
        (2008953, head(a=1, b=1), "v1.1"),
        (2008985, head(a=1, b=1), "v1.1-transient"),
        (2008985, head(a=1, b=2), "v1.2"),
        (2008953, head(a=1, b=3), "v1.2"),
        (1197897, head(a=0, b=0), "v0b"),
        (1500000, head(a=7, b=9), "v0b"),  # +4/+8 are sm_init_flag/owner_pid in v0b, not versions
    ],
)
def test_detection(size, hdr, expected):
    assert detect_layout(size, hdr)[0].name == expected


@pytest.mark.parametrize(
    "size,hdr,needle",
    [
        (0, b"", "too short"),
        (2008953, head(flag=0), "not initialised"),
        (2008953, head(flag=1234), "magic flag not matched: expected 19920718"),
        (2008953, head(a=2, b=0), "expected major version 1"),
        (804681, head(), "v0a"),
        (1000, head(), "expected at least 1197896 bytes"),
    ],
)
def test_detection_errors_name_what_was_expected(size, hdr, needle):
    with pytest.raises(RegionFormatError) as ei:
        detect_layout(size, hdr, "/x/r.cache")
    assert needle in str(ei.value) and "/x/r.cache" in str(ei.value)

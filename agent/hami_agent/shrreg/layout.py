"""Byte layouts of HAMi-core's shared region (``cudevshr.cache``) and how to tell them apart.

Offsets are the x86-64/aarch64 glibc ABI of the C structs (Project-HAMi/HAMi-core
``src/multiprocess/multiprocess_memory_limit.h`` and its history; docs/shrreg.md); they are
data, not code, so one decoder serves every variant. Detection follows the reference's rule:
magic first, then file size, then the header version (v0b files have no version fields).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 19920718
MAX_DEVICES = 16
MAX_PROCS = 1024
UUID_LEN = 96
SEM_SIZE = 32

# The version this agent writes nothing with, but knows best: HAMi-core HEAD.
AGENT_MAJOR = 1
AGENT_MINOR = 2

V0B = "v0b"
V11 = "v1.1"
V11_TRANSIENT = "v1.1-transient"
V12 = "v1.2"


class RegionFormatError(ValueError):
    """The bytes are not a shared region this tool understands; the message says what was expected."""


@dataclass(frozen=True)
class Layout:
    name: str
    size: int  # sizeof(shared_region_t): mmap length and lockf length
    has_version: bool
    off_sm_init_flag: int
    off_owner_pid: int
    off_sem: int
    off_sem_postinit: int | None  # None: no such semaphore in this layout
    off_device_num: int
    off_uuids: int
    off_limit: int
    off_sm_limit: int
    off_procs: int
    slot_size: int
    s_used: int
    s_used_stride: int  # 40 (v0b: 5 x u64) or 64 (v1: + unused[3])
    s_monitorused: int
    s_util: int
    s_util_stride: int  # 24 (v0b) or 48 (v1)
    s_status: int
    s_seqlock: int | None
    off_proc_num: int
    off_last_kernel_time: int | None
    hamiv: str  # HAMi releases that ship it, for messages

    @property
    def off_utilization_switch(self) -> int:
        return self.off_proc_num + 4

    @property
    def off_recent_kernel(self) -> int:
        return self.off_proc_num + 8

    @property
    def off_priority(self) -> int:
        return self.off_proc_num + 12

    def slot_offset(self, index: int) -> int:
        return self.off_procs + self.slot_size * index

    def slot_struct(self) -> struct.Struct:
        """One unpack for a whole slot: pid, hostpid, used, monitorused, device_util, status, seqlock."""
        return _slot_struct(self)


def _v1(name: str, *, transient: bool, seqlock: bool, hamiv: str) -> Layout:
    shift = 32 if transient else 0  # transient inserts sem_postinit (32 B) at +56
    return Layout(
        name=name,
        size=2008952 + shift,
        has_version=True,
        off_sm_init_flag=12,
        off_owner_pid=16,
        off_sem=24,
        off_sem_postinit=56 if transient else (2008920 if seqlock else None),
        off_device_num=56 + shift,
        off_uuids=64 + shift,
        off_limit=1600 + shift,
        off_sm_limit=1728 + shift,
        off_procs=1856 + shift,
        slot_size=1960,
        s_used=16 if transient else 8,
        s_used_stride=64,
        s_monitorused=1040 if transient else 1032,
        s_util=1168 if transient else 1160,
        s_util_stride=48,
        s_status=1936 if transient else 1928,
        s_seqlock=8 if transient else (1936 if seqlock else None),
        off_proc_num=2008896 + shift,
        off_last_kernel_time=2008912 + shift,
        hamiv=hamiv,
    )


LAYOUTS: dict[str, Layout] = {
    V0B: Layout(
        name=V0B,
        size=1197896,
        has_version=False,
        off_sm_init_flag=4,
        off_owner_pid=8,
        off_sem=16,
        off_sem_postinit=None,
        off_device_num=48,
        off_uuids=56,
        off_limit=1592,
        off_sm_limit=1720,
        off_procs=1848,
        slot_size=1168,
        s_used=8,
        s_used_stride=40,
        s_monitorused=648,
        s_util=776,
        s_util_stride=24,
        s_status=1160,
        s_seqlock=None,
        off_proc_num=1197880,
        off_last_kernel_time=None,
        hamiv="HAMi v2.4.0",
    ),
    # v1.1's trailer is `unused[4]`; a v1.2 library reads it as sem_postinit, so we decode it as such
    # (all zero on files a v1.1 library created) but never call it a v1.1 feature.
    V11: _v1(V11, transient=False, seqlock=False, hamiv="HAMi v2.4.1 .. v2.8.0"),
    V11_TRANSIENT: _v1(V11_TRANSIENT, transient=True, seqlock=True, hamiv="HAMi v2.8.1"),
    V12: _v1(V12, transient=False, seqlock=True, hamiv="HAMi v2.8.2 and later"),
}
# v1.1 files carry a trailer at the same place as v1.2's sem_postinit; keep its offset for decoding.
V11_TRAILER = 2008920

MIN_V0B = LAYOUTS[V0B].size
MIN_V1 = LAYOUTS[V12].size
MIN_TRANSIENT = LAYOUTS[V11_TRANSIENT].size
V0A_SIZE = 804680


_SLOT_STRUCTS: dict[str, struct.Struct] = {}


def _slot_struct(layout: Layout) -> struct.Struct:
    cached = _SLOT_STRUCTS.get(layout.name)
    if cached is not None:
        return cached
    words_mem = layout.s_used_stride // 8
    words_util = layout.s_util_stride // 8
    fmt = "<ii"
    pos = 8
    if layout.s_seqlock == 8:
        fmt += "Q"
        pos += 8
    assert pos == layout.s_used
    fmt += "Q" * (words_mem * MAX_DEVICES) + "Q" * MAX_DEVICES + "Q" * (words_util * MAX_DEVICES)
    fmt += "i4x"
    pos = layout.s_status + 8
    if layout.s_seqlock is not None and layout.s_seqlock > 8:
        assert layout.s_seqlock == pos
        fmt += "Q"
        pos += 8
    fmt += "x" * (layout.slot_size - pos)
    st = struct.Struct(fmt)
    assert st.size == layout.slot_size, (layout.name, st.size)
    _SLOT_STRUCTS[layout.name] = st
    return st


def detect_layout(
    file_size: int, head: bytes, path: str = "<region>"
) -> tuple[Layout, int | None, int | None]:
    """Pick the layout for a region file of ``file_size`` bytes whose first bytes are ``head``.

    Returns ``(layout, major, minor)`` (major/minor None for v0b). Raises RegionFormatError naming
    what was expected. ``head`` needs at least 12 bytes.
    """
    if file_size < 12 or len(head) < 12:
        raise RegionFormatError(
            f"{path}: file is {file_size} bytes, too short for a HAMi-core shared region (expected at "
            f"least {MIN_V0B} bytes; a region being created is written by the first CUDA process of the "
            "container)"
        )
    flag, w1, w2 = struct.unpack_from("<iII", head, 0)
    if flag != MAGIC:
        if flag == 0:
            raise RegionFormatError(
                f"{path}: magic flag not set (initialized_flag=0, expected {MAGIC}): the region is not "
                "initialised yet (half-written or never used by a CUDA process)"
            )
        raise RegionFormatError(
            f"{path}: cache file magic flag not matched: expected {MAGIC} (0x012FF74E) at offset 0, found "
            f"{flag}; not a HAMi-core shared region"
        )
    if file_size >= MIN_V1:
        major, minor = w1, w2
        if major != 1:
            raise RegionFormatError(
                f"{path}: unknown cache file size {file_size} version {major}.{minor}: expected major "
                "version 1 (HAMi-core layouts v1.1/v1.2)"
            )
        if minor == 1 and file_size >= MIN_TRANSIENT:
            return LAYOUTS[V11_TRANSIENT], major, minor
        if minor == 1:
            return LAYOUTS[V11], major, minor
        # 1.2 and any later 1.x: HAMi-core keeps newer minors byte-compatible with 1.2 so far.
        return LAYOUTS[V12], major, minor
    if file_size >= MIN_V0B:
        return LAYOUTS[V0B], None, None
    if file_size in (V0A_SIZE, V0A_SIZE + 1):
        raise RegionFormatError(
            f"{path}: {file_size} bytes is the pre-April-2024 'v0a' layout (no HAMi release); unsupported, "
            f"expected at least {MIN_V0B} bytes (v0b) or {MIN_V1} bytes (v1.x)"
        )
    raise RegionFormatError(
        f"{path}: unknown cache file size {file_size}: expected at least {MIN_V0B} bytes (v0b, HAMi "
        f"v2.4.0) or {MIN_V1} bytes (v1.1/v1.2); the file is truncated or foreign"
    )

"""Pure-Python region bytes for unit tests of analysis and decoding paths.

Byte compatibility with the C structs is proven by the integration tests against the C helper
(tests/shrreg/mkregion.c); this builder only saves unit tests from spawning processes.
"""

from __future__ import annotations

import struct

from hami_agent.shrreg.layout import LAYOUTS, MAGIC
from hami_agent.shrreg.reader import postinit_offset

MIB = 1 << 20


def uuid_for(i: int) -> str:
    return "GPU-%08x-0000-4000-8000-%012x" % (0xABC00000 + i, i)


def sem_bytes(value: int, private: int = 128) -> bytes:
    return struct.pack("<Qi", value, private) + bytes(20)


def build(
    layout: str = "v1.2",
    *,
    ndev: int = 1,
    limit_mib: int = 1024,
    sm_limit: int = 50,
    slots: list[tuple[int, int, int, list[int]]] = (),
    owner: int = 0,
    sem_value: int = 1,
    postinit_value: int | None = 1,
    proc_num: int | None = None,
    minor: int | None = None,
    seqlock_odd: tuple[int, ...] = (),
) -> bytes:
    lay = LAYOUTS[layout]
    buf = bytearray(lay.size + 1)
    struct.pack_into("<i", buf, 0, MAGIC)
    if lay.has_version:
        struct.pack_into("<II", buf, 4, 1, minor if minor is not None else (2 if layout == "v1.2" else 1))
    struct.pack_into("<Q", buf, lay.off_owner_pid, owner)
    buf[lay.off_sem : lay.off_sem + 32] = sem_bytes(sem_value)
    pi = postinit_offset(lay)
    if pi is not None and postinit_value is not None and layout != "v1.1":
        buf[pi : pi + 32] = sem_bytes(postinit_value)
    struct.pack_into("<Q", buf, lay.off_device_num, ndev)
    for d in range(ndev):
        raw = uuid_for(d).encode()
        buf[lay.off_uuids + 96 * d : lay.off_uuids + 96 * d + len(raw)] = raw
    for d in range(16):
        struct.pack_into("<Q", buf, lay.off_limit + 8 * d, limit_mib * MIB)
        struct.pack_into("<Q", buf, lay.off_sm_limit + 8 * d, sm_limit)
    for i, (pid, hostpid, status, used) in enumerate(slots):
        base = lay.slot_offset(i)
        struct.pack_into("<ii", buf, base, pid, hostpid)
        for d, n in enumerate(used):
            m = base + lay.s_used + lay.s_used_stride * d
            struct.pack_into("<QQQQQ", buf, m, 0, 0, n, 0, n)
            struct.pack_into("<Q", buf, base + lay.s_monitorused + 8 * d, n)
        struct.pack_into("<i", buf, base + lay.s_status, status)
        if i in seqlock_odd and lay.s_seqlock is not None:
            struct.pack_into("<Q", buf, base + lay.s_seqlock, 7)
    struct.pack_into("<iiii", buf, lay.off_proc_num, len(slots) if proc_num is None else proc_num, 1, 2, 1)
    if lay.off_last_kernel_time is not None:
        struct.pack_into("<Q", buf, lay.off_last_kernel_time, 1_700_000_000)
    return bytes(buf)

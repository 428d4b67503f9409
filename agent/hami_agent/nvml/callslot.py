"""The NVML call in progress, in memory the NVML worker and its parent share (issue 31).

The worker used to announce every NVML call on its stdout (a ``begin`` line) so the parent could hold
it to a deadline: about 75 lines per inventory of 8 GPUs, each waking two parent threads. Inside a batch
(an inventory, a usage sample) the worker now writes the call it is in to this slot instead and says
only that a batch started and ended; the parent reads the slot when a deadline may have passed, so it
still names the exact NVML function that hangs (seed 003) without a wakeup per call.

Layout (one 4 KiB ``memfd``, inherited by the worker as a file descriptor, never a path):

    u64 seq       even: stable; odd: the worker is rewriting the record (a seqlock)
    u64 k         the call's id; 0 when no call is in progress
    i64 start_ns  CLOCK_MONOTONIC when the call started (Python's ``time.monotonic_ns``, system-wide)
    f64 limit     the call's deadline in seconds
    64s fn        the NVML function's name, ASCII, NUL-padded

Only one worker thread writes the slot (the one running the batch). A reader retries a record caught
mid-rewrite and gives up after a few tries (a worker killed mid-write leaves ``seq`` odd: it is then no
longer running any call). A hung call leaves its record stable, so a stuck verdict is always read
from a consistent record.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

SIZE = 4096
_SEQ = struct.Struct("<Q")
_BODY = struct.Struct("<Qqd64s")
_BODY_AT = _SEQ.size
READ_TRIES = 100


@dataclass(frozen=True)
class SlotCall:
    k: int
    fn: str
    started: float  # time.monotonic() seconds
    limit: float


class CallSlot:
    def __init__(self, buf: mmap.mmap) -> None:
        self._buf = buf
        self._seq = 0

    @classmethod
    def create(cls) -> tuple[CallSlot, int] | None:
        """A new zeroed slot and the file descriptor to hand to the worker (``pass_fds``); None where
        ``memfd_create`` is not available (the worker then announces every call on its stdout)."""
        memfd_create = getattr(os, "memfd_create", None)
        if memfd_create is None:
            return None
        try:
            fd = memfd_create("hami-nvml-call", getattr(os, "MFD_CLOEXEC", 1))
        except OSError:
            return None
        try:
            os.ftruncate(fd, SIZE)
            buf = mmap.mmap(fd, SIZE)
        except OSError:
            os.close(fd)
            return None
        return cls(buf), fd

    @classmethod
    def attach(cls, fd: int) -> CallSlot:
        """The worker's side: map the descriptor its parent passed. Raises OSError/ValueError."""
        buf = mmap.mmap(fd, SIZE)
        os.close(fd)  # the mapping stays
        return cls(buf)

    # -- the worker (one writing thread)
    def publish(self, k: int, fn: str, limit: float) -> None:
        self._write(k, time.monotonic_ns(), limit, fn.encode("ascii", "replace")[:64])

    def clear(self) -> None:
        self._write(0, 0, 0.0, b"")

    def _write(self, k: int, start_ns: int, limit: float, fn: bytes) -> None:
        self._seq += 1
        _SEQ.pack_into(self._buf, 0, self._seq)  # odd: readers retry
        _BODY.pack_into(self._buf, _BODY_AT, k, start_ns, limit, fn)
        self._seq += 1
        _SEQ.pack_into(self._buf, 0, self._seq)

    # -- the parent
    def read(self) -> SlotCall | None:
        """The call in progress, or None (no call, or no consistent record after ``READ_TRIES``)."""
        for _ in range(READ_TRIES):
            before = _SEQ.unpack_from(self._buf, 0)[0]
            if before & 1:
                continue
            k, start_ns, limit, fn = _BODY.unpack_from(self._buf, _BODY_AT)
            if _SEQ.unpack_from(self._buf, 0)[0] != before:
                continue
            if k == 0:
                return None
            return SlotCall(k, fn.rstrip(b"\0").decode("ascii", "replace"), start_ns / 1e9, limit)
        return None

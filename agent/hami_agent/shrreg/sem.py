"""Operate on the process-shared ``sem_t`` that lives inside a mapped region, via glibc.

Why hand-written ctypes: the semaphores HAMi-core uses are unnamed POSIX semaphores embedded in
the mmapped file (``sem_init(&sem, 1, 1)``). Python's stdlib only has its own SemLock objects and
the ``posix_ipc`` package only opens *named* semaphores, so neither can act on a ``sem_t`` at an
arbitrary address. Calling glibc's own ``sem_timedwait``/``sem_post``/``sem_getvalue`` on the mapped
address uses exactly the futex protocol the CUDA processes use: a post wakes their sleeping
waiters immediately, which writing the bytes by hand would not.

``owner_pid`` is changed with a real compare-and-swap (``__atomic_compare_exchange_8`` from
libatomic) because HAMi-core's own dead-owner recovery CASes the same word; two recoverers must
never both win and both post (that would admit two lock holders).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import time
from contextlib import suppress


class SemError(OSError):
    """A semaphore operation failed; the message names the call and errno."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc: ctypes.CDLL | None = None
_libatomic: ctypes.CDLL | None | bool = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("sem_post", "sem_timedwait", "sem_getvalue", "sem_init"):
            getattr(lib, name).restype = ctypes.c_int
        lib.sem_post.argtypes = [ctypes.c_void_p]
        lib.sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]
        lib.sem_getvalue.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
        _libc = lib
    return _libc


def libatomic() -> ctypes.CDLL | None:
    """libatomic (gcc runtime), or None when the node lacks it."""
    global _libatomic
    if _libatomic is None:
        path = ctypes.util.find_library("atomic")
        try:
            lib = ctypes.CDLL(path or "libatomic.so.1")
            fn = getattr(lib, _CAS_SYMBOL)
            fn.restype = ctypes.c_bool
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
            _libatomic = lib
        except (OSError, AttributeError):
            _libatomic = False
    return _libatomic or None


_SEQ_CST = 5
_CAS_SYMBOL = "__atomic_compare_exchange_8"  # via getattr: a dunder name inside a class gets mangled


class MappedWord:
    """Address of a field inside an mmap; holds a buffer export, so call ``release()`` before close."""

    def __init__(self, mm: mmap.mmap, offset: int):
        self._anchor: ctypes.Array | None = (ctypes.c_char * 8).from_buffer(mm, offset)
        self.address = ctypes.addressof(self._anchor)

    def release(self) -> None:
        self._anchor = None

    def load_u64(self) -> int:
        return ctypes.c_uint64.from_address(self.address).value

    def store_u64(self, value: int) -> None:
        # One aligned 8-byte store (not a memcpy), like the C library's atomic store.
        ctypes.c_uint64.from_address(self.address).value = value

    def cas_u64(self, expected: int, desired: int) -> bool:
        """Atomically replace ``expected`` with ``desired``; False when the word had changed."""
        lib = libatomic()
        if lib is None:
            # Without libatomic we cannot CAS; the caller holds lockf, which excludes the old
            # libraries' fix-up path, and we re-check right before a single aligned store.
            if self.load_u64() != expected:
                return False
            self.store_u64(desired)
            return True
        exp = ctypes.c_uint64(expected)
        cas = getattr(lib, _CAS_SYMBOL)
        return bool(cas(self.address, ctypes.byref(exp), desired, _SEQ_CST, _SEQ_CST))


class SharedSemaphore:
    """A glibc ``sem_t`` at ``offset`` inside ``mm`` (a MAP_SHARED, writable mmap)."""

    def __init__(self, mm: mmap.mmap, offset: int):
        self._anchor: ctypes.Array | None = (ctypes.c_char * 32).from_buffer(mm, offset)
        self.address = ctypes.addressof(self._anchor)

    def release(self) -> None:
        self._anchor = None

    def value(self) -> int:
        v = ctypes.c_int(0)
        if libc().sem_getvalue(self.address, ctypes.byref(v)) != 0:
            e = ctypes.get_errno()
            raise SemError(e, f"sem_getvalue failed: errno={e}")
        return v.value

    def timed_acquire(self, timeout_s: float) -> bool:
        """``sem_timedwait`` with an absolute CLOCK_REALTIME deadline; False on timeout."""
        deadline = time.time() + max(0.0, timeout_s)
        ts = _Timespec(int(deadline), int((deadline - int(deadline)) * 1e9))
        while True:
            if libc().sem_timedwait(self.address, ctypes.byref(ts)) == 0:
                return True
            e = ctypes.get_errno()
            if e == errno.EINTR:
                continue
            if e == errno.ETIMEDOUT:
                return False
            raise SemError(e, f"sem_timedwait failed: errno={e}")

    def post(self) -> None:
        if libc().sem_post(self.address) != 0:
            e = ctypes.get_errno()
            raise SemError(e, f"sem_post failed: errno={e}")

    def reinit(self, value: int = 1) -> None:
        """``sem_init(pshared=1, value)``: only for a semaphore nobody can be waiting on."""
        if libc().sem_init(self.address, 1, value) != 0:
            e = ctypes.get_errno()
            raise SemError(e, f"sem_init failed: errno={e}")


def release_all(*objs: MappedWord | SharedSemaphore | None) -> None:
    for o in objs:
        if o is not None:
            with suppress(Exception):
                o.release()

"""A file whose reads never return, served by a tiny FUSE server: the faithful D-state model.

A real NVML hang is a thread inside an ``ioctl`` on ``/dev/nvidia*`` that the driver never completes: the
thread sleeps uninterruptibly (state ``D``), so SIGKILL is queued but the process cannot exit until the
driver returns. User space cannot put itself in that state, but the kernel's FUSE client does exactly
this to a reader once the FUSE server has *taken* the read request and not answered it: after a fatal
signal the reader waits in ``request_wait_answer()`` with ``wait_event()`` (uninterruptible) until the
server answers or the connection is aborted (Linux ``fs/fuse/dev.c``). gpusim's ``hang_file`` fault makes
a hung NVML call ``read()`` such a file, so a SIGKILLed worker really stays alive, in state ``D``, holding
its memory, until the test ``release()``s the reads ("the driver finally returns").

Needs ``/dev/fuse`` and the right to ``mount(2)`` (root, CAP_SYS_ADMIN); ``available()`` says whether this
machine can, and tests skip otherwise (the kill seam in ``hami_agent.nvml.reaper`` covers CI).

Hand-written protocol (about 150 lines) rather than libfuse/fusepy: neither is a dependency of this
project, and the server must *withhold* answers on purpose, which the libraries' blocking callback models
do only by blocking a thread per request. Opcodes and struct layouts: ``include/uapi/linux/fuse.h``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import struct
import threading
import time
from pathlib import Path

FUSE_LOOKUP, FUSE_FORGET, FUSE_GETATTR = 1, 2, 3
FUSE_OPEN, FUSE_READ, FUSE_STATFS, FUSE_RELEASE = 14, 15, 17, 18
FUSE_FLUSH, FUSE_INIT, FUSE_INTERRUPT, FUSE_DESTROY, FUSE_BATCH_FORGET = 25, 26, 36, 38, 42
FOPEN_DIRECT_IO = 1  # reads bypass the page cache: every read() reaches the server

_IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime *nsec mode nlink uid gid ...
ROOT_ID, FILE_ID = 1, 2
FILE_NAME = "hang"
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def available() -> str | None:
    """None when a FUSE file can be mounted here, else why not (for pytest.skip)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if os.geteuid() != 0:
        return "mounting a FUSE file system needs root (CAP_SYS_ADMIN)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened: {exc}"
    return None


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return lib


class HangingFile:
    """Mounts a FUSE file system at ``mountpoint`` with one file, ``hang``, whose reads are held."""

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = Path(mountpoint)
        self.path = self.mountpoint / FILE_NAME
        self._fd = -1
        self._thread: threading.Thread | None = None
        self._held: list[int] = []  # unique ids of READ requests we took and did not answer
        self._lock = threading.Lock()
        self._released = False
        self.readers: list[int] = []  # pids that entered the hanging read

    def __enter__(self) -> HangingFile:
        self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mount(self) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        opts = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if _libc().mount(b"gpusim-dstate", str(self.mountpoint).encode(), b"fuse", MS_NOSUID | MS_NODEV,
                         opts) != 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            self._fd = -1
            raise OSError(err, f"mount fuse at {self.mountpoint}: {os.strerror(err)}")
        self._thread = threading.Thread(target=self._serve, name="gpusim-dstate-fuse", daemon=True)
        self._thread.start()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def wait_held(self, n: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.held() < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def release(self) -> None:
        """Answer every held read with EIO ("the driver returns") and answer new reads at once."""
        with self._lock:
            self._released = True
            held, self._held = self._held, []
        for unique in held:
            self._reply(unique, -errno.EIO)

    def close(self) -> None:
        """Release the readers, then abort the connection and detach the mount (never blocks)."""
        if self._fd < 0:
            return
        self.release()
        _libc().umount2(str(self.mountpoint).encode(), MNT_DETACH)
        fd, self._fd = self._fd, -1
        os.close(fd)  # the last /dev/fuse descriptor: the kernel aborts anything still pending
        if self._thread is not None:
            self._thread.join(2.0)

    # ------------------------------------------------------------------------------------ server
    def _reply(self, unique: int, error: int = 0, payload: bytes = b"") -> None:
        try:
            os.write(self._fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(payload), error, unique) + payload)
        except OSError:
            pass  # ENOENT: the request was interrupted/aborted meanwhile; EBADF: closed

    def _attr(self, node: int) -> bytes:
        if node == ROOT_ID:
            mode, nlink, size = stat.S_IFDIR | 0o755, 2, 0
        else:
            mode, nlink, size = stat.S_IFREG | 0o444, 1, 4096
        now = int(time.time())
        return _ATTR.pack(node, size, 8, now, now, now, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)

    def _serve(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, 1 << 20)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN):
                    continue
                return  # ENODEV (unmounted) or EBADF (closed)
            if len(buf) < _IN_HEADER.size:
                continue
            _len, opcode, unique, node, _uid, _gid, pid, _pad = _IN_HEADER.unpack_from(buf)
            body = buf[_IN_HEADER.size:]
            self._handle(opcode, unique, node, pid, body)

    def _handle(self, opcode: int, unique: int, node: int, pid: int, body: bytes) -> None:
        if opcode == FUSE_INIT:
            major, minor = struct.unpack_from("<II", body)
            # fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
            # max_write, time_gran, max_pages, map_alignment, flags2, unused[7]
            out = struct.pack("<IIIIHHIIHHI7I", 7, min(minor, 31), 0, 0, 1, 1, 4096, 1, 1, 0, 0,
                              *([0] * 7))
            self._reply(unique, 0, out)
        elif opcode == FUSE_LOOKUP:
            name = body.split(b"\0", 1)[0].decode(errors="replace")
            if node != ROOT_ID or name != FILE_NAME:
                self._reply(unique, -errno.ENOENT)
                return
            self._reply(unique, 0, struct.pack("<QQQQII", FILE_ID, 0, 0, 0, 0, 0) + self._attr(FILE_ID))
        elif opcode == FUSE_GETATTR:
            self._reply(unique, 0, struct.pack("<QII", 0, 0, 0) + self._attr(node))
        elif opcode == FUSE_OPEN:
            self._reply(unique, 0, struct.pack("<QII", 0, FOPEN_DIRECT_IO, 0))
        elif opcode == FUSE_READ:
            with self._lock:
                if not self._released:
                    self._held.append(unique)  # taken, never answered: the reader is now in the kernel
                    self.readers.append(pid)
                    return
            self._reply(unique, -errno.EIO)
        elif opcode in (FUSE_FLUSH, FUSE_RELEASE):
            self._reply(unique, 0)
        elif opcode in (FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT):
            return  # no reply expected (an unanswered INTERRUPT is allowed: the read stays held)
        elif opcode == FUSE_DESTROY:
            self._reply(unique, 0)
        else:
            self._reply(unique, -errno.ENOSYS)

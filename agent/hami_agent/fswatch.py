"""Wake a loop when entries appear, vanish or change in a few directories (Linux inotify, via ctypes).

The device plugin used to ``stat()`` the kubelet socket, its own sockets and the MIG apply lock every
250 ms: about a third of an idle node's CPU (issue 31). NVIDIA's k8s-device-plugin watches the kubelet's
device-plugin directory with fsnotify instead (``cmd/nvidia-device-plugin/main.go``, ``watch.Files``
on ``pluginapi.DevicePluginPath``, restarting its plugins on ``fsnotify.Create`` of ``kubelet.sock``).
This does the same with no new dependency: inotify is four libc calls, and a new package would have to
join the wheelhouse the ``hami_agent`` role builds for offline node installs (``inotify_simple`` is the
same ctypes calls, packaged).

The watch only says "look again"; the caller re-checks the real state (``stat``), so a lost, merged or
spurious event costs one check, never a wrong decision. A directory that does not exist yet (``/run/hami``
before the first MIG apply) is covered by watching its nearest existing ancestor until it appears.
Where inotify cannot be had (no libc support, ``fs.inotify.max_user_instances`` / ``max_user_watches``
exhausted), ``active`` is False and the caller keeps polling.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)

# <sys/inotify.h>
IN_ATTRIB = 0x00000004  # chmod/chown: the MIG lock's trust rule looks at owner and mode
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
MASK = (IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
        | IN_ONLYDIR)
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class InotifyError(OSError):
    """inotify is not available here (or a watch could not be added)."""


class _Libc:
    """The three inotify calls; one instance per process."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        try:
            self._init1 = libc.inotify_init1
            self._add = libc.inotify_add_watch
            self._rm = libc.inotify_rm_watch
        except AttributeError as exc:
            raise InotifyError(errno.ENOSYS, "libc has no inotify") from exc
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)

    def init(self) -> int:
        fd = self._init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise InotifyError(e, f"inotify_init1: {os.strerror(e)}")
        return fd

    def add_watch(self, fd: int, path: str) -> int:
        wd = self._add(fd, os.fsencode(path), MASK)
        if wd < 0:
            e = ctypes.get_errno()
            raise InotifyError(e, f"inotify_add_watch {path}: {os.strerror(e)}")
        return wd

    def rm_watch(self, fd: int, wd: int) -> None:
        self._rm(fd, wd)  # fails only for a watch the kernel already dropped: nothing to do then


_libc: _Libc | None = None


def inotify_init() -> tuple[_Libc, int]:
    """(libc calls, a non-blocking inotify fd); raises ``InotifyError`` (tests replace this to fail)."""
    global _libc
    if _libc is None:
        try:
            _libc = _Libc()
        except OSError as exc:
            raise InotifyError(errno.ENOSYS, f"no libc inotify: {exc}") from exc
    return _libc, _libc.init()


def _nearest_existing(directory: str) -> str:
    d = os.path.abspath(directory)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    return d


class DirWatch:
    """Calls ``on_change()`` (from its own thread) after anything changed in one of ``directories``.

    ``start()`` returns ``active``: True when inotify watches every directory (or, for one that does not
    exist yet, its nearest existing ancestor). The thread sleeps in ``poll()`` with no timeout: an idle
    watch costs no wakeups at all. ``relevant(name)``, when given, says which entries of the directories
    matter: a batch of events that touched only others does not call ``on_change`` (the kubelet rewrites
    its ``kubelet_internal_checkpoint`` in the device-plugin directory at every Allocate and device-list
    update, kubernetes ``pkg/kubelet/cm/devicemanager/manager.go``: ``allocateContainerResources`` and
    ``genericDeviceUpdateCallback`` end in ``writeCheckpoint``). Events on the directory
    itself, on an ancestor watched while a directory is missing, and a queue overflow always do.
    """

    stop_wait_s = 2.0  # how long stop() waits for the thread (it may be inside on_change)

    def __init__(self, directories: Iterable[str], on_change: Callable[[], None],
                 name: str = "fswatch", relevant: Callable[[str], bool] | None = None) -> None:
        self.directories = sorted({os.path.abspath(d) for d in directories if d})
        self.on_change = on_change
        self.relevant = relevant
        self.name = name
        self.active = False
        self.error = ""
        self._fd = -1
        self._libc: _Libc | None = None
        self.watched: dict[str, int] = {}  # path -> wd: each directory, or its ancestor while it is missing
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None
        self._stop_lock = threading.Lock()
        self._stopped = False

    def start(self) -> bool:
        try:
            self._libc, self._fd = inotify_init()
            self._rearm()
        except OSError as exc:
            self._close_fd()
            self.error = str(exc)
            logger.warning("cannot watch %s with inotify (%s): polling instead", ", ".join(self.directories),
                           exc)
            return False
        self._stop_r, self._stop_w = os.pipe()
        self.active = True
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Ends the thread. Its descriptors are closed by whoever is last to use them: here once the thread
        has ended, else by the thread on its way out. Closing them under a running thread would hand it a
        bad descriptor (EBADF in ``os.read``) or, once the number is reused, someone else's file."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            thread, self._thread = self._thread, None
            if self._stop_w >= 0:
                os.write(self._stop_w, b"x")
        self.active = False
        if thread is not None:
            thread.join(timeout=self.stop_wait_s)
            if thread.is_alive():
                logger.warning("inotify watch %s did not stop within %g s; it closes its descriptors when it "
                               "does", self.name, self.stop_wait_s)
                return
        self._close_all()

    def _close_all(self) -> None:
        with self._stop_lock:
            self._close_fd()
            for fd in (self._stop_r, self._stop_w):
                if fd >= 0:
                    os.close(fd)
            self._stop_r = self._stop_w = -1

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops every watch with it
        self._fd = -1

    def _rearm(self) -> None:
        """Watch each directory, or its nearest existing ancestor until it exists. Adding a watch that is
        already there returns the same wd, so this is safe to repeat after every batch of events."""
        assert self._libc is not None
        watched = {}
        for d in self.directories:
            for attempt in range(3):  # the directory may vanish between the look and the watch
                target = _nearest_existing(d)
                try:
                    watched[target] = self._libc.add_watch(self._fd, target)
                    break
                except InotifyError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENOTDIR) or attempt == 2:
                        raise
        for path, wd in self.watched.items():
            if path not in watched and wd not in watched.values():
                self._libc.rm_watch(self._fd, wd)  # an ancestor no longer needed: its traffic is not ours
        self.watched = watched

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            if self._stopped:  # stop() may have given up waiting: close them here (a second close is a no-op)
                self._close_all()

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            overflow_or_gone, touched = self._drain()
            try:
                self._rearm()  # a directory may have appeared (watch it) or gone (watch its parent)
            except OSError as exc:
                self.active = False  # the caller polls again from now on
                self.error = str(exc)
                logger.warning("inotify watch lost (%s): polling instead", exc)
                self.on_change()
                return
            if overflow_or_gone:
                logger.debug("inotify: queue overflow or a watched directory went away; re-armed")
            if overflow_or_gone or self._matters(touched):
                self.on_change()

    def _matters(self, touched: list[tuple[int, str]]) -> bool:
        """Whether a batch of (wd, entry name) events concerns the caller."""
        if self.relevant is None:
            return True
        own = {wd for path, wd in self.watched.items() if path in self.directories}
        return any(wd not in own or not name or self.relevant(name) for wd, name in touched)

    def _drain(self) -> tuple[bool, list[tuple[int, str]]]:
        """Read every queued event: (the queue overflowed or a watch was dropped, the (wd, name) of the
        others)."""
        special = False
        touched: list[tuple[int, str]] = []
        while True:
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return special, touched
            off = 0
            while off + EVENT.size <= len(buf):
                wd, mask, _cookie, length = EVENT.unpack_from(buf, off)
                name = buf[off + EVENT.size:off + EVENT.size + length].split(b"\0", 1)[0]
                off += EVENT.size + length
                if mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                    special = True
                else:
                    touched.append((wd, os.fsdecode(name)))


class Wakeup:
    """An Event on a reentrant lock: ``set()`` is safe from a signal handler that interrupted ``wait()``
    in the same thread (``threading.Event``'s plain lock could deadlock there)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._flag = False

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``set()``; True if it was set (the flag is cleared either way)."""
        with self._cond:
            if not self._flag:
                self._cond.wait(timeout)
            flag, self._flag = self._flag, False
            return flag


class LoopWaker:
    """What wakes an agent's event-driven loop (the device plugin's, the DRA driver's): ``wake()`` from any
    thread or a signal handler, the watched directories' events, and the NVML source, which is woken too
    because the loop may be waiting on its next snapshot. ``source()`` returns the current source (it is
    replaced across a MIG pause), or None."""

    def __init__(self, source: Callable[[], Any], name: str) -> None:
        self.flag = Wakeup()  # what a loop that is not waiting on the source (a MIG pause) sleeps on
        self._source = source
        self._name = name
        self.watch: DirWatch | None = None

    def wake(self) -> None:
        self.flag.set()
        wake = getattr(self._source(), "wake", None)
        if wake is not None:
            wake()

    def start_watch(self, directories: Iterable[str], relevant: Callable[[str], bool] | None = None) -> None:
        """Watch ``directories`` (``relevant``: see ``DirWatch``); call it before the loop's first look, so
        no change in between is missed."""
        self.watch = DirWatch(directories, self.wake, name=self._name, relevant=relevant)
        self.watch.start()

    def stop_watch(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def watching(self) -> bool:
        """The directories' changes wake the loop (inotify works here)."""
        return self.watch is not None and self.watch.active

    def event_driven(self) -> bool:
        """Every change the loop must see wakes it: the directories and the source's new snapshots (else
        the loop ticks every poll interval)."""
        return self.watching() and callable(getattr(self._source(), "wake", None))


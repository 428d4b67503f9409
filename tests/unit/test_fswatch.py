"""The inotify directory watch that wakes the device plugin's loop (issue 31 item 2)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from hami_agent import fswatch
from hami_agent.fswatch import DirWatch, InotifyError

BOUND_S = 5.0  # a generous timeout for a wakeup that takes microseconds (loaded CI machines)


class Calls:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        self.event.set()

    def wait(self) -> bool:
        ok = self.event.wait(BOUND_S)
        self.event.clear()
        return ok


def bind_socket(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    return s


@pytest.fixture
def watch_of():
    made: list[DirWatch] = []

    def make(*dirs: str) -> tuple[DirWatch, Calls]:
        calls = Calls()
        w = DirWatch(dirs, calls)
        made.append(w)
        assert w.start(), w.error
        return w, calls

    yield make
    for w in made:
        w.stop()


def test_socket_created_deleted_and_recreated_each_wake_the_caller(tmp_path, watch_of):
    w, calls = watch_of(str(tmp_path))
    assert w.active and list(w.watched) == [str(tmp_path)]
    path = str(tmp_path / "kubelet.sock")
    s = bind_socket(path)
    assert calls.wait(), "no wakeup for the socket's creation"
    s.close()
    os.unlink(path)
    assert calls.wait(), "no wakeup for the socket's deletion"
    s = bind_socket(path)
    assert calls.wait(), "no wakeup for the socket's re-creation"
    s.close()


def test_an_idle_watch_calls_nothing(tmp_path, watch_of):
    _w, calls = watch_of(str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    assert calls.wait()
    assert not calls.event.wait(0.3)  # nothing changed since: no spurious call


def _eventually(cond, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_missing_directory_is_covered_by_its_ancestor_until_it_exists(tmp_path, watch_of):
    lock_dir = tmp_path / "run" / "hami"
    w, calls = watch_of(str(lock_dir))
    assert list(w.watched) == [str(tmp_path)]
    (tmp_path / "run").mkdir()
    assert calls.wait()
    # dropping an ancestor's watch queues IN_IGNORED, one more (harmless) wakeup: wait for the state, bounded
    assert _eventually(lambda: list(w.watched) == [str(tmp_path / "run")]), w.watched
    lock_dir.mkdir()
    assert calls.wait()
    assert _eventually(lambda: list(w.watched) == [str(lock_dir)]), w.watched  # ancestors dropped
    (lock_dir / "mig-apply.lock").write_text("")
    assert calls.wait(), "no wakeup for the lock file inside the new directory"


def test_a_removed_directory_falls_back_to_its_parent_and_is_watched_again(tmp_path, watch_of):
    d = tmp_path / "device-plugins"
    d.mkdir()
    w, calls = watch_of(str(d))
    d.rmdir()
    assert calls.wait()
    assert list(w.watched) == [str(tmp_path)]
    d.mkdir()
    assert calls.wait()
    assert list(w.watched) == [str(d)]
    (d / "kubelet.sock").write_text("")
    assert calls.wait()


def test_mode_change_wakes_the_caller(tmp_path, watch_of):
    lock = tmp_path / "mig-apply.lock"
    lock.write_text("")
    _w, calls = watch_of(str(tmp_path))
    os.chmod(lock, 0o666)  # the lock's trust rule looks at the mode
    assert calls.wait()


def test_inotify_unavailable_leaves_the_watch_inactive_for_the_caller_to_poll(tmp_path, monkeypatch, caplog):
    def no_inotify():
        raise InotifyError(24, "inotify_init1: Too many open files")

    monkeypatch.setattr(fswatch, "inotify_init", no_inotify)
    calls = Calls()
    w = DirWatch([str(tmp_path)], calls)
    assert w.start() is False
    assert not w.active and "Too many open files" in w.error
    assert "polling instead" in caplog.text
    w.stop()  # safe on a watch that never started


def test_stop_ends_the_thread_and_closes_the_descriptor(tmp_path):
    calls = Calls()
    w = DirWatch([str(tmp_path)], calls)
    assert w.start()
    thread = w._thread
    w.stop()
    assert not w.active and w._fd == -1
    assert thread is not None and not thread.is_alive()


def test_stop_while_the_callback_runs_long_leaves_the_descriptors_to_the_thread(tmp_path, monkeypatch):
    """stop() gives up waiting after ``stop_wait_s``; the thread must not find its descriptors closed
    under it (that was an ``OSError: [Errno 9] Bad file descriptor`` traceback from ``os.read``)."""
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))

    def slow_callback() -> None:
        inside.set()
        release.wait(BOUND_S)

    w = DirWatch([str(tmp_path)], slow_callback)
    monkeypatch.setattr(w, "stop_wait_s", 0.05)
    assert w.start()
    thread = w._thread
    (tmp_path / "f").write_text("x")
    assert inside.wait(BOUND_S)
    fd = w._fd
    w.stop()
    assert thread is not None and thread.is_alive()
    os.fstat(fd)  # still open: the thread may still read it
    release.set()
    thread.join(BOUND_S)
    assert not thread.is_alive() and errors == []
    assert w._fd == -1 and w._stop_r == -1 and w._stop_w == -1
    w.stop()  # a second stop is a no-op


def test_stop_twice_is_harmless(tmp_path):
    w = DirWatch([str(tmp_path)], Calls())
    assert w.start()
    w.stop()
    w.stop()
    assert w._fd == -1


def test_a_directory_that_vanishes_while_being_watched_is_tried_again(tmp_path, monkeypatch):
    real_init = fswatch.inotify_init

    class Flaky:
        """The first add_watch finds the directory gone (removed between the look and the watch)."""

        def __init__(self, libc) -> None:
            self.libc = libc
            self.failed = False

        def add_watch(self, fd: int, path: str) -> int:
            if not self.failed:
                self.failed = True
                raise InotifyError(2, f"inotify_add_watch {path}: No such file or directory")
            return self.libc.add_watch(fd, path)

        def rm_watch(self, fd: int, wd: int) -> None:
            self.libc.rm_watch(fd, wd)

    def flaky_init():
        libc, fd = real_init()
        return Flaky(libc), fd

    monkeypatch.setattr(fswatch, "inotify_init", flaky_init)
    calls = Calls()
    w = DirWatch([str(tmp_path)], calls)
    try:
        assert w.start(), w.error
        assert list(w.watched) == [str(tmp_path)]
        (tmp_path / "kubelet.sock").write_text("")
        assert calls.wait()
    finally:
        w.stop()


def test_loop_waker_wakes_the_flag_and_the_current_source(tmp_path):
    """The device plugin's and the DRA driver's loops share this: wake() sets the flag and wakes whichever
    NVML source is current; the loop counts as event-driven only while the watch works and the source can
    be woken."""
    from hami_agent.fswatch import LoopWaker

    class Source:
        woken = 0

        def wake(self) -> None:
            self.woken += 1

    current: list = [None]
    waker = LoopWaker(lambda: current[0], "test-waker")
    waker.wake()  # no source (paused): the flag only
    assert waker.flag.wait(0) and not waker.flag.wait(0)  # set once, cleared by the wait
    assert not waker.watching() and not waker.event_driven()
    waker.start_watch([str(tmp_path)])
    try:
        assert waker.watching() and not waker.event_driven()  # a source without wake() is polled
        current[0] = Source()
        assert waker.event_driven()
        waker.wake()
        assert current[0].woken == 1 and waker.flag.wait(0)
    finally:
        waker.stop_watch()
    assert not waker.watching()


def test_entries_that_do_not_matter_call_nothing_and_the_ones_that_do_still_do(tmp_path):
    """The kubelet's checkpoint is rewritten (a temp file renamed over it) at every Allocate: with
    ``relevant``, that wakes the watch's thread but not the caller; a socket still does."""
    calls = Calls()
    w = DirWatch([str(tmp_path)], calls, relevant=lambda name: name.endswith(".sock"))
    assert w.start(), w.error
    try:
        for _ in range(3):
            tmp = tmp_path / ".tmp-checkpoint-1"
            tmp.write_text("{}")
            os.replace(tmp, tmp_path / "kubelet_internal_checkpoint")
        assert not calls.event.wait(0.5), "a checkpoint write called the caller"
        s = bind_socket(str(tmp_path / "kubelet.sock"))
        assert calls.wait(), "no wakeup for the socket"
        s.close()
        calls.event.clear()
        (tmp_path / "sub").mkdir()  # an event naming another entry: not relevant either
        os.rmdir(tmp_path / "sub")
        assert not calls.event.wait(0.3)
    finally:
        w.stop()


def test_without_relevant_every_entry_calls(tmp_path, watch_of):
    _w, calls = watch_of(str(tmp_path))
    (tmp_path / "kubelet_internal_checkpoint").write_text("{}")
    assert calls.wait()


def test_an_ancestor_watched_for_a_missing_directory_calls_whatever_the_name(tmp_path):
    """While the MIG lock's directory is missing its ancestor is watched: the names there are path
    components, not entries, so ``relevant`` does not filter them."""
    calls = Calls()
    w = DirWatch([str(tmp_path / "run" / "hami")], calls, relevant=lambda name: name == "mig-apply.lock")
    assert w.start(), w.error
    try:
        (tmp_path / "run").mkdir()
        assert calls.wait(), "the ancestor's event was filtered"
    finally:
        w.stop()

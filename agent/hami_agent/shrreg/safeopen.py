"""Open a region file that a tenant may have tampered with: no symlinks, no special files, no blocking.

The cache directory of a container is mounted read-write into that container, so everything in it is
tenant-controlled. A tenant can replace its ``*.cache`` file with a FIFO (``open()`` would block forever),
a device node (opening it runs the driver's ``open``), or a symlink into another container's directory (a
repair would then write another tenant's region). ``open_regular`` therefore

1. opens the trusted ``root`` (the directory the operator pointed at: ``--dir``, the default region root,
   or the ``--file``'s own directory) and walks every component below it with ``O_PATH|O_NOFOLLOW``
   (``openat``-style, so a component swapped for a symlink between steps is caught, not followed);
2. ``fstat``s the ``O_PATH`` descriptor of the last component (``O_PATH`` never runs a driver's ``open``
   and never blocks) and refuses anything but a regular file;
3. re-opens exactly that inode through ``/proc/self/fd/N`` for reading (or writing).

No check-then-open window remains: the file that is opened is the inode that was checked.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


class RefusedFile(OSError):
    """The path is not a regular file reachable below its root without following a symlink."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), f"not a regular file (mode {oct(stat.S_IFMT(mode))})")


def split_below(path: str, root: str | None) -> tuple[str, list[str]]:
    """(trusted directory, components below it). A path outside ``root`` is trusted up to its own
    directory."""
    apath = os.path.abspath(path)
    if root:
        aroot = os.path.abspath(root)
        rel = os.path.relpath(apath, aroot)
        if rel != "." and not rel.startswith(".." + os.sep) and rel != "..":
            return aroot, rel.split(os.sep)
    return os.path.dirname(apath), [os.path.basename(apath)]


def open_regular(path: str, root: str | None = None, *, writable: bool = False) -> int:
    """A descriptor of the regular file ``path`` (O_RDONLY, or O_RDWR when ``writable``), opened without
    following any symlink below ``root`` and without blocking. Raises ``RefusedFile`` (naming what the
    path is and what to do) or the ``OSError`` of a missing/unreadable file."""
    top, parts = split_below(path, root)
    dirfd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = top
        for comp in parts[:-1]:
            try:
                nfd = os.open(comp, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    why = (f"{path}: {os.path.join(where, comp)} is a symbolic link or not a directory: "
                           f"refusing to follow it out of {top}")
                    raise RefusedFile(exc.errno, why) from None
                raise
            os.close(dirfd)
            dirfd = nfd
            where = os.path.join(where, comp)
        try:
            pfd = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError as exc:  # name the whole path, not the last component
            raise type(exc)(exc.errno, exc.strerror, path) from None
    finally:
        os.close(dirfd)
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            what = _kind(st.st_mode)
            hint = (f"refusing to follow it out of {top}" if stat.S_ISLNK(st.st_mode)
                    else "refusing to open it (a shared region is a regular file)")
            raise RefusedFile(errno.EINVAL, f"{path} is {what}: {hint}")
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        try:
            fd = os.open(f"/proc/self/fd/{pfd}", flags)  # the magic link: exactly the inode checked above
        except FileNotFoundError:  # no /proc: open the same name again and compare inodes
            fd = _reopen_by_name(top, parts, flags)
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(st2.st_mode):
            os.close(fd)
            raise RefusedFile(errno.EINVAL, f"{path} was replaced while being opened; refusing it")
        return fd
    finally:
        os.close(pfd)


def _reopen_by_name(top: str, parts: list[str], flags: int) -> int:
    dirfd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for comp in parts[:-1]:
            nfd = os.open(comp, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            os.close(dirfd)
            dirfd = nfd
        # O_NONBLOCK: should a FIFO have been swapped in since the check, open() must not wait for a writer
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    finally:
        os.close(dirfd)

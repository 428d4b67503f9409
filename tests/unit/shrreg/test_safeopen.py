"""safeopen.open_regular: only a regular file, reached below its root without following a symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hami_agent.shrreg.safeopen import RefusedFile, open_regular, split_below

pytestmark = pytest.mark.unit


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "containers"
    (r / "uid_main").mkdir(parents=True)
    (r / "uid_main" / "a.cache").write_bytes(b"region")
    return r


def read_all(fd: int) -> bytes:
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


def test_regular_file_below_root(root: Path) -> None:
    assert read_all(open_regular(str(root / "uid_main" / "a.cache"), str(root))) == b"region"
    fd = open_regular(str(root / "uid_main" / "a.cache"), str(root), writable=True)
    os.pwrite(fd, b"R", 0)
    os.close(fd)
    assert (root / "uid_main" / "a.cache").read_bytes() == b"Region"


def test_symlinked_file_and_parent_are_refused(root: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.cache").write_bytes(b"someone else's")
    os.symlink(other / "b.cache", root / "uid_main" / "link.cache")
    os.symlink(other, root / "uid_link")
    with pytest.raises(RefusedFile, match="is a symbolic link: refusing to follow it out of"):
        open_regular(str(root / "uid_main" / "link.cache"), str(root))
    with pytest.raises(RefusedFile, match="uid_link is a symbolic link or not a directory"):
        open_regular(str(root / "uid_link" / "b.cache"), str(root))


def test_fifo_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "uid_main" / "p.cache")
    with pytest.raises(RefusedFile, match="FIFO"):
        open_regular(str(root / "uid_main" / "p.cache"), str(root))


def test_device_is_refused_without_opening_it() -> None:
    with pytest.raises(RefusedFile, match="character device"):
        open_regular("/dev/null")  # O_PATH never runs the driver's open


def test_missing_file_names_the_whole_path(root: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        open_regular(str(root / "uid_main" / "gone.cache"), str(root))
    assert str(root / "uid_main" / "gone.cache") in str(info.value)


def test_a_path_outside_root_is_trusted_up_to_its_own_directory(tmp_path: Path) -> None:
    assert split_below("/x/y/z.cache", "/a/b") == ("/x/y", ["z.cache"])
    assert split_below("/a/b/c/z.cache", "/a/b") == ("/a/b", ["c", "z.cache"])
    assert split_below("/a/bc/z.cache", "/a/b") == ("/a/bc", ["z.cache"])

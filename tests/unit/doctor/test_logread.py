"""Logs as bounded streams: gzip by magic, truncated gzip and binary input said out loud, long lines cut."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hami_agent.doctor.collect.logread import MAX_LINE_BYTES, LogStream, LogUnreadable

pytestmark = pytest.mark.unit

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
STALL = LOGS / "seed003_kubelet_stalled_then_later.log"


def test_gzip_is_read_transparently_whatever_the_name(tmp_path: Path) -> None:
    f = tmp_path / "kubelet.log.1"  # a rotated log need not end in .gz
    f.write_bytes(gzip.compress(STALL.read_bytes()))
    stream = LogStream(str(f))
    assert list(stream) == STALL.read_text().splitlines(keepends=True)
    stream.check()
    assert stream.compressed and stream.error is None


def test_truncated_gzip_ends_the_stream_with_the_reason(tmp_path: Path) -> None:
    f = tmp_path / "kubelet.log.gz"
    f.write_bytes(gzip.compress(STALL.read_bytes() * 50)[:1500])
    stream = LogStream(str(f))
    lines = list(stream)
    assert 0 < len(lines) < len(STALL.read_text().splitlines()) * 50
    with pytest.raises(LogUnreadable, match="truncated or damaged gzip after"):
        stream.check()


def test_binary_garbage_is_not_a_log(tmp_path: Path) -> None:
    f = tmp_path / "kubelet.log"
    f.write_bytes(bytes(range(256)) * 400)
    stream = LogStream(str(f))
    list(stream)
    with pytest.raises(LogUnreadable, match="not a text log"):
        stream.check()


def test_a_few_odd_bytes_do_not_make_a_log_binary(tmp_path: Path) -> None:
    f = tmp_path / "kubelet.log"
    f.write_bytes(STALL.read_bytes() + b"\xff\xfe broken line\n")
    stream = LogStream(str(f))
    assert len(list(stream)) == len(STALL.read_text().splitlines()) + 1
    stream.check()


def test_an_endless_line_is_cut_not_held(tmp_path: Path) -> None:
    f = tmp_path / "kubelet.log"
    f.write_bytes(b"x" * (MAX_LINE_BYTES * 20) + b"\nnext line\n")
    lines = list(LogStream(str(f)))
    assert len(lines) == 2 and len(lines[0]) == MAX_LINE_BYTES and lines[1] == "next line\n"

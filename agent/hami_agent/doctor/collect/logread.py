"""Read a log as a stream with bounded memory: plain or gzip (rotated logs), one line at a time.

A kubelet log can be hundreds of MB (reading it whole took 1.63 GB of RSS for 205 MB), a rotated one is
``kubelet.log.1.gz``, and an operator can point doctor at the wrong file. So:

* lines are read one at a time, each cut at ``MAX_LINE_BYTES`` (the rest of an over-long line is skipped);
* gzip is recognised by its magic bytes (whatever the name) and decompressed on the fly;
* a truncated or damaged gzip, or a file that is mostly not text (NUL bytes, invalid UTF-8), ends the
  stream with ``error`` set: the collector then says the log is unreadable instead of reporting health.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import BinaryIO

MAX_LINE_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"
BINARY_SAMPLE_LINES = 2000  # judged on the first lines: a binary file is not read to its end
BINARY_RATIO = 0.3


class LogUnreadable(RuntimeError):
    """The log could not be read as text: the message says why and what to do."""


class LogStream:
    """``for line in LogStream(path)`` yields str lines (with their newline); then check ``error``."""

    def __init__(self, path: str, source: str | None = None) -> None:
        self.path = path
        self.source = source or path
        self.lines = 0
        self.bytes = 0
        self.binary_lines = 0
        self.long_lines = 0
        self.compressed = False
        self.error: str | None = None

    def _open(self) -> BinaryIO:
        fh: BinaryIO = open(self.path, "rb")  # noqa: SIM115 - closed by __iter__
        if fh.read(2) == GZIP_MAGIC:
            fh.close()
            self.compressed = True
            return gzip.open(self.path, "rb")  # type: ignore[return-value]
        fh.seek(0)
        return fh

    def __iter__(self) -> Iterator[str]:
        with self._open() as fh:
            while True:
                try:
                    raw = fh.readline(MAX_LINE_BYTES)
                    if raw and not raw.endswith(b"\n") and len(raw) >= MAX_LINE_BYTES:
                        self.long_lines += 1
                        while True:  # skip the rest of an over-long line, in bounded chunks
                            rest = fh.readline(MAX_LINE_BYTES)
                            if not rest or rest.endswith(b"\n"):
                                break
                except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                    kind = "truncated or damaged gzip" if self.compressed else "read error"
                    self.error = (f"{self.source}: {kind} after {self.lines} lines ({exc}); re-collect the "
                                  "log (e.g. journalctl -u kubelet > kubelet.log)")
                    return
                if not raw:
                    break
                self.lines += 1
                self.bytes += len(raw)
                text = self._decode(raw)
                if self.lines == BINARY_SAMPLE_LINES and self._mostly_binary():
                    self.error = self._binary_message()
                    return
                yield text
        if self.lines < BINARY_SAMPLE_LINES and self.lines and self._mostly_binary():
            self.error = self._binary_message()

    def _decode(self, raw: bytes) -> str:
        if b"\0" in raw:
            self.binary_lines += 1
            return raw.decode("utf-8", "replace")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.binary_lines += 1
            return raw.decode("utf-8", "replace")

    def _mostly_binary(self) -> bool:
        return self.binary_lines / max(1, self.lines) > BINARY_RATIO

    def _binary_message(self) -> str:
        return (f"{self.source}: not a text log ({self.binary_lines} of the first {self.lines} lines hold "
                "NUL bytes or invalid UTF-8): binary or the wrong file; pass the log as text or .gz")

    def check(self) -> None:
        """Raise ``LogUnreadable`` when the stream ended early or was not text."""
        if self.error:
            raise LogUnreadable(self.error)

"""klog-compatible logging for every hami-agent subcommand.

Operators grep our logs with the recipes in the seeds (written for HAMi's Go binaries), so lines use
klog's header: ``I1121 10:30:15.123456   1234 server.go:88] message``.

Verbosity follows klog: plain ``logger.info`` always prints; ``v(logger, n, msg)`` prints only with
``-v n`` or higher. Python levels are mapped so that V(n) == logging.INFO - n, which lets the standard
``logging`` machinery do the filtering.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

ROOT_LOGGER = "hami_agent"
MAX_VERBOSITY = 10


def level_for(verbosity: int) -> int:
    """Python logging level that corresponds to klog's V(verbosity)."""
    return logging.INFO - max(0, min(verbosity, MAX_VERBOSITY))


class KlogFormatter(logging.Formatter):
    """Formats records exactly like klog's text header."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.CRITICAL:
            letter = "F"
        elif record.levelno >= logging.ERROR:
            letter = "E"
        elif record.levelno >= logging.WARNING:
            letter = "W"
        else:
            letter = "I"
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1_000_000)
        header = "%s%02d%02d %02d:%02d:%02d.%06d %7d %s:%d] " % (
            letter, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, micros,
            record.process or os.getpid(), record.filename, record.lineno,
        )
        message = header + record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return message


def setup(verbosity: int = 0, stream: Any = None) -> logging.Logger:
    """Configure the ``hami_agent`` logger tree. Called once, by the CLI entry point."""
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(KlogFormatter())
    logger.addHandler(handler)
    logger.setLevel(level_for(verbosity))
    logger.propagate = False
    return logger


def v(logger: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """klog's ``V(level).Infof``: log ``msg`` only when verbosity >= level."""
    lvl = level_for(level)
    if logger.isEnabledFor(lvl):
        # stacklevel=2 so the header names the caller's file:line, like klog does.
        logger.log(lvl, msg, *args, stacklevel=2)


def enabled(logger: logging.Logger, level: int) -> bool:
    """True when ``v(logger, level, ...)`` would print; use to skip building costly messages."""
    return logger.isEnabledFor(level_for(level))


class WarnOnce:
    """Warns each distinct text once. The NVML snapshot loops meet the same notes (and the same known-bad
    driver) every few seconds; one line per change is what an operator reads."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, text: str) -> None:
        if text not in self._seen:
            self._seen.add(text)
            self._logger.warning("%s", text, stacklevel=2)

"""Hooks for every test.

``hami_agent.log.setup`` (run by the CLI entry points that tests call in-process) binds a handler to the
``sys.stderr`` of that moment, which under ``capsys`` is a buffer closed when the test ends. A thread of a
later test that logs through the ``hami_agent`` logger then printed ``--- Logging error ---`` into that
test's output. Each test gets the logger tree back as it found it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_agent_logger() -> Iterator[None]:
    logger = logging.getLogger("hami_agent")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]

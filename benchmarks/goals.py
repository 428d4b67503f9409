"""Every benchmark's exit status: 1 when a goal it prints is missed, unless ``--no-goals`` (report only).

A goal row is ``(figure, value, goal, met)``; rows whose goal is ``-`` are informational and always met."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

FLAG = "--no-goals"


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, dest="no_goals", action="store_true",
                        help="report the figures only: exit 0 even when a goal is missed")


def missed(rows: Iterable[tuple]) -> list[str]:
    """The figures of ``rows`` whose goal was not met."""
    return [row[0] for row in rows if not row[3]]


def exit_code(rows: Iterable[tuple], no_goals: bool) -> int:
    """0 when every goal in ``rows`` is met (or ``no_goals``), else 1, naming the misses on stderr."""
    misses = missed(rows)
    if not misses:
        return 0
    what = "reported only (--no-goals)" if no_goals else f"exit 1 ({FLAG} to only report)"
    print(f"{len(misses)} goal(s) missed, {what}: " + "; ".join(misses), file=sys.stderr)
    return 0 if no_goals else 1

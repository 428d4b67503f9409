"""The one error type every protocol decoder raises."""

from __future__ import annotations


class ProtocolError(ValueError):
    """Malformed HAMi wire data. The message always quotes the offending part."""


def quote(value: object, limit: int = 120) -> str:
    """``repr`` of ``value`` cut to ``limit`` characters, for error messages that quote input."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text

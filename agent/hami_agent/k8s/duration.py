"""Go's ``time.Duration.String()`` formatting, so messages match HAMi's byte for byte
(``node gpu-1 has been locked within 5m0s``)."""

from __future__ import annotations

_UNITS = ((1_000_000, "ms"), (1_000, "\u00b5s"), (1, "ns"))


def format_go_duration(seconds: float) -> str:
    """``300 -> "5m0s"``, ``90 -> "1m30s"``, ``30 -> "30s"``, ``3600 -> "1h0m0s"``, ``1.5 -> "1.5s"``,
    ``0.5 -> "500ms"``, ``0 -> "0s"``."""
    ns = round(seconds * 1_000_000_000)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for div, unit in _UNITS:
            if ns >= div:
                return sign + _frac(ns, div) + unit
    hours, rem = divmod(ns, 3600 * 1_000_000_000)
    minutes, rem = divmod(rem, 60 * 1_000_000_000)
    secs = _frac(rem, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return sign + secs


def _frac(value: int, unit: int) -> str:
    whole, rem = divmod(value, unit)
    if not rem:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{rem:0{digits}d}".rstrip("0")

"""Go time layouts used by HAMi's annotations: RFC3339, ``time.DateTime``, v2.4's dotted layout and
``time.Time.String()``. Stdlib only; Python 3.10's ``fromisoformat`` does not accept ``Z``, hence regexes."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from hami_agent.protocol.errors import ProtocolError

_RFC3339_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$")
# time.DateTime "2006-01-02 15:04:05" and v2.4's "2006.01.02 15:04:05"
_DATETIME_RE = re.compile(r"^(\d{4})([-.])(\d{2})\2(\d{2}) (\d{2}):(\d{2}):(\d{2})$")
# time.Time.String(): "2006-01-02 15:04:05.999999999 -0700 MST" + optional " m=+1.23" (monotonic)
_GO_STRING_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? ([+-])(\d{2})(\d{2})(?::?(\d{2}))?"
    r" (\S+)(?: m=[+-]\d+(?:\.\d+)?)?$")


def _mk(what: str, text: str, fields: tuple[str | None, ...], tz: timezone | None) -> datetime:
    """Build a datetime from regex groups (year, month, day, hour, minute, second, fraction)."""
    y, mo, d, h, mi, s, frac = fields
    micro = int((frac or "0").ljust(6, "0")[:6])
    try:
        return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micro, tzinfo=tz)
    except ValueError as exc:
        raise ProtocolError(f"{what}: {text!r} is not a valid time ({exc})") from None


def _offset(sign: str, hh: str, mm: str, ss: str | None = None) -> timezone:
    delta = timedelta(hours=int(hh), minutes=int(mm), seconds=int(ss or 0))
    if delta >= timedelta(hours=24):
        raise ProtocolError(f"time zone offset {sign}{hh}:{mm} is out of range")
    return timezone(-delta if sign == "-" else delta)


def parse_rfc3339(text: str, what: str = "time") -> datetime:
    """Parse RFC3339 (with optional fraction) into an aware datetime."""
    m = _RFC3339_RE.match(text)
    if not m:
        raise ProtocolError(f"{what}: {text!r} is not an RFC3339 time (e.g. 2024-01-23T04:30:04Z)")
    zone = m.group(8)
    tz = timezone.utc if zone in ("Z", "z") else _offset(zone[0], zone[1:3], zone[4:6])
    return _mk(what, text, m.group(1, 2, 3, 4, 5, 6, 7), tz)


def format_rfc3339(when: datetime) -> str:
    """Go's ``time.RFC3339`` layout (seconds precision). A naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    offset = when.utcoffset() or timedelta(0)
    base = when.strftime("%Y-%m-%dT%H:%M:%S")
    if offset == timedelta(0):
        return base + "Z"
    total = int(offset.total_seconds())
    sign = "-" if total < 0 else "+"
    total = abs(total)
    return "%s%s%02d:%02d" % (base, sign, total // 3600, (total % 3600) // 60)


def parse_datetime(text: str, what: str = "time") -> datetime:
    """Parse Go's ``time.DateTime`` (``2006-01-02 15:04:05``) or v2.4's ``2006.01.02 15:04:05``.
    The result is naive: HAMi writes the scheduler's local time without a zone."""
    m = _DATETIME_RE.match(text)
    if not m:
        raise ProtocolError(f"{what}: {text!r} is not a 'YYYY-MM-DD HH:MM:SS' time")
    y, _, mo, d, h, mi, s = m.groups()
    return _mk(what, text, (y, mo, d, h, mi, s, None), None)


def format_datetime(when: datetime) -> str:
    """Go's ``time.DateTime`` layout, ``2006-01-02 15:04:05`` (no zone)."""
    return when.strftime("%Y-%m-%d %H:%M:%S")


def parse_go_time_string(text: str, what: str = "time") -> datetime:
    """Parse Go's ``time.Time.String()`` output, e.g.
    ``2024-01-23 04:30:04.43 +0000 UTC m=+1104711.77`` (monotonic suffix ignored)."""
    m = _GO_STRING_RE.match(text)
    if not m:
        raise ProtocolError(f"{what}: {text!r} is not a Go time string "
                            "(e.g. '2024-01-23 04:30:04.43 +0000 UTC')")
    g = m.groups()
    tz = _offset(g[7], g[8], g[9], g[10])
    return _mk(what, text, g[0:7], tz)


def format_go_time_string(when: datetime) -> str:
    """Go's ``time.Time.String()`` without the monotonic part. A naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    base = when.strftime("%Y-%m-%d %H:%M:%S")
    if when.microsecond:
        base += ("." + "%06d" % when.microsecond).rstrip("0")
    offset = when.utcoffset() or timedelta(0)
    total = int(offset.total_seconds())
    sign = "-" if total < 0 else "+"
    total = abs(total)
    name = when.tzname() or ""
    if offset == timedelta(0) and (not name or name.startswith("UTC")):
        name = "UTC"
    if not name or " " in name:
        name = "%s%02d%02d" % (sign, total // 3600, (total % 3600) // 60)
    return "%s %s%02d%02d %s" % (base, sign, total // 3600, (total % 3600) // 60, name)


def format_go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()``, byte for byte, for messages copied from HAMi:
    ``300 -> "5m0s"``, ``90 -> "1m30s"``, ``30 -> "30s"``, ``3600 -> "1h0m0s"``, ``1.5 -> "1.5s"``,
    ``0.5 -> "500ms"``, ``0 -> "0s"``. Integer nanoseconds, so no float rounding leaks into the text."""
    ns = round(seconds * 1_000_000_000)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for size, unit in ((1_000_000, "ms"), (1_000, "\u00b5s"), (1, "ns")):
            if ns >= size:
                return sign + _frac(ns, size) + unit
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

"""Values of ``hami.io/node-handshake`` (Project-HAMi/HAMi ``pkg/device/devices.go`` ``CheckHealth``).

Current schedulers write ``Requesting_<2006-01-02 15:04:05>`` (local time, no zone) and delete the key on
node loss; legacy plugins wrote ``Reported <Go time.String()>`` and legacy schedulers ``Deleted_<time>``;
v2.4 and older used the ``2006.01.02 15:04:05`` layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from hami_agent.protocol.errors import ProtocolError, quote
from hami_agent.protocol.timefmt import (
    format_datetime,
    format_go_time_string,
    parse_datetime,
    parse_go_time_string,
)

REQUESTING = "Requesting"
DELETED = "Deleted"
REPORTED = "Reported"
# Kinds returned by parse_handshake
KIND_MISSING = "missing"
KIND_REQUESTING = "requesting"
KIND_DELETED = "deleted"
KIND_REPORTED = "reported"
KIND_OTHER = "other"

# After writing Requesting_, the scheduler waits this long before judging the node by its allocatable.
HANDSHAKE_TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True)
class Handshake:
    """A classified handshake value. ``when`` is naive for Requesting_/Deleted_ (scheduler local time)
    and aware for Reported (Go time strings carry a zone); None for missing/other."""

    kind: str
    when: datetime | None
    raw: str


def format_requesting(when: datetime) -> str:
    return f"{REQUESTING}_{format_datetime(when)}"


def format_deleted(when: datetime) -> str:
    return f"{DELETED}_{format_datetime(when)}"


def format_reported(when: datetime) -> str:
    """Legacy plugin heartbeat (space, not underscore), for schedulers at v2.7 or older."""
    return f"{REPORTED} {format_go_time_string(when)}"


def is_requesting(value: str | None) -> bool:
    """HAMi's test is a substring match on ``Requesting``."""
    return bool(value) and REQUESTING in value  # type: ignore[operator]


def parse_handshake(value: str | None) -> Handshake:
    """Classify a handshake value. Raises ProtocolError when a known prefix carries a bad time
    (callers that mimic HAMi treat that as healthy)."""
    if value is None or value == "":
        return Handshake(KIND_MISSING, None, value or "")
    if not isinstance(value, str):
        raise ProtocolError(f"node handshake: expected a string, got {quote(value)}")
    if value.startswith(REQUESTING + "_"):
        when = parse_datetime(value[len(REQUESTING) + 1:], "node handshake Requesting_ time")
        return Handshake(KIND_REQUESTING, when, value)
    if value.startswith(DELETED + "_"):
        return Handshake(KIND_DELETED,
                         parse_datetime(value[len(DELETED) + 1:], "node handshake Deleted_ time"), value)
    if value.startswith(REPORTED + " "):
        return Handshake(KIND_REPORTED,
                         parse_go_time_string(value[len(REPORTED) + 1:], "node handshake Reported time"),
                         value)
    return Handshake(KIND_OTHER, None, value)

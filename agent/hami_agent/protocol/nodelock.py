"""Value of the node lock annotation ``hami.io/mutex.lock`` (Project-HAMi/HAMi
``pkg/util/nodelock/nodelock.go``).

``<RFC3339 time>,<namespace>,<podName>``; the legacy value is a bare RFC3339 timestamp (no owner).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from hami_agent.protocol.errors import ProtocolError, quote
from hami_agent.protocol.timefmt import format_rfc3339, parse_rfc3339

# HAMi's NodeLockTimeout default; configurable via --node-lock-timeout / HAMI_NODELOCK_EXPIRE.
DEFAULT_LOCK_EXPIRY = timedelta(minutes=5)


@dataclass(frozen=True)
class NodeLockValue:
    """A parsed node lock. ``namespace``/``name`` are empty for a legacy (owner-less) lock."""

    when: datetime
    namespace: str = ""
    name: str = ""

    @property
    def has_owner(self) -> bool:
        return bool(self.namespace and self.name)

    def owned_by(self, namespace: str, name: str) -> bool:
        """HAMi releases only when the ``,<ns>,<name>`` suffix matches the pod."""
        return self.has_owner and self.namespace == namespace and self.name == name

    def expired(self, now: datetime, expiry: timedelta = DEFAULT_LOCK_EXPIRY) -> bool:
        """True when ``now`` is past ``when + expiry``. ``now`` must be timezone-aware."""
        return now > self.when + expiry


def format_lock_value(when: datetime, namespace: str, name: str) -> str:
    """``<RFC3339>,<ns>,<name>``. A naive ``when`` is taken as UTC."""
    for label, part in (("namespace", namespace), ("name", name)):
        if not part or "," in part:
            raise ProtocolError(f"node lock: pod {label} {part!r} must be non-empty and contain no ','")
    return f"{format_rfc3339(when)},{namespace},{name}"


def parse_lock_value(value: str) -> NodeLockValue:
    """Parse a node lock value (current or legacy bare timestamp)."""
    if not isinstance(value, str):
        raise ProtocolError(f"node lock: expected a string, got {quote(value)}")
    parts = value.split(",")
    if len(parts) == 1:
        return NodeLockValue(when=parse_rfc3339(parts[0].strip(), "node lock time"))
    if len(parts) != 3:
        raise ProtocolError(
            f"node lock: expected '<RFC3339>,<namespace>,<pod>' or a bare RFC3339 time, got {quote(value)}")
    when_s, ns, name = parts
    if not ns or not name:
        raise ProtocolError(f"node lock: empty namespace or pod name in {quote(value)}")
    return NodeLockValue(when=parse_rfc3339(when_s, "node lock time"), namespace=ns, name=name)

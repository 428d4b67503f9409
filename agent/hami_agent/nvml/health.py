"""Which XID events make a GPU unhealthy: NVIDIA's and HAMi's policy, as a pure function."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Application-class errors that say nothing about the GPU's health (NVIDIA k8s-device-plugin and
# HAMi rm/health.go): graphics engine exception, page fault, GPU stopped processing, preemptive
# cleanup, video processor exception, context switch timeout.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class XidPolicy:
    enabled: bool = True
    ignored: frozenset[int] = DEFAULT_IGNORED_XIDS
    forced: frozenset[int] = frozenset()
    force_all: bool = False

    def is_critical(self, xid: int) -> bool:
        if not self.enabled:
            return False
        if self.force_all or xid in self.forced:
            return True
        return xid not in self.ignored

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> XidPolicy:
        """``DP_DISABLE_HEALTHCHECKS``: ``all``/``xids`` disables XID health checks, else a comma list
        of extra XIDs to ignore. ``DP_ENABLE_HEALTHCHECKS``: ``all`` or a comma list of XIDs that count
        even if ignored. Unparseable entries raise ValueError naming the variable."""
        disable = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
        enable = env.get("DP_ENABLE_HEALTHCHECKS", "").strip().lower()
        if disable in ("all", "xids"):
            return cls(enabled=False)
        ignored = set(DEFAULT_IGNORED_XIDS) | _xids(disable, "DP_DISABLE_HEALTHCHECKS")
        if enable == "all":
            return cls(ignored=frozenset(ignored), force_all=True)
        return cls(ignored=frozenset(ignored), forced=frozenset(_xids(enable, "DP_ENABLE_HEALTHCHECKS")))


def _xids(value: str, var: str) -> set[int]:
    out: set[int] = set()
    for raw in value.split(","):
        part = raw.strip()
        if not part:
            continue
        try:
            out.add(int(part))
        except ValueError:
            raise ValueError(f"{var}: {part!r} is not an XID number (use a comma list like 48,79, "
                             f"or 'all')") from None
    return out

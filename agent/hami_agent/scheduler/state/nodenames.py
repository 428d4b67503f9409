"""kube-scheduler's last node-name list and what is known of it: the one copy.

kube-scheduler sends the same ``NodeNames`` array on every /filter and /prioritize (every node, 5,000 at
5,000 nodes; or the feasible ones its own filters found). The body parser hands out the same string
objects while the array repeats byte for byte (``httpserve.jsonbody.RepeatedArray``: that memo is of the
array's *text*), so comparing a new list with the last one is a C loop of identity checks. What the
extender derives from the list once - that every name is valid, and its set - is kept here, with the list,
and replaced whole: the argument parser (``verbs.args``) and the usage cache (``state.cache``) read it.
"""

from __future__ import annotations


class NodeNamesMemo:
    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (a copy of the list, every name found valid, its set or None until asked); replaced whole, so
        # threads see one consistent triple
        self._last: tuple[list[str], bool, frozenset[str] | None] = ([], False, None)

    def known_valid(self, names: list) -> bool:
        """``names`` equal the last list and its names were found valid."""
        last, valid, _ = self._last
        return valid and bool(names) and names == last

    def mark_valid(self, names: list[str]) -> None:
        last, _, as_set = self._last
        self._last = (last, True, as_set) if names == last else (list(names), True, None)

    def as_set(self, names: list[str]) -> frozenset[str]:
        """The set of ``names``: the last one when the list is equal. ``ValueError`` for a non-string."""
        last, valid, as_set = self._last
        if as_set is not None and names == last:
            return as_set
        try:
            as_set = frozenset(names)
        except TypeError as exc:
            raise ValueError(f"node names must be strings: {exc}") from exc
        same = names == last
        # a copy of the list: the caller's may change
        self._last = (last if same else list(names), valid and same, as_set)
        return as_set


LAST_NODE_NAMES = NodeNamesMemo()  # one per process: what kube-scheduler sends is one thing

__all__ = ["LAST_NODE_NAMES", "NodeNamesMemo"]

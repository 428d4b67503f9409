"""Dynamic MIG placement, ported from HAMi v2.10 (Project-HAMi/HAMi PR #2378): which MIG profile and
which physical placement a container gets on a GPU in ``mig`` mode.

The node publishes, per GPU, the allowlisted profiles with the legal placements NVML reports
(``migProfiles`` in ``hami.io/node-nvidia-register``). A placement ``{start, size}`` occupies memory
slices ``[start, start + size)``; the pods' reservations (``hami.io/vgpu-mig-allocations``) occupy
theirs. The rules, file by file:

* ``select_candidate`` = ``selectMigCandidate`` (``pkg/device/nvidia/device.go``): the smallest profile
  (memory, then slice count) whose memory is at least the request and that has a free placement;
* ``select_placement`` / ``ordered_placements`` = ``selectMigPlacement`` / ``orderedMigPlacements``
  (``pkg/device/nvidia/mig_topology.go``): ``1g.*`` and ``3g.*`` profiles take the highest free start,
  the others the lowest, so small instances pack from the top and large ones from the bottom;
* ``custom_filter`` = ``CustomFilterRule`` (``device.go``): the request fits a GPU if, after the
  placements already chosen for this container on it, one more candidate exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hami_agent.protocol.devices import MigPlacement, MigProfile


def _prefers_high(profile: str) -> bool:
    return profile.startswith(("1g.", "3g."))


def ordered_placements(profile: str, placements: Iterable[MigPlacement]) -> list[MigPlacement]:
    """``orderedMigPlacements``: a stable sort by start, descending for 1g/3g profiles."""
    return sorted(placements, key=lambda p: p.start, reverse=_prefers_high(profile))


def overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    return a.start < b.start + b.size and b.start < a.start + a.size


def select_placement(profile: MigProfile, occupied: Sequence[MigPlacement]) -> MigPlacement | None:
    for cand in ordered_placements(profile.name, profile.placements):
        if not any(overlaps(cand, o) for o in occupied):
            return cand
    return None


def select_candidate(profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement],
                     memory: int) -> tuple[MigProfile, MigPlacement] | None:
    """The profile and placement HAMi picks for ``memory`` MiB, or None."""
    for prof in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):  # stable, as SliceStable
        if prof.memory_mb < memory:
            continue
        placement = select_placement(prof, occupied)
        if placement is not None:
            return prof, placement
    return None


def custom_filter(profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement],
                  earlier_memreqs: Sequence[int], memreq: int) -> bool:
    """``CustomFilterRule`` for a MIG GPU: replay the placements of the devices already picked on this
    GPU for the container (``earlier_memreqs``), then ask for one more."""
    used = list(occupied)
    for mem in earlier_memreqs:
        got = select_candidate(profiles, used, mem)
        if got is None:
            return False
        used.append(got[1])
    return select_candidate(profiles, used, memreq) is not None


def largest_free_profile(profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement]) -> int:
    """The most memory (MiB) one more instance on this GPU can have: the largest profile with a free
    placement (0: none). ``custom_filter`` refuses any request above it, so it bounds what the GPU's
    free memory can serve (``prefit.summarize``)."""
    return max((p.memory_mb for p in profiles if select_placement(p, occupied) is not None), default=0)

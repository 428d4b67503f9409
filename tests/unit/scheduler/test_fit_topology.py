"""topology-aware device choice (HAMi ``computeBestCombination``): exact for small candidate sets, bounded for
large ones. A pod chooses the policy and the GPU count itself, and a MIG GPU is a candidate once per
instance, so the exhaustive search could take minutes of one /filter (C(56, 8) = 1.4e9 combinations)."""

from __future__ import annotations

import itertools
import math

import pytest

from hami_agent.scheduler.core import fit
from hami_agent.scheduler.core.model import Picked

pytestmark = pytest.mark.unit


def cards(n: int) -> list[Picked]:
    return [Picked(f"GPU-{i}", "NVIDIA", 1024, 10) for i in range(n)]


def pairs_for(n: int, seed: int) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for i, j in itertools.combinations(range(n), 2):
        s = (i * 7 + j * 13 + seed) % 17 - 4
        out.setdefault(f"GPU-{i}", {})[f"GPU-{j}"] = s
        out.setdefault(f"GPU-{j}", {})[f"GPU-{i}"] = s
    return out


def score(chosen: list[Picked], pairs: dict[str, dict[str, int]]) -> int:
    return sum(pairs.get(a.uuid, {}).get(b.uuid, 0) for a, b in itertools.combinations(chosen, 2))


def test_small_candidate_sets_get_hamis_exhaustive_choice() -> None:
    cands, pairs = cards(8), pairs_for(8, seed=3)
    got = fit._topology_choice(cands, 4, pairs)  # noqa: SLF001
    want = max(itertools.combinations(cands, 4), key=lambda c: score(list(c), pairs))
    assert score(got, pairs) == score(list(want), pairs)


def test_large_candidate_sets_are_searched_with_bounded_work(monkeypatch) -> None:
    cands, pairs = cards(56), pairs_for(56, seed=5)
    assert math.comb(56, 8) > fit.MAX_COMBINATIONS
    seen = {"n": 0}
    real = itertools.combinations

    def counting(it, r):  # noqa: ANN001 - counts every combination the choice generates
        for c in real(it, r):
            seen["n"] += 1
            yield c

    monkeypatch.setattr(fit.itertools, "combinations", counting)
    got = fit._topology_choice(cands, 8, pairs)  # noqa: SLF001
    assert len(got) == 8 and len({c.uuid for c in got}) == 8
    assert seen["n"] <= math.comb(56, 2)  # only the pairs of the greedy start: no combination search
    # and it is a good choice: better than every one of a thousand random 8-sets
    import random

    rng = random.Random(1)
    assert all(score(got, pairs) >= score(rng.sample(cands, 8), pairs) for _ in range(1000))

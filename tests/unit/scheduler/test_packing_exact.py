"""The exact feasibility model of the packing benchmark (``benchmarks/packing/exact.py``, PuLP/CBC) answers
known cases right, and on small random instances the extender never refuses a pod the model can place."""

from __future__ import annotations

import pytest

from benchmarks.packing.bench import cross_check
from benchmarks.packing.exact import pod_fits_node
from hami_agent.protocol import MigPlacement
from tests.unit.scheduler.helpers import a100_mig_profiles, dev, mig_dev, preq, req

pytestmark = pytest.mark.unit


def test_the_exact_model_on_known_cases():
    one = [dev(0, mem=8000, count=10)]
    assert pod_fits_node(one, preq(req(mem=4000), req(mem=4000)))
    assert not pod_fits_node(one, preq(req(mem=5000), req(mem=5000)))  # together they exceed the GPU
    assert pod_fits_node(one, preq(req(mem=7000), req(mem=1000), n_init=1))  # init runs alone
    assert not pod_fits_node([dev(0, used=1, usedmem=100)], preq(req(mem=1000, cores=100)))  # exclusive
    gpu = mig_dev(0, a100_mig_profiles("3g.40gb"))
    gpu.mig_used = (MigPlacement(0, 4),)
    assert pod_fits_node([gpu], preq(req(mem=30000)))
    assert not pod_fits_node([gpu], preq(req(nums=2, mem=30000)))


@pytest.mark.timeout(120)
def test_no_refusal_while_the_exact_model_finds_a_placement():
    total, refused, wrong = cross_check(4, seed=7)
    assert total == 32 and refused > 0  # the instances fill up: refusals happen and are checked
    assert wrong == 0

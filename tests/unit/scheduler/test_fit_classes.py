"""A pod that fits nowhere is fitted once per node class (``core.fitclass``), and every node still gets the
reason the decision core's definition (``core.decide.decide``: every node fitted) gives it: on a fleet with
cordoned and unhealthy GPUs, topology scores, MIG nodes, and shapes with mutex, NUMA binding, chained
policies, topology-aware, type and UUID lists and init containers."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from benchmarks.scheduler.trace import build_fleet, shapes
from hami_agent.protocol import keys
from hami_agent.scheduler.core import fitclass
from hami_agent.scheduler.core.decide import decide
from hami_agent.scheduler.core.fit import NodeExtras, NodeFit, pod_context
from hami_agent.scheduler.core.requests import pod_request
from hami_agent.scheduler.state.cache import UsageCache

pytestmark = pytest.mark.unit

EXTRA_ANNOTATIONS = ((keys.GPU_SCHEDULER_POLICY, "mutex"), (keys.NUMA_BIND, "true"),
                     (keys.GPU_SCHEDULER_POLICY, "topology-aware"), (keys.NOUSE_GPUTYPE, "H100"),
                     (keys.GPU_SCHEDULER_POLICY, "binpack,numa"))


def _perturbed_fleet(seed: int) -> UsageCache:
    rng = random.Random(seed)
    cache = build_fleet(150, seed=seed)
    for n in sorted(cache.nodes):
        st = cache.nodes[n]
        r = rng.random()
        if r < 0.1:
            cache.set_node_extras(n, NodeExtras(cordoned=frozenset({st.devices[rng.randrange(8)].id})))
        elif r < 0.2:
            devs = [d.clone() for d in st.devices]
            devs[rng.randrange(8)].health = False
            cache.set_node(n, devs, mig_capacity=dict(st.mig_capacity))
        elif r < 0.3:
            ids = [d.id for d in st.devices]
            pairs = {a: {b: rng.randrange(100) for b in ids} for a in ids}
            cache.set_node_extras(n, NodeExtras(pair_scores=pairs))
    return cache


def _pods(rng: random.Random, names: list[str], cache: UsageCache) -> list[dict]:
    out = []
    for s in shapes(40, seed=5):
        variants = [s, replace(s, init=True), replace(s, gpus=8, mem=81920)]
        for k, v in EXTRA_ANNOTATIONS:
            variants.append(replace(s, annotations=tuple(sorted((dict(s.annotations) | {k: v}).items()))))
        for v in variants:
            pod = v.pod(len(out))
            if rng.random() < 0.1:
                st = cache.nodes[rng.choice(names)]
                pod["metadata"]["annotations"][keys.USE_GPUUUID] = ",".join(d.id for d in st.devices[:3])
            out.append(pod)
    return out


def test_fits_nowhere_reasons_match_the_decision_core_and_classes_share_fits() -> None:
    cache = _perturbed_fleet(seed=6)
    names = sorted(cache.nodes)
    fitted = 0
    real = cache.evaluate

    def counting(*a, **kw) -> NodeFit:  # noqa: ANN002, ANN003
        nonlocal fitted
        fitted += 1
        return real(*a, **kw)

    cache.evaluate = counting  # type: ignore[method-assign]
    refused = refused_fits = 0
    for pod in _pods(random.Random(3), names, cache):
        preq, ctx = pod_request(pod), pod_context(pod["metadata"]["annotations"])
        want = decide(cache.nodes, names, preq, ctx)
        before = fitted
        dec = cache.decide(names, preq, ctx, event_nodes=0)
        assert dec.node == want.node
        if dec.node is None:
            assert dec.failed == want.failed
            if fitclass.verdict_request(preq, ctx) is not None:  # else (UUID lists) a fit per node
                refused += 1
                refused_fits += fitted - before
    assert refused >= 5
    # one fit per class, not per node: far fewer fits than the refusals' nodes
    assert refused_fits < refused * len(names) / 4


def test_a_reason_that_names_a_gpu_is_not_shared() -> None:
    st = build_fleet(1).nodes["gpu-node-00000"]
    gpu = st.devices[0].id
    assert not fitclass.shareable(NodeFit(False, [], f"AddResourceUsage failed for device {gpu}"), st)
    assert not fitclass.shareable(NodeFit(True, []), st)
    assert fitclass.shareable(NodeFit(False, [], "8/8 CardInsufficientMemory"), st)


def test_nodes_with_other_uuids_but_the_same_state_share_a_class() -> None:
    fleet = build_fleet(20)
    a, b = fleet.nodes["gpu-node-00009"], fleet.nodes["gpu-node-00019"]  # two idle MIG nodes
    assert a.devices[0].id != b.devices[0].id
    assert fitclass.state_key(a) == fitclass.state_key(b) != ""
    assert a.profiles == b.profiles == ()  # MIG nodes: the verdict key does not apply

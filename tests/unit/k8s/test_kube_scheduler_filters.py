"""The SIMULATED kube-scheduler's own filters: a cordoned node (``spec.unschedulable``) and untolerated
NoSchedule/NoExecute taints keep pods off a node, with kube-scheduler's reasons."""

from __future__ import annotations

import pytest

from tests.sim.kube_scheduler import fit_error_message, node_filter_reason, tolerates

pytestmark = pytest.mark.unit


def _node(unschedulable: bool = False, taints: list | None = None, ready: bool = True) -> dict:
    return {"metadata": {"name": "gpu-1"},
            "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(tolerations: list | None = None) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"tolerations": tolerations or []}}


def test_cordoned_node_is_skipped_unless_the_pod_tolerates_the_unschedulable_taint() -> None:
    assert node_filter_reason(_pod(), _node(unschedulable=True)) == "node(s) were unschedulable"
    daemonset_like = _pod([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                            "effect": "NoSchedule"}])
    assert node_filter_reason(daemonset_like, _node(unschedulable=True)) is None
    assert node_filter_reason(_pod(), _node()) is None


def test_taints_and_tolerations() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "upgrading", "effect": "NoSchedule"}
    assert node_filter_reason(_pod(), _node(taints=[taint])) == (
        "node(s) had untolerated taint {nvidia.com/gpu: upgrading}")
    assert tolerates(_pod([{"key": "nvidia.com/gpu", "value": "upgrading"}]), taint)  # Equal, any effect
    assert not tolerates(_pod([{"key": "nvidia.com/gpu", "value": "other"}]), taint)
    other_effect = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]
    assert not tolerates(_pod(other_effect), taint)
    assert tolerates(_pod([{"operator": "Exists"}]), taint)  # tolerates everything
    prefer = {"key": "x", "effect": "PreferNoSchedule"}
    assert node_filter_reason(_pod(), _node(taints=[prefer])) is None  # only a preference


def test_not_ready_node_reads_as_the_lifecycle_controllers_taint() -> None:
    assert node_filter_reason(_pod(), _node(ready=False)) == (
        "node(s) had untolerated taint {node.kubernetes.io/not-ready: }")


def test_fit_error_counts_reasons_like_kube_scheduler() -> None:
    msg = fit_error_message(3, {"a": "node(s) were unschedulable", "b": "node(s) were unschedulable",
                                "c": "1/8 CardInsufficientMemory"})
    assert msg == "0/3 nodes are available: 1 1/8 CardInsufficientMemory, 2 node(s) were unschedulable."

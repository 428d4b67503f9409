"""The seeds' decision trees as data (one module per seed), in evaluation order."""

from hami_agent.doctor.engine import Tree
from hami_agent.doctor.trees import (
    security,
    seed000_device_plugin,
    seed001_scheduler,
    seed002_hami_core,
    seed003_kubelet_stall,
)

# The incident tree first: its verdicts explain the symptoms the others would see.
TREES: tuple[Tree, ...] = (
    seed003_kubelet_stall.TREE,
    seed000_device_plugin.TREE,
    seed001_scheduler.TREE,
    seed002_hami_core.TREE,
    security.TREE,
)

__all__ = ["TREES"]

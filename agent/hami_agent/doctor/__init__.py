"""``hami-agent doctor``: evidence collectors + the seeds' decision trees as data + verdicts with fixes.

Public API::

    Context                      # what to look at (API client, files, host root, thresholds)
    diagnose_pod(ctx) / diagnose_node(ctx) / diagnose_cluster(ctx) / diagnose_logs(ctx) -> Report
    Report.verdicts: list[Verdict(code, severity, summary, evidence, fix, tree, subject, runbook)]
    analyse_kubelet_log(lines, stall_after_s=30) -> KubeletLogAnalysis   # the seed-003 stall detector
    TREES, REGISTRY (predicates), all_codes()
"""

from hami_agent.doctor.collect.base import Context
from hami_agent.doctor.diagnose import (
    UNKNOWN,
    diagnose_cluster,
    diagnose_logs,
    diagnose_node,
    diagnose_pod,
)
from hami_agent.doctor.kubeletlog import analyse_kubelet_log
from hami_agent.doctor.model import Facts, Report, Verdict
from hami_agent.doctor.predicates import REGISTRY
from hami_agent.doctor.trees import TREES


def all_codes() -> list[str]:
    """Every verdict code the trees can produce, plus UNKNOWN (each has docs/runbooks/<CODE>.md)."""
    codes = {rule.code for tree in TREES for rule in tree.rules}
    codes.add(UNKNOWN)
    return sorted(codes)


__all__ = [
    "REGISTRY", "TREES", "UNKNOWN", "Context", "Facts", "Report", "Verdict", "all_codes",
    "analyse_kubelet_log", "diagnose_cluster", "diagnose_logs", "diagnose_node", "diagnose_pod",
]

"""The cluster's own protection (issue 27 item 1, docs/security.md "Safe as installed"): is the allocation
guard installed?"""

from hami_agent.doctor.engine import Rule, Tree
from hami_agent.doctor.model import CRITICAL

TREE = Tree(
    name="security",
    seed="docs/security.md",
    title="the admission rules that keep HAMi's allocations the scheduler's",
    rules=(
        Rule(
            code="ALLOCATION_GUARD_MISSING", severity=CRITICAL, when=("allocation_guard_missing",),
            summary="the allocation guard is not installed (policies missing: {admission.missing_names}; "
                    "no guard webhook): any pod owner can rewrite its own pod's GPU allocation after "
                    "scheduling, and a pod created with spec.nodeName can make HAMi's pods fail admission",
            evidence=("admission.vap_served", "admission.policies_bound", "admission.guard_webhook"),
            fix="run playbooks/site.yml with a kubeconfig for the cluster on the controller "
                "(hami_rbac_kubeconfig or node_maintenance_kubeconfig): it applies the "
                "ValidatingAdmissionPolicies (Kubernetes >= 1.30) or the guard webhook (older clusters); by "
                "hand: kubectl apply -f ~/.cache/hami-node/rbac/hami-admission-policy.yaml",
            subject="cluster",
        ),
    ),
)

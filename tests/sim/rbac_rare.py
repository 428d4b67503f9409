"""Grants of the product's identities that only rare code paths use, each with the path that needs it.

The "every grant was used" checks (tests/integration/security/test_rbac_used.py and the demo's own in
tests/e2e/test_sandbox_demo.py) both start from this list, so a change that makes an API call rare is
allowed for in one place (the demo's check failed in CI when only the first list had been told).
"""

from __future__ import annotations

RARE_PATHS: dict[str, dict[tuple[str, str, str], str]] = {
    "scheduler": {
        # the node lock's first attempt patches against the extender's node watch copy (conditional on its
        # resourceVersion); the node is read afresh only when that copy was stale (409), the watch stalled,
        # or it showed a lock whose owner the watches cannot judge
        ("get", "", "nodes"): "k8s/nodelock.py lock_node (stale watch copy or a lock to judge)",
        # pods come from the pending-pod informer; a GET only when it has not shown the pod (or the
        # decision's write) yet (scheduler/state/podstate.py PodStates.get), or to read back a lost answer
        ("get", "", "pods"): "scheduler/state/podstate.py PodStates.get (watch lag), binder.py read-backs",
    },
    "plugin": {
        # K8sPodSource.fetch_pod: Allocate reads the pending pod from the API only when the pod informer
        # has not seen it yet (a just-bound pod racing the watch); the informer is normally first.
        ("get", "", "pods"): "deviceplugin/podsource.py K8sPodSource.fetch_pod (informer lag)",
        # the node is read from the plugin's node watch; a GET only when the watch has not shown the lock
        # yet (deviceplugin/owner.py find_lock_owner) or has not synced (node_register.py _read_node)
        ("get", "", "nodes"): "deviceplugin/owner.py find_lock_owner, node_register.py _read_node "
                              "(watch lag)",
    },
}

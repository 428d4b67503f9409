"""RBAC granted = used, and a node's DRA driver writes only its own node's ResourceSlices: the hami_rbac
role's own manifests (hami_rbac_dra: true) in the simulated API server with authentication, RBAC and the
ValidatingAdmissionPolicy evaluated by a real CEL engine; the real ``hami-agent dra`` runs with its node's
token."""

from __future__ import annotations

import pytest

from hami_agent.k8s.client import KubeClient
from hami_agent.k8s.errors import KubeError
from tests.sim.apiserver import ApiServer
from tests.sim.apiserver_auth import TokenTable, UserInfo
from tests.sim.dra_cluster import DraCluster
from tests.sim.role_manifests import rbac_manifests, render

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DRIVER = "gpu.hami.io"
SA = "hami-device-plugin-"


def slice_for(name: str, node: str, driver: str = DRIVER) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 0,
                                                                  "resourceSliceCount": 1}}}


def test_the_driver_runs_on_its_grants_and_cannot_write_another_nodes_slices(tmp_path, gpusim):
    tokens = TokenTable()
    with ApiServer(auth=tokens, rbac=True) as api, DraCluster(api.kubeconfig_path, tmp_path / "c") as c:
        api.apply(*rbac_manifests(["gpu-a", "gpu-b"], hami_rbac_dra=True, hami_rbac_dra_driver_name=DRIVER))
        api.apply(*render("dra-admission.yaml.j2", hami_rbac_dra_driver_name=DRIVER))
        c.apply_device_classes()
        a_token = tokens.add_service_account("kube-system", f"{SA}gpu-a")
        b_token = tokens.add_service_account("kube-system", f"{SA}gpu-b")
        alice = tokens.add_user(UserInfo("alice", ("team-a",)))
        g = gpusim("a100-80gb-x8", driver="570.172.08", name="gpu-a")
        n = c.add_node("gpu-a", g.state_path, g.lib_path, config={"dra": {"devices": {"index": [0, 1]}}},
                       kubeconfig=api.kubeconfig_for(a_token))
        assert c.wait(lambda: len(c.devices("gpu-a")) == 2, 30), open(n.driver_log).read()[-2000:]
        c.start_scheduler()
        c.submit(c.claim("c1", memory="10Gi", cores="10"), c.pod("p1", claim="c1"))
        running = c.wait(lambda: c.pod_phase("default", "p1") == "Running", 30)
        assert running, open(n.driver_log).read()[-2000:]
        g.set_lost(1)  # a health change: the driver updates its slice
        assert c.wait(lambda: c.devices("gpu-a")["gpu-1"].get("taints"), 20)
        # everything the driver did was allowed, and it did use each kind of access it was given
        records = api.audit_for(f"system:serviceaccount:kube-system:{SA}gpu-a")
        refused = [(r.attrs.verb, r.attrs.resource, r.code) for r in records if r.code in (401, 403)]
        assert not refused, refused
        used = {(r.attrs.resource, r.attrs.verb) for r in records if r.attrs is not None and r.code < 400}
        assert {("resourceslices", "create"), ("resourceslices", "update"), ("resourceslices", "list"),
                ("resourceslices", "watch"), ("resourceclaims", "list"), ("resourceclaims", "watch"),
                ("nodes", "get")} <= used

        b = KubeClient.from_kubeconfig(api.kubeconfig_for(b_token))
        with pytest.raises(KubeError) as exc:  # another node's slice: refused by the admission policy
            b.create("resourceslices", slice_for(f"gpu-a-{DRIVER}-3", "gpu-a"))
        assert exc.value.status == 403
        assert (f"ValidatingAdmissionPolicy 'hami-dra-resourceslices' with binding 'hami-dra-resourceslices' "
                f"denied request: rule hami-dra-resourceslices: system:serviceaccount:kube-system:{SA}gpu-b "
                f"may not write ResourceSlice gpu-a-{DRIVER}-3 (spec.nodeName gpu-a") in str(exc.value)
        wrong = (slice_for(f"gpu-a-{DRIVER}-0x", "gpu-b"), slice_for(f"gpu-b-{DRIVER}-0", "gpu-b", "x.io"))
        for bad in wrong:
            with pytest.raises(KubeError, match="hami-dra-resourceslices"):  # a name or driver not ours
                b.create("resourceslices", bad)
        own = api.get("resourceslices", None, f"gpu-a-{DRIVER}-0")
        with pytest.raises(KubeError, match=r'cannot update resource "resourceslices"'):  # RBAC names
            b.replace("resourceslices", own)
        with pytest.raises(KubeError, match=r'cannot delete resource "resourceslices"'):
            b.delete("resourceslices", f"gpu-a-{DRIVER}-0")
        assert b.create("resourceslices", slice_for(f"gpu-b-{DRIVER}-0", "gpu-b"))["metadata"]["name"]
        # a tenant cannot forge an allocation: claims' status is not theirs (no resourceclaims/status grant)
        t = KubeClient.from_kubeconfig(api.kubeconfig_for(alice))
        with pytest.raises(KubeError, match="forbidden"):
            t.patch("resourceclaims", "c1", {"status": {"reservedFor": []}}, "default", subresource="status")

"""With hami_rbac_dra, the node identity's RBAC grants exactly what the device plugin, the monitor and the
DRA driver call (scanned from the source, as tests/unit/roles/test_rbac_verbs.py does for the others), and
the DRA update/delete grants name only the node's own slices."""

import pytest

from tests.sim.role_manifests import render
from tests.unit.roles.test_rbac_verbs import _py, granted, required_verbs

pytestmark = pytest.mark.unit

DRIVER = "gpu.hami.io"
KW = {"hami_rbac_node_name": "gpu-1", "hami_rbac_dra": True, "hami_rbac_dra_driver_name": DRIVER}
DOCS = render("cluster.yaml.j2", **KW) + render("node.yaml.j2", **KW)
ROLES = ("hami-device-plugin", "hami-device-plugin-gpu-1", "hami-dra-driver", "hami-device-plugin-gpu-1-dra")


def test_every_dra_call_is_granted_and_nothing_more():
    need, problems = required_verbs(_py("deviceplugin", "monitor", "dra"))
    assert not problems, problems
    assert {
        ("resourceslices", "create"),
        ("resourceslices", "update"),
        ("resourceslices", "delete"),
        ("resourceclaims", "get"),
        ("resourceclaims", "watch"),
    } <= need
    have = granted(DOCS, *ROLES)
    assert not need - have, f"code needs {sorted(need - have)}"
    assert not have - need, f"granted but unused (least privilege): {sorted(have - need)}"


def test_slice_writes_are_limited_to_the_nodes_own_slice_names():
    role = next(d for d in DOCS if d["metadata"]["name"] == "hami-device-plugin-gpu-1-dra")
    [rule] = role["rules"]
    assert rule["verbs"] == ["update", "delete"]
    assert rule["resourceNames"] == [f"gpu-1-{DRIVER}-{i}" for i in range(4)]
    shared = next(d for d in DOCS if d["metadata"]["name"] == "hami-dra-driver")
    assert all("resourceNames" not in r for r in shared["rules"])
    assert {v for r in shared["rules"] for v in r["verbs"]} == {"get", "list", "watch", "create"}


def test_without_dra_nothing_dra_is_rendered():
    plain = render("cluster.yaml.j2", hami_rbac_node_name="gpu-1") + render(
        "node.yaml.j2", hami_rbac_node_name="gpu-1"
    )
    assert not [d for d in plain if "dra" in d["metadata"]["name"]]

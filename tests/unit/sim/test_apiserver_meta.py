"""The simulated API server refuses invalid metadata as kube-apiserver does (422, nothing written)."""

from __future__ import annotations

import pytest

from hami_agent.k8s import KubeClient
from hami_agent.k8s.errors import KubeError
from tests.sim.apiserver_store import ApiError
from tests.sim.fixtures import api_server  # noqa: F401

pytestmark = pytest.mark.unit

LONG = "gpu-node-pool-a100-80gb-europe-west4-b.compute.internal.example-01"  # 67 characters


def _pod(name: str, labels: dict | None = None, annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


def test_create_with_a_label_value_over_63_characters_is_refused(api_server):  # noqa: F811
    with pytest.raises(ApiError) as err:
        api_server.create(_pod("p", labels={"hami.io/vgpu-node": LONG}))
    assert err.value.code == 422
    assert err.value.message == (f'Pod "p" is invalid: metadata.labels: Invalid value: "{LONG}": '
                                 "must be no more than 63 characters")
    assert api_server.get("Pod", "default", "p") is None


def test_patch_with_a_bad_label_over_http_writes_nothing(api_server):  # noqa: F811
    api_server.create(_pod("p"))
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path)
    with pytest.raises(KubeError) as err:
        client.patch_pod_metadata("default", "p", annotations={"hami.io/vgpu-node": LONG},
                                  labels={"hami.io/vgpu-node": LONG})
    assert "422" in str(err.value) or getattr(err.value, "status", None) == 422, err.value
    assert "must be no more than 63 characters" in str(err.value)
    assert api_server.get("Pod", "default", "p")["metadata"]["annotations"] == {}


@pytest.mark.parametrize("labels, annotations, fragment", [
    ({"a/b/c": "x"}, {}, "metadata.labels: Invalid value: \"a/b/c\""),
    ({"Bad_Prefix.io/x": "v"}, {}, "prefix part"),
    ({"k": "-v"}, {}, "a valid label must be an empty string"),
    ({}, {"x": "y" * (256 * 1024)}, "metadata.annotations: Too long"),
    ({"a": "-", "b": "-"}, {}, "is invalid: [metadata.labels"),
])
def test_other_metadata_the_real_server_refuses(api_server, labels, annotations, fragment):  # noqa: F811
    with pytest.raises(ApiError) as err:
        api_server.create(_pod("p", labels=labels, annotations=annotations))
    assert err.value.code == 422 and fragment in err.value.message, err.value.message

"""Error wording and API path construction."""

from __future__ import annotations

import pytest

from hami_agent.k8s.client import api_path, kind_info
from hami_agent.k8s.errors import ConflictError, ExpiredError, KubeError, NotFoundError, error_for

pytestmark = pytest.mark.unit


def test_error_text_names_verb_status_and_object() -> None:
    e = error_for(409, "Conflict", "", "patch", "node", "gpu-1")
    assert isinstance(e, ConflictError)
    assert str(e) == "patch node error: 409 Conflict on node gpu-1"
    e = error_for(404, "NotFound", 'pods "p" not found', "get", "pod", "default/p")
    assert isinstance(e, NotFoundError)
    assert str(e) == 'get pod error: 404 Not Found on pod default/p: pods "p" not found'
    assert isinstance(error_for(410, "Expired", "too old", "watch", "pods"), ExpiredError)


def test_transport_error_and_transient_classification() -> None:
    e = KubeError(0, "connection refused", "[Errno 111]", "get", "node", "gpu-1")
    assert e.summary == "get node error: connection refused on node gpu-1"
    assert e.transient
    assert error_for(503, "ServiceUnavailable", "", "get", "node").transient
    assert error_for(429, "TooManyRequests", "", "get", "node").transient
    assert not error_for(409, "Conflict", "", "get", "node").transient
    assert not error_for(422, "Invalid", "", "get", "node").transient


def test_api_paths() -> None:
    assert api_path("nodes", None, "gpu-1") == "/api/v1/nodes/gpu-1"
    assert api_path("pods", "ns1", "p", "binding") == "/api/v1/namespaces/ns1/pods/p/binding"
    assert api_path("pods") == "/api/v1/pods"
    assert (api_path("lease", "kube-system", "hami")
            == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/hami")
    with pytest.raises(ValueError, match="unsupported kind 'deployments'"):
        kind_info("deployments")

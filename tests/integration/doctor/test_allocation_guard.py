"""``doctor cluster`` says when the allocation guard is missing (issue 27 item 1: ALLOCATION_GUARD_MISSING,
docs/runbooks/ALLOCATION_GUARD_MISSING.md): neither the admission policies are bound nor, on a cluster that
cannot run them, the guard webhook is registered."""

from __future__ import annotations

import pytest

from tests.integration.doctor.helpers import codes, node, run_doctor, verdict
from tests.integration.security.test_admission_install import OLD_CLUSTER, guard_manifest
from tests.sim.apiserver import ApiServer
from tests.sim.role_manifests import render

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def doctor(capsys, api: ApiServer) -> tuple[int, dict]:
    return run_doctor(capsys, "cluster", "--kubeconfig", api.kubeconfig_path, "--no-local")


def test_an_unguarded_cluster_is_a_critical_finding_and_a_guarded_one_is_not(capsys, tmp_path):
    with ApiServer() as api:
        api.create(node("gpu-1"))
        rc, report = doctor(capsys, api)
        assert rc == 1
        v = verdict(report, "ALLOCATION_GUARD_MISSING")
        assert v["severity"] == "critical" and v["runbook"] == "docs/runbooks/ALLOCATION_GUARD_MISSING.md"
        assert "hami-allocation-keys" in v["summary"] and "hami-scheduled-gpu-pods" in v["summary"]
        served = "serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"
        assert any(served in e for e in v["evidence"]), v
        # only the first of the two policies (an install from before issue 27): still missing a rule
        docs = render("admission.yaml.j2")
        api.apply(*docs[:2])
        v = verdict(doctor(capsys, api)[1], "ALLOCATION_GUARD_MISSING")
        assert "policies missing: hami-scheduled-gpu-pods;" in v["summary"], v["summary"]
        api.apply(*docs)
        assert "ALLOCATION_GUARD_MISSING" not in codes(doctor(capsys, api)[1])


def test_an_older_cluster_is_guarded_by_the_webhook(capsys, tmp_path):
    import yaml

    with ApiServer() as api:
        api.unserved = set(OLD_CLUSTER)
        api.create(node("gpu-1"))
        v = verdict(doctor(capsys, api)[1], "ALLOCATION_GUARD_MISSING")
        assert any("does not serve ValidatingAdmissionPolicy" in e for e in v["evidence"])
        api.apply(yaml.safe_load(guard_manifest(tmp_path).read_text()))
        assert "ALLOCATION_GUARD_MISSING" not in codes(doctor(capsys, api)[1])

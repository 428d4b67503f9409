"""``sandbox/dra_step.py`` (the demo's DRA step) run against an in-process API server: the same pieces as in
the sandbox (real ``hami-agent dra`` on gpusim, the simulated kubelet with DRA, the kube-scheduler's
allocator), without containers."""

from __future__ import annotations

import pytest

from sandbox import dra_step
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.mark.parametrize("graceful", [False, True], ids=["immediate-delete", "graceful-deletion"])
def test_the_dra_step_passes_and_leaves_nothing_behind(tmp_path, gpusim_lib_path, graceful):
    """With graceful deletion (the sandbox's API server) a deleted pod waits for its kubelet: the
    simulated kubelet unprepares the claims and confirms the deletion, as the real one does."""
    with ApiServer() as api:
        api.policy.graceful_deletion = graceful
        cluster = dra_step.DraStepCluster(api.kubeconfig_path, tmp_path / "dra", gpusim_lib=gpusim_lib_path)
        result = dra_step.run(cluster)
        assert result.ok, "\n".join(result.lines)
        assert [name for name, ok, _ in result.checks if ok] == [
            "the driver registered through the kubelet's plugin watcher",
            "ResourceSlice published with consumable memory and cores",
            "a claim for 20 GiB and 30 % lands with HAMi-core's limits",
            "a second claim (40 GiB, 50 %) shares the same GPU",
            "a third claim (30 GiB) that does not fit stays pending",
            "when the first pod goes its claim is unprepared and the third lands",
        ]
        assert not api.list("pods") and not api.list("resourceclaims") and not api.list("resourceslices")
        assert api.get("nodes", None, "gpu-dra") is None
        assert len(api.list("deviceclasses")) == 2

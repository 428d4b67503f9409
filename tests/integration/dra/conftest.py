"""A DRA cluster out of the simulators (tests/sim/dra_cluster.py) with the real ``hami-agent dra`` process on
gpusim nodes: the simulated API server (resource.k8s.io/v1), the kube-scheduler simulator's structured
allocator, and a simulated kubelet with its DRA manager per node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gpusim.fixtures import build_lib, make_node
from tests.sim.apiserver import ApiServer
from tests.sim.dra_cluster import DraCluster


@pytest.fixture(scope="session")
def gpusim_lib_path():
    return build_lib()


@pytest.fixture
def cluster(tmp_path, gpusim_lib_path) -> Iterator[tuple[ApiServer, DraCluster]]:
    with ApiServer() as api, DraCluster(api.kubeconfig_path, tmp_path / "cluster") as c:
        c.apply_device_classes()
        yield api, c


@pytest.fixture
def gpusim(tmp_path, gpusim_lib_path):
    def make(profile: str, driver: str | None = None, name: str | None = None):
        return make_node(tmp_path, profile, driver=driver, name=name, lib_path=gpusim_lib_path)

    return make

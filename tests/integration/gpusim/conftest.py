from tests.gpusim.fixtures import gpusim_factory, gpusim_lib, gpusim_node  # noqa: F401
